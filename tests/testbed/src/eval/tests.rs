use super::gen::*;
use super::score::*;
use super::*;
use crate::fault::Fault;
use crate::scenario::check_workload;

fn set() -> ScenarioSet {
    load_scenarios(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")).unwrap()
}

fn opts(synthetic: bool, max_ranks: usize) -> GenOptions {
    GenOptions {
        synthetic,
        max_ranks,
        overdue_ms: 1500,
        margin_s: 6,
    }
}

#[test]
fn the_generator_is_seeded_and_deterministic() {
    let s = set();
    let a = generate(&s, 42, 30, 10, &opts(true, 1024)).unwrap();
    let b = generate(&s, 42, 30, 10, &opts(true, 1024)).unwrap();
    assert_eq!(a, b);
    let c = generate(&s, 43, 30, 10, &opts(true, 1024)).unwrap();
    assert_ne!(a, c, "another seed, other cases");
    // Case i does not depend on how many cases are drawn (replay with --only).
    let short = generate(&s, 42, 7, 0, &opts(true, 1024)).unwrap();
    assert_eq!(short[..], a[..7]);
    // Kinds cycle through the faulty ones, then the healthy runs.
    let kinds: Vec<CaseKind> = a.iter().map(|c| c.kind).collect();
    assert_eq!(&kinds[..5], &CaseKind::FAULTY[..]);
    assert!(kinds[30..].iter().all(|k| *k == CaseKind::Healthy));
    assert!(kinds[..30].iter().all(|k| *k != CaseKind::Healthy));
}

#[test]
fn every_generated_case_is_a_valid_run_with_the_documented_shape() {
    let s = set();
    for (synthetic, max) in [(true, 1024), (false, 16), (true, 64)] {
        let cases = generate(&s, 7, 100, 40, &opts(synthetic, max)).unwrap();
        let mut scenarios = std::collections::BTreeSet::new();
        let mut sizes = std::collections::BTreeSet::new();
        for c in &cases {
            scenarios.insert(c.scenario.clone());
            sizes.insert(c.ranks);
            assert!(
                c.ranks <= max && c.hosts >= 2 && c.ranks % c.hosts == 0,
                "{c:?}"
            );
            let faults: Vec<Fault> = c.faults.iter().map(|f| f.parse().unwrap()).collect();
            let mut culprits: Vec<usize> = faults.iter().flat_map(Fault::culprits).collect();
            culprits.sort_unstable();
            assert_eq!(culprits, c.culprit_ranks, "{c:?}");
            let sc = &s[&c.scenario];
            let layout = sc.layout().rescaled(c.ranks).unwrap();
            if c.ranks <= 64 {
                crate::plan::build(sc, &layout, c.steps, &faults).unwrap();
            } else {
                crate::plan::check_faults(&faults, c.ranks, c.steps).unwrap();
                check_workload(&sc.workload, &layout).unwrap();
            }
            match c.kind {
                CaseKind::Healthy => {
                    // Only `slow:` jitter names ranks (the slowness culprits); stalls none.
                    let slow: Vec<usize> = faults
                        .iter()
                        .filter_map(|f| match f {
                            Fault::Slow { rank, .. } => Some(*rank),
                            _ => None,
                        })
                        .collect();
                    assert_eq!(c.culprit_ranks, slow);
                    assert!(c.expected_verdicts.is_empty());
                    let stalls: Vec<&Fault> = faults
                        .iter()
                        .filter(|f| matches!(f, Fault::Stall { .. }))
                        .collect();
                    assert!(!stalls.is_empty(), "{c:?}");
                    for f in stalls {
                        let Fault::Stall { ms, .. } = f else {
                            unreachable!()
                        };
                        assert!(*ms > 1500.0, "stalls outlast the threshold: {c:?}");
                    }
                    assert!(faults
                        .iter()
                        .all(|f| matches!(f, Fault::Stall { .. } | Fault::Slow { .. })));
                }
                kind => {
                    assert_eq!(faults.len(), 1);
                    assert_eq!(c.culprit_ranks.len(), 1);
                    let (Fault::Hang { step, rank }
                    | Fault::Pyhang { step, rank }
                    | Fault::Kill { step, rank }
                    | Fault::Mismatch { step, rank }) = faults[0]
                    else {
                        panic!("{c:?}")
                    };
                    assert!(step + 1 < c.steps, "not the last step: {c:?}");
                    assert_eq!(
                        faults[0].kind(),
                        if kind == CaseKind::PpChain {
                            "hang"
                        } else {
                            kind.name()
                        }
                    );
                    if kind == CaseKind::PpChain {
                        assert!(layout.pp >= 4);
                        let pp = layout.coords(rank).pp;
                        assert!(pp > 0 && pp + 1 < layout.pp, "middle stage: {c:?}");
                    }
                    if synthetic {
                        assert_eq!(c.timeout_s, 600);
                    } else {
                        assert_eq!(c.timeout_s, 2 + 6 + u64::from(step));
                    }
                }
            }
        }
        assert!(scenarios.len() >= 6, "layouts vary: {scenarios:?}");
        assert!(sizes.len() >= 3, "sizes vary: {sizes:?}");
        if max == 1024 {
            assert!(
                sizes.iter().any(|n| *n >= 256),
                "large worlds drawn: {sizes:?}"
            );
        }
    }
}

#[test]
fn impossible_requests_are_one_line_errors() {
    let s = set();
    let e = generate(&s, 1, 5, 0, &opts(true, 3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("raise --max-ranks"), "{e}");
    assert!(!e.contains('\n'));
}

fn case(kind: CaseKind, synthetic: bool) -> Case {
    Case {
        index: 0,
        seed: 1,
        kind,
        scenario: "megatron".into(),
        ranks: 8,
        hosts: 2,
        steps: 4,
        faults: vec![],
        culprit_ranks: vec![3],
        expected_verdicts: kind.expected_verdicts(synthetic),
        timeout_s: 10,
    }
}

fn answer(json: &str) -> Answer {
    parse_answer(json).unwrap()
}

#[test]
fn the_scorer_takes_the_first_verdicts_first_source_rank() {
    let hit = answer(
        r#"{"verdicts": [{"kind": "hang", "source_ranks": [3, 5], "evidence": {"big": 1}},
                         {"kind": "hang", "source_ranks": [5]}], "resolved": []}"#,
    );
    assert_eq!(hit.verdict_count, 2);
    assert!(
        hit.verdicts[0].get("evidence").is_none(),
        "evidence left out"
    );
    let s = score(&case(CaseKind::Hang, true), &[3], &hit);
    assert!(s.hit && s.kind_ok && !s.false_alarm);
    assert_eq!(s.top1, Some(3));
    // A culprit second in the list is a miss.
    let miss = answer(r#"{"verdicts": [{"kind": "hang", "source_ranks": [5, 3]}]}"#);
    let s = score(&case(CaseKind::Hang, true), &[3], &miss);
    assert!(!s.hit && s.kind_ok);
    assert_eq!(s.top1, Some(5));
    // No verdict, or one without source ranks: a miss.
    let empty = answer(r#"{"verdicts": [], "resolved": []}"#);
    assert!(!score(&case(CaseKind::Pyhang, false), &[3], &empty).hit);
    let none = answer(r#"{"verdicts": [{"kind": "hang", "source_ranks": []}]}"#);
    assert!(!score(&case(CaseKind::Hang, false), &[3], &none).hit);
}

#[test]
fn verdict_kinds_are_checked_per_fault_kind() {
    let v = |k: &str| {
        answer(&format!(
            r#"{{"verdicts": [{{"kind": "{k}", "source_ranks": [3]}}]}}"#
        ))
    };
    let ok = |kind, synthetic, k: &str| score(&case(kind, synthetic), &[3], &v(k)).kind_ok;
    assert!(ok(CaseKind::Kill, false, "failure"));
    assert!(
        !ok(CaseKind::Kill, false, "hang"),
        "real runs see the dead process"
    );
    assert!(ok(CaseKind::Kill, true, "hang") && ok(CaseKind::Kill, true, "failure"));
    assert!(ok(CaseKind::Mismatch, true, "mismatch"));
    assert!(!ok(CaseKind::Mismatch, true, "hang"));
    assert!(ok(CaseKind::PpChain, false, "hang"));
    assert!(!ok(CaseKind::Hang, false, "failure"));
}

#[test]
fn healthy_runs_count_false_and_transient_alarms_apart() {
    let h = case(CaseKind::Healthy, true);
    let quiet =
        answer(r#"{"verdicts": [], "resolved": [{"kind": "hang", "source_ranks": [2]}, {}]}"#);
    let s = score(&h, &[], &quiet);
    assert!(!s.false_alarm);
    assert_eq!(s.transient_alarms, 2);
    let alarm = answer(r#"{"verdicts": [{"kind": "hang", "source_ranks": [2]}]}"#);
    let s = score(&h, &[], &alarm);
    assert!(s.false_alarm && !s.hit);
    assert_eq!(s.transient_alarms, 0);
}

#[test]
fn bad_answers_are_errors_naming_the_problem() {
    assert!(parse_answer("Error: no segments")
        .unwrap_err()
        .contains("no JSON"));
    assert!(parse_answer(r#"{"verdict": []}"#)
        .unwrap_err()
        .contains("no `verdicts` list"));
    assert!(parse_answer(r#"{"verdicts": [], "resolved": 3}"#)
        .unwrap_err()
        .contains("`resolved` is not a list"));
}

fn result(kind: CaseKind, hit: bool, false_alarm: bool, error: bool) -> CaseResult {
    CaseResult {
        case: case(kind, true),
        truth_culprits: vec![3],
        got: None,
        score: Score {
            hit,
            kind_ok: hit,
            false_alarm,
            transient_alarms: 1,
            top1: None,
        },
        error: error.then(|| "boom".to_string()),
        dir: None,
        replay: String::new(),
        wall_s: 0.0,
    }
}

#[test]
fn the_summary_applies_both_targets() {
    let o = opts(true, 1024);
    let mut cases: Vec<CaseResult> = (0..200)
        .map(|_| result(CaseKind::Hang, true, false, false))
        .collect();
    cases.push(result(CaseKind::Healthy, false, false, false));
    let r = summarize(1, &o, cases.clone(), Duration::from_secs(1));
    assert_eq!(r.top1_accuracy, Some(1.0));
    assert_eq!(
        (r.false_alarms, r.transient_alarms, r.healthy_runs),
        (0, 1, 1)
    );
    assert!(r.passed());
    assert!(r.render(Path::new("/o")).contains("targets met"));
    // One miss in 200 is 99.5 %: still met; two are not.
    cases[0] = result(CaseKind::Hang, false, false, false);
    assert!(summarize(1, &o, cases.clone(), Duration::ZERO).passed());
    cases[1] = result(CaseKind::Hang, false, false, true);
    let r = summarize(1, &o, cases.clone(), Duration::ZERO);
    assert!(!r.passed());
    assert_eq!(r.by_kind[&CaseKind::Hang].errors, 1);
    let text = r.render(Path::new("/o"));
    assert!(
        text.contains("TARGET MISSED") && text.contains("error: boom"),
        "{text}"
    );
    // A false alarm fails the run whatever the accuracy; so does a healthy run that failed.
    let mut c2: Vec<CaseResult> = (0..10)
        .map(|_| result(CaseKind::Kill, true, false, false))
        .collect();
    c2.push(result(CaseKind::Healthy, false, true, false));
    assert!(!summarize(1, &o, c2.clone(), Duration::ZERO).passed());
    c2.pop();
    c2.push(result(CaseKind::Healthy, false, false, true));
    assert_eq!(summarize(1, &o, c2, Duration::ZERO).false_alarms, 1);
}

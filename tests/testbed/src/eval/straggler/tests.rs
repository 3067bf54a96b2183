use serde_json::json;

use super::exec::median_step_ms;
use super::gen::*;
use super::score::*;
use super::*;
use crate::eval::gen::ScenarioSet;
use crate::fault::Fault;
use crate::layout::host_of;

fn set() -> ScenarioSet {
    load_scenarios(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")).unwrap()
}

fn opts(synthetic: bool, max_ranks: usize) -> StragglerGenOptions {
    StragglerGenOptions {
        synthetic,
        max_ranks,
    }
}

#[test]
fn the_generator_is_seeded_deterministic_and_cycles_percent_and_variant() {
    let s = set();
    let a = generate(&s, 42, 24, 6, &opts(true, 1024)).unwrap();
    assert_eq!(a, generate(&s, 42, 24, 6, &opts(true, 1024)).unwrap());
    assert_ne!(a, generate(&s, 43, 24, 6, &opts(true, 1024)).unwrap());
    assert_eq!(
        generate(&s, 42, 5, 0, &opts(true, 1024)).unwrap()[..],
        a[..5]
    );
    for (i, c) in a.iter().enumerate().take(24) {
        assert_eq!(c.slow_pct, Some(PCTS[i % 4]), "{c:?}");
        assert_eq!(c.variant, Variant::FAULTY[(i / 4) % 3], "{c:?}");
    }
    // Real processes: 20 and 50 % only.
    let real = generate(&s, 42, 12, 0, &opts(false, 16)).unwrap();
    for (i, c) in real.iter().enumerate() {
        assert_eq!(c.slow_pct, Some([20, 50][i % 2]), "{c:?}");
        assert_eq!(c.variant, Variant::FAULTY[(i / 2) % 3], "{c:?}");
    }
    assert!(a[24..]
        .iter()
        .all(|c| c.variant == Variant::Healthy && c.slow_rank.is_none()));
}

#[test]
fn every_case_is_a_valid_run_of_the_documented_shape() {
    let s = set();
    for (synthetic, max) in [(true, 1024), (false, 16), (true, 64)] {
        let cases = generate(&s, 9, 120, 40, &opts(synthetic, max)).unwrap();
        let mut scenarios = std::collections::BTreeSet::new();
        for c in &cases {
            scenarios.insert(c.scenario.clone());
            assert!(c.ranks <= max && c.hosts >= 2 && c.ranks % c.hosts == 0);
            assert!((12..=20).contains(&c.steps), "{c:?}");
            let step_ms = 20.0;
            let faults = c.faults(step_ms);
            let sc = &s[&c.scenario];
            let layout = sc.layout().rescaled(c.ranks).unwrap();
            if c.ranks <= 64 {
                crate::plan::build(sc, &layout, c.steps, &faults).unwrap();
            } else {
                crate::plan::check_faults(&faults, c.ranks, c.steps).unwrap();
            }
            let host = |r: usize| host_of(r, c.ranks, c.hosts);
            match (c.variant, c.slow_rank, &c.link) {
                (Variant::Healthy, None, None) => {
                    assert!(!c.jitter.is_empty() && c.jitter.len() <= 3, "{c:?}");
                    for f in &faults {
                        let Fault::Slow { ms, steps, .. } = f else {
                            panic!("{f}")
                        };
                        assert!(*ms > 0.0 && *ms < step_ms * HEALTHY_JITTER_PCT / 100.0);
                        assert!(steps.is_some_and(|(a, b)| a <= b && b < c.steps));
                    }
                }
                (Variant::Alone, Some(r), None) => {
                    let want = f64::from(c.slow_pct.unwrap()) / 100.0 * step_ms;
                    assert_eq!(
                        faults,
                        vec![Fault::Slow {
                            rank: r,
                            ms: want,
                            steps: None
                        }]
                    );
                }
                (Variant::LinkApart, Some(r), Some(l)) => {
                    assert!(l.a != r && l.b != r, "{c:?}");
                    assert!(host(l.a) != host(r) && host(l.b) != host(r), "{c:?}");
                    assert_ne!(host(l.a), host(l.b));
                }
                (Variant::LinkOn, Some(r), Some(l)) => {
                    assert_eq!(l.a, r);
                    assert_ne!(host(l.b), host(r));
                }
                _ => panic!("inconsistent case {c:?}"),
            }
        }
        assert!(scenarios.len() >= 5, "{scenarios:?}");
    }
}

fn report(threshold: f64, ranks: &[(i64, f64)], steps: &[&[(i64, f64)]]) -> String {
    json!({
        "job": "eval-0",
        "threshold": threshold,
        "ranks": ranks.iter().map(|(r, i)| json!({"rank": r, "index": i, "class": "none"})).collect::<Vec<_>>(),
        "steps": steps.iter().enumerate().map(|(s, rs)| json!({
            "step": s,
            "avg_step_us": 1000.0,
            "ranks": rs.iter().map(|(r, i)| json!({"rank": r, "index": i, "avg_cause_us": i * 10.0})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

fn case(slow: Option<usize>) -> StragglerCase {
    StragglerCase {
        index: 0,
        seed: 1,
        variant: if slow.is_some() {
            Variant::Alone
        } else {
            Variant::Healthy
        },
        scenario: "megatron".into(),
        ranks: 4,
        hosts: 2,
        steps: 4,
        slow_rank: slow,
        slow_pct: slow.map(|_| 5),
        link: None,
        jitter: vec![],
        timeout_s: 60,
    }
}

#[test]
fn a_step_is_a_hit_only_when_the_injected_rank_is_strictly_highest() {
    let out = report(
        2.0,
        &[(3, 4.5), (1, 0.5)],
        &[
            &[(3, 5.0), (1, 1.0)],
            &[(1, 5.0), (3, 5.0)], // tie
            &[(0, 0.1)],           // injected absent = 0
            &[(3, 4.0), (1, 4.5)],
        ],
    );
    let p = parse(&out).unwrap();
    assert!(p.finding());
    let s = score(&case(Some(3)), &p);
    assert_eq!((s.top1, s.hit, s.detected), (Some(3), true, true));
    assert_eq!((s.steps, s.step_hits), (4, 1));
    assert_eq!(
        s.missed_steps,
        vec![(1, Some(3)), (2, Some(0)), (3, Some(1))]
    );
    let wrong = score(&case(Some(1)), &p);
    assert!(!wrong.hit && !wrong.detected);
    assert_eq!(wrong.step_hits, 1);
    // The {"jobs": [..]} form with one job is the same report.
    let jobs = format!("{{\"jobs\": [{out}]}}");
    assert_eq!(parse(&jobs).unwrap(), p);
    let two = format!("{{\"jobs\": [{out}, {out}]}}");
    assert!(parse(&two).unwrap_err().contains("2 jobs"));
    assert!(parse("not json").unwrap_err().contains("no JSON object"));
    assert!(parse("{\"threshold\": 1, \"ranks\": []}")
        .unwrap_err()
        .contains("no `steps` list"));
}

#[test]
fn healthy_alarms_on_the_multi_step_index_or_three_of_five_consecutive_steps() {
    let quiet: Vec<Vec<(i64, f64)>> = (0..10)
        .map(|s| vec![(0, 1.0), (1, if s % 3 == 0 { 3.0 } else { 0.5 })])
        .collect();
    let steps: Vec<&[(i64, f64)]> = quiet.iter().map(|v| &v[..]).collect();
    // Rank 1 is over 2.0 at steps 0, 3, 6, 9: at most 2 in any 5 consecutive steps.
    let p = parse(&report(2.0, &[(1, 1.3), (0, 1.0)], &steps)).unwrap();
    let s = score(&case(None), &p);
    assert!(!s.false_positive, "{:?}", s.alarm);
    assert_eq!(s.max_step_index, 3.0);
    // Over at steps 4, 6, 8: 3 of the 5 steps 4..=8.
    let loud: Vec<Vec<(i64, f64)>> = (0..10)
        .map(|s| vec![(2, if s >= 4 && s % 2 == 0 { 2.5 } else { 0.0 })])
        .collect();
    let steps: Vec<&[(i64, f64)]> = loud.iter().map(|v| &v[..]).collect();
    let s = score(
        &case(None),
        &parse(&report(2.0, &[(2, 1.2)], &steps)).unwrap(),
    );
    assert!(s.false_positive);
    assert!(s.alarm.unwrap().contains("rank 2"));
    // The multi-step index alone.
    let s = score(
        &case(None),
        &parse(&report(2.0, &[(5, 2.01)], &[&[(5, 1.0)]])).unwrap(),
    );
    assert!(s.alarm.unwrap().contains("multi-step index 2.01"));
}

fn result(pct: Option<u32>, steps: usize, hits: usize, fp: bool, err: bool) -> StragglerResult {
    let mut c = case(pct.map(|_| 1));
    c.slow_pct = pct;
    StragglerResult {
        case: c,
        step_ms: Some(10.0),
        faults: vec![],
        score: StragglerScore {
            hit: hits * 2 > steps,
            steps,
            step_hits: hits,
            false_positive: fp,
            threshold: 2.0,
            ..StragglerScore::default()
        },
        agent_exit: Some(1),
        error: err.then(|| "boom".into()),
        dir: None,
        replay: String::new(),
        wall_s: 0.0,
    }
}

#[test]
fn targets_are_per_percentage_and_errors_count_as_misses() {
    let o = opts(true, 64);
    // 20 %: 97 of 100 steps passes; 50 %: 97 %; 5 %: no per-step target; top-1 >= 97 %.
    let ok = vec![
        result(Some(5), 50, 30, false, false),
        result(Some(20), 50, 50, false, false),
        result(Some(20), 50, 47, false, false),
        result(Some(50), 20, 20, false, false),
        result(None, 0, 0, false, false),
    ];
    let r = summarize(1, &o, ok.clone());
    assert!(r.passed(), "{}", r.render(Path::new("/tmp")));
    assert_eq!(r.by_pct[&20].step_accuracy(), Some(0.97));
    assert_eq!(r.top1_accuracy, Some(1.0));
    let mut bad = ok.clone();
    bad[3] = result(Some(50), 20, 19, false, false);
    assert!(!summarize(1, &o, bad).passed());
    let mut bad = ok.clone();
    bad[2] = result(Some(20), 50, 46, false, false);
    assert!(!summarize(1, &o, bad).passed());
    // A top-1 miss (the 5 % case) puts top-1 at 75 %: below 97 %, and its layout below 95 %.
    let mut bad = ok.clone();
    bad[0] = result(Some(5), 50, 10, false, false);
    let r = summarize(1, &o, bad);
    assert!(!r.passed());
    assert!(r.render(Path::new("/tmp")).contains("every layout"));
    let mut fp = ok.clone();
    fp[3] = result(None, 0, 0, true, false);
    let r = summarize(1, &o, fp);
    assert_eq!(r.false_positives, 1);
    assert!(r.render(Path::new("/tmp")).contains("TARGET MISSED"));
    // An errored 50 % case counts its --steps (4) as missed.
    let mut err = ok;
    err.push(result(Some(50), 0, 0, false, true));
    let r = summarize(1, &o, err);
    assert_eq!((r.by_pct[&50].steps, r.by_pct[&50].errors), (24, 1));
    assert!(!r.passed());
}

#[test]
fn the_step_time_is_the_median_without_the_first_step() {
    let t = json!({"step_times_ns": {
        "0": [[0, 900_000_000], [0, 10_000_000], [5, 12_000_005]],
        "1": [[0, 1], [100, 11_000_100]],
    }});
    assert_eq!(median_step_ms(&t), Some(11.0));
    assert_eq!(median_step_ms(&json!({"step_times_ns": {}})), None);
}

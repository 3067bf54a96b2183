//! Plans of the `fsdp`, `ddp` and `decode` workload kinds: they pair up, finish, and issue the
//! sequences `tests/scenarios/README.md` documents.

use super::tests::check_structure;
use super::tests_support::scenario;
use super::*;

/// A rank's step as short tokens: `dp:AG`, `tp:AR`, `pp:recv`, `pp:send`, `compute:optimizer`.
fn tokens(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .map(|o| match o {
            Op::Compute { phase, .. } => format!("compute:{phase:?}").to_lowercase(),
            Op::Coll { comm, func, .. } => {
                let f = match func {
                    CollFunc::AllReduce => "AR",
                    CollFunc::AllGather => "AG",
                    CollFunc::ReduceScatter => "RS",
                    CollFunc::AllToAll => "A2A",
                };
                format!("{comm}:{f}")
            }
            Op::P2p { parts, .. } => parts
                .iter()
                .map(|p| if p.send { "pp:send" } else { "pp:recv" })
                .collect::<Vec<_>>()
                .join("+"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Only the communication tokens.
fn comms(ops: &[Op]) -> Vec<String> {
    tokens(ops)
        .into_iter()
        .filter(|t| !t.starts_with("compute"))
        .collect()
}

fn count(ts: &[String], t: &str) -> usize {
    ts.iter().filter(|x| *x == t).count()
}

#[test]
fn fsdp_plans_pair_up_finish_and_gather_per_layer() {
    let s = scenario("fsdp");
    let l = s.layout();
    assert_eq!(l.world(), 16);
    check_structure(&s, &l, 2);
    check_structure(&s, &l.rescaled(8).unwrap(), 2);
    let mut s1 = s.clone();
    s1.workload.microbatches = 1;
    s1.workload.layers = 3;
    check_structure(&s1, &Layout::new(1, 1, 2, 1, 1), 3);

    let plans = build(&s, &l, 1, &[]).unwrap();
    let (mbs, layers) = (s.workload.microbatches as usize, s.workload.layers as usize);
    let ts = comms(&plans[5].steps[0]);
    assert_eq!(count(&ts, "dp:AG"), mbs * layers * 2);
    assert_eq!(count(&ts, "dp:RS"), mbs * layers);
    assert_eq!(count(&ts, "tp:AR"), mbs * layers * 4);
    assert_eq!(ts.len(), mbs * layers * 7 + 1);
    // One microbatch: L x [AG, AR, AR], then L x [AG, AR, AR, RS]; the loss all-reduce last.
    let one_layer_fwd = ["dp:AG", "tp:AR", "tp:AR"];
    let one_layer_bwd = ["dp:AG", "tp:AR", "tp:AR", "dp:RS"];
    let mut want: Vec<&str> = Vec::new();
    for _ in 0..mbs {
        (0..layers).for_each(|_| want.extend(one_layer_fwd));
        (0..layers).for_each(|_| want.extend(one_layer_bwd));
    }
    want.push("global:AR");
    assert_eq!(ts, want);
    let all = tokens(&plans[5].steps[0]);
    assert_eq!(all[all.len() - 2], "compute:optimizer");
    // A layer's shard of all parameters.
    let shard = elems(s.messages.dp / layers as u64 / l.dp as u64);
    assert!(plans[5].steps[0].iter().any(|o| matches!(o,
        Op::Coll { comm: Role::Dp, func: CollFunc::AllGather, count, .. } if *count == shard)));
}

#[test]
fn ddp_plans_pair_up_finish_and_all_reduce_buckets_during_backward() {
    let s = scenario("ddp");
    let l = s.layout();
    assert_eq!(l.world(), 16);
    check_structure(&s, &l, 2);
    let mut s3 = s.clone();
    s3.workload.microbatches = 3;
    s3.workload.buckets = 1;
    check_structure(&s3, &Layout::new(1, 1, 2, 1, 1), 2);

    let plans = build(&s, &l, 1, &[]).unwrap();
    let b = s.workload.buckets as usize;
    let mut want = vec!["compute:forward".to_string()];
    for _ in 0..b {
        want.push("compute:backward".into());
        want.push("dp:AR".into());
    }
    want.extend(["compute:optimizer".into(), "global:AR".into()]);
    assert_eq!(tokens(&plans[11].steps[0]), want);
    // Gradient accumulation: only the last microbatch's backward communicates.
    let plans = build(&s3, &Layout::new(1, 1, 2, 1, 1), 1, &[]).unwrap();
    let t = tokens(&plans[1].steps[0]);
    assert_eq!(comms(&plans[1].steps[0]), ["dp:AR", "global:AR"]);
    assert_eq!(count(&t, "compute:forward"), 3);
    assert_eq!(t[..5].iter().filter(|x| x.starts_with("dp")).count(), 0);
}

#[test]
fn decode_plans_pair_up_finish_and_pass_token_batches_down_the_pipeline() {
    let s = scenario("decode");
    let l = s.layout();
    assert_eq!(l.world(), 16);
    check_structure(&s, &l, 3);
    let mut s1 = s.clone();
    for (tp, pp, mbs) in [(2, 1, 1), (2, 3, 1), (2, 2, 5)] {
        s1.workload.microbatches = mbs;
        check_structure(&s1, &Layout::new(tp, 1, 1, pp, 1), 2);
    }

    let plans = build(&s, &l, 1, &[]).unwrap();
    let (mbs, layers) = (s.workload.microbatches as usize, s.workload.layers as usize);
    let last = l.pp - 1;
    for p in &plans {
        let (rank, stage) = (p.rank, l.coords(p.rank).pp);
        let ts = comms(&p.steps[0]);
        let mut want: Vec<&str> = Vec::new();
        for _ in 0..mbs {
            if stage > 0 {
                want.push("pp:recv");
            }
            (0..layers).for_each(|_| want.extend(["tp:AR", "tp:AR"]));
            if stage < last {
                want.push("pp:send");
            }
        }
        want.push("tp:AG");
        assert_eq!(ts, want, "rank {rank} stage {stage}");
    }
    assert!(!plans
        .iter()
        .flat_map(|p| p.steps.iter().flatten())
        .any(|o| matches!(
            o,
            Op::Coll {
                comm: Role::Dp | Role::Global,
                ..
            }
        )));
}

#[test]
fn kinds_reject_layouts_they_cannot_run_in_one_line() {
    let parse = |t: &str| Scenario::parse(t, std::path::Path::new("k.toml"), "k");
    for (text, words) in [
        (
            "[layout]\ntp = 2\ndp = 2\n[workload]\nkind = \"ddp\"\n",
            &["ddp", "tp = 1"][..],
        ),
        (
            "[layout]\ndp = 1\n[workload]\nkind = \"ddp\"\n",
            &["ddp", "dp >= 2"],
        ),
        (
            "[layout]\ndp = 2\n[workload]\nkind = \"ddp\"\nbuckets = 0\n",
            &["buckets >= 1"],
        ),
        (
            "[layout]\npp = 2\ndp = 2\n[workload]\nkind = \"fsdp\"\n",
            &["fsdp", "pp = 1"],
        ),
        (
            "[layout]\ndp = 4\nep = 2\n[workload]\nkind = \"fsdp\"\n",
            &["fsdp", "ep = 1"],
        ),
        (
            "[layout]\ntp = 2\ndp = 2\n[workload]\nkind = \"decode\"\n",
            &["decode", "dp = 1"],
        ),
        (
            "[layout]\npp = 2\n[workload]\nkind = \"decode\"\n",
            &["decode", "tp >= 2"],
        ),
        (
            "[layout]\ntp = 2\n[workload]\nkind = \"decode\"\nmoe_layers = 1\n",
            &["moe_layers = 0"],
        ),
        (
            "[layout]\n[workload]\nkind = \"zero\"\n",
            &["kind = \"zero\"", "`fsdp`"],
        ),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        for w in words {
            assert!(e.contains(w), "{text}: {e}");
        }
    }
    // `--ranks` rescales dp: the plan checks the rescaled layout too.
    let s = scenario("decode");
    let e = build(&s, &s.layout().rescaled(32).unwrap(), 1, &[]).unwrap_err();
    assert!(
        matches!(&e, PlanError::Workload(m) if m.contains("dp = 1")),
        "{e}"
    );
}

#[test]
fn faults_land_in_every_kind() {
    for name in ["fsdp", "ddp", "decode"] {
        let s = scenario(name);
        let l = s.layout();
        let faults: Vec<Fault> = ["hang:rank=5,step=1", "mismatch:rank=6,step=0"]
            .iter()
            .map(|f| f.parse().unwrap())
            .collect();
        let plans = build(&s, &l, 2, &faults).unwrap();
        let i = plans[5].steps[1].iter().position(|o| *o == Op::Hang);
        let i = i.unwrap_or_else(|| panic!("{name}: no hang"));
        assert!(
            matches!(plans[5].steps[1][i - 1], Op::Compute { .. }),
            "{name}"
        );
        let anchor = plans[6].steps[0]
            .iter()
            .rev()
            .find(|o| matches!(o, Op::Coll { .. }))
            .unwrap();
        let want = if name == "decode" {
            Role::Tp
        } else {
            Role::Global
        };
        assert!(
            matches!(anchor, Op::Coll { comm, mismatch: true, .. } if *comm == want),
            "{name}: {anchor:?}"
        );
        // The mismatched anchor never completes: rank 6 never ends step 0.
        let tl = crate::sim::simulate(&plans, &l, &crate::sim::SimConfig::default());
        assert!(tl[6].step_end_ns.is_empty(), "{name}");
        assert_ne!(tl[6].state, crate::sim::RankState::Done, "{name}");
    }
}

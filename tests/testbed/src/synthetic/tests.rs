use super::*;
use comminsight_wire::record::{Kind, FLAG_REPEAT};
use comminsight_wire::segment::{find_segments, read_segment};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cit-synth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn megatron() -> crate::scenario::Scenario {
    crate::plan::tests_support::scenario("megatron")
}

fn run_synth(
    name: &str,
    ranks: usize,
    hosts: usize,
    steps: u32,
    faults: &[&str],
) -> (SyntheticConfig, SyntheticOutcome) {
    let s = megatron();
    let layout = s.layout().rescaled(ranks).unwrap();
    let faults: Vec<Fault> = faults.iter().map(|f| f.parse().unwrap()).collect();
    let plans = crate::plan::build(&s, &layout, steps, &faults).unwrap();
    let cfg = SyntheticConfig {
        layout,
        hosts,
        steps,
        seed: 7,
        faults,
        out: scratch(name),
        job: "synth".into(),
        scenario: "megatron".into(),
        overdue_ms: 2000,
        named_comms: true,
    };
    let out = run(&cfg, &plans).unwrap();
    (cfg, out)
}

/// Records of one rank (stream only), in file order.
fn rank_records(cfg: &SyntheticConfig, rank: usize) -> Vec<Record> {
    let dir = rank_dir(&cfg.out, &cfg.job, rank, cfg.layout.world(), cfg.hosts);
    let mut out = Vec::new();
    for f in find_segments(&dir).unwrap() {
        let seg = read_segment(&f).unwrap();
        assert!(seg.bad.is_empty() && seg.torn_tail_bytes == 0);
        out.extend(
            seg.records
                .into_iter()
                .filter(|r| r.kind() != Kind::Segment && r.flags & FLAG_REPEAT == 0),
        );
    }
    out
}

fn op_sns(recs: &[Record]) -> Vec<u64> {
    recs.iter()
        .filter_map(|r| match &r.body {
            Body::Coll(o) | Body::P2p(o) => Some(o.coll_local_sn),
            _ => None,
        })
        .collect()
}

/// Truth boundaries of `rank` tile exactly the op records written, in order.
fn check_rank(cfg: &SyntheticConfig, truth: &Truth, rank: usize) {
    let recs = rank_records(cfg, rank);
    let seqs: Vec<u64> = recs.iter().map(|r| r.seq).collect();
    assert_eq!(
        seqs,
        (0..recs.len() as u64).collect::<Vec<_>>(),
        "rank {rank}: consecutive seq"
    );
    assert!(recs.iter().all(|r| r.flags & FLAG_SYNTHETIC != 0));
    let sns = op_sns(&recs);
    assert_eq!(
        sns,
        (0..sns.len() as u64).collect::<Vec<_>>(),
        "rank {rank}: coll_local_sn"
    );
    let mut next = 0;
    for b in truth.steps[&rank].iter().flatten() {
        assert_eq!(b[0], next, "rank {rank}: steps tile the records");
        next = b[1] + 1;
    }
    let partial = truth.partial_steps.iter().find(|p| p.rank == rank);
    match partial {
        None => assert_eq!(
            next,
            sns.len() as u64,
            "rank {rank}: all records inside steps"
        ),
        Some(p) => assert_eq!(
            p.first_coll_local_sn, next,
            "rank {rank}: partial step starts after the last"
        ),
    }
}

#[test]
fn four_thousand_ranks_are_written_quickly_and_match_the_truth() {
    let t0 = Instant::now();
    let (cfg, out) = run_synth("scale", 4096, 512, 2, &[]);
    let wall = t0.elapsed();
    assert!(wall < Duration::from_secs(60), "4096 ranks took {wall:?}");
    assert_eq!(out.truth.ranks, 4096);
    assert_eq!(out.truth.steps.len(), 4096);
    assert!(out.truth.partial_steps.is_empty());
    let dirs = std::fs::read_dir(cfg.out.join("inspector_logs/synth/host511"))
        .unwrap()
        .count();
    assert_eq!(dirs, 8);
    for rank in [0, 1, 2, 3, 1000, 2049, 4095] {
        assert_eq!(out.truth.steps[&rank].len(), 2);
        check_rank(&cfg, &out.truth, rank);
    }
    // Comm hashes in truth are the ones recorded.
    let recs = rank_records(&cfg, 4095);
    for r in &recs {
        if let Body::CommInit(c) = &r.body {
            let hex = truth::hex(c.comm_hash);
            let tc = out
                .truth
                .comms
                .iter()
                .find(|t| t.hash == hex)
                .expect("comm in truth");
            assert_eq!(tc.ranks.len() as u32, c.nranks);
            assert!(tc.ranks.contains(&4095));
        }
    }
    std::fs::remove_dir_all(&cfg.out).unwrap();
}

#[test]
fn a_hang_gives_overdue_records_on_peers_and_partial_steps() {
    let (cfg, out) = run_synth("hang", 8, 2, 4, &["hang:rank=2,step=1"]);
    assert_eq!(out.truth.culprit_ranks, vec![2]);
    assert_eq!(out.truth.partial_steps.len(), 8);
    let mut overdue_ranks = 0;
    for r in 0..8 {
        assert_eq!(out.truth.steps[&r].len(), 1);
        check_rank(&cfg, &out.truth, r);
        let recs = rank_records(&cfg, r);
        let od = recs.iter().filter(|x| x.kind() == Kind::Overdue).count();
        let incomplete = recs
            .iter()
            .filter(|x| x.flags & FLAG_INCOMPLETE != 0)
            .count();
        assert_eq!(od, incomplete);
        if od > 0 {
            overdue_ranks += 1;
        }
    }
    assert!(
        overdue_ranks >= 4,
        "peers of the hung rank report overdue ops"
    );
    std::fs::remove_dir_all(&cfg.out).unwrap();
}

#[test]
fn overdue_ages_follow_the_plugins_backoff() {
    let ms = 1_000_000;
    assert_eq!(overdue_ages(1000, Some(999 * ms)), Vec::<u64>::new());
    assert_eq!(overdue_ages(1000, Some(1001 * ms)), vec![1000 * ms]);
    assert_eq!(
        overdue_ages(1000, Some(9000 * ms)),
        vec![1000 * ms, 2000 * ms, 4000 * ms, 8000 * ms]
    );
    assert_eq!(overdue_ages(1000, None), vec![1000 * ms]);
    assert_eq!(overdue_ages(0, Some(9000 * ms)), Vec::<u64>::new());
    // Intervals double up to the plugin's 600 s cap.
    let long = overdue_ages(100_000, Some(3_000_000 * ms));
    let gaps: Vec<u64> = long.windows(2).map(|w| (w[1] - w[0]) / ms).collect();
    assert_eq!(&gaps[..4], &[100_000, 200_000, 400_000, 600_000]);
    assert!(gaps[3..].iter().all(|g| *g == 600_000), "{gaps:?}");
}

#[test]
fn a_stall_gives_overdue_records_then_completions_and_no_culprit() {
    // Overdue 2000 ms; rank 5 stalls 5 s at the start of step 2: peers' ops of step 2 wait ~5 s.
    let (cfg, out) = run_synth("stall", 8, 2, 4, &["stall:rank=5,step=2,ms=5000"]);
    assert!(out.truth.culprit_ranks.is_empty());
    assert!(out.truth.partial_steps.is_empty());
    let mut waited = 0;
    for r in 0..8 {
        assert_eq!(out.truth.steps[&r].len(), 4, "rank {r} completes");
        check_rank(&cfg, &out.truth, r);
        let recs = rank_records(&cfg, r);
        assert!(recs.iter().all(|x| x.flags & FLAG_INCOMPLETE == 0));
        let overdue: Vec<(usize, &Overdue)> = recs
            .iter()
            .enumerate()
            .filter_map(|(i, x)| match &x.body {
                Body::Overdue(o) => Some((i, o)),
                _ => None,
            })
            .collect();
        if r == 5 {
            assert!(overdue.is_empty(), "the stalled rank waits on nobody");
            continue;
        }
        if overdue.is_empty() {
            continue;
        }
        waited += 1;
        // Per op: repeat 0 at age 2 s, then (rank 4, TP peer of 5, waits ~5 s from its first
        // compute) repeat 1 at 4 s (8 s is past the end), then its completion.
        let sn = overdue[0].1.coll_local_sn;
        let reps: Vec<(u32, u32)> = overdue
            .iter()
            .filter(|(_, o)| o.coll_local_sn == sn)
            .map(|(_, o)| (o.repeat, o.age_ms))
            .collect();
        assert_eq!(reps[0], (0, 2000), "rank {r}");
        if r == 4 {
            assert_eq!(reps, vec![(0, 2000), (1, 4000)]);
        }
        let done = recs
            .iter()
            .position(|x| matches!(&x.body, Body::Coll(o) | Body::P2p(o) if o.coll_local_sn == sn))
            .unwrap();
        let last_overdue = overdue
            .iter()
            .rfind(|(_, o)| o.coll_local_sn == sn)
            .unwrap()
            .0;
        assert!(
            last_overdue < done,
            "rank {r}: overdue before the completion"
        );
        let (Body::Coll(o) | Body::P2p(o)) = &recs[done].body else {
            unreachable!()
        };
        assert!(o.end_ns >= overdue[0].1.now_ns, "rank {r}");
        assert!(o.end_ns - o.enqueue_ns > 2_000_000_000, "rank {r}");
        // Completions of earlier ops precede the first overdue record.
        assert!(recs[..overdue[0].0]
            .iter()
            .filter_map(|x| match &x.body {
                Body::Coll(o) | Body::P2p(o) => Some(o.coll_local_sn),
                _ => None,
            })
            .all(|s| s < sn));
    }
    assert!(waited >= 4, "peers of the stalled rank wait: {waited}");
    std::fs::remove_dir_all(&cfg.out).unwrap();
}

#[test]
fn lost_events_shrink_the_steps_and_the_truth_follows() {
    let (cfg, full) = run_synth("noloss", 8, 1, 3, &[]);
    let n_full = op_sns(&rank_records(&cfg, 5)).len();
    let (cfg, lossy) = run_synth("loss", 8, 1, 3, &["loss:pct=30"]);
    let n_lossy = op_sns(&rank_records(&cfg, 5)).len();
    assert!(
        n_lossy < n_full && n_lossy > n_full / 3,
        "{n_lossy} of {n_full}"
    );
    for r in 0..8 {
        check_rank(&cfg, &lossy.truth, r);
    }
    assert_eq!(full.truth.culprit_ranks, Vec::<usize>::new());
    std::fs::remove_dir_all(&cfg.out).unwrap();
    let _ = std::fs::remove_dir_all(scratch("noloss"));
}

#[test]
fn slowlinks_need_two_hosts() {
    let s = megatron();
    let plans = crate::plan::build(&s, &s.layout(), 1, &[]).unwrap();
    let cfg = SyntheticConfig {
        layout: s.layout(),
        hosts: 1,
        steps: 1,
        seed: 1,
        faults: vec!["slowlink:a=0,b=5,rate=1mbit".parse().unwrap()],
        out: scratch("slowlink"),
        job: "j".into(),
        scenario: "megatron".into(),
        overdue_ms: 1000,
        named_comms: true,
    };
    let e = run(&cfg, &plans).unwrap_err().to_string();
    assert!(e.contains("use --hosts"), "{e}");
    let _ = std::fs::remove_dir_all(&cfg.out);
}

#[test]
fn synthetic_runs_follow_the_rank_order_and_can_leave_comms_unnamed() {
    let s = megatron();
    let layout = s
        .layout()
        .rescaled(16)
        .unwrap()
        .with_order("tp-cp-ep-pp-dp".parse().unwrap());
    let plans = crate::plan::build(&s, &layout, 2, &[]).unwrap();
    let cfg = SyntheticConfig {
        layout,
        hosts: 2,
        steps: 2,
        seed: 7,
        faults: vec![],
        out: scratch("order"),
        job: "synth".into(),
        scenario: "megatron".into(),
        overdue_ms: 2000,
        named_comms: false,
    };
    let out = run(&cfg, &plans).unwrap();
    assert_eq!(out.truth.layout.order.to_string(), "tp-cp-ep-pp-dp");
    let group = |role: Role, rank: usize| {
        out.truth
            .comms
            .iter()
            .find(|c| c.role == role && c.ranks.contains(&rank))
            .unwrap()
            .ranks
            .clone()
    };
    // tp fastest, then pp, then dp.
    assert_eq!(group(Role::Tp, 0), vec![0, 1]);
    assert_eq!(group(Role::Pp, 0), vec![0, 2]);
    assert_eq!(group(Role::Dp, 0), vec![0, 4, 8, 12]);
    for rank in [0, 5, 15] {
        check_rank(&cfg, &out.truth, rank);
        let mut inits = 0;
        for r in rank_records(&cfg, rank) {
            if let Body::CommInit(c) = &r.body {
                let hex = truth::hex(c.comm_hash);
                let tc = out.truth.comms.iter().find(|t| t.hash == hex).unwrap();
                assert_eq!(
                    tc.ranks.iter().position(|x| *x == rank),
                    Some(c.rank as usize)
                );
                inits += 1;
            }
        }
        assert_eq!(inits, 4, "rank {rank}: tp, dp, pp, global");
    }
    std::fs::remove_dir_all(&cfg.out).unwrap();
}

//! The formula on hand-computed examples (DESIGN.md §5).

use super::*;

const COMM: u64 = 0xc0;

fn coll(func: u8, seq: u64, start_us: u64) -> Arrival {
    Arrival {
        key: InstanceKey::Coll {
            comm: COMM,
            func,
            seq,
        },
        start_us,
        dur_us: 5,
    }
}

fn p2p(src: u32, dst: u32, seq: u64, start_us: u64) -> Arrival {
    Arrival {
        key: InstanceKey::P2p {
            comm: 0xd2,
            src,
            dst,
            seq,
        },
        start_us,
        dur_us: 5,
    }
}

fn rs(rank: i64, step: u64, dur: u64, arrivals: Vec<Arrival>) -> RankStep {
    RankStep {
        rank,
        host: format!("h{}", rank / 8),
        step,
        duration_us: dur,
        coverage_complete: true,
        err_us: 0,
        arrivals,
        prev_end_us: None,
    }
}

/// The defaults with every step analysed (these examples start at step 0).
fn no_warmup() -> StragglerSettings {
    StragglerSettings {
        warmup_steps: 0,
        ..StragglerSettings::default()
    }
}

fn index_of(a: &StepAnalysis, rank: i64) -> f64 {
    a.index.ranks.iter().find(|r| r.rank == rank).unwrap().index
}

fn worked(step: u64) -> Vec<RankStep> {
    // Op A arrivals r0=0, r1=10, r2=30; op B r0=100, r1=150, r2=110.
    let at = [[0, 100], [10, 150], [30, 110]];
    (0..3)
        .map(|r| {
            let b = step * 1000;
            rs(
                r,
                step,
                200,
                vec![
                    coll(5, step * 2, b + at[r as usize][0]),
                    coll(5, step * 2 + 1, b + at[r as usize][1]),
                ],
            )
        })
        .collect()
}

#[test]
fn design_worked_example() {
    let a = analyze_step(0, &worked(0));
    assert_eq!(a.index.avg_step_us, 200.0);
    assert_eq!(a.net, vec![(1, 0, 60), (2, 0, 40), (1, 2, 20)]);
    assert_eq!(index_of(&a, 0), 0.0);
    assert_eq!(index_of(&a, 1), 20.0);
    assert_eq!(index_of(&a, 2), 20.0);
    let r1 = a.index.ranks.iter().find(|r| r.rank == 1).unwrap();
    assert_eq!(r1.avg_cause_us, 40.0);
    // Highest first, ties by rank.
    let order: Vec<i64> = a.index.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(order, vec![1, 2, 0]);
}

#[test]
fn overlapping_intervals_count_once() {
    // Two concurrent comms: r1 makes r0 wait [0,50] and [20,60] -> union 60, not 90.
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0), p2p(1, 0, 0, 20)]),
        rs(1, 0, 100, vec![coll(5, 0, 50), p2p(1, 0, 0, 60)]),
    ];
    let a = analyze_step(0, &s);
    assert_eq!(a.net, vec![(1, 0, 60)]);
    assert_eq!(index_of(&a, 1), 60.0);
    // Disjoint intervals add up: [0,10] and [20,30] -> 20.
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0), coll(5, 1, 20)]),
        rs(1, 0, 100, vec![coll(5, 0, 10), coll(5, 1, 30)]),
    ];
    assert_eq!(analyze_step(0, &s).net, vec![(1, 0, 20)]);
}

#[test]
fn two_directions_cancel() {
    // r1 makes r0 wait 30, r0 makes r1 wait 30: nothing; 30 vs 10: r1 -> r0 net 20.
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0), coll(5, 1, 80)]),
        rs(1, 0, 100, vec![coll(5, 0, 30), coll(5, 1, 50)]),
    ];
    let a = analyze_step(0, &s);
    assert!(a.net.is_empty());
    assert_eq!(index_of(&a, 0), 0.0);
    assert_eq!(index_of(&a, 1), 0.0);
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0), coll(5, 1, 60)]),
        rs(1, 0, 100, vec![coll(5, 0, 30), coll(5, 1, 50)]),
    ];
    let a = analyze_step(0, &s);
    assert_eq!(a.net, vec![(1, 0, 20)]);
    assert_eq!(index_of(&a, 0), 0.0);
}

#[test]
fn pairs_never_cancel_each_other() {
    // r2 makes r0 wait 40 and r1 makes r2 wait 40 (separate pairs): both stand.
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0)]),
        rs(1, 0, 100, vec![p2p(2, 1, 0, 100)]),
        rs(2, 0, 100, vec![coll(5, 0, 40), p2p(2, 1, 0, 60)]),
    ];
    let a = analyze_step(0, &s);
    assert_eq!(a.net, vec![(2, 0, 40), (1, 2, 40)]);
    assert_eq!(index_of(&a, 1), 40.0);
    assert_eq!(index_of(&a, 2), 40.0);
}

#[test]
fn empty_r_cap_and_zero_step() {
    // Nobody waits for r0: index 0; r1's wait exceeds the step: capped at 100.
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0)]),
        rs(1, 0, 100, vec![coll(5, 0, 500)]),
    ];
    let a = analyze_step(0, &s);
    assert_eq!(index_of(&a, 0), 0.0);
    assert_eq!(index_of(&a, 1), 100.0);
    assert_eq!(a.index.ranks[1].avg_cause_us, 0.0);
    assert_eq!(a.index.ranks[0].avg_cause_us, 500.0);
    // AvgStep 0: every index 0.
    let s = vec![
        rs(0, 0, 0, vec![coll(5, 0, 0)]),
        rs(1, 0, 0, vec![coll(5, 0, 500)]),
    ];
    let a = analyze_step(0, &s);
    assert!(a.index.ranks.iter().all(|r| r.index == 0.0));
    // A single-member instance and equal arrivals attribute nothing.
    let s = vec![
        rs(0, 0, 100, vec![coll(5, 0, 0), coll(5, 1, 7)]),
        rs(1, 0, 100, vec![coll(5, 0, 0), coll(5, 2, 90)]),
    ];
    assert!(analyze_step(0, &s).net.is_empty());
}

#[test]
fn clock_bound_suppresses_small_waits() {
    let mk = |e0, e1| {
        let mut s = vec![
            rs(0, 0, 100, vec![coll(5, 0, 0)]),
            rs(1, 0, 100, vec![coll(5, 0, 10)]),
        ];
        s[0].err_us = e0;
        s[1].err_us = e1;
        analyze_step(0, &s).net
    };
    assert_eq!(mk(0, 0), vec![(1, 0, 10)]);
    assert_eq!(mk(4, 5), vec![(1, 0, 10)]);
    assert!(mk(5, 5).is_empty());
    assert!(mk(0, 30).is_empty());
}

#[test]
fn p2p_pairs_only_the_two_peers() {
    // A send 0 -> 1 and its recv: r1 posts late; r2's unrelated p2p with the same seq is
    // another instance.
    let s = vec![
        rs(0, 0, 100, vec![p2p(0, 1, 0, 10)]),
        rs(1, 0, 100, vec![p2p(0, 1, 0, 35)]),
        rs(2, 0, 100, vec![p2p(2, 1, 0, 90)]),
    ];
    let a = analyze_step(0, &s);
    assert_eq!(a.net, vec![(1, 0, 25)]);
}

#[test]
fn multi_step_mean_over_complete_steps_only() {
    let mut all = worked(0);
    all.extend(worked(1));
    // Step 2: r1 very late, but its step is incomplete: not in its mean.
    let mut s2 = vec![
        rs(0, 2, 200, vec![coll(5, 100, 2000)]),
        rs(1, 2, 200, vec![coll(5, 100, 2100)]),
        rs(2, 2, 200, vec![coll(5, 100, 2000)]),
    ];
    s2[1].coverage_complete = false;
    all.extend(s2);
    // Step 3: r0 incomplete everywhere else: r0 has complete steps 0, 1 and 3.
    let mut s3 = worked(3);
    s3[2].coverage_complete = false;
    all.extend(s3);
    all.reverse();
    let rep = analyze("j", all, &no_warmup());
    assert_eq!(rep.steps.len(), 4);
    let s2i = &rep.steps[2];
    assert_eq!(s2i.step, 2);
    assert_eq!(s2i.ranks[0].rank, 1);
    assert_eq!(s2i.ranks[0].index, 50.0);
    let r = |k: i64| rep.ranks.iter().find(|x| x.rank == k).unwrap();
    assert_eq!(r(1).complete_steps, 3);
    assert_eq!(r(1).index, 20.0);
    assert_eq!(r(1).max_index, 20.0);
    // r2: complete in steps 0, 1 (20 each) and 2 (0), not in 3.
    assert_eq!(r(2).complete_steps, 3);
    assert!((r(2).index - 40.0 / 3.0).abs() < 1e-9);
    assert_eq!(r(0).complete_steps, 4);
    assert_eq!(r(0).index, 0.0);
    // Steps over the default threshold (15): r1 in its 3 complete steps.
    assert_eq!(r(1).steps_over_threshold, 3);
    // No complete step (a step cut by a hang on every rank): index 0, the step left out.
    let mut one = worked(0);
    for x in &mut one {
        x.coverage_complete = false;
    }
    let rep = analyze("j", one, &no_warmup());
    assert_eq!(rep.ranks.len(), 3);
    assert!(rep
        .ranks
        .iter()
        .all(|r| r.index == 0.0 && r.complete_steps == 0));
    assert!(rep.steps.is_empty(), "{:?}", rep.steps);
}

#[test]
fn warmup_steps_are_left_out() {
    // Step 0: r1 very late (the warm-up); steps 1 and 2 balanced.
    let mut all = vec![
        rs(0, 0, 200, vec![coll(5, 0, 0)]),
        rs(1, 0, 200, vec![coll(5, 0, 150)]),
    ];
    for s in 1..3 {
        all.extend((0..2).map(|r| rs(r, s, 200, vec![coll(5, s, s * 1000)])));
    }
    // The default: one warm-up step.
    let rep = analyze("j", all.clone(), &StragglerSettings::default());
    let steps: Vec<u64> = rep.steps.iter().map(|s| s.step).collect();
    assert_eq!(steps, vec![1, 2]);
    assert!(rep
        .ranks
        .iter()
        .all(|r| r.index == 0.0 && r.complete_steps == 2));
    // None: step 0 makes r1 the straggler (150 of 200 µs on r0: 75, mean 25 over 3 steps).
    let rep = analyze("j", all.clone(), &no_warmup());
    assert_eq!(rep.steps.len(), 3);
    assert_eq!(rep.ranks[0].rank, 1);
    assert_eq!(rep.ranks[0].index, 25.0);
    // More warm-up steps than the job has: nothing analysed, every rank still listed.
    let rep = analyze(
        "j",
        all,
        &StragglerSettings {
            warmup_steps: 10,
            ..StragglerSettings::default()
        },
    );
    assert!(rep.steps.is_empty());
    assert_eq!(rep.ranks.len(), 2);
}

#[test]
fn top_causes_and_victims_explain_only() {
    let mut all = worked(0);
    all.extend(worked(1));
    let base = analyze("j", all.clone(), &no_warmup());
    let r0 = base.ranks.iter().find(|x| x.rank == 0).unwrap();
    // r0 waited for r1 (60 per step) and r2 (40 per step).
    assert_eq!(
        r0.top_causes,
        vec![
            PeerWait {
                rank: 1,
                wait_us: 120,
                steps: 2
            },
            PeerWait {
                rank: 2,
                wait_us: 80,
                steps: 2
            },
        ]
    );
    assert!(r0.top_victims.is_empty());
    let r1 = base.ranks.iter().find(|x| x.rank == 1).unwrap();
    assert_eq!(
        r1.top_victims,
        vec![
            PeerWait {
                rank: 0,
                wait_us: 120,
                steps: 2
            },
            PeerWait {
                rank: 2,
                wait_us: 40,
                steps: 2
            },
        ]
    );
    // Keeping one peer changes the lists, never the index.
    let one = analyze(
        "j",
        all,
        &StragglerSettings {
            top: 1,
            ..no_warmup()
        },
    );
    for (a, b) in base.ranks.iter().zip(&one.ranks) {
        assert_eq!(
            (a.rank, a.index, a.max_index),
            (b.rank, b.index, b.max_index)
        );
        assert!(b.top_causes.len() <= 1 && b.top_victims.len() <= 1);
    }
    assert_eq!(base.steps, one.steps);
    // Ranks by index, ties by rank.
    let order: Vec<i64> = base.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(order, vec![1, 2, 0]);
}

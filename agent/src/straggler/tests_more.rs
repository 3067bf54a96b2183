//! Classification rules and the collector (records -> rank-steps).

use comminsight_wire::record::{Body, Record};
use comminsight_wire::record::{CommInit, OpRecord};
use comminsight_wire::Func;

use super::classify::{classify, RankShape, Shape};
use super::*;
use crate::steps::fsm::{ClosedBy, Evidence, StepSummary};
use crate::stream::{Alignment, StreamId};

fn shape(rank: i64, index: f64, over: u64, late: f64, ratio: f64, comms: &[u64]) -> RankShape {
    RankShape {
        rank,
        index,
        complete_steps: 10,
        steps_over: over,
        shape: Shape {
            late_sum: late * 4.0,
            late_n: 4,
            dur_sum: ratio * 4.0,
            dur_n: 4,
        },
        comms: comms.to_vec(),
        ..RankShape::default()
    }
}

fn classes(v: &[RankShape]) -> Vec<StragglerClass> {
    classify(v, 10.0).into_iter().map(|c| c.0).collect()
}

#[test]
fn compute_comm_and_none() {
    let v = [
        shape(0, 5.0, 0, 900.0, 1.0, &[1]),
        shape(1, 30.0, 10, 900.0, 1.1, &[1]),
        shape(2, 30.0, 3, 50.0, 1.8, &[2]),
        shape(3, 30.0, 3, -20.0, 1.0, &[3]),
        // Late and 1.2 < ratio <= 1.5: still compute-slow.
        shape(4, 12.0, 2, 100.0, 1.4, &[4]),
    ];
    use StragglerClass::*;
    assert_eq!(
        classes(&v),
        vec![None, ComputeSlow, CommSlow, CommSlow, ComputeSlow]
    );
    let r = classify(&v, 10.0);
    assert!(r[1].1.contains("late arrival"), "{}", r[1].1);
    assert!(r[0].1.contains("threshold"), "{}", r[0].1);
}

#[test]
fn structural_group() {
    use StragglerClass::*;
    // Three persistent culprits chained through shared communicators (7: 0-1, 8: 1-2).
    let g = [
        shape(0, 20.0, 9, 500.0, 1.0, &[7]),
        shape(1, 25.0, 10, 500.0, 1.0, &[7, 8]),
        shape(2, 30.0, 8, 500.0, 1.0, &[8]),
        shape(3, 2.0, 0, 0.0, 1.0, &[7]),
    ];
    assert_eq!(classes(&g), vec![Structural, Structural, Structural, None]);
    // Not connected: each its own class.
    let mut apart = g.clone();
    apart[2].comms = vec![9];
    assert_eq!(
        classes(&apart),
        vec![ComputeSlow, ComputeSlow, ComputeSlow, None]
    );
    // One rank far above the others: a slow rank and its victims, not a group.
    let mut one = g.clone();
    one[2].index = 80.0;
    assert_eq!(classes(&one)[2], ComputeSlow);
    // Not persistent (over in < 80% of steps).
    let mut brief = g.clone();
    for r in &mut brief[..3] {
        r.steps_over = 5;
    }
    assert_eq!(classes(&brief)[0], ComputeSlow);
    // A single culprit is never structural.
    assert_eq!(classes(&g[1..2]), vec![ComputeSlow]);
}

#[test]
fn analyze_classifies_a_late_rank() {
    // 4 ranks, one all-reduce per step; rank 2 arrives 60 µs late at every one.
    let steps: Vec<RankStep> = (0..5u64)
        .flat_map(|s| {
            (0..4i64).map(move |r| RankStep {
                rank: r,
                host: "h".into(),
                step: s,
                duration_us: 200,
                coverage_complete: true,
                err_us: 1,
                arrivals: vec![Arrival {
                    key: InstanceKey::Coll {
                        comm: 1,
                        func: 5,
                        seq: s,
                    },
                    start_us: s * 1000 + r as u64 + if r == 2 { 60 } else { 0 },
                    dur_us: if r == 2 { 10 } else { 70 },
                }],
                prev_end_us: None,
            })
        })
        .collect();
    let rep = analyze(
        "j",
        steps,
        &StragglerSettings {
            warmup_steps: 0,
            ..StragglerSettings::default()
        },
    );
    assert_eq!(rep.ranks[0].rank, 2);
    assert_eq!(rep.ranks[0].class, StragglerClass::ComputeSlow);
    assert_eq!(rep.ranks[0].steps_over_threshold, 5);
    assert!(rep.ranks[1..]
        .iter()
        .all(|r| r.class == StragglerClass::None));
    // Net waits 60-1=59.. per victim: (62-0-... ) all below the step -> index < 100.
    assert!(rep.ranks[0].index > 10.0 && rep.ranks[0].index < 100.0);
}

fn op(func: Func, sn: u64, local: u64, peer: i32, start_us: u64, end_us: u64) -> Record {
    let o = OpRecord {
        comm_hash: 0xab,
        coll_sn: sn,
        coll_local_sn: local,
        start_ns: start_us * 1000,
        end_ns: end_us * 1000,
        rank: 1,
        peer,
        func,
        ..OpRecord::default()
    };
    Record::new(if peer >= 0 {
        Body::P2p(o)
    } else {
        Body::Coll(o)
    })
}

fn ev(local: u64, start_us: u64) -> Evidence {
    Evidence {
        comm_hash: 0xab,
        func: Func::ALL_REDUCE,
        coll_sn: 0,
        coll_local_sn: local,
        start_us,
    }
}

fn summary(first: Evidence, last: Evidence) -> StepSummary {
    StepSummary {
        rank: 3,
        step: 0,
        first,
        anchor: None,
        anchor_alt: None,
        last,
        duration_us: 500,
        ops: 0,
        coverage_complete: true,
        closed_by: ClosedBy::Close,
        phases: None,
        microbatches: None,
    }
}

#[test]
fn collector_keys_and_step_range() {
    let id = StreamId::new("j", "h1", "42");
    let mut c = StepOpCollector::new();
    let al = Alignment {
        offset_ns: 2_000,
        err_ns: 0,
    };
    c.observe(
        &id,
        &Record::new(Body::CommInit(CommInit {
            comm_hash: 0xab,
            rank: 3,
            ..CommInit::default()
        })),
        al,
    );
    c.observe(&id, &op(Func::ALL_REDUCE, 0, 0, -1, 5, 9), al); // before the step
    c.observe(&id, &op(Func::ALL_REDUCE, 1, 1, -1, 10, 20), al);
    c.observe(&id, &op(Func::SEND, 0, 3, 0, 30, 0), al); // unfinished
    c.observe(&id, &op(Func::RECV, 4, 2, 2, 25, 28), al); // out of order
    c.observe(&id, &op(Func::ALL_REDUCE, 2, 4, -1, 40, 41), al); // next step
    assert_eq!(c.buffered(), 5);
    let rs = c.take(&id, &summary(ev(1, 12), ev(3, 32)), 7, 3, 4);
    assert_eq!(
        (rs.rank, rs.step, rs.err_us, rs.host.as_str()),
        (3, 7, 4, "h1")
    );
    assert_eq!((rs.duration_us, rs.coverage_complete), (500, true));
    let got: Vec<(InstanceKey, u64, u64)> = rs
        .arrivals
        .iter()
        .map(|a| (a.key, a.start_us, a.dur_us))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                InstanceKey::Coll {
                    comm: 0xab,
                    func: 5,
                    seq: 1
                },
                12,
                10
            ),
            (
                InstanceKey::P2p {
                    comm: 0xab,
                    src: 2,
                    dst: 3,
                    seq: 4
                },
                27,
                3
            ),
            (
                InstanceKey::P2p {
                    comm: 0xab,
                    src: 3,
                    dst: 0,
                    seq: 0
                },
                32,
                0
            ),
        ]
    );
    // Only the next step's op is left; a late record of the taken step is dropped.
    assert_eq!(c.buffered(), 1);
    c.observe(&id, &op(Func::ALL_REDUCE, 9, 5, -1, 20, 21), al);
    assert_eq!(c.buffered(), 1);
    // The state round-trips through serde.
    let back: StepOpCollector = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    let rs = back
        .clone()
        .take(&id, &summary(ev(4, 42), ev(4, 42)), 8, 3, 0);
    assert_eq!(rs.arrivals.len(), 1);
    assert_eq!(rs.arrivals[0].start_us, 42);
    c.end_stream(&id);
    assert_eq!(c.buffered(), 0);
    assert_eq!(c.dropped(), 0);
}

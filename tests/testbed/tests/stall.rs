//! The `stall` fault with real rank processes (libnccl stand-in + the CommInsight plugin): a
//! healthy checkpoint-like pause. The run completes, the truth names no culprit, and the peers'
//! ops that outlive `COMMINSIGHT_OVERDUE_MS` get the plugin's `overdue` records followed by their
//! normal completion records (what `--synthetic` imitates).

mod support;

use std::collections::BTreeMap;

use comminsight_wire::record::{Body, FLAG_INCOMPLETE};
use support::*;

#[test]
fn a_stall_completes_without_culprit_and_peers_report_overdue_then_completion() {
    let _g = one_job_at_a_time();
    let out = Out::new("stall");
    let (o, _) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--ranks",
            "8",
            "--hosts",
            "2",
            "--steps",
            "4",
            "--fault",
            "stall:rank=5,step=2,ms=1200",
            "--timeout",
            "60",
            "--json",
        ],
        &[("COMMINSIGHT_OVERDUE_MS", "250")],
    );
    assert_ok(&o);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json summary");
    assert_eq!(summary["timed_out"], false);
    assert_eq!(summary["steps_completed_min"], 4);
    let truth = out.truth();
    assert_eq!(truth["culprit_ranks"], serde_json::json!([]));
    assert_eq!(
        truth["faults"][0],
        serde_json::json!({"kind": "stall", "rank": 5, "step": 2, "ms": 1200.0})
    );
    assert_eq!(truth["partial_steps"], serde_json::json!([]));
    let recs = records_by_rank(out.path());
    assert_eq!(recs.len(), 8);
    let mut waited = Vec::new();
    for (rank, rs) in &recs {
        assert_steps_tile_records(&truth, &recs, *rank);
        assert!(
            rs.iter().all(|r| r.flags & FLAG_INCOMPLETE == 0),
            "rank {rank}: every op finished"
        );
        // Per overdue op (coll_local_sn): the file positions and repeats of its reports.
        let mut reports: BTreeMap<u64, Vec<(usize, u32)>> = BTreeMap::new();
        for (i, r) in rs.iter().enumerate() {
            if let Body::Overdue(od) = &r.body {
                assert_eq!(od.threshold_ms, 250);
                assert!(od.age_ms >= 250, "rank {rank}: {od:?}");
                reports
                    .entry(od.coll_local_sn)
                    .or_default()
                    .push((i, od.repeat));
            }
        }
        if reports.is_empty() {
            continue;
        }
        for (sn, reps) in &reports {
            let repeats: Vec<u32> = reps.iter().map(|(_, rep)| *rep).collect();
            assert_eq!(
                repeats,
                (0..repeats.len() as u32).collect::<Vec<_>>(),
                "rank {rank} op {sn}: repeats 0, 1, ... in order"
            );
            let done = rs
                .iter()
                .position(
                    |r| matches!(&r.body, Body::Coll(o) | Body::P2p(o) if o.coll_local_sn == *sn),
                )
                .unwrap_or_else(|| panic!("rank {rank} op {sn}: overdue but never completed"));
            assert!(
                reps.iter().all(|(i, _)| *i < done),
                "rank {rank} op {sn}: the overdue reports come before the completion"
            );
            let (Body::Coll(op) | Body::P2p(op)) = &rs[done].body else {
                unreachable!()
            };
            assert!(
                op.end_ns.saturating_sub(op.enqueue_ns) >= 250_000_000,
                "rank {rank} op {sn}: lasted longer than the threshold: {op:?}"
            );
        }
        waited.push(*rank);
    }
    assert!(!waited.contains(&5), "the stalled rank waits on nobody");
    assert!(
        waited.len() >= 4,
        "peers of the stalled rank report overdue ops: {waited:?}"
    );
}

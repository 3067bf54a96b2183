//! The analysis on hand-built snapshots: DESIGN.md §5's pipeline example, failures, mismatches,
//! pending ranks, the phase-aware threshold, merging several hosts' views.

use super::analyze::{analyze, threshold_us, HangSettings};
use super::merge::merge;
use super::model::*;
use crate::stacks::{ProcState, ProcStatus};

const S: u64 = 1_000_000;
const NOW: u64 = 1_000 * S;

fn comm(hash: u64, role: &str, ranks: &[i64]) -> CommView {
    CommView {
        hash,
        name: format!("{role}:{hash}"),
        role: role.into(),
        nranks: ranks.len() as u32,
        members: ranks
            .iter()
            .enumerate()
            .map(|(i, r)| (i as i32, *r))
            .collect(),
    }
}

fn rank(r: i64, last_end: u64) -> RankView {
    RankView {
        rank: r,
        host: format!("h{}", r / 4),
        pid: 100 + r as u32,
        stream: format!("j/h/{r}"),
        last_end_us: last_end,
        last_heard_us: NOW,
        ..RankView::default()
    }
}

fn coll(comm: u64, func: &str, seq: u64, at: u64) -> OpenOp {
    OpenOp {
        comm,
        func: func.into(),
        seq,
        peer: -1,
        count: 1024,
        bytes: 4096,
        enqueue_us: at,
        seen_us: NOW,
        ..OpenOp::default()
    }
}

fn p2p(comm: u64, func: &str, peer: i32, ord: u64, at: u64) -> OpenOp {
    OpenOp {
        peer,
        p2p_ord: ord,
        ..coll(comm, func, 0, at)
    }
}

fn done(comm: u64, func: &str, last_seq: u64) -> CollProgress {
    CollProgress {
        comm,
        func: func.into(),
        last_seq,
        last_count: 1024,
    }
}

fn snap(comms: Vec<CommView>, ranks: Vec<RankView>) -> JobSnapshot {
    JobSnapshot {
        v: SNAPSHOT_VERSION,
        job: "j".into(),
        hosts: vec!["h0".into(), "h1".into()],
        taken_us: NOW,
        world: ranks.len() as u32,
        comms,
        ranks,
        gaps: GapStats {
            max_op_us: 1000,
            max_idle_us: 2000,
            plugin_threshold_ms: 30_000,
        },
    }
}

/// DESIGN.md §5: pp = 4 (ranks 0..3), dp = 2 (ranks 4..7 are the second pipeline); rank 2
/// stops in compute. 3 waits in recv from 2, 1 in send to 2, 0 in send to 1; DP peers wait in
/// the gradient all-reduce where ranks 0, 1, 3 are absent.
fn pipeline() -> JobSnapshot {
    const PP0: u64 = 0x10;
    let dp = |i: i64| 0x20 + i as u64;
    let t0 = NOW - 60 * S;
    let mut comms = vec![
        comm(PP0, "pp", &[0, 1, 2, 3]),
        comm(0x11, "pp", &[4, 5, 6, 7]),
    ];
    for i in 0..4 {
        comms.push(comm(dp(i), "dp", &[i, i + 4]));
    }
    let mut r = vec![rank(0, t0), rank(1, t0), rank(2, t0 - 2 * S), rank(3, t0)];
    r[0].open = vec![p2p(PP0, "Send", 1, 7, t0 + 30)];
    r[1].open = vec![p2p(PP0, "Send", 2, 7, t0 + 10)];
    r[3].open = vec![p2p(PP0, "Recv", 2, 7, t0 + 5)];
    for i in 0..4 {
        let mut v = rank(i + 4, t0);
        v.open = vec![coll(dp(i), "AllReduce", 5, t0 + 100)];
        r.push(v);
    }
    snap(comms, r)
}

#[test]
fn the_pipeline_example_names_the_stuck_stage_and_the_first_p2p() {
    let a = analyze(&pipeline(), &HangSettings::default(), &[]);
    assert!(a.pending.is_empty());
    assert_eq!(a.verdicts.len(), 1, "{:#?}", a.verdicts);
    let v = &a.verdicts[0];
    assert_eq!(v.kind, VerdictKind::Hang);
    assert_eq!(v.source_ranks, vec![2]);
    // Posted first: 3's recv from 2 (t0 + 5), before 1's send to 2 (t0 + 10).
    assert_eq!((v.comm.hash, v.func.as_str()), (0x10, "Recv"));
    assert_eq!(v.entered_ranks, vec![3]);
    assert_eq!(v.absent_ranks, vec![2]);
    assert_eq!(v.category.as_deref(), Some("missing"));
    // Every waiter leads to 2: 0 -> 1 -> 2, 3 -> 2, the DP peers -> {0, 1, 3} (and 6 -> 2).
    let waits = |r: i64| {
        v.chain
            .iter()
            .find(|l| l.rank == r)
            .map(|l| l.waits_for.clone())
    };
    assert_eq!(waits(0), Some(vec![1]));
    assert_eq!(waits(1), Some(vec![2]));
    assert_eq!(waits(3), Some(vec![2]));
    assert_eq!(waits(6), Some(vec![2]));
    assert_eq!(v.since_us, NOW - 60 * S + 5);
    assert_eq!(v.evidence["sources"][0]["state"], "compute");
}

#[test]
fn an_xid_on_the_source_ranks_gpu_is_said_first() {
    use crate::host::gpu::context::GpuView;
    let mut s = pipeline();
    let gpu = |xids: Vec<(u64, u64)>| GpuView {
        pci: "0000:3a:00.0".into(),
        ordinal: 2,
        index: 2,
        xids,
        ..GpuView::default()
    };
    // A waiter's XID is not the source's.
    s.ranks[5].gpus = vec![gpu(vec![(NOW - 5 * S, 13)])];
    let a = analyze(&s, &HangSettings::default(), &[]);
    assert_eq!(a.verdicts[0].gpu_fault, None);
    s.ranks[2].gpus = vec![gpu(vec![(NOW - 70 * S, 31), (NOW - 61 * S, 79)])];
    let a = analyze(&s, &HangSettings::default(), &[]);
    let v = &a.verdicts[0];
    assert_eq!(v.source_ranks, vec![2]);
    assert_eq!(
        v.gpu_fault.as_deref(),
        Some("rank 2: GPU 0000:3a:00.0 (CUDA device 2) raised XID 79 61.0 s before the snapshot")
    );
    assert!(
        v.one_line()
            .starts_with("GPU fault: rank 2: GPU 0000:3a:00.0"),
        "{}",
        v.one_line()
    );
    assert_eq!(v.evidence["sources"][0]["gpus"][0]["xids"][1][1], 79);
}

#[test]
fn a_dead_source_makes_a_failure() {
    let mut s = pipeline();
    s.ranks[2].proc_state = Some(ProcState {
        status: ProcStatus::Gone,
        detail: String::new(),
    });
    let a = analyze(&s, &HangSettings::default(), &[]);
    assert_eq!(a.verdicts[0].kind, VerdictKind::Failure);
    assert_eq!(a.verdicts[0].source_ranks, vec![2]);
}

#[test]
fn nothing_before_the_threshold_and_a_recently_active_rank_is_pending() {
    let mut s = pipeline();
    // The oldest wait is 60 s: a 90 s minimum holds it back.
    let held = HangSettings {
        min_wait_us: 90 * S,
        ..HangSettings::default()
    };
    let a = analyze(&s, &held, &[]);
    assert!(a.verdicts.is_empty());
    assert_eq!(a.threshold_us, 90 * S);
    // Rank 2 finished an op 1 s ago: it may be in a normal compute phase.
    s.ranks[2].last_end_us = NOW - S;
    let a = analyze(&s, &HangSettings::default(), &[]);
    assert!(a.verdicts.is_empty());
    assert_eq!(a.pending, vec![2]);
}

#[test]
fn the_threshold_learns_the_jobs_long_pauses() {
    let mut s = pipeline();
    let st = HangSettings::default();
    assert_eq!(threshold_us(&s, &st), 30 * S, "the plugin's threshold");
    // A 45 s checkpoint pause was seen and the job went on: waits up to 90 s are normal now.
    s.gaps.max_idle_us = 45 * S;
    assert_eq!(threshold_us(&s, &st), 90 * S);
    assert!(analyze(&s, &st, &[]).verdicts.is_empty());
    let no_learning = HangSettings {
        gap_factor: 0.0,
        ..st
    };
    assert_eq!(analyze(&s, &no_learning, &[]).verdicts.len(), 1);
}

#[test]
fn a_different_count_at_the_same_sequence_is_a_mismatch() {
    let t = NOW - 60 * S;
    let g = comm(0x30, "global", &[0, 1, 2, 3]);
    let ranks = (0..4)
        .map(|r| {
            let mut v = rank(r, t);
            v.colls = vec![done(0x30, "AllReduce", 4)];
            let mut op = coll(0x30, "AllReduce", 5, t + 10);
            if r == 2 {
                op.count *= 2;
                op.bytes *= 2;
            }
            v.open = vec![op];
            v
        })
        .collect();
    let a = analyze(&snap(vec![g], ranks), &HangSettings::default(), &[]);
    assert_eq!(a.verdicts.len(), 1, "{:#?}", a.verdicts);
    let v = &a.verdicts[0];
    assert_eq!(v.kind, VerdictKind::Mismatch);
    assert_eq!(v.source_ranks, vec![2]);
    assert_eq!((v.func.as_str(), v.seq), ("AllReduce", 5));
    assert_eq!(
        v.category.as_deref(),
        Some("size"),
        "Flight Recorder's term"
    );
}

#[test]
fn a_different_data_type_at_the_same_sequence_is_a_type_mismatch() {
    let t = NOW - 60 * S;
    let g = comm(0x31, "ep", &[0, 1, 2, 3]);
    let ranks = (0..4)
        .map(|r| {
            let mut v = rank(r, t);
            v.colls = vec![done(0x31, "AlltoAll", 4)];
            let mut op = coll(0x31, "AlltoAll", 5, t + 10);
            op.dtype = if r == 3 {
                "ncclFloat32"
            } else {
                "ncclBfloat16"
            }
            .into();
            v.open = vec![op];
            v
        })
        .collect();
    let a = analyze(&snap(vec![g], ranks), &HangSettings::default(), &[]);
    assert_eq!(a.verdicts.len(), 1, "{:#?}", a.verdicts);
    let v = &a.verdicts[0];
    assert_eq!(v.kind, VerdictKind::Mismatch);
    assert_eq!(v.source_ranks, vec![3]);
    assert_eq!(v.category.as_deref(), Some("type"));
    assert_eq!(v.evidence["dtypes"]["ncclFloat32"], serde_json::json!([3]));
}

#[test]
fn two_ranks_with_different_counts_are_told_apart_by_the_comms_history() {
    let t = NOW - 60 * S;
    let tp = comm(0x40, "tp", &[0, 1]);
    let ranks = (0..2)
        .map(|r| {
            let mut v = rank(r, t);
            v.colls = vec![done(0x40, "AllReduce", 4)];
            let mut op = coll(0x40, "AllReduce", 5, t + 10);
            if r == 0 {
                op.count = 4096;
            }
            v.open = vec![op];
            v
        })
        .collect();
    let a = analyze(&snap(vec![tp], ranks), &HangSettings::default(), &[]);
    assert_eq!(a.verdicts[0].source_ranks, vec![0]);
}

#[test]
fn members_blocked_in_different_functions_are_a_mismatch() {
    let t = NOW - 60 * S;
    let g = comm(0x50, "dp", &[0, 1, 2]);
    let ranks = (0..3)
        .map(|r| {
            let mut v = rank(r, t);
            v.open = vec![if r == 1 {
                coll(0x50, "AllGather", 0, t)
            } else {
                coll(0x50, "AllReduce", 3, t)
            }];
            v
        })
        .collect();
    let a = analyze(&snap(vec![g], ranks), &HangSettings::default(), &[]);
    let m: Vec<&Verdict> = a
        .verdicts
        .iter()
        .filter(|v| v.kind == VerdictKind::Mismatch)
        .collect();
    assert_eq!(m.len(), 1, "{:#?}", a.verdicts);
    assert_eq!(m[0].source_ranks, vec![1]);
    assert_eq!(m[0].category.as_deref(), Some("collective"));
    assert!(a.verdicts.iter().all(|v| v.kind == VerdictKind::Mismatch));
}

#[test]
fn a_rank_without_data_is_a_source_after_the_ranks_that_are_known() {
    let mut s = pipeline();
    // Host of rank 2 never reported.
    s.ranks.retain(|r| r.rank != 2);
    let a = analyze(&s, &HangSettings::default(), &["h0".into()]);
    let v = &a.verdicts[0];
    assert_eq!(v.source_ranks, vec![2]);
    assert_eq!(v.evidence["sources"][0]["state"], "no_data");
    assert_eq!(v.evidence["missing_hosts"][0], "h0");
}

#[test]
fn healthy_snapshots_give_nothing() {
    let mut s = pipeline();
    for r in &mut s.ranks {
        r.open.clear();
    }
    let a = analyze(&s, &HangSettings::default(), &[]);
    assert!(a.verdicts.is_empty() && a.pending.is_empty());
}

#[test]
fn merging_hosts_equals_one_view_and_keeps_stacks() {
    let full = pipeline();
    let (mut a, mut b) = (full.clone(), full.clone());
    a.ranks.retain(|r| r.rank < 4);
    a.hosts = vec!["h0".into()];
    b.ranks.retain(|r| r.rank >= 4);
    b.hosts = vec!["h1".into()];
    // Each host saw only the members of the comms that it holds.
    for c in &mut a.comms {
        c.members.retain(|(_, g)| *g < 4);
    }
    for c in &mut b.comms {
        c.members.retain(|(_, g)| *g >= 4);
    }
    a.ranks[2].stacks = Some(crate::stacks::ProcessStacks {
        pid: 102,
        mode: "locked".into(),
        ..Default::default()
    });
    let m = merge(&[a, b]);
    assert_eq!(m.hosts, full.hosts);
    assert_eq!(m.comms, full.comms);
    let v = &analyze(&m, &HangSettings::default(), &[]).verdicts[0];
    assert_eq!(v.source_ranks, vec![2]);
    assert_eq!(v.evidence["sources"][0]["stacks"]["pid"], 102);
    // Serde round trip of a snapshot (what the master and the archive hold).
    let text = serde_json::to_string(&m).unwrap();
    assert_eq!(serde_json::from_str::<JobSnapshot>(&text).unwrap(), m);
}

/// Flight Recorder's view (every op only enqueued): rank 0 waits in a send whose receive rank 1
/// has enqueued, but rank 1 is blocked in an older all-reduce that rank 2 never joined. Rank 0
/// waits for rank 1, which waits for rank 2: the source is 2, not rank 0.
#[test]
fn a_peer_that_only_enqueued_the_op_behind_an_older_one_is_waited_for() {
    let t = NOW - 60 * S;
    let pp = comm(0x60, "pp", &[0, 1]);
    let dp = comm(0x61, "dp", &[1, 2]);
    let mut r0 = rank(0, t);
    r0.open = vec![p2p(0x60, "Send", 1, 7, t + 20)];
    let mut r1 = rank(1, t);
    r1.open = vec![
        coll(0x61, "AllReduce", 3, t + 10),
        p2p(0x60, "Recv", 0, 7, t + 30),
    ];
    let mut r2 = rank(2, t);
    r2.colls = vec![done(0x61, "AllReduce", 2)];
    let a = analyze(
        &snap(vec![pp, dp], vec![r0, r1, r2]),
        &HangSettings::default(),
        &[],
    );
    assert_eq!(a.verdicts.len(), 1, "{:#?}", a.verdicts);
    assert_eq!(a.verdicts[0].source_ranks, vec![2]);
}

/// One all-reduce (ranks 0, 1, 2, 30-s threshold): host h0's view (now) has rank 0 waiting in
/// it for 40 s and rank 1 silent in compute for 41 s; host h1's view, taken `age` before, has
/// rank 2 in compute for 27 s (an ordinary phase) and not yet in the all-reduce.
fn two_hosts_one_older(age: u64) -> JobSnapshot {
    let dp = comm(0x30, "dp", &[0, 1, 2]);
    let mut r0 = rank(0, NOW - 41 * S);
    r0.open = vec![coll(0x30, "AllReduce", 5, NOW - 40 * S)];
    let r1 = rank(1, NOW - 41 * S);
    let mut h0 = snap(vec![dp.clone()], vec![r0, r1]);
    h0.hosts = vec!["h0".into()];
    let mut r2 = rank(2, NOW - age - 27 * S);
    (r2.host, r2.last_heard_us) = ("h1".into(), NOW - age);
    r2.colls = vec![done(0x30, "AllReduce", 4)];
    let mut h1 = snap(vec![dp], vec![r2]);
    (h1.hosts, h1.taken_us) = (vec!["h1".into()], NOW - age);
    merge(&[h0, h1])
}

#[test]
fn a_rank_computing_in_an_older_current_view_is_pending_not_a_source() {
    // h1's view is 4 s old (agents re-send every 2 s; a master that just restarted may still
    // hold the one from before): rank 2 had computed 27 s when it was seen, so it is pending.
    // Measured to the newest view it would have been silent 31 s and a second source.
    let a = analyze(&two_hosts_one_older(4 * S), &HangSettings::default(), &[]);
    assert!(a.verdicts.is_empty(), "{:#?}", a.verdicts);
    assert_eq!(a.pending, vec![2]);
    // A view older than CURRENT_VIEW_US is from a host that stopped reporting: no waiting for
    // it, the silence counts to now.
    let a = analyze(&two_hosts_one_older(6 * S), &HangSettings::default(), &[]);
    assert!(a.pending.is_empty());
    assert_eq!(a.verdicts[0].source_ranks, vec![1, 2]);
    // h1's next view: rank 2 entered the all-reduce; rank 1 alone is the source.
    let mut s = two_hosts_one_older(0);
    let r2 = s.ranks.iter_mut().find(|r| r.rank == 2).unwrap();
    r2.open = vec![coll(0x30, "AllReduce", 5, NOW - S)];
    let a = analyze(&s, &HangSettings::default(), &[]);
    assert_eq!(a.verdicts[0].source_ranks, vec![1]);
    assert_eq!(a.verdicts[0].absent_ranks, vec![1]);
}

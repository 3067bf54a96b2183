//! Boundary machine and reorder, on hand-written op streams.

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::fsm::{ClosedBy, StepFsm, StepSummary};
use super::session::RankSession;
use super::template::{OpMatch, SizeClass, Template};
use super::StepOp;

fn m(role: Role, func: Func, size: Option<SizeClass>) -> OpMatch {
    OpMatch {
        role: Some(role),
        func: Some(func),
        size,
    }
}

/// Megatron-like: a step ends with the DP all-reduce then the tiny global all-reduce (anchor).
fn megatron() -> Template {
    Template {
        name: "test-megatron".into(),
        version: 1,
        priority: 1,
        description: String::new(),
        requires: vec![],
        forbids: vec![],
        open: vec![
            vec![m(Role::Tp, Func::ALL_REDUCE, None)],
            vec![m(Role::Pp, Func::RECV, None)],
        ],
        anchor: vec![vec![m(
            Role::Global,
            Func::ALL_REDUCE,
            Some(SizeClass::Tiny),
        )]],
        close: vec![vec![
            m(Role::Dp, Func::ALL_REDUCE, None),
            m(Role::Global, Func::ALL_REDUCE, Some(SizeClass::Tiny)),
        ]],
        phases: vec![],
        file: "test.toml".into(),
        file_version: 1,
        line: 0,
    }
}

/// One step of a pipeline stage > 0: recv, tp x4, send, dp, global.
fn step_ops(step: u64, lsn: &mut u64, t: &mut u64) -> Vec<StepOp> {
    let mut v = Vec::new();
    let mut op = |role: Role, func: Func, bytes: u64, sn: u64| {
        v.push(StepOp {
            comm_hash: role as u64,
            role: Some(role),
            func,
            bytes,
            coll_sn: sn,
            coll_local_sn: *lsn,
            start_us: *t,
        });
        *lsn += 1;
        *t += 10;
    };
    op(Role::Pp, Func::RECV, 65_536, step);
    for i in 0..4 {
        op(Role::Tp, Func::ALL_REDUCE, 65_536, step * 4 + i);
    }
    op(Role::Pp, Func::SEND, 65_536, step);
    op(Role::Dp, Func::ALL_REDUCE, 1 << 20, step);
    op(Role::Global, Func::ALL_REDUCE, 8, step);
    v
}

fn stream(steps: u64) -> Vec<StepOp> {
    let (mut lsn, mut t) = (0, 1_000);
    (0..steps)
        .flat_map(|s| step_ops(s, &mut lsn, &mut t))
        .collect()
}

fn run(ops: &[StepOp]) -> (Vec<StepSummary>, StepFsm) {
    let mut fsm = StepFsm::new(&megatron(), 3);
    let mut out = Vec::new();
    for op in ops {
        fsm.push(op, op.start_us + 5, &mut out);
    }
    (out, fsm)
}

#[test]
fn complete_steps_end_at_their_close() {
    let (steps, fsm) = run(&stream(5));
    assert_eq!(steps.len(), 5);
    for (i, s) in steps.iter().enumerate() {
        let i = i as u64;
        assert_eq!(s.step, i);
        assert_eq!(s.rank, 3);
        assert_eq!(s.first.coll_local_sn, i * 8);
        assert_eq!(s.last.coll_local_sn, i * 8 + 7);
        assert_eq!(s.anchor.unwrap().coll_sn, i);
        assert_eq!(s.ops, 8);
        assert!(s.coverage_complete);
        assert_eq!(s.closed_by, ClosedBy::Close);
        assert_eq!(s.duration_us, 7 * 10 + 5);
    }
    assert_eq!(fsm.pending_ops(), 0);
}

#[test]
fn a_lost_close_is_cut_at_the_next_open_after_the_anchor() {
    // Step 1 loses its DP all-reduce: Close cannot match, the Anchor still proves the tail.
    let mut ops = stream(3);
    ops.remove(8 + 6);
    let (steps, _) = run(&ops);
    assert_eq!(steps.len(), 3, "{steps:#?}");
    assert_eq!(steps[1].closed_by, ClosedBy::Open);
    assert_eq!(
        steps[1].last.coll_local_sn, 15,
        "ends at the global all-reduce"
    );
    assert!(!steps[1].coverage_complete, "an op was lost");
    assert_eq!(steps[2].first.coll_local_sn, 16);
    assert!(
        !steps[2].coverage_complete,
        "its start was inferred from the Open, not proven by a Close"
    );
}

#[test]
fn without_dp_the_open_after_the_anchor_is_the_normal_boundary() {
    // Megatron with dp = 1 has no DP sync: the Close never occurs on any step, so the Open
    // after the Anchor is how every step ends, not a sign of a lost Close (issue 17: 4-rank
    // tp 2 x pp 2 jobs had no complete step after the first).
    let ops: Vec<StepOp> = stream(4)
        .into_iter()
        .filter(|o| o.role != Some(Role::Dp))
        .enumerate()
        .map(|(i, mut o)| {
            o.coll_local_sn = i as u64;
            o
        })
        .collect();
    let (steps, _) = run(&ops);
    assert_eq!(steps.len(), 3, "{steps:#?}");
    for s in &steps {
        assert_eq!(s.closed_by, ClosedBy::Open);
        assert!(s.coverage_complete, "{s:#?}");
    }
}

#[test]
fn a_lost_anchor_merges_two_steps_visibly() {
    // Step 1 loses its global all-reduce: steps 1 and 2 merge, marked incomplete, never silent.
    let mut ops = stream(4);
    ops.remove(8 + 7);
    let (steps, _) = run(&ops);
    assert_eq!(steps.len(), 3);
    let merged = &steps[1];
    assert_eq!(
        (merged.first.coll_local_sn, merged.last.coll_local_sn),
        (8, 23)
    );
    assert!(!merged.coverage_complete);
    assert_eq!(
        merged.anchor.unwrap().coll_sn,
        2,
        "the anchor tells which step it is"
    );
    assert!(steps[0].coverage_complete && steps[2].coverage_complete);
}

#[test]
fn an_open_like_run_inside_a_step_does_not_split_it() {
    // Plenty of TP all-reduces (Open-like) before any anchor: one step.
    let (steps, _) = run(&stream(2));
    assert!(steps.iter().all(|s| s.ops == 8));
}

#[test]
fn the_open_step_at_the_end_is_kept_not_emitted() {
    let ops = stream(3);
    let (steps, fsm) = run(&ops[..20]);
    assert_eq!(steps.len(), 2);
    assert_eq!(fsm.pending_ops(), 4);
}

#[test]
fn a_stream_starting_mid_step_is_incomplete() {
    let ops = stream(3);
    let (steps, _) = run(&ops[3..]);
    assert!(!steps[0].coverage_complete);
    assert!(steps[1].coverage_complete);
}

#[test]
fn reorder_gives_the_same_steps_for_shuffled_arrival_within_the_window() {
    let ops = stream(20);
    let direct = run(&ops).0;
    // Shuffle deterministically in blocks of 7 (well inside a 1000 µs window).
    let mut shuffled = ops.clone();
    for chunk in shuffled.chunks_mut(7) {
        chunk.reverse();
    }
    let mut session = RankSession::new(StepFsm::new(&megatron(), 3), 1_000);
    let mut out = Vec::new();
    let mut max_held = 0;
    for op in shuffled {
        let end = op.start_us + 5;
        session.push(op, end, &mut out);
        max_held = max_held.max(session.held());
    }
    session.drain(&mut out);
    assert_eq!(out, direct);
    assert_eq!(session.late, 0);
    assert!(
        max_held <= 1_000 / 10 + 8,
        "held {max_held}: bounded by the window"
    );
}

#[test]
fn calibration_realigns_a_rank_that_merged_two_steps() {
    use super::calibrate::calibrate;
    // Rank 3 loses the anchor of step 1 (merge), rank 4 loses nothing.
    let mut lost = stream(5);
    lost.remove(8 + 7);
    let (mut steps, _) = run(&lost);
    let mut fsm = StepFsm::new(&megatron(), 4);
    for op in stream(5) {
        fsm.push(&op, op.start_us + 5, &mut steps);
    }
    let cal = calibrate(&steps);
    assert_eq!(cal.ranks[&4], vec![0, 1, 2, 3, 4]);
    // Raw steps of rank 3: 0, merged(1+2), 3, 4 -> numbered 0, 2, 3, 4.
    assert_eq!(cal.ranks[&3], vec![0, 2, 3, 4]);
    assert_eq!(cal.step(3, 1), 2);
    assert!(cal.is_merged(3, 1));
    assert!(!cal.is_merged(3, 2) && !cal.is_merged(4, 1));
    assert_eq!(cal.moved, 3);
    // Losing the very first anchor: the first step (from operation 0) is numbered 1 and merged.
    let mut first_lost = stream(3);
    first_lost.remove(7);
    let (mut steps, _) = run(&first_lost);
    let mut fsm = StepFsm::new(&megatron(), 4);
    for op in stream(3) {
        fsm.push(&op, op.start_us + 5, &mut steps);
    }
    let cal = calibrate(&steps);
    assert_eq!(cal.ranks[&3], vec![1, 2]);
    assert!(cal.is_merged(3, 0));
}

#[test]
fn a_secondary_anchor_proves_the_tail_when_the_primary_is_lost() {
    // With the DP all-reduce as a secondary anchor, a lost global all-reduce no longer merges.
    let mut t = megatron();
    t.anchor.push(vec![m(Role::Dp, Func::ALL_REDUCE, None)]);
    let mut ops = stream(3);
    ops.remove(8 + 7);
    let mut fsm = StepFsm::new(&t, 0);
    let mut steps = Vec::new();
    for op in &ops {
        fsm.push(op, op.start_us + 5, &mut steps);
    }
    assert_eq!(steps.len(), 3, "{steps:#?}");
    assert_eq!(
        (steps[1].first.coll_local_sn, steps[1].last.coll_local_sn),
        (8, 14)
    );
    assert_eq!(steps[1].anchor_alt, Some(1));
    assert!(!steps[1].coverage_complete, "the primary anchor is missing");
    // The step after it starts where the Open was inferred: not proven complete.
    assert!(steps[0].coverage_complete && !steps[2].coverage_complete);
    assert_eq!(
        steps[0].anchor_alt,
        Some(0),
        "the primary anchor is preferred"
    );
}

#[test]
fn a_merged_step_is_split_when_the_next_anchor_skips_one() {
    // Steps 0..2 teach the stride (1) and the usual length (8); step 3 loses its anchor (no
    // secondary anchor in this template): step 4's anchor arrives with coll_sn 4 after 2, and
    // the merged step is cut at the Open nearest to 8 operations.
    let mut ops = stream(6);
    ops.remove(3 * 8 + 7);
    let (steps, _) = run(&ops);
    let bounds: Vec<(u64, u64)> = steps
        .iter()
        .map(|s| (s.first.coll_local_sn, s.last.coll_local_sn))
        .collect();
    assert_eq!(
        bounds,
        vec![(0, 7), (8, 15), (16, 23), (24, 30), (32, 39), (40, 47)],
        "{steps:#?}"
    );
    assert_eq!(steps[3].closed_by, ClosedBy::Split);
    assert!(!steps[3].coverage_complete && !steps[4].coverage_complete);
    assert!(steps[5].coverage_complete);
}

#[test]
fn the_circuit_breaker_frees_a_step_that_never_ends() {
    // A template whose Close and Anchor never occur: the open step grows until the breaker.
    let mut t = megatron();
    t.anchor = vec![vec![m(Role::Ep, Func::ALL_TO_ALL, None)]];
    t.close = t.anchor.clone();
    let mut fsm = StepFsm::new(&t, 0).with_max_open(100);
    let mut out = Vec::new();
    for op in stream(50) {
        fsm.push(&op, op.start_us + 5, &mut out);
    }
    assert!(out.is_empty());
    assert!(fsm.tripped());
    assert_eq!(fsm.pending_ops(), 0, "memory freed");
}

/// `ops` with the operations at `lost` (indices) never delivered, as the test bed's `loss:`
/// fault does: the plugin never saw them, so they take no `coll_local_sn` (no gap shows). The
/// rest is re-timed evenly, so that no idle gap tells where they were either.
fn lose(ops: &[StepOp], lost: &[usize]) -> Vec<StepOp> {
    let mut v: Vec<StepOp> = ops
        .iter()
        .enumerate()
        .filter(|(i, _)| !lost.contains(i))
        .map(|(_, o)| o.clone())
        .collect();
    for (i, o) in v.iter_mut().enumerate() {
        o.coll_local_sn = i as u64;
        o.start_us = 1_000 + 10 * i as u64;
    }
    v
}

/// (first, last) `coll_sn` of the TP all-reduces of each step: which ops each step holds,
/// independent of the renumbering.
fn tp_blocks(steps: &[StepSummary], ops: &[StepOp]) -> Vec<(u64, u64)> {
    steps
        .iter()
        .map(|s| {
            let tp = ops[s.first.coll_local_sn as usize..=s.last.coll_local_sn as usize]
                .iter()
                .filter(|o| o.role == Some(Role::Tp))
                .map(|o| o.coll_sn);
            (tp.clone().min().unwrap_or(0), tp.max().unwrap_or(0))
        })
        .collect()
}

#[test]
fn a_merged_step_is_cut_where_the_sequence_numbers_say() {
    // Step 3 loses its DP all-reduce and its anchor (its whole Close): it is 6 operations
    // instead of 8, and step 4's first TP all-reduce (an Open, 7 operations in) is nearer the
    // usual length (8 less the lost anchor) than step 4's Recv. The sequence numbers (4 TP
    // all-reduces and 1 Recv per step, learned from the complete steps) put the cut before the
    // Recv.
    let ops = lose(&stream(7), &[3 * 8 + 6, 3 * 8 + 7]);
    let (steps, _) = run(&ops);
    assert_eq!(steps.len(), 7, "{steps:#?}");
    assert_eq!(
        tp_blocks(&steps, &ops),
        (0..7).map(|s| (s * 4, s * 4 + 3)).collect::<Vec<_>>(),
        "{steps:#?}"
    );
    assert_eq!(
        (steps[3].first.coll_local_sn, steps[3].last.coll_local_sn),
        (24, 29)
    );
    assert_eq!(steps[4].first.coll_local_sn, 30, "starts with its Recv");
    assert_eq!(steps[3].closed_by, ClosedBy::Split);
    assert!(!steps[3].coverage_complete && !steps[4].coverage_complete);
    assert!(steps[5].coverage_complete && steps[6].coverage_complete);
}

#[test]
fn a_merge_hidden_by_a_secondary_anchor_is_split_by_the_sequence_numbers() {
    // With the DP all-reduce as a secondary anchor: step 3 loses both anchors (DP and global
    // all-reduce) and step 4 its global one. Step 4's DP all-reduce proves the tail of what looks
    // like one step, 3 and 4 together; the sequence numbers split it, and step 5's anchor is not
    // taken for a second merge (its advance is accounted for by the two steps emitted).
    let mut t = megatron();
    t.anchor.push(vec![m(Role::Dp, Func::ALL_REDUCE, None)]);
    let ops = lose(&stream(8), &[3 * 8 + 6, 3 * 8 + 7, 4 * 8 + 7]);
    let mut fsm = StepFsm::new(&t, 0);
    let mut steps = Vec::new();
    for op in &ops {
        fsm.push(op, op.start_us + 5, &mut steps);
    }
    assert_eq!(steps.len(), 8, "{steps:#?}");
    assert_eq!(
        tp_blocks(&steps, &ops),
        (0..8).map(|s| (s * 4, s * 4 + 3)).collect::<Vec<_>>(),
        "{steps:#?}"
    );
    assert_eq!(steps[3].closed_by, ClosedBy::Split);
    assert_eq!(steps[4].closed_by, ClosedBy::Open);
    assert_eq!(steps[4].anchor_alt, Some(1));
    assert!(steps[3..=5].iter().all(|s| !s.coverage_complete));
    assert!(steps[6].coverage_complete && steps[7].coverage_complete);
}

#[test]
fn without_lost_operations_the_sequence_numbers_change_nothing() {
    // The periods are learned from every complete step; a lossless stream still gives exactly
    // its steps (no cut anywhere else), also after a checkpoint round trip mid-stream.
    let ops = stream(12);
    let (direct, _) = run(&ops);
    let mut fsm = StepFsm::new(&megatron(), 3);
    let mut out = Vec::new();
    for op in &ops[..50] {
        fsm.push(op, op.start_us + 5, &mut out);
    }
    let json = serde_json::to_string(&fsm).unwrap();
    let mut fsm: StepFsm = serde_json::from_str(&json).unwrap();
    fsm.rebind(&megatron());
    for op in &ops[50..] {
        fsm.push(op, op.start_us + 5, &mut out);
    }
    assert_eq!(out, direct);
    assert!(out.iter().all(|s| s.coverage_complete && s.ops == 8));
}

/// A phase rule over `begin` alternatives.
fn rule(
    phase: super::phase::Phase,
    begin: Vec<Vec<OpMatch>>,
    at: usize,
    microbatch: bool,
) -> super::phase::PhaseRule {
    super::phase::PhaseRule {
        phase,
        begin,
        at,
        microbatch,
    }
}

#[test]
fn phases_run_from_each_phase_start_to_the_next_and_count_microbatches() {
    use super::phase::{label, spans, Phase, PhaseTimes};
    // FSDP, tp = 1, 2 microbatches of 4 layers: forward 4 x [dp AG], backward 4 x [dp AG, dp RS],
    // then the optimizer (compute) and the global all-reduce. Op i starts at 10 i, lasts 5 µs.
    let ag = || m(Role::Dp, Func::ALL_GATHER, None);
    let rs = || m(Role::Dp, Func::REDUCE_SCATTER, None);
    let global = || m(Role::Global, Func::ALL_REDUCE, None);
    let rules = vec![
        rule(Phase::Forward, vec![vec![ag()]], 0, true),
        rule(Phase::Backward, vec![vec![ag(), rs()]], 0, false),
        rule(Phase::Optimizer, vec![vec![rs(), global()]], 1, false),
    ];
    let mut kinds = Vec::new();
    for _ in 0..2 {
        kinds.extend([(Role::Dp, Func::ALL_GATHER); 4]);
        for _ in 0..4 {
            kinds.extend([
                (Role::Dp, Func::ALL_GATHER),
                (Role::Dp, Func::REDUCE_SCATTER),
            ]);
        }
    }
    kinds.push((Role::Global, Func::ALL_REDUCE));
    let ops: Vec<(StepOp, u64)> = kinds
        .iter()
        .enumerate()
        .map(|(i, &(role, func))| {
            let t = 10 * i as u64;
            let op = StepOp {
                comm_hash: role as u64,
                role: Some(role),
                func,
                bytes: 8,
                coll_sn: 0,
                coll_local_sn: i as u64,
                start_us: t,
            };
            (op, t + 5)
        })
        .collect();
    let end = 10 * 24 + 5;
    // Forward from op 0 and op 12 (starts: an all-gather starts its layer), backward from op 4
    // and op 16 (the [AG, RS] match reaches back over the forward its AG alone suggested), the
    // optimizer from the end of the last reduce-scatter (at = 1: the idle time before the
    // all-reduce is its compute).
    let sp: Vec<(Phase, u64, u64)> = spans(&rules, &ops, end)
        .iter()
        .map(|s| (s.phase, s.from_us, s.to_us))
        .collect();
    assert_eq!(
        sp,
        vec![
            (Phase::Forward, 0, 40),
            (Phase::Backward, 40, 120),
            (Phase::Forward, 120, 160),
            (Phase::Backward, 160, 235),
            (Phase::Optimizer, 235, 245),
        ]
    );
    let (times, micro) = label(&rules, &ops, end);
    assert_eq!(
        times,
        Some(PhaseTimes {
            forward_us: 80,
            backward_us: 155,
            grad_sync_us: 0,
            optimizer_us: 10,
        })
    );
    assert_eq!(micro, Some(2), "two entries into forward");
    // Without a microbatch rule no count; without rules nothing at all.
    assert_eq!(label(&rules[1..], &ops, end).1, None);
    assert_eq!(label(&[], &ops, end), (None, None));
    // Time before the first phase is in no phase.
    let later = label(&rules[1..], &ops, end).0.unwrap();
    assert_eq!((later.forward_us, later.backward_us), (0, 80 + 75 + 40));
}

#[test]
fn the_step_summary_carries_its_phase_times() {
    use super::phase::{Phase, PhaseTimes};
    let mut t = megatron();
    t.phases = vec![
        rule(
            Phase::GradSync,
            vec![vec![m(Role::Dp, Func::ALL_REDUCE, None)]],
            0,
            false,
        ),
        rule(
            Phase::Optimizer,
            vec![vec![m(Role::Global, Func::ALL_REDUCE, None)]],
            0,
            false,
        ),
    ];
    let mut fsm = StepFsm::new(&t, 3);
    let mut steps = Vec::new();
    for op in stream(3) {
        fsm.push(&op, op.start_us + 5, &mut steps);
    }
    // Step ops 10 µs apart, 5 µs long: dp AR at +60, global AR at +70, end +75.
    for s in &steps {
        assert_eq!(
            s.phases,
            Some(PhaseTimes {
                grad_sync_us: 10,
                optimizer_us: 5,
                ..PhaseTimes::default()
            })
        );
        assert_eq!(s.microbatches, None);
        assert!(s.phases.unwrap().get(Phase::GradSync) <= s.duration_us);
    }
    // A template without phase rules: none, and the JSON has no such keys (older readers).
    let (plain, _) = run(&stream(2));
    assert_eq!(plain[0].phases, None);
    let json = serde_json::to_string(&plain[0]).unwrap();
    assert!(
        !json.contains("phases") && !json.contains("microbatches"),
        "{json}"
    );
    let back: StepSummary = serde_json::from_str(&json).unwrap();
    assert_eq!(back, plain[0]);
    let json = serde_json::to_string(&steps[0]).unwrap();
    assert!(
        json.contains(
            r#""phases":{"forward_us":0,"backward_us":0,"grad_sync_us":10,"optimizer_us":5}"#
        ),
        "{json}"
    );
}

#[test]
fn the_readme_phase_example_holds() {
    use super::phase::{label, Phase, PhaseTimes};
    // templates/README.md, "Phases": FSDP, tp = 1, 2 microbatches of 2 layers.
    let ag = || m(Role::Dp, Func::ALL_GATHER, None);
    let rs = || m(Role::Dp, Func::REDUCE_SCATTER, None);
    let rules = vec![
        rule(Phase::Forward, vec![vec![ag()]], 0, true),
        rule(Phase::Backward, vec![vec![ag(), rs()]], 0, false),
        rule(
            Phase::Optimizer,
            vec![vec![rs(), m(Role::Global, Func::ALL_REDUCE, None)]],
            1,
            false,
        ),
    ];
    let (a, r, g) = (Func::ALL_GATHER, Func::REDUCE_SCATTER, Func::ALL_REDUCE);
    let kinds = [a, a, a, r, a, r, a, a, a, r, a, r, g];
    let ops: Vec<(StepOp, u64)> = kinds
        .iter()
        .enumerate()
        .map(|(i, &func)| {
            let t = if i == 12 { 130 } else { 10 * i as u64 };
            let role = if i == 12 { Role::Global } else { Role::Dp };
            let op = StepOp {
                comm_hash: role as u64,
                role: Some(role),
                func,
                bytes: 8,
                coll_sn: 0,
                coll_local_sn: i as u64,
                start_us: t,
            };
            (op, t + 5)
        })
        .collect();
    assert_eq!(
        label(&rules, &ops, 135),
        (
            Some(PhaseTimes {
                forward_us: 40,
                backward_us: 75,
                grad_sync_us: 0,
                optimizer_us: 20,
            }),
            Some(2)
        )
    );
}

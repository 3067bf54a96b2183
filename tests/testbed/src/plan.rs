//! Per-rank, per-step operation lists, with faults applied. `[workload] kind` picks the step:
//! * `megatron`: 1F1B pipeline schedule, TP all-reduces, CP all-gather / reduce-scatter, MoE EP
//!   all-to-all, DP gradient sync, a small global all-reduce as the step anchor, compute in between;
//! * `fsdp`: per microbatch, per layer DP all-gather (forward), DP all-gather + DP reduce-scatter
//!   (backward, reverse), then the optimizer and a small global all-reduce (loss);
//! * `ddp`: forward, backward interleaved with `buckets` DP all-reduces (last microbatch only),
//!   the optimizer and a small global all-reduce (loss);
//! * `decode`: per token batch PP recv, per layer two TP all-reduces, PP send, then a TP
//!   all-gather of the sampled tokens.
//!
//! The exact sequences are in `tests/scenarios/README.md`.
//!
//! The plans are what the Python rank driver executes (`DIR/run/plan-<rank>.json`) and what the
//! synthetic mode simulates.

use serde::{Deserialize, Serialize};

use crate::fault::Fault;
use crate::layout::{Layout, Role};
use crate::scenario::{check_workload, DpSync, Scenario, WorkloadKind};

/// Collective functions the plans use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollFunc {
    /// `count` = elements of the buffer.
    AllReduce,
    /// `count` = elements each rank contributes.
    AllGather,
    /// `count` = elements each rank receives.
    ReduceScatter,
    /// `count` = elements sent to each peer.
    AllToAll,
}

/// Compute phases (labels for logs and stacks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
    Expert,
    Optimizer,
    /// Extra compute injected by a `slow` fault.
    Slow,
    /// A finite stall injected by a `stall` fault (checkpoint, evaluation pass).
    Stall,
}

/// One half of a point-to-point exchange; `peer` is a global rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2pPart {
    pub send: bool,
    pub peer: usize,
    pub count: u64,
}

/// One operation of a rank's step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Host compute, `us` microseconds (native `usleep`).
    Compute { us: u64, phase: Phase },
    /// A collective on the rank's communicator of `comm`.
    Coll {
        comm: Role,
        func: CollFunc,
        count: u64,
        /// Injected mismatch: this rank's op differs from its peers' (not verified).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        mismatch: bool,
    },
    /// Sends/receives on the communicator of `comm`, grouped (`ncclGroupStart/End`) when more than one.
    P2p { comm: Role, parts: Vec<P2pPart> },
    /// Block forever in native code.
    Hang,
    /// Spin forever in a pure-Python function.
    Pyhang,
    /// SIGKILL itself.
    Kill,
}

/// Everything one rank does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankPlan {
    pub rank: usize,
    /// `steps[s]` = the operations of step `s` (0-based).
    pub steps: Vec<Vec<Op>>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("{0}")]
    Workload(String),
    #[error("fault `{fault}` names rank {rank}, but the run has only {world} ranks")]
    RankOutOfRange {
        fault: String,
        rank: usize,
        world: usize,
    },
    #[error("fault `{fault}` names step {step}, but the run has only {steps} steps (0..{steps})")]
    StepOutOfRange {
        fault: String,
        step: u32,
        steps: u32,
    },
}

/// Elements (float32) of a message of `bytes`, at least 1.
pub fn elems(bytes: u64) -> u64 {
    (bytes / 4).max(1)
}

fn us(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

struct Builder<'a> {
    s: &'a Scenario,
    l: &'a Layout,
    rank: usize,
    ops: Vec<Op>,
}

impl Builder<'_> {
    fn compute(&mut self, ms: f64, phase: Phase) {
        let us = us(ms);
        if us > 0 {
            self.ops.push(Op::Compute { us, phase });
        }
    }

    fn coll(&mut self, comm: Role, func: CollFunc, count: u64) {
        if self.l.size(comm) > 1 || comm == Role::Global {
            self.ops.push(Op::Coll {
                comm,
                func,
                count,
                mismatch: false,
            });
        }
    }

    fn moe(&self) -> bool {
        self.l.ep > 1 && self.s.workload.moe_layers > 0
    }

    /// One layer's forward (`back` = false) or backward pass for one microbatch.
    fn layer(&mut self, layer: u32, back: bool) {
        let w = &self.s.workload;
        let m = &self.s.messages;
        let c = &self.s.compute;
        let layers = w.layers as f64;
        let half = if back { c.backward_ms } else { c.forward_ms } / layers / 2.0;
        let phase = if back {
            Phase::Backward
        } else {
            Phase::Forward
        };
        let tp_count = elems(m.tp);
        let moe_layer = self.moe() && layer < w.moe_layers;
        let cp = self.l.cp as u64;
        let ep = self.l.ep as u64;
        if !back && self.l.cp > 1 {
            self.coll(Role::Cp, CollFunc::AllGather, elems(m.cp / cp));
        }
        self.compute(half, phase);
        self.coll(Role::Tp, CollFunc::AllReduce, tp_count);
        if moe_layer {
            let a2a = elems(m.ep / ep);
            let expert = if back { 2.0 } else { 1.0 } * c.expert_ms;
            self.coll(Role::Ep, CollFunc::AllToAll, a2a);
            self.compute(expert, Phase::Expert);
            self.coll(Role::Ep, CollFunc::AllToAll, a2a);
        }
        self.compute(half, phase);
        self.coll(Role::Tp, CollFunc::AllReduce, tp_count);
        if back && self.l.cp > 1 {
            self.coll(Role::Cp, CollFunc::ReduceScatter, elems(m.cp / cp));
        }
    }

    fn forward(&mut self) {
        for layer in 0..self.s.workload.layers {
            self.layer(layer, false);
        }
    }

    fn backward(&mut self) {
        for layer in (0..self.s.workload.layers).rev() {
            self.layer(layer, true);
        }
    }

    /// Pipeline transfer: `to_next` / `from_next` / ... as (send?, towards next stage?).
    fn p2p(&mut self, parts: &[(bool, bool)]) {
        let c = self.l.coords(self.rank);
        let last = self.l.pp - 1;
        let count = elems(self.s.messages.pp);
        let parts: Vec<P2pPart> = parts
            .iter()
            .filter_map(|&(send, next)| {
                let stage = if next {
                    (c.pp < last).then(|| c.pp + 1)?
                } else {
                    c.pp.checked_sub(1)?
                };
                Some(P2pPart {
                    send,
                    peer: self.l.rank_of(c.tp, c.cp, c.dp, stage),
                    count,
                })
            })
            .collect();
        if !parts.is_empty() {
            self.ops.push(Op::P2p {
                comm: Role::Pp,
                parts,
            });
        }
    }

    /// One step of the scenario's workload kind.
    fn step(&mut self) {
        match self.s.workload.kind {
            WorkloadKind::Megatron => self.megatron_step(),
            WorkloadKind::Fsdp => self.fsdp_step(),
            WorkloadKind::Ddp => self.ddp_step(),
            WorkloadKind::Decode => self.decode_step(),
        }
    }

    /// Megatron's non-interleaved 1F1B schedule.
    fn megatron_step(&mut self) {
        const RECV_FWD: &[(bool, bool)] = &[(false, false)];
        const SEND_FWD: &[(bool, bool)] = &[(true, true)];
        const SEND_FWD_RECV_BWD: &[(bool, bool)] = &[(true, true), (false, true)];
        const SEND_BWD_RECV_FWD: &[(bool, bool)] = &[(true, false), (false, false)];
        const RECV_BWD: &[(bool, bool)] = &[(false, true)];
        const SEND_BWD: &[(bool, bool)] = &[(true, false)];
        let stage = self.l.coords(self.rank).pp;
        let mbs = self.s.workload.microbatches as usize;
        let warmup = (self.l.pp - stage - 1).min(mbs);
        let remaining = mbs - warmup;
        for _ in 0..warmup {
            self.p2p(RECV_FWD);
            self.forward();
            self.p2p(SEND_FWD);
        }
        if remaining > 0 {
            self.p2p(RECV_FWD);
        }
        for i in 0..remaining {
            self.forward();
            self.p2p(SEND_FWD_RECV_BWD);
            self.backward();
            if i == remaining - 1 {
                self.p2p(SEND_BWD);
            } else {
                self.p2p(SEND_BWD_RECV_FWD);
            }
        }
        for _ in 0..warmup {
            self.p2p(RECV_BWD);
            self.backward();
            self.p2p(SEND_BWD);
        }
        let m = &self.s.messages;
        match self.s.workload.dp_sync {
            DpSync::AllReduce => self.coll(Role::Dp, CollFunc::AllReduce, elems(m.dp)),
            DpSync::ReduceScatterAllGather => {
                let shard = elems(m.dp / self.l.dp as u64);
                self.coll(Role::Dp, CollFunc::ReduceScatter, shard);
                self.coll(Role::Dp, CollFunc::AllGather, shard);
            }
        }
        self.coll(Role::Global, CollFunc::AllReduce, elems(m.global));
        self.compute(self.s.compute.optimizer_ms, Phase::Optimizer);
    }
}

/// Check that every fault fits the run.
pub fn check_faults(faults: &[Fault], world: usize, steps: u32) -> Result<(), PlanError> {
    for f in faults {
        for rank in f.ranks() {
            if rank >= world {
                return Err(PlanError::RankOutOfRange {
                    fault: f.to_string(),
                    rank,
                    world,
                });
            }
        }
        if let Fault::Hang { step, .. }
        | Fault::Pyhang { step, .. }
        | Fault::Kill { step, .. }
        | Fault::Mismatch { step, .. }
        | Fault::Mute { step, .. }
        | Fault::Stall { step, .. } = f
        {
            if *step >= steps {
                return Err(PlanError::StepOutOfRange {
                    fault: f.to_string(),
                    step: *step,
                    steps,
                });
            }
        }
    }
    Ok(())
}

/// Build every rank's plan for `steps` steps with `faults` applied.
pub fn build(
    s: &Scenario,
    l: &Layout,
    steps: u32,
    faults: &[Fault],
) -> Result<Vec<RankPlan>, PlanError> {
    check_workload(&s.workload, l).map_err(PlanError::Workload)?;
    crate::moe::check(s, l).map_err(PlanError::Workload)?;
    check_faults(faults, l.world(), steps)?;
    let plans = (0..l.world())
        .map(|rank| {
            let mut b = Builder {
                s,
                l,
                rank,
                ops: Vec::new(),
            };
            b.step();
            let base = b.ops;
            let steps = (0..steps)
                .map(|step| {
                    let mut ops = base.clone();
                    apply_faults(&mut ops, rank, step, faults);
                    ops
                })
                .collect();
            RankPlan { rank, steps }
        })
        .collect();
    Ok(plans)
}

fn apply_faults(ops: &mut Vec<Op>, rank: usize, step: u32, faults: &[Fault]) {
    let slow: f64 = faults.iter().map(|f| f.slow_ms(rank, step)).sum();
    let stall: f64 = faults.iter().map(|f| f.stall_ms(rank, step)).sum();
    for f in faults {
        match *f {
            Fault::Hang { rank: r, step: s }
            | Fault::Pyhang { rank: r, step: s }
            | Fault::Kill { rank: r, step: s }
                if r == rank && s == step =>
            {
                let stuck = match f {
                    Fault::Hang { .. } => Op::Hang,
                    Fault::Pyhang { .. } => Op::Pyhang,
                    _ => Op::Kill,
                };
                // Inside the first forward compute of the step (after it, before its collective).
                let at = ops
                    .iter()
                    .position(|o| matches!(o, Op::Compute { .. }))
                    .map_or(0, |i| i + 1);
                ops.insert(at, stuck);
            }
            Fault::Mismatch { rank: r, step: s } if r == rank && s == step => {
                // The step's anchor: its last `global` collective, else (decode) its last one.
                let anchor = ops
                    .iter()
                    .rposition(|o| {
                        matches!(
                            o,
                            Op::Coll {
                                comm: Role::Global,
                                ..
                            }
                        )
                    })
                    .or_else(|| ops.iter().rposition(|o| matches!(o, Op::Coll { .. })));
                if let Some(Op::Coll {
                    count, mismatch, ..
                }) = anchor.map(|i| &mut ops[i])
                {
                    *count *= 2;
                    *mismatch = true;
                }
            }
            _ => {}
        }
    }
    if slow > 0.0 {
        ops.insert(
            0,
            Op::Compute {
                us: us(slow),
                phase: Phase::Slow,
            },
        );
    }
    if stall > 0.0 {
        ops.insert(
            0,
            Op::Compute {
                us: us(stall),
                phase: Phase::Stall,
            },
        );
    }
}

mod kinds;

#[cfg(test)]
mod kinds_tests;

#[cfg(test)]
pub(crate) mod tests_support {
    use crate::scenario::Scenario;

    /// A shipped scenario (`tests/scenarios/<name>.toml`).
    pub(crate) fn scenario(name: &str) -> Scenario {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../scenarios/{name}.toml"));
        Scenario::load(&p).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::scenario;
    use super::*;
    use std::collections::HashMap;

    /// Per rank and role: the sequence of (func, count) of its collectives.
    fn coll_sequences(plans: &[RankPlan]) -> HashMap<(usize, Role), Vec<(CollFunc, u64)>> {
        let mut m: HashMap<(usize, Role), Vec<(CollFunc, u64)>> = HashMap::new();
        for p in plans {
            for op in p.steps.iter().flatten() {
                if let Op::Coll {
                    comm, func, count, ..
                } = op
                {
                    m.entry((p.rank, *comm)).or_default().push((*func, *count));
                }
            }
        }
        m
    }

    pub(super) fn check_structure(s: &Scenario, l: &Layout, steps: u32) {
        let plans = build(s, l, steps, &[]).unwrap();
        assert_eq!(plans.len(), l.world());
        let seqs = coll_sequences(&plans);
        for g in l.all_groups() {
            let first = seqs.get(&(g.ranks[0], g.role));
            for r in &g.ranks {
                assert_eq!(seqs.get(&(*r, g.role)), first, "{} rank {r}", g.name);
            }
        }
        // Sends pair with receives, in order, per direction.
        let mut sends: HashMap<(usize, usize), Vec<u64>> = HashMap::new();
        let mut recvs: HashMap<(usize, usize), Vec<u64>> = HashMap::new();
        for p in &plans {
            for op in p.steps.iter().flatten() {
                if let Op::P2p { parts, .. } = op {
                    for part in parts {
                        if part.send {
                            sends
                                .entry((p.rank, part.peer))
                                .or_default()
                                .push(part.count);
                        } else {
                            recvs
                                .entry((part.peer, p.rank))
                                .or_default()
                                .push(part.count);
                        }
                    }
                }
            }
        }
        assert_eq!(sends, recvs);
        // No deadlock: the strict rendezvous simulation finishes every rank.
        let tl = crate::sim::simulate(&plans, l, &crate::sim::SimConfig::default());
        for t in &tl {
            assert_eq!(t.state, crate::sim::RankState::Done, "rank {}", t.rank);
            assert_eq!(t.step_end_ns.len(), steps as usize);
        }
    }

    #[test]
    fn megatron_plans_match_pair_up_and_finish() {
        let s = scenario("megatron");
        check_structure(&s, &s.layout(), 3);
        check_structure(&s, &s.layout().rescaled(16).unwrap(), 2);
    }

    #[test]
    fn moe_plans_match_pair_up_and_finish() {
        let s = scenario("moe");
        let plans = build(&s, &s.layout(), 1, &[]).unwrap();
        let a2a = plans[0].steps[0]
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Op::Coll {
                        func: CollFunc::AllToAll,
                        ..
                    }
                )
            })
            .count();
        assert!(a2a > 0);
        check_structure(&s, &s.layout(), 2);
    }

    #[test]
    fn odd_layouts_finish_too() {
        let mut s = scenario("megatron");
        s.workload.microbatches = 1;
        s.workload.dp_sync = DpSync::ReduceScatterAllGather;
        for (tp, cp, dp, pp) in [(1, 1, 1, 4), (1, 2, 2, 3), (2, 1, 1, 1), (1, 1, 8, 1)] {
            let l = Layout::new(tp, cp, dp, pp, 1);
            check_structure(&s, &l, 2);
        }
        s.workload.microbatches = 7;
        check_structure(&s, &Layout::new(1, 1, 2, 4, 1), 1);
    }

    #[test]
    fn faults_are_placed_where_documented() {
        let s = scenario("megatron");
        let l = s.layout();
        let faults: Vec<Fault> = [
            "hang:rank=2,step=1",
            "mismatch:rank=3,step=0",
            "slow:rank=1,ms=7,steps=1..1",
        ]
        .iter()
        .map(|f| f.parse().unwrap())
        .collect();
        let plans = build(&s, &l, 2, &faults).unwrap();
        assert!(!plans[2].steps[0].contains(&Op::Hang));
        let i = plans[2].steps[1]
            .iter()
            .position(|o| *o == Op::Hang)
            .unwrap();
        assert!(matches!(plans[2].steps[1][i - 1], Op::Compute { .. }));
        let mm: Vec<_> = plans[3].steps[0]
            .iter()
            .filter(|o| matches!(o, Op::Coll { mismatch: true, .. }))
            .collect();
        assert_eq!(mm.len(), 1);
        assert_eq!(
            plans[1].steps[1][0],
            Op::Compute {
                us: 7000,
                phase: Phase::Slow
            }
        );
        assert_ne!(
            plans[1].steps[0][0],
            Op::Compute {
                us: 7000,
                phase: Phase::Slow
            }
        );
        let e = build(&s, &l, 2, &["kill:rank=9,step=0".parse().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("only 8 ranks"));
        let e = build(&s, &l, 2, &["kill:rank=1,step=2".parse().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("only 2 steps"));
        let e = build(&s, &l, 2, &["stall:rank=1,step=2,ms=5".parse().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("only 2 steps"));
        let e = build(&s, &l, 2, &["stall:rank=8,step=0,ms=5".parse().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("only 8 ranks"));
    }

    #[test]
    fn a_stall_is_compute_at_the_start_of_its_steps_only() {
        let s = scenario("megatron");
        let l = s.layout();
        let f: Vec<Fault> = vec!["stall:rank=6,step=1,ms=2500,every=2".parse().unwrap()];
        let plans = build(&s, &l, 5, &f).unwrap();
        let base = build(&s, &l, 5, &[]).unwrap();
        let stall = Op::Compute {
            us: 2_500_000,
            phase: Phase::Stall,
        };
        for step in 0..5 {
            let ops = &plans[6].steps[step];
            if step % 2 == 1 {
                assert_eq!(ops[0], stall, "step {step}");
                assert_eq!(ops[1..], base[6].steps[step][..], "step {step}");
            } else {
                assert_eq!(ops, &base[6].steps[step], "step {step}");
            }
        }
        for r in (0..8).filter(|r| *r != 6) {
            assert_eq!(plans[r], base[r], "rank {r}");
        }
        let json = serde_json::to_value(&stall).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"op": "compute", "us": 2_500_000, "phase": "stall"})
        );
    }
}

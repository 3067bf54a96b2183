//! Phase labels inside a step (issue 5, item 3): forward / backward / gradient sync / optimizer
//! time and the microbatch count, from a template's `[[template.phase]]` rules
//! (templates/README.md, "Phases").
//!
//! A rule names a phase and the strictly contiguous operation sequences (`begin`, alternatives,
//! matchers as in `open`) that show it has begun; `at` picks the sequence's operation that is
//! the phase's first. With `at = 0` the phase begins where that operation starts (the compute
//! before it stays in the previous phase: FSDP gathers a layer, then computes it); with `at >= 1`
//! where the sequence's operation before it ended (the compute in between is the new phase's: a
//! Megatron backward layer computes, then all-reduces; `{ role = "any" }` matches whatever op
//! precedes). The phase lasts until another phase begins or the step ends (its last op's end).
//! A later match that reaches back over earlier phase changes replaces them (a backward layer
//! `[dp AllGather, tp AllReduce, tp AllReduce, dp ReduceScatter]` overrides the forward that its
//! all-gather alone suggested); at one op the match reaching furthest back wins. Time before the
//! first phase begins is in no phase, so every phase's sum is at most the step's duration, and
//! all of them together too.
//!
//! Rules with `microbatch = true` count microbatches: each entry into such a phase from another
//! phase (or from the step's start) is one.

use serde::{Deserialize, Serialize};

use crate::steps::matcher::Seq;
use crate::steps::StepOp;

/// The phases a template can label (a fixed set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Forward passes (activations; CP all-gathers, TP all-reduces, pipeline sends forward).
    Forward,
    /// Backward passes (gradients of activations and weights).
    Backward,
    /// The data-parallel gradient synchronisation (all-reduce, or reduce-scatter + all-gather).
    GradSync,
    /// The optimizer step (compute only; seen as the time before its next communication).
    Optimizer,
}

impl Phase {
    /// Every phase, in step order.
    pub const ALL: [Phase; 4] = [
        Phase::Forward,
        Phase::Backward,
        Phase::GradSync,
        Phase::Optimizer,
    ];

    /// The name in template files and JSON (`forward`, `backward`, `grad_sync`, `optimizer`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::GradSync => "grad_sync",
            Phase::Optimizer => "optimizer",
        }
    }

    /// The phase called `s` (template files).
    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// One `[[template.phase]]` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseRule {
    /// The phase it labels.
    pub phase: Phase,
    /// Alternatives: strictly contiguous sequences that show the phase has begun.
    pub begin: Vec<Seq>,
    /// Index of the sequence's operation that is the phase's first (every alternative is longer).
    pub at: usize,
    /// Each entry into this phase starts a microbatch.
    pub microbatch: bool,
}

/// Time in each phase of one step, µs (sums over the step; 0 = not seen).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub forward_us: u64,
    pub backward_us: u64,
    pub grad_sync_us: u64,
    pub optimizer_us: u64,
}

impl PhaseTimes {
    /// The time of `p`.
    pub fn get(&self, p: Phase) -> u64 {
        match p {
            Phase::Forward => self.forward_us,
            Phase::Backward => self.backward_us,
            Phase::GradSync => self.grad_sync_us,
            Phase::Optimizer => self.optimizer_us,
        }
    }

    fn add(&mut self, p: Phase, us: u64) {
        match p {
            Phase::Forward => self.forward_us += us,
            Phase::Backward => self.backward_us += us,
            Phase::GradSync => self.grad_sync_us += us,
            Phase::Optimizer => self.optimizer_us += us,
        }
    }
}

/// One stretch of a step in one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseSpan {
    pub phase: Phase,
    /// From (µs, on the step's timeline).
    pub from_us: u64,
    /// To (µs; the next span's `from_us`, or the step's end).
    pub to_us: u64,
    /// The rule counts microbatches (this span is the start of one).
    pub microbatch: bool,
}

/// The phase stretches of a step made of `ops` (each with its end time, in step order) that ends
/// at `end_us`, in time order; no two neighbours in the same phase. Empty without rules.
pub fn spans(rules: &[PhaseRule], ops: &[(StepOp, u64)], end_us: u64) -> Vec<PhaseSpan> {
    let Some((first, _)) = ops.first() else {
        return Vec::new();
    };
    // Phase changes: (index of the phase's first op, rule), in op order, no two equal in a row.
    let mut changes: Vec<(usize, usize)> = Vec::new();
    for i in 0..ops.len() {
        // At one op, the match reaching furthest back wins (it explains the most operations).
        let best = rules
            .iter()
            .enumerate()
            .filter_map(|(r, rule)| {
                let len = rule
                    .begin
                    .iter()
                    .filter(|s| !s.is_empty() && s.len() <= i + 1)
                    .filter(|s| {
                        s.iter()
                            .zip(&ops[i + 1 - s.len()..=i])
                            .all(|(m, (o, _))| m.matches(o))
                    })
                    .map(Vec::len)
                    .max()?;
                Some((i + 1 - len + rule.at.min(len - 1), r))
            })
            .min();
        let Some((k, r)) = best else { continue };
        while changes.last().is_some_and(|&(p, _)| p >= k) {
            changes.pop();
        }
        if changes
            .last()
            .is_none_or(|&(_, q)| rules[q].phase != rules[r].phase)
        {
            changes.push((k, r));
        }
    }
    let start = first.start_us;
    let end = end_us.max(start);
    // `at` = 0: the phase begins where its first op starts; `at` >= 1: where the match's op
    // before it ended (the idle time in between, compute, is the new phase's).
    let begin_of = |k: usize, r: usize| -> u64 {
        let s = ops[k].0.start_us;
        let t = if rules[r].at == 0 || k == 0 {
            s
        } else {
            let (prev, prev_end) = &ops[k - 1];
            (*prev_end).max(prev.start_us).min(s)
        };
        t.clamp(start, end)
    };
    changes
        .iter()
        .enumerate()
        .map(|(j, &(k, r))| PhaseSpan {
            phase: rules[r].phase,
            from_us: begin_of(k, r),
            to_us: changes.get(j + 1).map_or(end, |&(k2, r2)| begin_of(k2, r2)),
            microbatch: rules[r].microbatch,
        })
        .collect()
}

/// Phase times and microbatch count of a step made of `ops` (each with its end time, in step
/// order) that ends at `end_us`; `(None, None)` without rules, the count `None` without a
/// `microbatch` rule.
pub fn label(
    rules: &[PhaseRule],
    ops: &[(StepOp, u64)],
    end_us: u64,
) -> (Option<PhaseTimes>, Option<u32>) {
    if rules.is_empty() {
        return (None, None);
    }
    let mut times = PhaseTimes::default();
    let mut micro = 0;
    for s in spans(rules, ops, end_us) {
        times.add(s.phase, s.to_us.saturating_sub(s.from_us));
        micro += u32::from(s.microbatch);
    }
    (
        Some(times),
        rules.iter().any(|r| r.microbatch).then_some(micro),
    )
}

//! The straggler index (DESIGN.md §5, issue 7): who makes the others wait, per step and over
//! steps, from matched operation instances on the aligned clock.
//!
//! * [`model`]: inputs ([`RankStep`]) and the report ([`StragglerReport`]).
//! * [`index`]: the formula ([`analyze`], [`analyze_step`]); `classify`: the culprits' class.
//! * [`collect`]: op records of each stream -> [`RankStep`] at each step summary.
//! * [`propagate`]: optional, outside the formula: arrivals discounted by the time already
//!   spent blocked in the step.

mod classify;
pub mod collect;
pub mod index;
pub mod live;
pub mod model;
mod pairs;
pub mod propagate;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_more;

pub use collect::StepOpCollector;
pub use index::{analyze, analyze_step, StepAnalysis};
pub use model::{
    Arrival, InstanceKey, PeerWait, RankIndex, RankStep, RankSummary, StepIndex, StragglerClass,
    StragglerReport,
};

/// Default index threshold (percent of the mean step): a rank above it is a straggler.
/// Measured on the test bed (megatron scenario, 16 ranks, 2 hosts, 12 steps): healthy runs peak
/// at a per-step index of 13.0 (synthetic; job index 10.5), 6.9 job index with isolated steps
/// up to 27.6 (processes on 2 shared cores, never 3 of 5 steps above 15); a rank slowed by
/// half the step reaches 19.2 (5% of the step: 9.6, not separable from the healthy ranks
/// with this formula).
pub const DEFAULT_THRESHOLD: f64 = 15.0;

/// How the analysis reports.
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerSettings {
    /// Index above which a step counts in `steps_over_threshold` and a rank is classified.
    pub threshold: f64,
    /// Top causes / victims kept per rank.
    pub top: usize,
}

impl Default for StragglerSettings {
    fn default() -> Self {
        StragglerSettings {
            threshold: DEFAULT_THRESHOLD,
            top: 10,
        }
    }
}

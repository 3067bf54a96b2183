//! The straggler index (DESIGN.md §5, issue 7): who makes the others wait, per step and over
//! steps, from matched operation instances on the aligned clock.
//!
//! * [`model`]: inputs ([`RankStep`]) and the report ([`StragglerReport`]).
//! * [`index`]: the formula ([`analyze`], [`analyze_step`]); `classify`: the culprits' class.
//! * [`collect`]: op records of each stream -> [`RankStep`] at each step summary.
//! * [`offline`]: every job under a directory -> one report per job.
//! * [`propagate`]: optional, outside the formula: arrivals discounted by the time already
//!   spent blocked in the step.

mod classify;
pub mod collect;
pub mod index;
pub mod live;
pub mod model;
pub mod offline;
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
pub use offline::{OfflineOptions, StragglerError};

/// Default index threshold (percent of the mean step): a rank above it is a straggler. Measured
/// on the test bed (16 ranks, megatron scenario): healthy jittered runs stay well below it, a
/// rank slowed by 5% of the step is above it.
pub const DEFAULT_THRESHOLD: f64 = 10.0;

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

//! The straggler index (DESIGN.md §5, issue 7): who makes the others wait, per step and over
//! steps, from matched operation instances on the aligned clock.
//!
//! * [`model`]: inputs ([`RankStep`]) and the report ([`StragglerReport`]).
//! * [`index`]: the formula ([`analyze`], [`analyze_step`]); `classify`: the culprits' class.
//! * [`collect`]: op records of each stream -> [`RankStep`] at each step summary.
//! * [`config`]: `[straggler]` of the agent's configuration and the settings from it.
//! * [`root`]: root-cause attribution (issue 17): whose own slowness started the waiting, what
//!   fixing it would save; verdicts rank by it, the seed index stays beside it.

mod classify;
pub mod collect;
pub mod config;
pub mod gpu;
pub mod host;
pub mod index;
pub mod live;
pub mod model;
mod pair_waits;
pub mod root;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_more;

pub use collect::StepOpCollector;
pub use config::{StragglerConfig, DEFAULT_THRESHOLD};
pub use index::{analyze, analyze_step, StepAnalysis};
pub use model::{
    Arrival, InstanceKey, PeerWait, RankIndex, RankStep, RankSummary, StepIndex, StragglerClass,
    StragglerReport,
};

/// The straggler rule on the root cause: root index above `threshold` and own excess
/// (`root_delay`) above `min_delay`, both percent of the step.
pub fn root_over(root_index: f64, root_delay: f64, threshold: f64, min_delay: f64) -> bool {
    root_index > threshold && root_delay > min_delay
}

/// Top causes and victims kept per rank by default.
pub const DEFAULT_TOP: usize = 10;

/// How the analysis reports.
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerSettings {
    /// Index above which a step counts in `steps_over_threshold` and a rank is classified.
    pub threshold: f64,
    /// Root index above which a step counts in `root_steps_over` and a rank is a straggler.
    pub root_threshold: f64,
    /// ...with an own excess (`root_delay`, % of the step) above this.
    pub root_min_delay: f64,
    /// Run the root-cause pass (on by default; off: the seed index alone, as before issue 17,
    /// for comparison in the benchmark).
    pub root_cause: bool,
    /// Top causes / victims kept per rank.
    pub top: usize,
    /// Steps numbered below this are the job's warm-up, left out of the analysis
    /// (`[straggler] warmup_steps`).
    pub warmup_steps: u64,
    /// Communicator hash -> role, to name the hops of the root-cause chains ("through rank 4
    /// (tp)"); empty: no names. The offline driver and the live analysis fill it from the
    /// roles that decided the job's template.
    pub comm_roles: std::sync::Arc<std::collections::BTreeMap<u64, comminsight_wire::roles::Role>>,
}

impl Default for StragglerSettings {
    /// The defaults of `[straggler]` ([`config`]).
    fn default() -> Self {
        (&StragglerConfig::default()).into()
    }
}

//! `[straggler]` of the agent's configuration, and the settings of the analysis
//! ([`StragglerSettings`]) and of the live index ([`LiveSettings`]) derived from it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::live::LiveSettings;
use super::{StragglerSettings, DEFAULT_TOP};

/// Default of `enabled`.
pub const DEFAULT_ENABLED: bool = true;
/// Default index threshold (percent of the mean step): a rank above it is a straggler.
/// Measured on the test bed (megatron scenario, 16 ranks, 2 hosts, 12 steps): healthy runs peak
/// at a per-step index of 13.0 (synthetic; job index 10.5), 6.9 job index with isolated steps
/// up to 27.6 (processes on 2 shared cores, never 3 of 5 steps above 15); a rank slowed by
/// half the step reaches 19.2 (5% of the step: 9.6, not separable from the healthy ranks
/// with this formula).
pub const DEFAULT_THRESHOLD: f64 = 15.0;
/// Default root-index threshold (percent of the step, the seed's scale): a rank above it is a
/// straggler. See [`DEFAULT_ROOT_THRESHOLD`]'s measurement in BENCHMARKS.md.
pub const DEFAULT_ROOT_THRESHOLD: f64 = 1.0;
/// Default of `root_min_delay`: the rank's own excess over its role peers, % of the step, a
/// straggler must also have (research note §3.5: healthy jitter stays below 1 %).
pub const DEFAULT_ROOT_MIN_DELAY: f64 = 2.0;
/// Default of `window_steps`.
pub const DEFAULT_WINDOW_STEPS: u64 = 5;
/// Default of `min_steps_over`.
pub const DEFAULT_MIN_STEPS_OVER: u64 = 3;
/// Default of `report_steps`.
pub const DEFAULT_REPORT_STEPS: u64 = 20;
/// Default of `settle_s`.
pub const DEFAULT_SETTLE_S: u64 = 30;
/// Default of `warmup_steps`: step 0 holds communicator set-up and the ranks' staggered start
/// (on the test bed's 8-rank megatron job one rank is late in it by up to 30% of the step, by
/// chance), which says nothing of speed.
pub const DEFAULT_WARMUP_STEPS: u64 = 1;

/// `[straggler]`: the straggler index of each step (DESIGN.md §5), computed live on the job
/// master (or on this agent when it has none) from every rank's step arrivals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StragglerConfig {
    /// Compute the index live; OTLP gauge `comminsight.straggler.index` per rank.
    pub enabled: bool,
    /// Report a rank whose index is above this in `min_steps_over` of the last `window_steps`
    /// steps (percent of the step time its peers wait for it).
    pub threshold: f64,
    /// Root-cause index threshold (issue 17): a rank whose own slowness costs the others more
    /// than this (percent of the step) in `min_steps_over` of the last `window_steps` steps is
    /// announced.
    pub root_threshold: f64,
    /// ...and whose own excess self time over its role peers is above this (percent of the
    /// step) in those steps.
    pub root_min_delay: f64,
    /// The n of "m of n steps".
    pub window_steps: u64,
    /// The m of "m of n steps".
    pub min_steps_over: u64,
    /// `results/straggler/<job>.json` covers the last this many analysed steps.
    pub report_steps: u64,
    /// A step is analysed when every rank reported a later one, or this long after its first
    /// report (s).
    pub settle_s: u64,
    /// The first this many steps of a job (step numbers below it) are its warm-up: left out of
    /// the index, live and offline (`straggler`, `report`).
    pub warmup_steps: u64,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        StragglerConfig {
            enabled: DEFAULT_ENABLED,
            threshold: DEFAULT_THRESHOLD,
            root_threshold: DEFAULT_ROOT_THRESHOLD,
            root_min_delay: DEFAULT_ROOT_MIN_DELAY,
            window_steps: DEFAULT_WINDOW_STEPS,
            min_steps_over: DEFAULT_MIN_STEPS_OVER,
            report_steps: DEFAULT_REPORT_STEPS,
            settle_s: DEFAULT_SETTLE_S,
            warmup_steps: DEFAULT_WARMUP_STEPS,
        }
    }
}

/// The analysis reports with `threshold` and `warmup_steps` (and the default number of top
/// causes and victims).
impl From<&StragglerConfig> for StragglerSettings {
    fn from(c: &StragglerConfig) -> Self {
        StragglerSettings {
            threshold: c.threshold,
            root_threshold: c.root_threshold,
            root_min_delay: c.root_min_delay,
            root_cause: true,
            top: DEFAULT_TOP,
            warmup_steps: c.warmup_steps,
            comm_roles: Default::default(),
        }
    }
}

impl From<&StragglerConfig> for LiveSettings {
    fn from(c: &StragglerConfig) -> Self {
        LiveSettings {
            threshold: c.threshold,
            root_threshold: c.root_threshold,
            root_min_delay: c.root_min_delay,
            window_steps: c.window_steps as usize,
            min_steps_over: c.min_steps_over as usize,
            report_steps: c.report_steps as usize,
            settle: Duration::from_secs(c.settle_s),
            warmup_steps: c.warmup_steps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_are_the_default_config() {
        let s = StragglerSettings::default();
        assert_eq!(s, StragglerSettings::from(&StragglerConfig::default()));
        assert_eq!(s.threshold, 15.0);
        assert_eq!(s.top, 10);
        assert_eq!(s.warmup_steps, 1);
        assert_eq!(super::super::DEFAULT_THRESHOLD, DEFAULT_THRESHOLD);
    }

    #[test]
    fn live_settings_take_every_key() {
        let c = StragglerConfig {
            threshold: 12.5,
            window_steps: 7,
            min_steps_over: 4,
            report_steps: 9,
            settle_s: 11,
            warmup_steps: 3,
            ..StragglerConfig::default()
        };
        let l = LiveSettings::from(&c);
        assert_eq!(l.threshold, 12.5);
        assert_eq!(
            (l.window_steps, l.min_steps_over, l.report_steps),
            (7, 4, 9)
        );
        assert_eq!(l.settle, Duration::from_secs(11));
        assert_eq!(l.warmup_steps, 3);
        assert_eq!(StragglerSettings::from(&c).warmup_steps, 3);
    }
}

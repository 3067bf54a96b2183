//! When a wait is a hang: the settings and the threshold they give with a job's learned gaps.

use super::model::JobSnapshot;

/// When a wait is long enough to be a hang.
#[derive(Clone, Debug, PartialEq)]
pub struct HangSettings {
    /// Never call a wait shorter than this a hang (µs), whatever the plugin's threshold.
    pub min_wait_us: u64,
    /// A wait must also exceed this many times the job's longest normal quiet interval
    /// (learned: longest finished op, longest gap between ops).
    pub gap_factor: f64,
}

impl Default for HangSettings {
    fn default() -> Self {
        HangSettings {
            min_wait_us: 0,
            gap_factor: 2.0,
        }
    }
}

/// The wait a hang needs given the job's learned gaps (µs).
pub fn threshold_us(s: &JobSnapshot, settings: &HangSettings) -> u64 {
    let plugin = u64::from(s.gaps.plugin_threshold_ms) * 1000;
    let learned = s.gaps.max_op_us.max(s.gaps.max_idle_us) as f64 * settings.gap_factor;
    plugin.max(settings.min_wait_us).max(learned as u64)
}

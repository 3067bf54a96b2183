//! When a wait is a hang: the settings and the threshold they give with a job's learned gaps.

use super::model::JobSnapshot;

pub use super::config::HangSettings;

/// The wait a hang needs given the job's learned gaps (µs).
pub fn threshold_us(s: &JobSnapshot, settings: &HangSettings) -> u64 {
    let plugin = u64::from(s.gaps.plugin_threshold_ms) * 1000;
    let learned = s.gaps.max_op_us.max(s.gaps.max_idle_us) as f64 * settings.gap_factor;
    plugin.max(settings.min_wait_us).max(learned as u64)
}

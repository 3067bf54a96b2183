//! When a wait is a hang: the settings and the threshold they give with a job's learned gaps.

use super::model::JobSnapshot;

pub use super::config::HangSettings;

/// A view taken more than this before the newest of the snapshots merged with it is not
/// current: agents re-send a live event's snapshot every 2 s, so its host stopped reporting
/// (its ranks finished their ops, it died, or it has not re-sent since a master restart). The
/// master waits a while for current views of such hosts; the analysis counts the silence of a
/// rank in a current view only up to when it was seen.
pub const CURRENT_VIEW_US: u64 = 5_000_000;

/// The wait a hang needs given the job's learned gaps (µs).
pub fn threshold_us(s: &JobSnapshot, settings: &HangSettings) -> u64 {
    let plugin = u64::from(s.gaps.plugin_threshold_ms) * 1000;
    let learned = s.gaps.max_op_us.max(s.gaps.max_idle_us) as f64 * settings.gap_factor;
    plugin.max(settings.min_wait_us).max(learned as u64)
}

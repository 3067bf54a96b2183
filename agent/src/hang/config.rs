//! `[hang]` of the agent's configuration, and the analysis' [`HangSettings`] derived from it.

use serde::{Deserialize, Serialize};

/// Default of `enabled`.
pub const DEFAULT_ENABLED: bool = true;
/// Default of `min_wait_s`: no floor, the plugin's threshold and the learned gaps decide.
pub const DEFAULT_MIN_WAIT_S: u64 = 0;
/// Default of `gap_factor`.
pub const DEFAULT_GAP_FACTOR: f64 = 2.0;
/// Default of `stacks`.
pub const DEFAULT_STACKS: bool = true;
/// Default of `native_stacks`.
pub const DEFAULT_NATIVE_STACKS: bool = true;

/// `[hang]`: hang and failure localisation (overdue operations -> wait-for graph -> source
/// ranks), stacks of the local ranks, evidence under `<state_dir>/results/hang/`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HangConfig {
    /// Watch overdue operations and name the ranks that stopped the job.
    pub enabled: bool,
    /// Never call a wait shorter than this a hang (s); 0 = the plugin's overdue threshold
    /// (`COMMINSIGHT_OVERDUE_MS`) and the learned gaps decide. Set it above the longest pause a
    /// job makes before its first checkpoint or evaluation has been seen.
    pub min_wait_s: u64,
    /// A wait must also exceed this many times the job's longest normal quiet interval seen so
    /// far (longest finished op, longest gap between ops: checkpoints, evaluation); 0 = no
    /// learning.
    pub gap_factor: f64,
    /// Capture Python stacks (py-spy; needs CAP_SYS_PTRACE) of a hung job's local ranks, once per
    /// hang, with one short locked dump each.
    pub stacks: bool,
    /// Native frames too (libunwind).
    pub native_stacks: bool,
}

impl Default for HangConfig {
    fn default() -> Self {
        HangConfig {
            enabled: DEFAULT_ENABLED,
            min_wait_s: DEFAULT_MIN_WAIT_S,
            gap_factor: DEFAULT_GAP_FACTOR,
            stacks: DEFAULT_STACKS,
            native_stacks: DEFAULT_NATIVE_STACKS,
        }
    }
}

impl HangConfig {
    /// The analysis settings.
    pub fn settings(&self) -> HangSettings {
        self.into()
    }
}

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
    /// The defaults of `[hang]`.
    fn default() -> Self {
        (&HangConfig::default()).into()
    }
}

impl From<&HangConfig> for HangSettings {
    fn from(c: &HangConfig) -> Self {
        HangSettings {
            min_wait_us: c.min_wait_s.saturating_mul(1_000_000),
            gap_factor: c.gap_factor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_are_the_default_config_in_analysis_units() {
        let s = HangSettings::default();
        assert_eq!(s, HangConfig::default().settings());
        assert_eq!(s.min_wait_us, 0);
        assert_eq!(s.gap_factor, 2.0);
    }

    #[test]
    fn settings_convert_seconds_and_keep_a_fractional_factor() {
        let c = HangConfig {
            min_wait_s: 90,
            gap_factor: 1.5,
            ..HangConfig::default()
        };
        let s = HangSettings::from(&c);
        assert_eq!(s.min_wait_us, 90_000_000);
        assert_eq!(s.gap_factor, 1.5);
    }
}

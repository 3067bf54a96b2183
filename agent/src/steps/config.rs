//! `[steps]` of the agent's configuration, and the engine's [`StepSettings`] derived from it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::template::{TemplateError, TemplateSet};

/// Default of `enabled`.
pub const DEFAULT_ENABLED: bool = true;
/// Default of `safe_window_ms`.
pub const DEFAULT_SAFE_WINDOW_MS: u64 = 2000;
/// Default of `settle_ops`.
pub const DEFAULT_SETTLE_OPS: u64 = 20_000;
/// Default of `max_held_ops`.
pub const DEFAULT_MAX_HELD_OPS: u64 = 500_000;
/// Default of `breaker_minutes`.
pub const DEFAULT_BREAKER_MINUTES: u64 = 30;
/// Default of `stream_end_s`.
pub const DEFAULT_STREAM_END_S: u64 = 600;

/// Default reorder window: operations may arrive this late (µs) without changing the result
/// (`DEFAULT_SAFE_WINDOW_MS` in µs).
pub const DEFAULT_SAFE_WINDOW_US: u64 = ms_to_us(DEFAULT_SAFE_WINDOW_MS);
/// Open-step duration at which the circuit breaker trips by default: no step for
/// `DEFAULT_BREAKER_MINUTES` (in µs).
pub const DEFAULT_BREAKER_US: u64 = minutes_to_us(DEFAULT_BREAKER_MINUTES);

/// Milliseconds to µs (saturating).
const fn ms_to_us(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

/// Minutes to µs (saturating).
const fn minutes_to_us(minutes: u64) -> u64 {
    minutes.saturating_mul(60_000_000)
}

/// `[steps]`: training steps rebuilt online from each GPU's operations (templates).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepsConfig {
    /// Rebuild steps online (`<state_dir>/results/steps/`).
    pub enabled: bool,
    /// Directory of template files (`*.toml`); empty = the built-in templates.
    pub templates_dir: PathBuf,
    /// Operations may arrive this late (start time) without changing the result (ms).
    pub safe_window_ms: u64,
    /// Operations of a job seen before its template is chosen (roles settle first).
    pub settle_ops: u64,
    /// Operations held per job while its template is not chosen; the choice is forced here.
    pub max_held_ops: u64,
    /// No step for this long closes the rank's step session (circuit breaker; minutes).
    pub breaker_minutes: u64,
    /// A stream without a ring whose segments are all read has ended after this long without a
    /// new one (its step session drains; seconds). Streams with a ring end with it.
    pub stream_end_s: u64,
}

impl Default for StepsConfig {
    fn default() -> Self {
        StepsConfig {
            enabled: DEFAULT_ENABLED,
            templates_dir: PathBuf::new(),
            safe_window_ms: DEFAULT_SAFE_WINDOW_MS,
            settle_ops: DEFAULT_SETTLE_OPS,
            max_held_ops: DEFAULT_MAX_HELD_OPS,
            breaker_minutes: DEFAULT_BREAKER_MINUTES,
            stream_end_s: DEFAULT_STREAM_END_S,
        }
    }
}

impl StepsConfig {
    /// The engine's settings.
    pub fn settings(&self) -> StepSettings {
        self.into()
    }

    /// The templates: `templates_dir`, or the built-in ones.
    pub fn templates(&self) -> Result<TemplateSet, TemplateError> {
        if self.templates_dir.as_os_str().is_empty() {
            Ok(TemplateSet::builtin())
        } else {
            TemplateSet::load_dir(&self.templates_dir)
        }
    }
}

/// How the engine runs (`[steps]` of the agent's configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepSettings {
    /// Operations may arrive this late (µs of start time) without changing the result.
    pub safe_window_us: u64,
    /// Operations of a job seen before its template may be chosen.
    pub settle_ops: u64,
    /// Held operations of a job (template not chosen yet) at which the choice is forced.
    pub max_held_ops: u64,
    /// An open step longer than this (µs) trips the session's circuit breaker.
    pub breaker_us: u64,
}

impl Default for StepSettings {
    /// The defaults of `[steps]`.
    fn default() -> Self {
        (&StepsConfig::default()).into()
    }
}

impl From<&StepsConfig> for StepSettings {
    fn from(c: &StepsConfig) -> Self {
        StepSettings {
            safe_window_us: ms_to_us(c.safe_window_ms),
            settle_ops: c.settle_ops,
            max_held_ops: c.max_held_ops,
            breaker_us: minutes_to_us(c.breaker_minutes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_are_the_default_config_in_engine_units() {
        let s = StepSettings::default();
        assert_eq!(s, StepsConfig::default().settings());
        assert_eq!(s.safe_window_us, 2_000_000);
        assert_eq!(s.settle_ops, 20_000);
        assert_eq!(s.max_held_ops, 500_000);
        assert_eq!(s.breaker_us, 30 * 60 * 1_000_000);
        assert_eq!(super::DEFAULT_SAFE_WINDOW_US, s.safe_window_us);
        assert_eq!(super::super::fsm::MAX_OPEN_US, s.breaker_us);
    }

    #[test]
    fn settings_convert_units_and_saturate() {
        let c = StepsConfig {
            safe_window_ms: 5,
            breaker_minutes: u64::MAX,
            ..StepsConfig::default()
        };
        let s = StepSettings::from(&c);
        assert_eq!(s.safe_window_us, 5000);
        assert_eq!(s.breaker_us, u64::MAX);
    }
}

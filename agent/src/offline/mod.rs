//! The offline side: every command that analyses recorded data (`replay`, `roles`, `steps`,
//! `straggler`, `hang`, `report`, `trace`) opens one [`Input`] (inputs found and archives staged
//! once), drives the daemon's own [`crate::engine::Engine`] over it with exactly-once cursors,
//! in as few passes as its analyses need, with the site's settings ([`Settings`], from the same
//! configuration file the daemon reads).
//!
//! Passes: the template of a job is chosen from the whole input's roles, so commands that
//! rebuild steps read the input twice — first communicator membership and traffic
//! ([`steps::topology`]), then the step engine with those choices ([`steps::step_engine`]).

pub mod calibration;
pub mod hang;
pub mod host_evidence;
mod input;
pub mod moe;
pub mod replay;
pub mod skipped;
mod staging;
pub mod steps;
pub mod straggler;

use std::path::PathBuf;

pub use input::{Input, InputError, PassStats};
pub use skipped::Skipped;

use crate::config::AgentConfig;
use crate::hang::HangSettings;
use crate::steps::engine::StepSettings;
use crate::steps::template::{TemplateError, TemplateSet};
use crate::straggler::StragglerSettings;

/// The analyses' settings of an offline command: the site's `[steps]`, `[hang]`, `[straggler]`
/// and `[otlp] max_series`, so that its results equal the daemon's for the same records.
#[derive(Clone, Debug)]
pub struct Settings {
    pub templates: TemplateSet,
    pub steps: StepSettings,
    /// `[steps] enabled`: `replay` rebuilds the steps only then.
    pub steps_enabled: bool,
    pub hang: HangSettings,
    pub straggler: StragglerSettings,
    /// The metrics' series cap (`[otlp] max_series`).
    pub max_series: usize,
    /// `[moe]`.
    pub moe: crate::moe::MoeConfig,
}

impl Settings {
    /// The settings of a configuration (its templates loaded).
    pub fn from_config(cfg: &AgentConfig) -> Result<Settings, TemplateError> {
        Ok(Settings {
            templates: cfg.steps.templates()?,
            steps: (&cfg.steps).into(),
            steps_enabled: cfg.steps.enabled,
            hang: (&cfg.hang).into(),
            straggler: (&cfg.straggler).into(),
            max_series: cfg.otlp.max_series,
            moe: cfg.moe.clone(),
        })
    }
}

impl Default for Settings {
    /// The documented defaults (built-in templates).
    fn default() -> Settings {
        Settings::from_config(&AgentConfig::default()).expect("the built-in templates load")
    }
}

/// Why an offline analysis could not run; each message names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Calibration(#[from] calibration::CalibrationError),
    #[error("{path}: cannot write the steps: {source}")]
    WriteSteps {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot write {what}: {source}")]
    Write {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no job {job:?} (jobs found: {known}); pass one of them to --job")]
    UnknownJob {
        path: PathBuf,
        job: String,
        known: String,
    },
    #[error("--steps {a}..{b}: the first step is after the last; use a..b with a <= b")]
    BadRange { a: u64, b: u64 },
}

#[cfg(test)]
mod tests;

//! `comminsight-agent report DIR -o report.html` (issue 7): one self-contained HTML page per job
//! (inline CSS, script and data; no network; works from `file://`) with the job summary, the
//! step-duration chart, the straggler heatmap on the parallel grid with a per-rank drill-down,
//! the hang verdicts, EP matrices when present and the commands that cut Perfetto traces.
//!
//! * [`gather`]: the offline analyses over one [`crate::offline::Input`] (roles and hangs, steps
//!   and the straggler index, the top ranks' ops: three passes) -> one [`model::ReportModel`]
//!   per job;
//! * [`render`]: a model -> the HTML text (pure). The model is embedded once as JSON in
//!   `<script type="application/json" id="data">` and drawn by the page's own script (canvas and
//!   SVG); the page sets `document.body.dataset.ready = "1"` when done and writes any error it
//!   caught into `#errors`.
//!
//! ```
//! use comminsight_agent::report::{model::ReportModel, render};
//! let html = render(&ReportModel::default());
//! assert!(html.starts_with("<!DOCTYPE html>"));
//! ```

mod build;
mod ep;
mod gather;
mod labels;
mod layout;
pub mod model;
mod render;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use crate::offline::{Input, Settings};

pub use build::{build, rank_list, shell_quote, trace_command, Inputs, MAX_LISTED};
pub use gather::GatherOptions;
pub use render::render;

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The input could not be read or analysed.
    #[error("{path}: {message}")]
    Input { path: PathBuf, message: String },
    /// The records could not be read or analysed (the message names the input).
    #[error(transparent)]
    Offline(#[from] crate::offline::OfflineError),
    /// `--job` named no job of the input.
    #[error("{path}: no job {job:?} (jobs found: {found}); pass one of them to --job")]
    NoSuchJob {
        path: PathBuf,
        job: String,
        found: String,
    },
    /// Nothing to report.
    #[error("{path}: no job with step summaries under it (give a test-bed output directory, a segment root or an agent archive)")]
    Empty { path: PathBuf },
}

/// Every job's report model of `input` (one per job, by job id), with the analyses' `settings`.
pub fn gather(
    input: &Input,
    settings: &Settings,
    opts: &GatherOptions,
) -> Result<Vec<model::ReportModel>, ReportError> {
    let dir = input.dir();
    let inputs = gather::inputs(input, settings, opts)?;
    if inputs.is_empty() {
        return Err(match &opts.job {
            Some(j) => ReportError::NoSuchJob {
                path: dir.to_path_buf(),
                job: j.clone(),
                found: "none".into(),
            },
            None => ReportError::Empty {
                path: dir.to_path_buf(),
            },
        });
    }
    Ok(inputs.into_iter().map(build).collect())
}

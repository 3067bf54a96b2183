//! Perfetto timelines of a job's steps (issue 7, deliverable 3):
//! `comminsight-agent trace DIR --steps a..b | --time t0..t1 [--ranks ..] -o FILE.pftrace`.
//!
//! * [`perfetto`]: the hand-written Perfetto messages (TracePacket, TrackDescriptor, TrackEvent,
//!   interned names).
//! * [`writer`]: a streaming packet writer (length-delimited `Trace.packet` fields appended as
//!   they are made; names interned).
//! * [`index`]: the per-segment time index (`DIR/.comminsight/time-index.json`) that lets a
//!   window be read from the overlapping segments only.
//! * [`build`]: steps (the step engine's summaries, same code and numbering as `steps`) -> the
//!   ranks and windows to draw, and the reads of their segments (one [`crate::offline::Input`]).
//! * [`draw`]: tracks (a process per host, a thread per rank), nested step -> phase -> op
//!   slices, and flows linking the matched instances of an operation across ranks.
//! * [`ep`]: MoE EP findings as instants on the ranks they name.
//! * [`host`]: the host context from the job's host streams (main-thread CPU states, TCP
//!   retransmits and QP events per rank, port counters per host).

pub mod build;
mod draw;
mod ep;
mod host;
pub mod index;
pub mod perfetto;
pub mod writer;

use std::path::PathBuf;

pub use build::{write_trace, TraceOptions};
pub use draw::{busbw_factor, flow_id, net_rate, HostDrawn, TraceSummary, Window, NET_BUCKET_US};
pub use writer::{ArgValue, TraceWriter};

/// Why a trace could not be written; each message names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The input could not be read, or its saved calibration is corrupt.
    #[error(transparent)]
    Offline(#[from] crate::offline::OfflineError),
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    /// `--job` names no job of the input.
    #[error("{path}: no job {job:?} (jobs found: {known}); pass one of them to --job")]
    NoJob {
        path: PathBuf,
        job: String,
        known: String,
    },
    /// Several jobs and no `--job`.
    #[error("{path}: several jobs ({known}); choose one with --job")]
    SeveralJobs { path: PathBuf, known: String },
    /// The job's steps could not be rebuilt.
    #[error("job {job}: no step template matches its features [{features}]; add one (templates/README.md) and pass --templates DIR, or use `dump` for the raw records")]
    NoTemplate { job: String, features: String },
    /// The window selects nothing.
    #[error(
        "{path}: {what} selects no step of job {job} (its steps: {have}); choose another window"
    )]
    EmptyWindow {
        path: PathBuf,
        job: String,
        what: String,
        have: String,
    },
}

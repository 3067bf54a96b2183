//! Sources: the plugin processes' record streams, read exactly once per sequence number.
//!
//! * [`Discovery`] finds every process stream: segment directories `<root>/<job>/<host>/<pid>`
//!   under the configured log roots, and live rings `<job>.<host>.<pid>[.<start>-<ns>].ring` in
//!   the per-user directories `<shm_dir>/<uid>/` (owner and mode checked); [`find_log_roots`] finds the log roots at or below any directory.
//! * [`StreamCursor`] follows one process: sealed segments in index order, then the `.open`
//!   tail, then the ring for the records not yet on disk. Each record is delivered once per seq
//!   epoch; segment headers and `FLAG_REPEAT` preamble copies are never delivered.
//! * [`CursorCheckpoint`] is a cursor's exact position; the daemon stores it together with
//!   the engine's state (its checkpoint) so a restarted agent resumes without losing or
//!   duplicating records.
//!
//! This module is synchronous and does no tokio: the daemon polls cursors from its ingest
//! thread, and every offline command ([`crate::offline::Input`]) uses the same cursor over
//! finished directories.

pub mod config;
mod cursor;
mod discovery;
mod disk;

use std::path::PathBuf;

pub use config::SourcesConfig;
pub use cursor::{
    CursorCheckpoint, CursorStats, Progress, SealedSegment, StreamCursor, DEFAULT_STALE_AFTER,
};
pub use discovery::{
    find_log_roots, parse_ring_name, prepare_shm_dir, DiscoveredStream, Discovery, RingName,
};
pub use disk::{EpochKey, RING_DEPTH, SEGMENT_DEPTH};

/// Why a source could not be read or its state not be stored. Records that are merely corrupt
/// or missing are counted in [`CursorStats`], never reported as errors.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Reading a segment or directory failed for a reason other than its absence.
    #[error("{path}: {source}; check that the agent may read the plugin's log directory")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

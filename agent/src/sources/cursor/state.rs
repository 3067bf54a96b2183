//! What a [`super::StreamCursor`] reports: its checkpoint, one poll's progress, its counters and
//! the segments that became final.

use std::path::PathBuf;

use comminsight_wire::record::RawRecord;
use serde::{Deserialize, Serialize};

use crate::sources::disk::EpochKey;
use crate::stream::StreamId;

/// Where a cursor stands; resuming from it delivers exactly the records after it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorCheckpoint {
    /// Index of the segment being read (or last read), if any.
    pub segment: Option<u64>,
    /// Bytes of it consumed (whole records).
    pub offset: u64,
    /// That segment is final and fully read.
    pub segment_done: bool,
    /// Seq epoch (0 first).
    pub epoch: u32,
    pub epoch_key: Option<EpochKey>,
    /// Last seq delivered in `epoch`.
    pub last_seq: Option<u64>,
    /// Highest seq read from disk in `epoch`.
    pub disk_seq: Option<u64>,
    /// Highest segment index the archive stored ([`super::StreamCursor::ack_sealed`]).
    pub acked: Option<u64>,
}

/// What one poll did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Records appended to `out`.
    pub records: usize,
    /// Of which from the ring.
    pub from_ring: usize,
    /// `max` was reached: more may be ready now.
    pub more: bool,
}

/// A cursor's counters since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorStats {
    pub records: u64,
    pub from_ring: u64,
    pub from_segments: u64,
    /// Seqs never delivered (plugin-side loss, lapped ring with nothing on disk, deleted segments).
    pub seq_gaps: u64,
    /// Records with an invalid header, skipped.
    pub corrupt: u64,
    /// Trailing bytes of final segments that do not make a whole record.
    pub torn_bytes: u64,
    /// Seq epochs seen (1 + restarts of the plugin runtime in the same process).
    pub epochs: u32,
    /// Segment files refused by the safety checks (a symbolic link, a FIFO, a foreign owner):
    /// never read; see [`super::StreamCursor::refusals`].
    #[serde(default)]
    pub refused_files: u64,
    /// Rings found truncated by their owner while mapped (read as zeros, never a `SIGBUS`):
    /// each was let go, the stream goes on from its segments.
    #[serde(default)]
    pub rings_truncated: u64,
}

/// A segment that became final: sealed, or `.open` and `abandoned` by a writer that is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedSegment {
    pub id: StreamId,
    pub index: u64,
    pub path: PathBuf,
    /// Never sealed: its writer died (or moved on to a later index without sealing it).
    pub abandoned: bool,
    /// Records of the stream that were in the ring but never reached this segment (kill -9).
    pub recovered: Vec<RawRecord>,
}

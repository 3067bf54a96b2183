//! [`StreamCursor`]: one process' records, exactly once per seq epoch, from segments and ring.
//!
//! Order of reading in one poll: the segments in index order from the checkpointed position
//! (sealed ones to their end, the `.open` tail up to its last whole record), then the ring for
//! records not yet on disk. While the disk is being written (it grew within [`DISK_GRACE`]) only
//! ring records that continue the delivered sequence are taken, so records the ring lapped are
//! read from disk later instead of being lost; once the disk stalls, the ring alone is followed
//! and gaps are counted.
//!
//! Epochs: a non-repeat `proc_start` with seq 0 met on disk after other records of the current
//! epoch starts a new seq space. Each epoch is identified by its `proc_start` clock pair
//! ([`EpochKey`]); a ring is followed only while it belongs to the disk's current epoch.
//!
//! Staleness of an `.open` segment (its writer was killed): no growth for `stale_after`, the ring
//! (if any) did not advance for as long, and `/proc/<pid>` does not exist. Container caveat: an
//! agent in another pid namespace than the job sees either no `/proc/<pid>` for a live writer or
//! an unrelated process with that pid. The latter only delays abandonment; the former is covered
//! by the growth rules, because a live plugin writes a `stats` record every 10 s (its ring
//! advances and its segment grows well within `stale_after`, 120 s by default). Keep
//! `stale_after` far above that period.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use comminsight_wire::record::{Kind, RawRecord, FLAG_REPEAT, RECORD_SIZE};

pub use self::state::{CursorCheckpoint, CursorStats, Progress, SealedSegment};
use super::disk::{epoch_key, flags, header_ok, seg_path, EpochKey, Ring};
use super::SourceError;
use crate::stream::StreamId;

/// Default staleness of an unsealed segment whose writer is gone (`[sources] stale_after_s`).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(super::config::DEFAULT_STALE_AFTER_S);
/// The disk counts as being written while it grew within this long: ring records that skip
/// seqs are then left for the disk to deliver.
pub const DISK_GRACE: Duration = Duration::from_secs(2);
/// A directory modified less than this before a listing may change again within the same
/// timestamp tick; it is listed again at the next poll.
const DIR_MTIME_MARGIN: Duration = Duration::from_millis(200);
/// Bytes read from a segment per system call.
const READ_CHUNK: usize = 4096 * RECORD_SIZE;
/// A ring created this long after its epoch's `proc_start` (clock drift allowance) is not
/// that epoch's ring (used only when the ring no longer holds its own `proc_start`).
const RING_EPOCH_SLACK_NS: u64 = 1_000_000_000;

/// The segment being read.
struct Current {
    index: u64,
    file: File,
    /// Still under its `.open` name when last checked.
    open: bool,
    last_size: u64,
    last_change: Instant,
}

/// One process stream's exactly-once reader. See the module documentation.
pub struct StreamCursor {
    id: StreamId,
    seg_dir: Option<PathBuf>,
    ring_path: Option<PathBuf>,
    ring: Option<Ring>,
    /// Inode of a ring that is final (its writer died and it was recovered): never read again.
    done_ino: Option<u64>,
    /// A ring was attached before in this cursor's life.
    ring_seen: bool,
    cur: Option<Current>,
    pos_index: Option<u64>,
    pos_offset: u64,
    pos_done: bool,
    epoch: u32,
    epoch_key: Option<EpochKey>,
    last_seq: Option<u64>,
    disk_seq: Option<u64>,
    acked: Option<u64>,
    offered: Option<u64>,
    finals: BTreeMap<u64, SealedSegment>,
    last_disk_progress: Option<Instant>,
    stale_after: Duration,
    proc_root: PathBuf,
    stats: CursorStats,
    buf: Vec<u8>,
    ring_buf: Vec<RawRecord>,
    reported: bool,
    /// Indexes of segments refused by the safety checks, never read again.
    refused_idx: std::collections::BTreeSet<u64>,
    /// The first [`listing::MAX_REFUSALS_KEPT`] refusals: path and why.
    refused: Vec<(PathBuf, String)>,
    /// The stream's user (the owner of its ring), once known: segments must be theirs.
    owner: Option<u32>,
    /// Modification time of the segment directory at a listing that found nothing to read,
    /// when old enough to be trusted: an unchanged directory is not listed again.
    dir_seen: Option<SystemTime>,
    /// A poll ends where a segment ends ([`StreamCursor::with_segment_batches`]).
    segment_batches: bool,
    /// The last listing of the segment directory (index -> `.open`): the next segment is taken
    /// from it while it has one after the position, so a stream of N segments is listed O(1)
    /// times, not once per segment (which made reading quadratic in N).
    listed: BTreeMap<u64, bool>,
}

impl std::fmt::Debug for StreamCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCursor")
            .field("id", &self.id)
            .field("checkpoint", &self.checkpoint())
            .field("stats", &self.stats)
            .finish()
    }
}

impl StreamCursor {
    /// A cursor over a process' segment directory and/or ring, resuming after `from`.
    pub fn new(
        id: StreamId,
        seg_dir: Option<PathBuf>,
        ring: Option<PathBuf>,
        from: Option<CursorCheckpoint>,
    ) -> Self {
        let cp = from.unwrap_or_default();
        let has_dir = seg_dir.is_some();
        StreamCursor {
            id,
            seg_dir,
            ring_path: ring,
            ring: None,
            done_ino: None,
            ring_seen: false,
            cur: None,
            pos_index: cp.segment,
            pos_offset: cp.offset,
            pos_done: cp.segment_done,
            epoch: cp.epoch,
            epoch_key: cp.epoch_key,
            last_seq: cp.last_seq,
            disk_seq: cp.disk_seq,
            acked: cp.acked,
            offered: None,
            finals: BTreeMap::new(),
            // A new cursor (first start, or an agent restart) gives the disk DISK_GRACE to catch
            // up before a gap in the ring is accepted: after a restart the ring may have lapped
            // past the checkpoint while the missing records are still only in the plugin's
            // drain; accepting the gap at once lost them for the live pipeline.
            last_disk_progress: has_dir.then(Instant::now),
            stale_after: DEFAULT_STALE_AFTER,
            proc_root: PathBuf::from("/proc"),
            stats: CursorStats {
                epochs: cp.epoch + 1,
                ..Default::default()
            },
            buf: Vec::new(),
            ring_buf: Vec::new(),
            reported: false,
            refused_idx: Default::default(),
            refused: Vec::new(),
            dir_seen: None,
            segment_batches: false,
            listed: BTreeMap::new(),
            owner: None,
        }
    }

    /// A cursor over a discovered stream, with `[sources] stale_after_s` applied.
    pub fn for_stream(
        d: &super::DiscoveredStream,
        from: Option<CursorCheckpoint>,
        cfg: &super::SourcesConfig,
    ) -> Self {
        let mut c = StreamCursor::new(d.id.clone(), d.seg_dir.clone(), d.ring.clone(), from)
            .with_stale_after(Duration::from_secs(cfg.stale_after_s));
        c.set_owner(d.ring_owner);
        c
    }

    /// The uid that owns the stream's ring (its per-user directory's): from then on its
    /// segment files and process directory must be that user's too, or they are refused.
    pub fn set_owner(&mut self, uid: Option<u32>) {
        if uid.is_some() {
            self.owner = uid;
        }
    }

    /// Set the staleness of an unsealed segment (`[sources] stale_after_s`).
    pub fn with_stale_after(mut self, d: Duration) -> Self {
        self.stale_after = d;
        self
    }

    /// End each poll where a segment ends (once it delivered records or skipped corrupt ones),
    /// so that every batch comes from one segment: the one [`StreamCursor::checkpoint`] names
    /// after the poll (offline). A batch may then be empty before the stream's end.
    pub fn with_segment_batches(mut self) -> Self {
        self.segment_batches = true;
        self
    }

    /// Look for live processes under `root` instead of `/proc` (tests).
    pub fn with_proc_root(mut self, root: PathBuf) -> Self {
        self.proc_root = root;
        self
    }

    /// The stream.
    pub fn id(&self) -> &StreamId {
        &self.id
    }

    /// Follow another ring (discovery found a newer one) or none. A followed ring whose file is
    /// gone (unlinked by its process at exit) stays mapped until the next poll has read what it
    /// still holds (see `poll_ring`).
    pub fn set_ring(&mut self, ring: Option<PathBuf>) {
        if ring != self.ring_path {
            let unlinked = ring.is_none()
                && self.ring.as_ref().is_some_and(|r| r.matched == Some(true))
                && self
                    .ring_path
                    .as_ref()
                    .is_some_and(|p| std::fs::metadata(p).is_err());
            self.ring_path = ring;
            if !unlinked {
                self.ring = None;
            }
            self.done_ino = None;
        }
    }

    /// Follow the process' segment directory once it exists. Discovery may find a process'
    /// ring before the plugin created its segment directory (the ring is created first, at
    /// plugin start); a cursor made then must take the directory when it appears, or it reads
    /// the ring alone for its whole life: the records pushed between its last poll and the
    /// ring's unlink at exit never reach it, and none of the stream's segments are offered to
    /// the archive. The disk is read from its start; records the ring delivered already (seq
    /// at or below the last delivered, same epoch) are skipped. A directory once followed is
    /// kept (`None`, or another path, changes nothing).
    pub fn set_seg_dir(&mut self, dir: Option<PathBuf>) {
        if self.seg_dir.is_some() {
            return;
        }
        let Some(dir) = dir else { return };
        tracing::debug!(stream = %self.id, dir = %dir.display(), "segment directory found after the ring");
        self.seg_dir = Some(dir);
        self.dir_seen = None;
        // As for a new cursor: the disk gets DISK_GRACE before a gap in the ring is accepted.
        self.last_disk_progress = Some(Instant::now());
    }

    /// [`StreamCursor::poll_at`] now.
    pub fn poll(&mut self, out: &mut Vec<RawRecord>, max: usize) -> Result<Progress, SourceError> {
        self.poll_at(out, max, Instant::now())
    }

    /// Append up to `max` new records to `out` in seq order; `now` drives staleness.
    pub fn poll_at(
        &mut self,
        out: &mut Vec<RawRecord>,
        max: usize,
        now: Instant,
    ) -> Result<Progress, SourceError> {
        let start = out.len();
        let mut p = Progress::default();
        let caught_up = self.poll_disk(out, max, now)?;
        if caught_up && out.len() - start < max {
            p.from_ring = self.poll_ring(out, max - (out.len() - start), now);
            if out.len() - start < max {
                self.check_abandon(out, now, &mut p);
            }
        }
        p.records = out.len() - start;
        p.more = max > 0 && p.records >= max;
        Ok(p)
    }

    /// Where the cursor stands (see [`CursorCheckpoint`]).
    pub fn checkpoint(&self) -> CursorCheckpoint {
        CursorCheckpoint {
            segment: self.pos_index,
            offset: self.pos_offset,
            segment_done: self.pos_done,
            epoch: self.epoch,
            epoch_key: self.epoch_key,
            last_seq: self.last_seq,
            disk_seq: self.disk_seq,
            acked: self.acked,
        }
    }

    /// Segments that became final and were fully read since the last call, in index order.
    /// Never one offered before by this cursor, never one at or below the acked index.
    pub fn take_sealed(&mut self) -> Vec<SealedSegment> {
        let floor = self.acked.max(self.offered);
        let mut out = Vec::new();
        while let Some((&i, _)) = self.finals.first_key_value() {
            let seg = self.finals.remove(&i).expect("present");
            if floor.is_none_or(|f| i > f) {
                self.offered = Some(i);
                out.push(seg);
            }
        }
        out
    }

    /// The archive stored segment `index` (kept in the checkpoint).
    pub fn ack_sealed(&mut self, index: u64) {
        self.acked = self.acked.max(Some(index));
    }

    /// Counters since creation.
    pub fn stats(&self) -> CursorStats {
        self.stats
    }

    /// The segment files refused by the safety checks, with why (at most
    /// [`listing::MAX_REFUSALS_KEPT`]; [`CursorStats::refused_files`] counts them all).
    pub fn refusals(&self) -> impl Iterator<Item = (&Path, &str)> {
        self.refused.iter().map(|(p, r)| (p.as_path(), r.as_str()))
    }

    /// Whether the stream has a live ring (its process' state is known: the ring ends with it).
    pub fn has_ring(&self) -> bool {
        self.ring_path.is_some()
    }

    /// Whether this cursor ever followed a ring (gone now: its process ended with it).
    pub fn had_ring(&self) -> bool {
        self.ring_seen
    }

    /// No ring to follow, the last segment sealed or abandoned and read, nothing to offer.
    /// Not terminal: a later poll still sees new segments.
    pub fn is_finished(&self) -> bool {
        let ring_over = match &self.ring_path {
            None => true,
            Some(p) => match std::fs::metadata(p) {
                Ok(m) => Some(std::os::unix::fs::MetadataExt::ino(&m)) == self.done_ino,
                Err(_) => true,
            },
        };
        ring_over && self.cur.is_none() && self.finals.is_empty()
    }

    fn deliver(&mut self, raw: RawRecord, out: &mut Vec<RawRecord>, from_ring: bool) {
        let seq = raw.seq();
        let expected = self.last_seq.map_or(0, |l| l + 1);
        self.stats.seq_gaps += seq.saturating_sub(expected);
        self.last_seq = Some(seq);
        self.stats.records += 1;
        if from_ring {
            self.stats.from_ring += 1;
        } else {
            self.stats.from_segments += 1;
        }
        out.push(raw);
    }

    fn new_epoch(&mut self, key: EpochKey) {
        self.epoch += 1;
        self.stats.epochs += 1;
        self.epoch_key = Some(key);
        self.last_seq = None;
        self.disk_seq = None;
        tracing::info!(stream = %self.id, epoch = self.epoch, "plugin runtime restarted: new seq epoch");
    }

    /// Read segments; true when everything on disk now was consumed (`max` not reached).
    fn poll_disk(
        &mut self,
        out: &mut Vec<RawRecord>,
        max: usize,
        now: Instant,
    ) -> Result<bool, SourceError> {
        let Some(dir) = self.seg_dir.clone() else {
            return Ok(true);
        };
        let start = out.len();
        let skipped = (self.stats.corrupt, self.stats.torn_bytes);
        loop {
            if self.cur.is_none() && !self.open_next(&dir, now)? {
                return Ok(true);
            }
            let cur = self.cur.as_mut().expect("opened");
            let index = cur.index;
            let size = cur
                .file
                .metadata()
                .map_err(|source| SourceError::Read {
                    path: seg_path(&dir, index, cur.open),
                    source,
                })?
                .len();
            if size != cur.last_size {
                cur.last_size = size;
                cur.last_change = now;
            }
            let whole = size - size % RECORD_SIZE as u64;
            while self.pos_offset < whole {
                if out.len() - start >= max {
                    return Ok(false);
                }
                let room = (max - (out.len() - start)).saturating_mul(RECORD_SIZE);
                let len = ((whole - self.pos_offset) as usize)
                    .min(READ_CHUNK)
                    .min(room);
                self.read_chunk(&dir, index, len, out, now)?;
            }
            let cur = self.cur.as_mut().expect("opened");
            if cur.open {
                if seg_path(&dir, index, true).exists() {
                    return Ok(true); // the writer may still append
                }
                cur.open = false; // renamed (sealed) or deleted: read to its final size
                continue;
            }
            self.stats.torn_bytes += size - whole;
            let sealed = seg_path(&dir, index, false);
            if sealed.exists() {
                self.finals.insert(index, self.sealed(index, sealed, false));
            }
            self.pos_done = true;
            self.cur = None;
            // A segment that held only corrupt records ends its (empty) batch too, so that
            // what was skipped is known per segment.
            let bad = (self.stats.corrupt, self.stats.torn_bytes) != skipped;
            if self.segment_batches && (out.len() > start || bad) {
                return Ok(false);
            }
        }
    }

    /// Read `len` bytes (whole records) of the current segment at the position and deliver.
    fn read_chunk(
        &mut self,
        dir: &Path,
        index: u64,
        len: usize,
        out: &mut Vec<RawRecord>,
        now: Instant,
    ) -> Result<(), SourceError> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(len, 0);
        let cur = self.cur.as_ref().expect("opened");
        let res = cur.file.read_exact_at(&mut buf, self.pos_offset);
        if let Err(source) = res {
            self.buf = buf;
            return Err(SourceError::Read {
                path: seg_path(dir, index, cur.open),
                source,
            });
        }
        for c in buf.chunks_exact(RECORD_SIZE) {
            self.pos_offset += RECORD_SIZE as u64;
            let raw = RawRecord(c.try_into().expect("record-sized chunk"));
            self.disk_record(raw, out);
        }
        self.last_disk_progress = Some(now);
        self.buf = buf;
        Ok(())
    }

    fn disk_record(&mut self, raw: RawRecord, out: &mut Vec<RawRecord>) {
        if !header_ok(&raw) {
            self.stats.corrupt += 1;
            return;
        }
        let kind = raw.kind_byte();
        if kind == Kind::Segment as u8 {
            return;
        }
        let seq = raw.seq();
        if kind == Kind::ProcStart as u8 {
            let key = epoch_key(&raw);
            if flags(&raw) & FLAG_REPEAT != 0 {
                if self.epoch_key.is_none() {
                    self.epoch_key = key;
                }
                return;
            }
            if seq == 0 {
                if let Some(key) = key {
                    let other = self.epoch_key.is_some_and(|k| k != key);
                    if self.disk_seq.is_some() || other {
                        self.new_epoch(key);
                    } else {
                        self.epoch_key = Some(key);
                    }
                }
            }
        } else if flags(&raw) & FLAG_REPEAT != 0 {
            return;
        }
        if self.disk_seq.is_some_and(|d| seq <= d) {
            if seq == 0 && kind == Kind::Stats as u8 {
                // The plugin's final `stats`, written straight to disk when its ring refused
                // it: it has no seq. Delivered as it is, outside the seq accounting.
                self.stats.records += 1;
                self.stats.from_segments += 1;
                out.push(raw);
                return;
            }
            self.stats.corrupt += 1; // seqs only grow within an epoch on disk
            return;
        }
        self.disk_seq = Some(seq);
        if self.last_seq.is_some_and(|l| seq <= l) {
            return; // delivered from the ring already
        }
        self.deliver(raw, out, false);
    }
}

mod listing;
mod ring;
mod state;
#[cfg(test)]
mod tests;

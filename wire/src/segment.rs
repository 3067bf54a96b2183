//! Segment files (docs/contracts.md "Segments"): `<dir>/seg-NNNNNN.cis`, written as
//! `seg-NNNNNN.cis.open` and renamed when sealed.
//!
//! A segment is records only: first a `segment` record ([`SegmentHeader`]), then, from the second
//! segment a writer opens on, the preamble (`proc_start`, live `comm_init`s) repeated with
//! [`FLAG_REPEAT`], then the stream. The writer never panics and never retries: the first I/O
//! error (ENOSPC included) stops it for good, and every record handed to it afterwards is counted
//! as lost. The `segment` record's `seq` is 0 and repeats keep their original `seq`: readers
//! looking for `seq` gaps skip both. Reading: [`find_segments`] and [`read_segment`] (in `segment/read.rs`).
//!
//! Ownership: every directory the writer creates (`<root>/<job>/<host>/<pid>` and any missing
//! ancestor) is made mode 0700 and every segment file 0600, both forced with `fchmod` so the
//! umask cannot widen them (communicator metadata is for the job's user and the root agent
//! only). The process directory is then opened `O_DIRECTORY|O_NOFOLLOW` and must be ours: a
//! symlink or a directory owned by another user (pre-created in a shared log root) is refused,
//! the writer stops like on an I/O error (counted, [`SegmentWriter::failure`] says why) and
//! never writes there. Files are created, renamed and removed relative to the opened directory.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::record::{Body, RawRecord, Record, SegmentHeader, FLAG_REPEAT, RECORD_SIZE};
use crate::sys;

mod read;
pub use read::{
    decode_segment_bytes, find_segments, parse_segment_name, read_segment, SegmentError,
    SegmentRead, MAX_SEGMENT_FILE_BYTES,
};

/// Segment file format version, in every `segment` record.
pub const SEGMENT_FORMAT: u32 = 1;
/// Default `max_segment_bytes` (`COMMINSIGHT_SEGMENT_BYTES`).
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default `max_segment_age` (`COMMINSIGHT_SEGMENT_SECS`).
pub const DEFAULT_SEGMENT_AGE: Duration = Duration::from_secs(300);
/// Default `retention_bytes` (`COMMINSIGHT_RETENTION_BYTES`).
pub const DEFAULT_RETENTION_BYTES: u64 = 1 << 30;
/// Default `dir` (the plugin passes `<COMMINSIGHT_LOG_DIR>/<job>/<host>/<pid>`).
pub const DEFAULT_DIR: &str = "inspector_logs";
/// `SegmentHeader::source` of streams recorded live (the plugin, the agent's host stream).
pub const SOURCE_LIVE: u8 = 0;
/// Converted from PyTorch NCCL Flight Recorder dumps (`comminsight-agent import flight-recorder`).
pub const SOURCE_FLIGHT_RECORDER: u8 = 1;
/// Converted from Kineto / Chrome JSON traces (`import kineto`).
pub const SOURCE_KINETO: u8 = 2;
/// Converted from NCCL Inspector JSON lines (`import nccl-inspector`).
pub const SOURCE_NCCL_INSPECTOR: u8 = 3;

/// The name of a `SOURCE_*` value (`live`, `flight_recorder`, `kineto`, `nccl_inspector`), or
/// `None` for a value this build does not know.
pub fn source_name(source: u8) -> Option<&'static str> {
    match source {
        SOURCE_LIVE => Some("live"),
        SOURCE_FLIGHT_RECORDER => Some("flight_recorder"),
        SOURCE_KINETO => Some("kineto"),
        SOURCE_NCCL_INSPECTOR => Some("nccl_inspector"),
        _ => None,
    }
}

/// Bytes buffered before they are handed to the OS.
pub const WRITE_BUFFER_BYTES: usize = 64 << 10;

/// Where and how a [`SegmentWriter`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    /// Directory of this process' segments (created, with parents, on first write).
    pub dir: PathBuf,
    /// A segment is sealed before it would exceed this size (it always holds at least one
    /// stream record).
    pub max_segment_bytes: u64,
    /// A segment holding stream records is sealed at this age ([`SegmentWriter::maybe_rotate`]).
    pub max_segment_age: Duration,
    /// After sealing, the oldest sealed segments in `dir` are deleted while their total exceeds this.
    pub retention_bytes: u64,
}

impl Default for SegmentConfig {
    fn default() -> Self {
        SegmentConfig {
            dir: PathBuf::from(DEFAULT_DIR),
            max_segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_segment_age: DEFAULT_SEGMENT_AGE,
            retention_bytes: DEFAULT_RETENTION_BYTES,
        }
    }
}

/// A writer's self-accounting (goes into `stats` records).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Bytes handed to the OS, all segments together.
    pub bytes_written: u64,
    pub segments_sealed: u64,
    /// Sealed segments removed by retention.
    pub segments_deleted: u64,
    /// I/O errors met (the first one that hit a write stops the writer).
    pub io_errors: u64,
    /// Records not written because of an I/O error.
    pub records_lost: u64,
    /// The writer stopped for good after an I/O error.
    pub failed: bool,
}

/// `seg-NNNNNN.cis` (sealed) or `seg-NNNNNN.cis.open`.
pub fn segment_file_name(index: u64, open: bool) -> String {
    if open {
        format!("seg-{index:06}.cis.open")
    } else {
        format!("seg-{index:06}.cis")
    }
}

/// Mode of the directories the writer creates.
pub const SEGMENT_DIR_MODE: u32 = 0o700;
/// Mode of segment files.
pub const SEGMENT_FILE_MODE: u32 = 0o600;

/// The segment currently being written.
struct OpenSegment {
    file: File,
    index: u64,
    /// Bytes in the segment, buffered ones included.
    bytes: u64,
    /// Stream records (not header or preamble) in the segment.
    stream_records: u64,
    opened: Instant,
}

/// Writes a process' record stream into rotating segment files. Owned by one thread (the
/// plugin's drain thread).
pub struct SegmentWriter {
    cfg: SegmentConfig,
    pid: u32,
    /// `SOURCE_*` written in every `segment` record.
    source: u8,
    preamble: Vec<RawRecord>,
    seg: Option<OpenSegment>,
    buf: Vec<u8>,
    /// Next index to create; found by scanning `dir` when the first segment is opened.
    next_index: Option<u64>,
    stats: WriterStats,
    /// Stream records in `buf` (lost if the flush fails).
    pending: u64,
    /// The process directory, opened and checked before the first segment.
    dir: Option<File>,
    /// Why the writer stopped (one line naming the path and the fix).
    failure: Option<String>,
    /// Sealed segments still on disk, oldest first (index, bytes), and their total: listed
    /// once when the first segment opens, then kept as segments are sealed and deleted, so
    /// retention costs nothing per seal (a listing per seal made 10 000 segments quadratic).
    sealed: std::collections::VecDeque<(u64, u64)>,
    sealed_total: u64,
    /// Test hook: simulate ENOSPC once this many bytes have been written.
    #[cfg(test)]
    fail_after_bytes: Option<u64>,
}

impl std::fmt::Debug for SegmentWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentWriter")
            .field("dir", &self.cfg.dir)
            .field("index", &self.seg.as_ref().map(|s| s.index))
            .field("stats", &self.stats)
            .finish()
    }
}

impl SegmentWriter {
    /// A writer for process `pid`. Touches no file until the first record.
    pub fn new(cfg: SegmentConfig, pid: u32) -> SegmentWriter {
        SegmentWriter {
            cfg,
            pid,
            source: SOURCE_LIVE,
            preamble: Vec::new(),
            seg: None,
            buf: Vec::with_capacity(WRITE_BUFFER_BYTES),
            next_index: None,
            sealed: std::collections::VecDeque::new(),
            sealed_total: 0,
            stats: WriterStats::default(),
            pending: 0,
            dir: None,
            failure: None,
            #[cfg(test)]
            fail_after_bytes: None,
        }
    }

    /// Mark every segment this writer opens as converted from another tool's data
    /// (`SOURCE_*`; the importers set it, the plugin leaves [`SOURCE_LIVE`]).
    pub fn set_source(&mut self, source: u8) {
        self.source = source;
    }

    /// Records repeated (with `FLAG_REPEAT`) after the `segment` record of every segment but the
    /// first one this writer opens. Replaces the previous preamble.
    pub fn set_preamble(&mut self, recs: Vec<RawRecord>) {
        self.preamble = recs;
    }

    /// Append records (buffered), rotating by size. After a failure, only counts them as lost.
    pub fn write(&mut self, recs: &[RawRecord]) {
        for (i, rec) in recs.iter().enumerate() {
            let full = self.seg.as_ref().is_some_and(|s| {
                s.stream_records > 0 && s.bytes + RECORD_SIZE as u64 > self.cfg.max_segment_bytes
            });
            if full {
                self.seal();
            }
            if self.seg.is_none() && !self.stats.failed {
                self.open_next();
            }
            if self.stats.failed {
                self.stats.records_lost += (recs.len() - i) as u64;
                return;
            }
            self.pending += 1;
            if let Some(s) = &mut self.seg {
                s.stream_records += 1;
            }
            self.append(rec);
        }
    }

    /// Hand buffered bytes to the OS (`write(2)`; no fsync).
    pub fn flush(&mut self) {
        if self.buf.is_empty() || self.stats.failed {
            return;
        }
        let res = match &mut self.seg {
            Some(s) => {
                #[cfg(test)]
                let res = match self.fail_after_bytes {
                    Some(lim) if self.stats.bytes_written + self.buf.len() as u64 > lim => {
                        Err(io::Error::from_raw_os_error(libc::ENOSPC))
                    }
                    _ => s.file.write_all(&self.buf),
                };
                #[cfg(not(test))]
                let res = s.file.write_all(&self.buf);
                res
            }
            None => Ok(()),
        };
        match res {
            Ok(()) => {
                self.stats.bytes_written += self.buf.len() as u64;
                self.buf.clear();
                self.pending = 0;
            }
            Err(e) => self.fail_with(format!("write failed: {e}")),
        }
    }

    /// Seal the open segment if it holds stream records and is older than `max_segment_age`.
    /// The next segment is opened by the next write, so an idle process leaves no empty files.
    pub fn maybe_rotate(&mut self, now: Instant) {
        let due = self.seg.as_ref().is_some_and(|s| {
            s.stream_records > 0
                && now.saturating_duration_since(s.opened) >= self.cfg.max_segment_age
        });
        if due {
            self.seal();
        }
    }

    /// Flush and rename the open segment to its sealed name, then apply retention.
    /// No-op when no segment is open.
    pub fn seal(&mut self) {
        self.flush();
        let Some(seg) = self.seg.take() else {
            return;
        };
        if self.stats.failed {
            return;
        }
        drop(seg.file);
        let (from, to) = (
            segment_file_name(seg.index, true),
            segment_file_name(seg.index, false),
        );
        let renamed = match &self.dir {
            Some(d) => sys::rename_at(d, &from, &to),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        if let Err(e) = renamed {
            return self.fail_with(format!("renaming {from} failed: {e}"));
        }
        self.stats.segments_sealed += 1;
        self.sealed.push_back((seg.index, seg.bytes));
        self.sealed_total = self.sealed_total.saturating_add(seg.bytes);
        self.apply_retention();
    }

    /// Current counters.
    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// Index of the open segment, if any.
    pub fn current_index(&self) -> Option<u64> {
        self.seg.as_ref().map(|s| s.index)
    }

    /// Why the writer stopped, once it has: one line naming the directory, what failed and the fix.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    fn fail_with(&mut self, what: String) {
        if self.failure.is_none() {
            self.failure = Some(format!(
                "segment directory {}: {what}; segments are not written (check COMMINSIGHT_LOG_DIR)",
                self.cfg.dir.display()
            ));
        }
        self.fail();
    }

    /// The first I/O error: stop for good. Buffered records are lost; the `.open` file is left
    /// as it is (readers ignore a torn tail).
    fn fail(&mut self) {
        self.stats.io_errors += 1;
        self.stats.failed = true;
        self.stats.records_lost += self.pending;
        self.pending = 0;
        self.buf = Vec::new();
        self.seg = None;
    }

    fn append(&mut self, rec: &RawRecord) {
        self.buf.extend_from_slice(&rec.0);
        if let Some(s) = &mut self.seg {
            s.bytes += RECORD_SIZE as u64;
        }
        if self.buf.len() >= WRITE_BUFFER_BYTES {
            self.flush();
        }
    }

    /// Open the next segment and write its `segment` record (and preamble after the first).
    fn open_next(&mut self) {
        let index = match self.next_index {
            Some(i) => i,
            None => {
                match open_own_dir(&self.cfg.dir) {
                    Ok(d) => self.dir = Some(d),
                    Err(what) => return self.fail_with(what),
                }
                match sealed_segments(&self.cfg.dir) {
                    Ok(mut old) => {
                        old.sort_unstable();
                        self.sealed_total = old.iter().map(|(_, len, _)| len).sum();
                        self.sealed = old.iter().map(|(i, len, _)| (*i, *len)).collect();
                    }
                    Err(e) => return self.fail_with(format!("cannot list it: {e}")),
                }
                match highest_index(&self.cfg.dir) {
                    Ok(h) => h.map_or(0, |h| h + 1),
                    Err(e) => return self.fail_with(format!("cannot list it: {e}")),
                }
            }
        };
        let first = self.next_index.is_none();
        let name = segment_file_name(index, true);
        let created = match &self.dir {
            Some(d) => sys::create_excl_at(d, &name, SEGMENT_FILE_MODE),
            None => Err(("openat", io::Error::from(io::ErrorKind::NotFound))),
        };
        let file = match created {
            Ok(f) => f,
            Err((call, e)) => return self.fail_with(format!("{call} {name} failed: {e}")),
        };
        self.next_index = Some(index + 1);
        self.seg = Some(OpenSegment {
            file,
            index,
            bytes: 0,
            stream_records: 0,
            opened: Instant::now(),
        });
        let header = Record::new(Body::Segment(SegmentHeader {
            format: SEGMENT_FORMAT,
            record_size: RECORD_SIZE as u32,
            segment_index: index,
            pid: self.pid,
            source: self.source,
            created_real_ns: realtime_ns(),
            created_mono_ns: sys::monotonic_ns(),
        }))
        .encode();
        self.append(&header);
        if !first {
            for i in 0..self.preamble.len() {
                let rec = repeat_of(&self.preamble[i]);
                self.append(&rec);
            }
        }
    }

    /// Delete the oldest sealed segments while their total exceeds `retention_bytes`.
    fn apply_retention(&mut self) {
        let Some(dir) = &self.dir else { return };
        while self.sealed_total > self.cfg.retention_bytes {
            let Some((index, len)) = self.sealed.pop_front() else {
                break;
            };
            match sys::unlink_at(dir, &segment_file_name(index, false)) {
                Ok(()) => self.stats.segments_deleted += 1,
                // Already gone (an operator, the agent's cleanup): its bytes are gone too.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => {
                    self.stats.io_errors += 1;
                    self.sealed.push_front((index, len));
                    return;
                }
            }
            self.sealed_total = self.sealed_total.saturating_sub(len);
        }
    }
}

impl Drop for SegmentWriter {
    /// Best effort: seal the open segment.
    fn drop(&mut self) {
        self.seal();
    }
}

/// A preamble record as repeated in a segment: `FLAG_REPEAT` or'ed into its header flags.
pub fn repeat_of(rec: &RawRecord) -> RawRecord {
    let mut r = *rec;
    let flags = u16::from_le_bytes([r.0[6], r.0[7]]) | FLAG_REPEAT;
    r.0[6..8].copy_from_slice(&flags.to_le_bytes());
    r
}

/// Create `dir` and its missing ancestors, each mode 0700 (forced with `fchmod`), then open it
/// `O_DIRECTORY|O_NOFOLLOW` and check that it is a directory owned by us. Errors are one line
/// (what was found and the fix), for [`SegmentWriter::failure`].
fn open_own_dir(dir: &Path) -> Result<File, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let missing: Vec<&Path> = dir
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .take_while(|a| {
            matches!(std::fs::symlink_metadata(a), Err(e) if e.kind() == io::ErrorKind::NotFound)
        })
        .collect();
    for a in missing.into_iter().rev() {
        match std::fs::create_dir(a) {
            Ok(()) => {
                let d =
                    sys::open_dir(a).map_err(|e| format!("cannot open {}: {e}", a.display()))?;
                d.set_permissions(std::fs::Permissions::from_mode(SEGMENT_DIR_MODE))
                    .map_err(|e| format!("cannot chmod {}: {e}", a.display()))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", a.display())),
        }
    }
    let refused = |found: String| {
        format!("refused: {found}; remove it (it must be a directory of uid {}) or use another COMMINSIGHT_LOG_DIR", sys::euid())
    };
    let d = match sys::open_dir(dir) {
        Ok(d) => d,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
            return Err(refused("a symbolic link or not a directory".into()));
        }
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let m = d.metadata().map_err(|e| format!("cannot fstat it: {e}"))?;
    if m.uid() != sys::euid() {
        return Err(refused(format!(
            "owned by uid {} (mode {:04o})",
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(d)
}

/// Highest segment index present in `dir` (sealed or open).
fn highest_index(dir: &Path) -> io::Result<Option<u64>> {
    let mut best = None;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if let Some((i, _)) = e.file_name().to_str().and_then(parse_segment_name) {
            best = best.max(Some(i));
        }
    }
    Ok(best)
}

/// (index, length, path) of each sealed segment in `dir`.
fn sealed_segments(dir: &Path) -> io::Result<Vec<(u64, u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if let Some((i, false)) = e.file_name().to_str().and_then(parse_segment_name) {
            out.push((i, e.metadata()?.len(), e.path()));
        }
    }
    Ok(out)
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;

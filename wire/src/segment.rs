//! Segment files (docs/contracts.md "Segments"): `<dir>/seg-NNNNNN.cis`, written as
//! `seg-NNNNNN.cis.open` and renamed when sealed.
//!
//! A segment is records only: first a `segment` record ([`SegmentHeader`]), then, from the second
//! segment a writer opens on, the preamble (`proc_start`, live `comm_init`s) repeated with
//! [`FLAG_REPEAT`], then the stream. The writer never panics and never retries: the first I/O
//! error (ENOSPC included) stops it for good, and every record handed to it afterwards is counted
//! as lost. The `segment` record's `seq` is 0 and repeats keep their original `seq`: readers
//! looking for `seq` gaps skip both. Reading: [`find_segments`] and [`read_segment`] (in `segment/read.rs`).

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
    preamble: Vec<RawRecord>,
    seg: Option<OpenSegment>,
    buf: Vec<u8>,
    /// Next index to create; found by scanning `dir` when the first segment is opened.
    next_index: Option<u64>,
    stats: WriterStats,
    /// Stream records in `buf` (lost if the flush fails).
    pending: u64,
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
            preamble: Vec::new(),
            seg: None,
            buf: Vec::with_capacity(WRITE_BUFFER_BYTES),
            next_index: None,
            stats: WriterStats::default(),
            pending: 0,
            #[cfg(test)]
            fail_after_bytes: None,
        }
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
            Err(_) => self.fail(),
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
        let from = self.cfg.dir.join(segment_file_name(seg.index, true));
        let to = self.cfg.dir.join(segment_file_name(seg.index, false));
        if std::fs::rename(&from, &to).is_err() {
            self.fail();
            return;
        }
        self.stats.segments_sealed += 1;
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
                if std::fs::create_dir_all(&self.cfg.dir).is_err() {
                    return self.fail();
                }
                match highest_index(&self.cfg.dir) {
                    Ok(h) => h.map_or(0, |h| h + 1),
                    Err(_) => return self.fail(),
                }
            }
        };
        let first = self.next_index.is_none();
        let path = self.cfg.dir.join(segment_file_name(index, true));
        let file = match sys::create_excl(&path, 0o644) {
            Ok(f) => f,
            Err(_) => return self.fail(),
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
        let Ok(mut sealed) = sealed_segments(&self.cfg.dir) else {
            self.stats.io_errors += 1;
            return;
        };
        sealed.sort_unstable();
        let mut total: u64 = sealed.iter().map(|(_, len, _)| len).sum();
        for (_, len, path) in sealed {
            if total <= self.cfg.retention_bytes {
                break;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total -= len;
                    self.stats.segments_deleted += 1;
                }
                Err(_) => self.stats.io_errors += 1,
            }
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

//! The archive: every final plugin segment is kept as compressed raw records
//! (`raw/<job>/<host>/<pid>/seg-NNNNNN.cis.zst`) and, optionally, as Parquet
//! (`parquet/job=<job>/host=<host>/hour=<YYYY-MM-DDTHH>/<pid>-seg-NNNNNN.parquet`) for DuckDB,
//! Spark or Trino; [`Archive::enforce_retention`] bounds it and [`Uploader`] copies it to an
//! S3-compatible object store (the local archive is the spool while the store is down).
//!
//! Every file is written atomically (a unique `*.tmp`, fsync, rename, directory fsync) under a
//! deterministic name, so archiving a segment again after a crash overwrites instead of
//! duplicating. The raw file is renamed last, then the segment is appended to
//! `<dir>/archived-index` (`<job>/<host>/<pid> <index>` lines, fsynced), so
//! [`Archive::contains`] stays true after retention removed the files (a restarted source does
//! not archive an old segment again).

mod aws_profile;
mod body_json;
pub mod config;
mod journal;
mod parquet_cols;
mod parquet_file;
mod parquet_row;
mod retention;
mod segment_read;
mod upload;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use comminsight_wire::fsafe;
use comminsight_wire::record::{RawRecord, Record, RECORD_SIZE};

use self::segment_read::{
    for_each_chunk, open_segment_file, raw_encoder, scan_segment, SegmentScan,
};
use crate::stream::{Alignment, StreamId};

pub use self::config::{ArchiveConfig, ObjectStoreConfig};
pub use self::parquet_file::{hour_of_ns, PARQUET_COLUMNS};
pub use self::retention::RetentionReport;
pub use self::upload::{backoff_delay, UploadReport, Uploader, IDLE_SCAN, MULTIPART_BYTES};

/// Directory of the raw archive under the archive root.
pub const RAW_DIR: &str = "raw";
/// Directory of the Parquet archive under the archive root.
pub const PARQUET_DIR: &str = "parquet";
/// File (in the archive root) recording which archived files were uploaded.
pub const UPLOAD_JOURNAL: &str = "upload-journal";
/// File (in the archive root) listing every segment archived, also after retention removed it.
pub const ARCHIVED_INDEX: &str = "archived-index";
/// Suffix of files being written; leftovers of a crashed run are removed by [`Archive::open`].
pub const TMP_SUFFIX: &str = ".tmp";

/// Why archiving failed. Each message names the input and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}; check that the path exists, is writable and the disk has space", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A segment failed the checks every file from a job user's directory must pass.
    #[error("{}: refused ({reason}); the segment is not archived", path.display())]
    Refused { path: PathBuf, reason: String },
    /// A stream id component cannot be used as a path component.
    #[error("stream {id}: {what} {value:?} is not a plain path component; plugin directories must be <job>/<host>/<pid> without '/', '..' or control characters")]
    BadStreamId {
        id: String,
        what: &'static str,
        value: String,
    },
    /// Writing the Parquet file failed.
    #[error("{}: writing Parquet failed: {msg}; set archive.parquet = false to keep raw segments only", path.display())]
    Parquet { path: PathBuf, msg: String },
    /// The object store configuration is unusable.
    #[error("archive.object_store: {0}; fix the [archive.object_store] section")]
    ObjectStore(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One final segment handed to [`Archive::archive_segment`].
#[derive(Clone, Copy, Debug)]
pub struct SegmentInput<'a> {
    /// The process stream the segment belongs to.
    pub id: &'a StreamId,
    /// The segment's index (`seg-NNNNNN`).
    pub index: u64,
    /// The sealed (or abandoned `.open`) segment file.
    pub path: &'a Path,
    /// Records recovered from the ring after a crash, appended after the file's records.
    pub recovered: &'a [RawRecord],
    /// The stream's place on the job timeline (fills `aligned_*_ns` and `clock_err_ns`).
    pub align: Alignment,
    /// The stream's GPU timer values on the job timeline (fills `aligned_gpu_*_ns` and
    /// `gpu_clock_err_ns`); `None` when the process had no GPU-timed operation yet.
    pub gpu_align: Option<Alignment>,
}

/// What [`Archive::archive_segment`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchivedSegment {
    /// The compressed raw segment.
    pub raw_path: PathBuf,
    /// The Parquet file (None when `archive.parquet` is off).
    pub parquet_path: Option<PathBuf>,
    /// Whole records in the raw file (the file's records plus the recovered ones).
    pub records: u64,
    /// Parquet rows: records except the `segment` header, preamble repeats and corrupt ones.
    pub rows: u64,
    /// Records that did not decode (kept in the raw file, skipped in Parquet).
    pub bad_records: u64,
    /// Bytes of a torn tail dropped from the segment (a writer killed mid-write).
    pub torn_bytes: u64,
    /// Size of the compressed raw file.
    pub raw_bytes: u64,
    /// Size of the Parquet file (0 when none).
    pub parquet_bytes: u64,
    /// Uncompressed bytes archived (whole records).
    pub input_bytes: u64,
}

/// Archive counters for the metrics sink; shared by [`Archive`] and [`Uploader`] (all monotonic
/// except the `backlog_*` and `stored_bytes` gauges).
#[derive(Debug, Default)]
pub struct ArchiveStats {
    /// Segments archived (a repeat counts again).
    pub segments: AtomicU64,
    /// Records archived.
    pub records: AtomicU64,
    /// Corrupt records skipped in Parquet.
    pub bad_records: AtomicU64,
    /// Torn-tail bytes dropped.
    pub torn_bytes: AtomicU64,
    /// Bytes written (raw + Parquet files).
    pub bytes_written: AtomicU64,
    /// Segments that failed to archive.
    pub errors: AtomicU64,
    /// Files uploaded to the object store.
    pub uploaded_files: AtomicU64,
    /// Bytes uploaded to the object store.
    pub uploaded_bytes: AtomicU64,
    /// Failed upload attempts.
    pub upload_failures: AtomicU64,
    /// Gauge: archived files waiting for upload (after the last pass).
    pub backlog_files: AtomicU64,
    /// Gauge: bytes waiting for upload (after the last pass).
    pub backlog_bytes: AtomicU64,
    /// Files deleted by retention.
    pub retention_deleted_files: AtomicU64,
    /// Bytes deleted by retention.
    pub retention_deleted_bytes: AtomicU64,
    /// Gauge: bytes in the archive after the last retention pass.
    pub stored_bytes: AtomicU64,
}

/// A plain copy of [`ArchiveStats`] (fields documented there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ArchiveStatsSnapshot {
    pub segments: u64,
    pub records: u64,
    pub bad_records: u64,
    pub torn_bytes: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    pub upload_failures: u64,
    pub backlog_files: u64,
    pub backlog_bytes: u64,
    pub retention_deleted_files: u64,
    pub retention_deleted_bytes: u64,
    pub stored_bytes: u64,
}

impl ArchiveStats {
    /// Current values.
    pub fn snapshot(&self) -> ArchiveStatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ArchiveStatsSnapshot {
            segments: g(&self.segments),
            records: g(&self.records),
            bad_records: g(&self.bad_records),
            torn_bytes: g(&self.torn_bytes),
            bytes_written: g(&self.bytes_written),
            errors: g(&self.errors),
            uploaded_files: g(&self.uploaded_files),
            uploaded_bytes: g(&self.uploaded_bytes),
            upload_failures: g(&self.upload_failures),
            backlog_files: g(&self.backlog_files),
            backlog_bytes: g(&self.backlog_bytes),
            retention_deleted_files: g(&self.retention_deleted_files),
            retention_deleted_bytes: g(&self.retention_deleted_bytes),
            stored_bytes: g(&self.stored_bytes),
        }
    }
}

fn add(a: &AtomicU64, v: u64) {
    a.fetch_add(v, Ordering::Relaxed);
}

/// The local archive (synchronous; call it from a blocking task).
#[derive(Debug)]
pub struct Archive {
    cfg: ArchiveConfig,
    /// Segments archived (from `archived-index`), by "<job>/<host>/<pid>" then index.
    index: std::sync::Mutex<std::collections::HashSet<(String, u64)>>,
    stats: Arc<ArchiveStats>,
}

impl Archive {
    /// Create the archive directories and remove `*.tmp` leftovers of a crashed run.
    pub fn open(cfg: &ArchiveConfig) -> Result<Archive, ArchiveError> {
        for sub in [RAW_DIR, PARQUET_DIR] {
            let d = cfg.dir.join(sub);
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        let mut removed = 0u64;
        for f in retention::list_files(&cfg.dir, true)? {
            if f.path.to_string_lossy().ends_with(TMP_SUFFIX) {
                std::fs::remove_file(&f.path).map_err(io_err(&f.path))?;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(dir = %cfg.dir.display(), removed, "removed unfinished archive files of a previous run");
        }
        Ok(Archive {
            cfg: cfg.clone(),
            index: std::sync::Mutex::new(load_index(&cfg.dir)?),
            stats: Arc::new(ArchiveStats::default()),
        })
    }

    /// The counters (share them with [`Uploader::with_stats`] and the metrics sink).
    pub fn stats(&self) -> Arc<ArchiveStats> {
        self.stats.clone()
    }

    /// The archive root.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// `raw/<job>/<host>/<pid>/seg-NNNNNN.cis.zst` for a segment.
    pub fn raw_path(&self, id: &StreamId, index: u64) -> PathBuf {
        self.cfg
            .dir
            .join(RAW_DIR)
            .join(id.rel_dir())
            .join(format!("seg-{index:06}.cis.zst"))
    }

    /// `parquet/job=<job>/host=<host>/hour=<hour>/<pid>-seg-NNNNNN.parquet` for a segment.
    pub fn parquet_path(&self, id: &StreamId, index: u64, hour: &str) -> PathBuf {
        self.cfg
            .dir
            .join(PARQUET_DIR)
            .join(format!("job={}", id.job))
            .join(format!("host={}", id.host))
            .join(format!("hour={hour}"))
            .join(format!("{}-seg-{index:06}.parquet", id.pid))
    }

    /// Whether the segment was archived (listed in `archived-index`, or its raw file exists),
    /// also when retention removed its files since.
    pub fn contains(&self, id: &StreamId, index: u64) -> bool {
        let listed = self
            .index
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(id.to_string(), index));
        listed || self.raw_path(id, index).is_file()
    }

    /// Append a segment to `archived-index` (fsynced) unless listed already.
    fn mark_archived(&self, id: &StreamId, index: u64) -> Result<(), ArchiveError> {
        let mut set = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let key = (id.to_string(), index);
        if set.contains(&key) {
            return Ok(());
        }
        let path = self.cfg.dir.join(ARCHIVED_INDEX);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        f.write_all(format!("{} {index}\n", key.0).as_bytes())
            .and_then(|()| f.sync_data())
            .map_err(io_err(&path))?;
        set.insert(key);
        Ok(())
    }

    /// Archive one final segment: Parquet (if enabled) then the raw file, each atomically.
    /// A torn tail is dropped and reported; corrupt records are counted and skipped in Parquet.
    pub fn archive_segment(&self, seg: SegmentInput<'_>) -> Result<ArchivedSegment, ArchiveError> {
        let res = self.archive_inner(seg);
        match &res {
            Ok(a) => {
                add(&self.stats.segments, 1);
                add(&self.stats.records, a.records);
                add(&self.stats.bad_records, a.bad_records);
                add(&self.stats.torn_bytes, a.torn_bytes);
                add(&self.stats.bytes_written, a.raw_bytes + a.parquet_bytes);
            }
            Err(_) => add(&self.stats.errors, 1),
        }
        res
    }

    fn archive_inner(&self, seg: SegmentInput<'_>) -> Result<ArchivedSegment, ArchiveError> {
        check_id(seg.id)?;
        let (file, len) = open_segment_file(seg.path)?;
        let whole = len / RECORD_SIZE as u64 * RECORD_SIZE as u64;
        let torn_bytes = len - whole;
        if torn_bytes > 0 {
            tracing::warn!(file = %seg.path.display(), torn_bytes, "segment has a torn tail; dropped from the archive");
        }
        let records = whole / RECORD_SIZE as u64 + seg.recovered.len() as u64;
        let mut out = ArchivedSegment {
            records,
            torn_bytes,
            input_bytes: records * RECORD_SIZE as u64,
            ..Default::default()
        };
        let scan = scan_segment(&file, whole, seg.recovered, seg.path)?;
        if let Some((index, _)) = scan.header.filter(|(i, _)| *i != seg.index) {
            tracing::warn!(file = %seg.path.display(), header = index, index = seg.index, "segment header index differs from the file index");
        }
        let raw_path = self.raw_path(seg.id, seg.index);
        if self.cfg.parquet {
            let hour = if scan.first_time_ns == 0 {
                "unknown".to_string()
            } else {
                parquet_file::hour_of_ns(scan.first_time_ns)
            };
            let path = self.parquet_path(seg.id, seg.index, &hour);
            let (mut raw_bytes, mut counts) = (0, (0, 0));
            let parquet_bytes = write_atomic(&path, |pf| {
                raw_bytes = write_atomic(&raw_path, |rf| {
                    counts = self.write_both(&seg, &file, whole, &scan, rf, pf)?;
                    Ok(())
                })?;
                Ok(())
            })?;
            (out.raw_bytes, out.parquet_bytes) = (raw_bytes, parquet_bytes);
            (out.bad_records, out.rows) = counts;
            out.parquet_path = Some(path);
        } else {
            out.raw_bytes = write_atomic(&raw_path, |rf| {
                let rpath = rf.path.clone();
                let mut enc = raw_encoder(&mut rf.file, &rpath, self.cfg.zstd_level)?;
                for_each_chunk(&file, whole, seg.recovered, seg.path, |b| {
                    enc.write_all(b).map_err(io_err(&rpath))
                })?;
                enc.finish().map_err(io_err(&rpath))?;
                Ok(())
            })?;
        }
        if out.bad_records > 0 {
            tracing::warn!(file = %seg.path.display(), bad_records = out.bad_records, "corrupt records kept in the raw archive, skipped in Parquet");
        }
        out.raw_path = raw_path;
        self.mark_archived(seg.id, seg.index)?;
        tracing::debug!(stream = %seg.id, index = seg.index, records = out.records, rows = out.rows, "segment archived");
        Ok(out)
    }

    /// The second pass with Parquet on: each chunk compressed into the raw file and decoded into
    /// rows. Returns the records that did not decode (kept raw, no row) and the rows written.
    fn write_both(
        &self,
        seg: &SegmentInput<'_>,
        file: &std::fs::File,
        whole: u64,
        scan: &SegmentScan,
        rf: &mut TmpFile,
        pf: &mut TmpFile,
    ) -> Result<(u64, u64), ArchiveError> {
        let pid = seg
            .id
            .pid
            .parse::<i64>()
            .ok()
            .or(scan.header.map(|(_, p)| i64::from(p)));
        let (ppath, rpath) = (pf.path.clone(), rf.path.clone());
        let perr = |e: ::parquet::errors::ParquetError| ArchiveError::Parquet {
            path: ppath.clone(),
            msg: e.to_string(),
        };
        let rows_hint = (whole as usize / RECORD_SIZE).saturating_add(seg.recovered.len());
        let mut pw = parquet_file::ParquetWriter::new(
            &mut pf.file,
            rows_hint,
            pid,
            seg.align,
            seg.gpu_align,
        )
        .map_err(perr)?;
        for r in &scan.comm_inits {
            pw.learn(r);
        }
        let mut enc = raw_encoder(&mut rf.file, &rpath, self.cfg.zstd_level)?;
        let mut bad = 0u64;
        for_each_chunk(file, whole, seg.recovered, seg.path, |b| {
            enc.write_all(b).map_err(io_err(&rpath))?;
            for c in b.chunks_exact(RECORD_SIZE) {
                match Record::decode(&RawRecord(c.try_into().expect("record-sized chunk"))) {
                    Ok(r) => pw.push(&r).map_err(perr)?,
                    Err(_) => bad += 1,
                }
            }
            Ok(())
        })?;
        enc.finish().map_err(io_err(&rpath))?;
        let rows = pw.finish().map_err(perr)?;
        Ok((bad, rows))
    }

    /// Apply `retention_bytes` / `retention_days` at time `now` (see [`RetentionReport`]).
    pub fn enforce_retention(&self, now: std::time::SystemTime) -> RetentionReport {
        let rep = retention::enforce(&self.cfg, now);
        add(&self.stats.retention_deleted_files, rep.deleted_files);
        add(&self.stats.retention_deleted_bytes, rep.deleted_bytes);
        self.stats
            .stored_bytes
            .store(rep.kept_bytes, Ordering::Relaxed);
        rep
    }
}

/// The complete lines of `archived-index` (a torn last line is ignored).
fn load_index(dir: &Path) -> Result<std::collections::HashSet<(String, u64)>, ArchiveError> {
    let path = dir.join(ARCHIVED_INDEX);
    let text = match std::fs::read(&path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err(&path)(e)),
    };
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    Ok(complete
        .lines()
        .filter_map(|l| {
            let (id, idx) = l.rsplit_once(' ')?;
            Some((id.to_string(), idx.parse().ok()?))
        })
        .collect())
}

/// Reject stream ids that would escape or confuse the archive layout.
fn check_id(id: &StreamId) -> Result<(), ArchiveError> {
    for (what, v) in [("job", &id.job), ("host", &id.host), ("pid", &id.pid)] {
        let bad = v.is_empty()
            || v == "."
            || v == ".."
            || v.chars().any(|c| c == '/' || c == '\\' || c.is_control());
        if bad {
            return Err(ArchiveError::BadStreamId {
                id: id.to_string(),
                what,
                value: v.clone(),
            });
        }
    }
    Ok(())
}

/// A temporary file being written by [`write_atomic`].
struct TmpFile {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

/// Write `path` through a unique `*.tmp` sibling: fill, fsync, rename, fsync the directory.
/// Returns the file size. The tmp file is removed on failure.
fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut TmpFile) -> Result<(), ArchiveError>,
) -> Result<u64, ArchiveError> {
    use std::sync::atomic::AtomicU32;
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = path.parent().expect("archive paths have a parent");
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let name = path.file_name().expect("file name").to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.{}-{}{TMP_SUFFIX}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    // Exclusive and never through a link, relative to the directory opened once.
    let d = fsafe::Dir::open(dir).map_err(|e| io_err(dir)(crate::util::fs::to_io(e)))?;
    let tmp_name = tmp.file_name().expect("file name").to_os_string();
    let file = d
        .create_excl(&tmp_name, 0o640)
        .map_err(|e| io_err(&tmp)(crate::util::fs::to_io(e)))?;
    let mut t = TmpFile {
        file: std::io::BufWriter::with_capacity(1 << 20, file),
        path: tmp.clone(),
    };
    let res = (|| {
        fill(&mut t)?;
        let file = t
            .file
            .into_inner()
            .map_err(|e| io_err(&tmp)(e.into_error()))?;
        file.sync_all().map_err(io_err(&tmp))?;
        let size = file.metadata().map_err(io_err(&tmp))?.len();
        drop(file);
        d.rename(&tmp_name, path.file_name().expect("file name"))
            .map_err(|e| io_err(path)(crate::util::fs::to_io(e)))?;
        d.sync().map_err(io_err(dir))?;
        Ok(size)
    })();
    if res.is_err() {
        d.remove(&tmp_name);
    }
    res
}

#[cfg(test)]
mod tests;

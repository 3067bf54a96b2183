//! Bounded retention: the oldest archived files go first (by mtime, i.e. when the segment was
//! archived, then by path) while the archive exceeds `retention_bytes` or they are older than
//! `retention_days`. With the object store enabled, a file not uploaded yet is never deleted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::journal::{version_of, Journal, Version};
use super::{io_err, ArchiveConfig, ArchiveError, PARQUET_DIR, RAW_DIR, TMP_SUFFIX};

/// One archived file.
#[derive(Clone, Debug)]
pub(crate) struct FileEntry {
    pub(crate) path: PathBuf,
    /// Path relative to the archive root, `/`-separated (the object key suffix).
    pub(crate) rel: String,
    pub(crate) mtime: SystemTime,
    pub(crate) version: Version,
}

impl FileEntry {
    pub(crate) fn size(&self) -> u64 {
        self.version.0
    }
}

/// Files under `raw/` and `parquet/` of the archive at `dir`; `*.tmp` files only when
/// `with_tmp`. Sorted by (mtime, path).
pub(crate) fn list_files(dir: &Path, with_tmp: bool) -> Result<Vec<FileEntry>, ArchiveError> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = [RAW_DIR, PARQUET_DIR].iter().map(|s| dir.join(s)).collect();
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(&d)(e)),
        };
        for e in rd {
            let e = e.map_err(io_err(&d))?;
            let path = e.path();
            let ft = e.file_type().map_err(io_err(&path))?;
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            if !ft.is_file() {
                continue;
            }
            if !with_tmp && e.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
                continue;
            }
            let meta = match e.metadata() {
                Ok(m) => m,
                // Removed meanwhile (a concurrent rename or retention).
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(io_err(&path)(err)),
            };
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .iter()
                .map(|c| c.to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push(FileEntry {
                mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                version: version_of(&meta),
                path,
                rel,
            });
        }
    }
    out.sort_by(|a, b| (a.mtime, &a.rel).cmp(&(b.mtime, &b.rel)));
    Ok(out)
}

/// What one retention pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RetentionReport {
    /// Files and bytes deleted by this pass.
    pub deleted_files: u64,
    pub deleted_bytes: u64,
    /// Files and bytes left in the archive.
    pub kept_files: u64,
    pub kept_bytes: u64,
    /// Files that retention would delete but that are not uploaded yet (kept).
    pub waiting_upload_files: u64,
    pub waiting_upload_bytes: u64,
    /// The archive is still above `retention_bytes`.
    pub over_budget: bool,
    /// Files that could not be listed or deleted (each message names the path).
    pub errors: Vec<String>,
}

impl RetentionReport {
    /// A one-line warning when the archive stays over budget, else None.
    pub fn warning(&self) -> Option<String> {
        if !self.over_budget {
            return None;
        }
        Some(if self.waiting_upload_bytes > 0 {
            format!(
                "archive over budget, {} bytes waiting for upload",
                self.waiting_upload_bytes
            )
        } else {
            format!("archive over budget: {} bytes kept", self.kept_bytes)
        })
    }
}

/// One retention pass over the archive of `cfg` at time `now`.
pub(crate) fn enforce(cfg: &ArchiveConfig, now: SystemTime) -> RetentionReport {
    let mut rep = RetentionReport::default();
    let files = match list_files(&cfg.dir, false) {
        Ok(f) => f,
        Err(e) => {
            rep.errors.push(e.to_string());
            return rep;
        }
    };
    let journal = if cfg.object_store.enabled {
        match Journal::load(&cfg.dir) {
            Ok(j) => Some(j),
            Err(e) => {
                // Without the journal nothing counts as uploaded: keep everything.
                rep.errors.push(e.to_string());
                Some(Journal::default())
            }
        }
    } else {
        None
    };
    let cutoff = (cfg.retention_days > 0)
        .then(|| now.checked_sub(Duration::from_secs(cfg.retention_days * 86_400)))
        .flatten();
    let mut total: u64 = files.iter().map(FileEntry::size).sum();
    let mut kept_files = files.len() as u64;
    for f in &files {
        let expired = cutoff.is_some_and(|c| f.mtime < c);
        if !expired && total <= cfg.retention_bytes {
            continue;
        }
        if journal
            .as_ref()
            .is_some_and(|j| !j.is_uploaded(&f.rel, f.version))
        {
            rep.waiting_upload_files += 1;
            rep.waiting_upload_bytes += f.size();
            continue;
        }
        match std::fs::remove_file(&f.path) {
            Ok(()) => {
                rep.deleted_files += 1;
                rep.deleted_bytes += f.size();
                total -= f.size();
                kept_files -= 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                total -= f.size();
                kept_files -= 1;
            }
            Err(e) => rep.errors.push(io_err(&f.path)(e).to_string()),
        }
    }
    rep.kept_files = kept_files;
    rep.kept_bytes = total;
    rep.over_budget = total > cfg.retention_bytes;
    for sub in [RAW_DIR, PARQUET_DIR] {
        prune_empty(&cfg.dir.join(sub), true);
    }
    if let Some(w) = rep.warning() {
        tracing::warn!(dir = %cfg.dir.display(), "{w}");
    }
    for e in &rep.errors {
        tracing::warn!("archive retention: {e}");
    }
    if rep.deleted_files > 0 {
        tracing::info!(
            files = rep.deleted_files,
            bytes = rep.deleted_bytes,
            "archive retention deleted old files"
        );
    }
    rep
}

/// Remove empty directories below `dir` (and `dir` itself unless `keep`); true when `dir` is
/// now gone or empty.
fn prune_empty(dir: &Path, keep: bool) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut empty = true;
    for e in rd.flatten() {
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !(is_dir && prune_empty(&e.path(), false)) {
            empty = false;
        }
    }
    if empty && !keep {
        return std::fs::remove_dir(dir).is_ok();
    }
    empty
}

/// Versions of the archived files by relative path (for journal compaction).
pub(crate) fn versions(files: &[FileEntry]) -> HashMap<String, Version> {
    files.iter().map(|f| (f.rel.clone(), f.version)).collect()
}

//! The upload journal: which archived files are in the object store, crash-safely.
//!
//! `<archive>/upload-journal` holds one line per upload, `<size> <mtime_ns> <relative path>`,
//! appended and fsynced after the store acknowledged the object. A file counts as uploaded
//! while its size and mtime match its latest line (an archive repeat rewrites the file and so
//! uploads it again). Unparsable lines (a torn last line after a crash) are ignored. The journal
//! is compacted (rewritten atomically, dropping lines of deleted files and superseded lines)
//! when most of its lines are dead.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::{ArchiveError, UPLOAD_JOURNAL};

/// Size and mtime (ns since the epoch) identifying one version of a file.
pub(crate) type Version = (u64, u128);

/// The version of a file on disk.
pub(crate) fn version_of(meta: &std::fs::Metadata) -> Version {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    (meta.len(), mtime)
}

/// The journal's content.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    path: PathBuf,
    uploaded: HashMap<String, Version>,
    lines: usize,
}

impl Journal {
    /// Load the journal of the archive at `dir` (empty when absent).
    pub(crate) fn load(dir: &Path) -> Result<Journal, ArchiveError> {
        let path = dir.join(UPLOAD_JOURNAL);
        let mut j = Journal {
            path: path.clone(),
            ..Default::default()
        };
        let text = match std::fs::read(&path) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(j),
            Err(source) => return Err(ArchiveError::Io { path, source }),
        };
        // Only newline-terminated lines are complete.
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        for line in complete.lines() {
            j.lines += 1;
            let mut it = line.splitn(3, ' ');
            let (Some(size), Some(mtime), Some(rel)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if let (Ok(size), Ok(mtime)) = (size.parse(), mtime.parse()) {
                j.uploaded.insert(rel.to_string(), (size, mtime));
            }
        }
        Ok(j)
    }

    /// Whether this version of `rel` was uploaded.
    pub(crate) fn is_uploaded(&self, rel: &str, v: Version) -> bool {
        self.uploaded.get(rel) == Some(&v)
    }

    /// Record an upload durably (append + fsync).
    pub(crate) fn record(&mut self, rel: &str, v: Version) -> Result<(), ArchiveError> {
        let io = |source| ArchiveError::Io {
            path: self.path.clone(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(io)?;
        f.write_all(format!("{} {} {rel}\n", v.0, v.1).as_bytes())
            .map_err(io)?;
        f.sync_data().map_err(io)?;
        self.uploaded.insert(rel.to_string(), v);
        self.lines += 1;
        Ok(())
    }

    /// Rewrite the journal keeping only the entries whose file still exists with the recorded
    /// version (`current`: relative path -> version on disk), when more than half of its lines
    /// are dead.
    pub(crate) fn compact(
        &mut self,
        current: &HashMap<String, Version>,
    ) -> Result<(), ArchiveError> {
        self.uploaded.retain(|rel, v| current.get(rel) == Some(v));
        if self.lines <= 64 || self.lines <= 2 * self.uploaded.len() {
            return Ok(());
        }
        let mut entries: Vec<_> = self.uploaded.iter().collect();
        entries.sort();
        let mut text = String::new();
        for (rel, v) in entries {
            text.push_str(&format!("{} {} {rel}\n", v.0, v.1));
        }
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| ArchiveError::Io { path: p, source }
        };
        crate::util::fs::write_atomic(&self.path, text.as_bytes()).map_err(io(&self.path))?;
        self.lines = self.uploaded.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::tests::TempDir;

    #[test]
    fn journal_survives_reload_and_ignores_a_torn_line() {
        let d = TempDir::new("journal");
        let mut j = Journal::load(d.path()).unwrap();
        assert!(!j.is_uploaded("raw/a", (1, 2)));
        j.record("raw/a b", (10, 20)).unwrap();
        j.record("raw/c", (11, 21)).unwrap();
        j.record("raw/c", (12, 22)).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(d.path().join(UPLOAD_JOURNAL))
            .unwrap();
        f.write_all(b"13 23 raw/torn").unwrap();
        let j = Journal::load(d.path()).unwrap();
        assert!(j.is_uploaded("raw/a b", (10, 20)));
        assert!(!j.is_uploaded("raw/c", (11, 21)));
        assert!(j.is_uploaded("raw/c", (12, 22)));
        assert!(!j.is_uploaded("raw/torn", (13, 23)));
    }

    #[test]
    fn compaction_drops_dead_lines() {
        let d = TempDir::new("journal-compact");
        let mut j = Journal::load(d.path()).unwrap();
        for i in 0..100u64 {
            j.record(&format!("raw/f{i}"), (i, 1)).unwrap();
        }
        let current: HashMap<String, Version> = [("raw/f7".to_string(), (7, 1))].into();
        j.compact(&current).unwrap();
        let text = std::fs::read_to_string(d.path().join(UPLOAD_JOURNAL)).unwrap();
        assert_eq!(text, "7 1 raw/f7\n");
        let j = Journal::load(d.path()).unwrap();
        assert!(j.is_uploaded("raw/f7", (7, 1)));
        assert!(!j.is_uploaded("raw/f8", (8, 1)));
    }
}

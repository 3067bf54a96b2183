//! Persisted host-offset measurements: `<state_dir>/clock/host-offsets.jsonl`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::HostOffset;

/// Measurements kept (the file is compacted to this many lines once it holds 10% more).
pub const MAX_BOOK_LINES: usize = 10_000;

/// Why the clock book could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("{path}: {source}; check that [agent] state_dir is writable by the agent")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The host-offset measurements of this host, oldest first, bounded to [`MAX_BOOK_LINES`].
#[derive(Debug)]
pub struct ClockBook {
    path: PathBuf,
    entries: VecDeque<HostOffset>,
    /// Lines in the file (valid or not).
    file_lines: usize,
}

impl ClockBook {
    /// The book's file under a state directory.
    pub fn file_in(state_dir: &Path) -> PathBuf {
        state_dir.join("clock").join("host-offsets.jsonl")
    }

    /// Load the book (a missing file is empty; unparsable lines are skipped with a warning).
    pub fn open(state_dir: &Path) -> Result<ClockBook, ClockError> {
        let path = Self::file_in(state_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(ClockError::Io { path, source }),
        };
        let mut entries = VecDeque::new();
        let mut file_lines = 0;
        let mut bad = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            file_lines += 1;
            match serde_json::from_str::<HostOffset>(line) {
                Ok(o) => {
                    entries.push_back(o);
                    if entries.len() > MAX_BOOK_LINES {
                        entries.pop_front();
                    }
                }
                Err(_) => bad += 1,
            }
        }
        if bad > 0 {
            tracing::warn!(file = %path.display(), lines = bad, "skipped unreadable clock samples");
        }
        Ok(ClockBook {
            path,
            entries,
            file_lines,
        })
    }

    /// The file behind the book.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append a measurement (one JSON line; the file is compacted when it grows past the bound).
    pub fn append(&mut self, o: HostOffset) -> Result<(), ClockError> {
        let err = |source| ClockError::Io {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        let mut line = serde_json::to_string(&o).map_err(|e| err(e.into()))?;
        line.push('\n');
        self.entries.push_back(o);
        if self.entries.len() > MAX_BOOK_LINES {
            self.entries.pop_front();
        }
        if self.file_lines + 1 > MAX_BOOK_LINES + MAX_BOOK_LINES / 10 {
            return self.compact();
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(err)?;
        f.write_all(line.as_bytes()).map_err(err)?;
        self.file_lines += 1;
        Ok(())
    }

    /// Rewrite the file with the kept entries (temporary file, fsync, rename).
    fn compact(&mut self) -> Result<(), ClockError> {
        let err = |source| ClockError::Io {
            path: self.path.clone(),
            source,
        };
        let mut text = String::new();
        for e in &self.entries {
            text.push_str(&serde_json::to_string(e).map_err(|e| err(e.into()))?);
            text.push('\n');
        }
        let tmp = self.path.with_extension("jsonl.tmp");
        {
            let mut f = std::fs::File::create(&tmp).map_err(err)?;
            f.write_all(text.as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        self.file_lines = self.entries.len();
        Ok(())
    }

    /// The newest measurement.
    pub fn latest(&self) -> Option<&HostOffset> {
        self.entries.back()
    }

    /// Every kept measurement, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &HostOffset> {
        self.entries.iter()
    }

    /// Number of kept measurements.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No measurement yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

//! [`Skipped`]: what an offline command could not use, counted in one place (the input's passes)
//! and reported at the end of every offline command — one line on standard error, and a
//! `skipped` object in its `--json` output.
//!
//! Three kinds: corrupt records (an invalid header on disk, a record that does not decode or is
//! impossible, a partial record at the end of a sealed segment), unreadable files (an open or a
//! read failed) and refused files (a safety check said no: a symlink, a FIFO, a foreign owner).
//! Every pass over the input reports what it met again; a file counts once, with the largest
//! count any pass saw for it, so commands that read the input twice do not count twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::sources::SourceError;

/// Paths kept per kind in a [`Skipped`] (the counts stay exact beyond it).
pub const MAX_PATHS: usize = 100;
/// Paths named in the one-line summary before "and N more".
const LINE_PATHS: usize = 3;

/// A file skipped whole, with why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedFile {
    pub path: PathBuf,
    pub reason: String,
}

/// What was skipped (see the module docs); `--json` writes it as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub corrupt_records: u64,
    pub files_with_corrupt: u64,
    pub unreadable_files: u64,
    pub refused_files: u64,
    /// The first [`MAX_PATHS`] files with corrupt records, with their counts.
    pub corrupt: Vec<CorruptFile>,
    /// The first [`MAX_PATHS`] unreadable files.
    pub unreadable: Vec<SkippedFile>,
    /// The first [`MAX_PATHS`] refused files.
    pub refused: Vec<SkippedFile>,
}

/// A file with corrupt records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CorruptFile {
    pub path: PathBuf,
    pub records: u64,
}

impl Skipped {
    /// Nothing was skipped.
    pub fn is_empty(&self) -> bool {
        self.corrupt_records == 0 && self.unreadable_files == 0 && self.refused_files == 0
    }

    /// "64 corrupt records in 1 file, 2 unreadable files: a (permission denied), b (...)" —
    /// `None` when nothing was skipped.
    pub fn describe(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if self.corrupt_records > 0 {
            parts.push(format!(
                "{} corrupt record{} in {} file{}",
                self.corrupt_records,
                plural(self.corrupt_records),
                self.files_with_corrupt,
                plural(self.files_with_corrupt)
            ));
        }
        for (n, what, files) in [
            (self.unreadable_files, "unreadable", &self.unreadable),
            (self.refused_files, "refused", &self.refused),
        ] {
            if n > 0 {
                parts.push(format!(
                    "{n} {what} file{}: {}",
                    plural(n),
                    name_some(n, files)
                ));
            }
        }
        Some(parts.join(", "))
    }

    /// The line an offline command ends with on standard error, when something was skipped.
    pub fn line(&self) -> Option<String> {
        self.describe().map(|d| format!("skipped {d}"))
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The first few files with their reasons, then "and N more".
fn name_some(n: u64, files: &[SkippedFile]) -> String {
    let mut s: Vec<String> = files
        .iter()
        .take(LINE_PATHS)
        .map(|f| format!("{} ({})", f.path.display(), f.reason))
        .collect();
    let shown = s.len() as u64;
    if n > shown {
        s.push(format!("and {} more", n - shown));
    }
    s.join(", ")
}

/// How a file that could not be used is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileSkip {
    Unreadable,
    Refused,
}

/// Unreadable or refused, from the error of opening or reading a file. A refusal is a safety
/// check saying no: a symlink not followed (`ELOOP`), a path leaving its directory (`EXDEV`),
/// a FIFO or device opened non-blocking (`ENXIO`, `EWOULDBLOCK`), or a check of the opened
/// file (not a regular file, a foreign owner: `InvalidData` / `InvalidInput`). Everything else
/// (permission denied, I/O error) is unreadable.
pub fn classify(e: &std::io::Error) -> FileSkip {
    let refusal_errno = matches!(
        e.raw_os_error(),
        Some(libc::ELOOP | libc::EXDEV | libc::ENXIO | libc::EWOULDBLOCK)
    );
    let refusal_kind = matches!(
        e.kind(),
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
    );
    if refusal_errno || refusal_kind {
        FileSkip::Refused
    } else {
        FileSkip::Unreadable
    }
}

/// The path, kind and reason of a cursor's error.
pub fn of_source_error(e: &SourceError) -> (PathBuf, FileSkip, String) {
    match e {
        SourceError::Read { path, source } => (path.clone(), classify(source), reason(source)),
    }
}

/// An I/O error as a short reason: "permission denied", "too many levels of symbolic links".
pub fn reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = s.split(" (os error").next().unwrap_or(&s).to_string();
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => s,
    }
}

/// What the passes met, per file (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct SkipLog {
    corrupt: BTreeMap<PathBuf, u64>,
    files: BTreeMap<PathBuf, (FileSkip, String)>,
}

impl SkipLog {
    /// `n` corrupt records in `path` (added to what this log holds for it).
    pub fn corrupt(&mut self, path: &Path, n: u64) {
        if n > 0 {
            *self.corrupt.entry(path.to_path_buf()).or_default() += n;
        }
    }

    /// `path` could not be used.
    pub fn file(&mut self, path: &Path, how: FileSkip, reason: String) {
        self.files.insert(path.to_path_buf(), (how, reason));
    }

    /// Another pass's log: a file keeps the largest count seen.
    pub fn merge(&mut self, other: SkipLog) {
        for (p, n) in other.corrupt {
            let e = self.corrupt.entry(p).or_default();
            *e = (*e).max(n);
        }
        self.files.extend(other.files);
    }

    /// The counts and the first paths.
    pub fn summary(&self) -> Skipped {
        let mut s = Skipped {
            corrupt_records: self.corrupt.values().sum(),
            files_with_corrupt: self.corrupt.len() as u64,
            ..Skipped::default()
        };
        s.corrupt = self
            .corrupt
            .iter()
            .take(MAX_PATHS)
            .map(|(p, n)| CorruptFile {
                path: p.clone(),
                records: *n,
            })
            .collect();
        for (path, (how, reason)) in &self.files {
            let (n, list) = match how {
                FileSkip::Unreadable => (&mut s.unreadable_files, &mut s.unreadable),
                FileSkip::Refused => (&mut s.refused_files, &mut s.refused),
            };
            *n += 1;
            if list.len() < MAX_PATHS {
                list.push(SkippedFile {
                    path: path.clone(),
                    reason: reason.clone(),
                });
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_counts_and_a_few_paths() {
        let mut log = SkipLog::default();
        log.corrupt(Path::new("a/seg-000001.cis"), 60);
        log.corrupt(Path::new("a/seg-000001.cis"), 4);
        for i in 0..5 {
            log.file(
                Path::new(&format!("b/seg-00000{i}.cis")),
                FileSkip::Unreadable,
                "permission denied".into(),
            );
        }
        let s = log.summary();
        assert_eq!((s.corrupt_records, s.files_with_corrupt), (64, 1));
        assert_eq!((s.unreadable_files, s.refused_files), (5, 0));
        assert_eq!(
            s.line().unwrap(),
            "skipped 64 corrupt records in 1 file, 5 unreadable files: b/seg-000000.cis (permission denied), b/seg-000001.cis (permission denied), b/seg-000002.cis (permission denied), and 2 more"
        );
        assert_eq!(SkipLog::default().summary().line(), None);
    }

    #[test]
    fn passes_over_the_same_files_count_once() {
        let mut a = SkipLog::default();
        a.corrupt(Path::new("x"), 3);
        let mut b = SkipLog::default();
        b.corrupt(Path::new("x"), 3);
        b.corrupt(Path::new("y"), 1);
        b.file(Path::new("z"), FileSkip::Refused, "symlink".into());
        a.merge(b.clone());
        a.merge(b);
        let s = a.summary();
        assert_eq!((s.corrupt_records, s.files_with_corrupt), (4, 2));
        assert_eq!(s.refused_files, 1);
        assert_eq!(
            s.line().unwrap(),
            "skipped 4 corrupt records in 2 files, 1 refused file: z (symlink)"
        );
    }

    #[test]
    fn open_errors_split_into_unreadable_and_refused() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert_eq!(classify(&e(libc::EACCES)), FileSkip::Unreadable);
        assert_eq!(classify(&e(libc::EIO)), FileSkip::Unreadable);
        assert_eq!(classify(&e(libc::ELOOP)), FileSkip::Refused);
        assert_eq!(classify(&e(libc::ENXIO)), FileSkip::Refused);
        let odd = std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file");
        assert_eq!(classify(&odd), FileSkip::Refused);
        assert_eq!(reason(&e(libc::EACCES)), "permission denied");
    }
}

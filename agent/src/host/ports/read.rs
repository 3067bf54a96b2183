//! Tolerant sysfs readers: every failure becomes a [`ReadError`], never a panic.

use std::fs;
use std::io;
use std::path::Path;

use super::ReadError;

/// Records one failed read of `path`.
pub(super) fn push_error(errors: &mut Vec<ReadError>, path: &Path, error: impl ToString) {
    errors.push(ReadError {
        path: path.to_string_lossy().into_owned(),
        error: error.to_string(),
    });
}

/// The sorted names in directory `path`. A missing directory is an empty set (devices come and
/// go); any other failure is recorded.
pub(super) fn list_dir(path: &Path, errors: &mut Vec<ReadError>) -> Vec<String> {
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            push_error(errors, path, e);
            return Vec::new();
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => match entry.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(name) => push_error(errors, &path.join(name), "file name is not UTF-8"),
            },
            Err(e) => push_error(errors, path, e),
        }
    }
    names.sort();
    names
}

/// The trimmed text of `path`. With `missing_ok`, a missing file is `None` without an error
/// (optional metadata); every other failure is recorded and gives `None`.
pub(super) fn read_text(
    path: &Path,
    missing_ok: bool,
    errors: &mut Vec<ReadError>,
) -> Option<String> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if missing_ok && e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            push_error(errors, path, e);
            return None;
        }
    };
    match String::from_utf8(bytes) {
        Ok(text) => Some(text.trim().to_owned()),
        Err(_) => {
            push_error(errors, path, "content is not UTF-8");
            None
        }
    }
}

/// One decimal counter value from `path`; unreadable or non-numeric content is recorded.
pub(super) fn read_u64(path: &Path, errors: &mut Vec<ReadError>) -> Option<u64> {
    let text = read_text(path, false, errors)?;
    match text.parse::<u64>() {
        Ok(value) => Some(value),
        Err(e) => {
            push_error(
                errors,
                path,
                format!("not a decimal counter ({e}): {text:?}"),
            );
            None
        }
    }
}

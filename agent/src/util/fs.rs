//! File-system helpers shared by the daemon and the offline commands: atomic writes, scratch
//! directories removed on drop, and one bounded directory walker that never follows symbolic
//! links.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `bytes` to `path` atomically and durably: a temporary file beside it, synced, renamed
/// over `path`, and the directory synced (so the rename survives a crash).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// A scratch directory under the system temp dir, unique to this process and moment, removed
/// (with everything in it) when dropped. It is created on first use by whoever writes into it.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// `$TMPDIR/comminsight-<what>-<pid>-<ns>` (not created yet).
    pub fn new(what: &str) -> ScratchDir {
        ScratchDir(std::env::temp_dir().join(format!(
            "comminsight-{what}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        )))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Name of the state directory offline commands keep beside their input (calibration, time
/// index); walkers never descend into it.
pub const STATE_DIR_NAME: &str = ".comminsight";

/// Every regular file at most `max_depth` directory levels below `dir` (0: `dir`'s own files)
/// whose name satisfies `keep`, sorted. Symbolic links are neither followed nor listed,
/// unreadable directories are skipped, and [`STATE_DIR_NAME`] is never entered.
pub fn files_under(dir: &Path, max_depth: u32, keep: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0u32)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(t) = e.file_type() else { continue };
            let name = e.file_name();
            let name = name.to_string_lossy();
            if t.is_dir() {
                if depth < max_depth && name != STATE_DIR_NAME {
                    stack.push((e.path(), depth + 1));
                }
            } else if t.is_file() && keep(&name) {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Every directory named `name` at most `max_depth` levels below `dir` (or `dir` itself), not
/// looking inside the ones found, sorted. Symbolic links are not followed.
pub fn dirs_named(dir: &Path, name: &str, max_depth: u32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0u32)];
    while let Some((d, depth)) = stack.pop() {
        if d.file_name().is_some_and(|n| n == name) {
            out.push(d);
            continue;
        }
        if depth >= max_depth {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walker_lists_files_to_the_depth_and_skips_links_and_state() {
        let s = ScratchDir::new("fs-test");
        let root = s.path();
        for d in ["a/b/c", ".comminsight", "raw/j/h/1"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "top.txt",
            "a/one.txt",
            "a/b/two.txt",
            "a/b/c/three.txt",
            ".comminsight/x.txt",
        ] {
            std::fs::write(root.join(f), b"x").unwrap();
        }
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
        let all = files_under(root, 2, &|n| n.ends_with(".txt"));
        let rel: Vec<String> = all
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(rel, ["a/b/two.txt", "a/one.txt", "top.txt"]);
        assert_eq!(dirs_named(root, "raw", 3), vec![root.join("raw")]);
        assert!(dirs_named(root, "c", 1).is_empty());
        write_atomic(&root.join("w.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(root.join("w.json")).unwrap(), b"{}");
        let kept = root.to_path_buf();
        drop(s);
        assert!(!kept.exists(), "the scratch directory goes with its guard");
    }
}

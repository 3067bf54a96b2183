//! File-system helpers shared by the daemon and the offline commands: atomic writes, scratch
//! directories removed on drop, and one bounded directory walker that never follows symbolic
//! links.

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use comminsight_wire::fsafe;

/// Write `bytes` to `path` atomically and durably: a temporary file beside it, created
/// exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0640, an unpredictable name) in the
/// directory opened once, synced, renamed over `path` relative to that directory (a symbolic
/// link planted at `path` is replaced, never followed), and the directory synced. The
/// directory's own path is trusted (see [`write_state`] for a user-writable place).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_stream(path, &mut |w| w.write_all(bytes))
}

/// [`write_atomic`] of `name` inside the open directory `d`.
pub fn write_atomic_in(d: &fsafe::Dir, name: &OsStr, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(d, name, &mut |w| w.write_all(bytes))
}

/// [`write_atomic`] with the content written by `fill` through a buffer, never held whole in
/// memory (the daemon's state checkpoint can be hundreds of megabytes of JSON under load).
pub fn write_atomic_stream(
    path: &Path,
    fill: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))?;
    let d = fsafe::Dir::open(dir).map_err(to_io)?;
    write_atomic_with(&d, name, fill)
}

fn write_atomic_with(
    d: &fsafe::Dir,
    name: &OsStr,
    fill: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos())
    ));
    let res = (|| {
        let f = d.create_excl(&tmp, 0o640).map_err(to_io)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 16, f);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        d.rename(&tmp, name).map_err(to_io)?;
        d.sync()
    })();
    if res.is_err() {
        d.remove(&tmp);
    }
    res
}

/// An [`fsafe::OpenError`] as an I/O error (a refusal is `PermissionDenied` with its reason).
pub fn to_io(e: fsafe::OpenError) -> std::io::Error {
    match e {
        fsafe::OpenError::Io { source, .. } => source,
        e @ fsafe::OpenError::Refused { .. } => {
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string())
        }
    }
}

/// Largest state file ([`read_state`]) read back: 256 MiB.
pub const MAX_STATE_FILE_BYTES: u64 = 256 << 20;

/// `dir/.comminsight` ([`STATE_DIR_NAME`]), created (0755) when `create` and missing, opened
/// without following a symbolic link, and refused unless this process' user owns it: the
/// directory an offline command analyses may belong to someone else, who must not be able to
/// point the state directory elsewhere. `Ok(None)`: absent and not created.
pub fn state_dir(dir: &Path, create: bool) -> std::io::Result<Option<fsafe::Dir>> {
    let base = fsafe::Dir::open(dir).map_err(to_io)?;
    if create {
        match std::fs::DirBuilder::new()
            .mode(0o755)
            .create(dir.join(STATE_DIR_NAME))
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let d = match base.dir(Path::new(STATE_DIR_NAME)) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(to_io(e)),
    };
    let me = euid();
    if d.owner() != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{}: owned by uid {}, not by this user (uid {me}); remove it to let this command keep its state there",
                d.path().display(),
                d.owner()
            ),
        ));
    }
    Ok(Some(d))
}

/// The state file `dir/.comminsight/<name>`: `Ok(None)` when absent (or the state directory
/// is); refused (an error) when it is a symbolic link, not a regular file, not ours, or larger
/// than [`MAX_STATE_FILE_BYTES`].
pub fn read_state(dir: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let Some(d) = state_dir(dir, false)? else {
        return Ok(None);
    };
    let mut f = match d.file(Path::new(name), fsafe::Owner::Uid(euid())) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(to_io(e)),
    };
    let len = f.metadata()?.len();
    if len > MAX_STATE_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "{}: {len} bytes, more than a state file may have; remove it",
            d.path().join(name).display()
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    (&mut f)
        .take(MAX_STATE_FILE_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Write the state file `dir/.comminsight/<name>` atomically ([`write_atomic_in`]) in a state
/// directory this user owns ([`state_dir`]); returns its path.
pub fn write_state(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let d = state_dir(dir, true)?.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "the state directory vanished")
    })?;
    write_atomic_in(&d, OsStr::new(name), bytes)?;
    Ok(d.path().join(name))
}

/// This process' effective uid.
pub fn euid() -> u32 {
    fsafe::euid()
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

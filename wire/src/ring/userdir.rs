//! Per-user ring directories (docs/contracts.md "Shared-memory ring").
//!
//! The shm directory (`COMMINSIGHT_SHM_DIR`, agent `[sources] shm_dir`, default
//! `/dev/shm/comminsight`) is a shared *parent*, root-owned with mode 01777 like /tmp: whoever
//! finds it missing creates it so ([`ensure_shared_dir`]; the agent at start, a plugin otherwise).
//! Each user's rings and control files live in `<shm_dir>/<uid>/` (decimal effective uid),
//! created by the plugin with mode 0700 and owned by that uid ([`UserDir::open`]). A directory
//! that fails the checks (a symlink, another owner, group or other access: e.g. pre-created by
//! another user to read or feed our rings) is refused, never used or repaired; the plugin then
//! keeps a private ring and says so. Files are created relative to the opened directory
//! (`openat`), so swapping the directory after the check cannot redirect them.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sys;

/// Mode of the shared shm directory.
pub const SHARED_DIR_MODE: u32 = 0o1777;
/// Mode of a per-user directory.
pub const USER_DIR_MODE: u32 = 0o700;

/// Why a per-user ring directory cannot be used. Each names the path, what was found and the fix.
#[derive(Debug)]
pub enum UserDirError {
    /// A system call failed.
    Io {
        call: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The directory (or its parent) exists but fails the ownership checks.
    Refused {
        path: PathBuf,
        found: String,
        fix: String,
    },
}

impl std::fmt::Display for UserDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserDirError::Io { call, path, source } => write!(
                f,
                "ring directory {}: {call} failed: {source}; check that /dev/shm is mounted and writable",
                path.display()
            ),
            UserDirError::Refused { path, found, fix } => write!(
                f,
                "ring directory {} refused: {found}; {fix}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for UserDirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UserDirError::Io { source, .. } => Some(source),
            UserDirError::Refused { .. } => None,
        }
    }
}

/// What kind of file `m` describes, in words (for refusal messages).
pub fn kind_name(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_file() {
        "regular file"
    } else {
        "device"
    }
}

fn describe(m: &Metadata, reason: &str) -> String {
    format!(
        "{}, owner uid {}, mode {:04o}: {reason}",
        kind_name(m),
        m.uid(),
        m.mode() & 0o7777
    )
}

/// What is wrong with the shared shm directory for a process of effective uid `euid` (`None`:
/// nothing). It must be a directory (`meta` from `lstat` or `fstat`: a symlink is refused), owned
/// by root or by `euid`, and sticky if group or others may write it.
pub fn shared_dir_problem(meta: &Metadata, euid: u32) -> Option<String> {
    let mode = meta.mode();
    let reason = if !meta.file_type().is_dir() {
        "not a directory".to_string()
    } else if meta.uid() != 0 && meta.uid() != euid {
        "owned by another user, who could replace its per-user directories".to_string()
    } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        "writable by others but not sticky: anyone may rename or remove its entries".to_string()
    } else {
        return None;
    };
    Some(describe(meta, &reason))
}

/// What is wrong with the per-user directory of `uid` (`None`: nothing): it must be a directory
/// (`meta` from `lstat` or `fstat`: a symlink is refused), owned by `uid`, no group or other
/// access (`mode & 0o077 == 0`).
pub fn user_dir_problem(meta: &Metadata, uid: u32) -> Option<String> {
    let reason = if !meta.file_type().is_dir() {
        "not a directory".to_string()
    } else if meta.uid() != uid {
        format!("owned by uid {}, not by uid {uid}", meta.uid())
    } else if meta.mode() & 0o077 != 0 {
        "group or others have access (need 0700)".to_string()
    } else {
        return None;
    };
    Some(describe(meta, &reason))
}

/// Create the shared shm directory with mode 01777 (forced with `fchmod`, whatever the umask) if
/// nothing exists at `dir`; missing ancestors get default modes. Returns whether it created it.
/// Something already there is left alone (check it with [`shared_dir_problem`]).
pub fn ensure_shared_dir(dir: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(dir) {
        Ok(_) => return Ok(false),
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    }
    let d = sys::open_dir(dir)?;
    d.set_permissions(std::fs::Permissions::from_mode(SHARED_DIR_MODE))?;
    Ok(true)
}

/// This process' checked ring directory `<shm_dir>/<euid>/`, held open: rings are created in it
/// with [`crate::ring::ShmRing::create_in`].
#[derive(Clone, Debug)]
pub struct UserDir {
    dir: Arc<File>,
    path: PathBuf,
}

impl UserDir {
    /// Create (mode 0700; an existing one is fine) and check `<shm_dir>/<euid>/`: the shared
    /// parent is created 01777 if missing and must pass [`shared_dir_problem`], the per-user
    /// directory is opened `O_DIRECTORY|O_NOFOLLOW` and must pass [`user_dir_problem`] (by `fstat`
    /// of the opened directory, so what is checked is what is used).
    pub fn open(shm_dir: &Path) -> Result<UserDir, UserDirError> {
        let io_err = |call: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| UserDirError::Io { call, path, source }
        };
        let euid = sys::euid();
        ensure_shared_dir(shm_dir).map_err(io_err("mkdir", shm_dir))?;
        let parent = match sys::open_dir(shm_dir) {
            Ok(d) => d,
            Err(e) if is_not_a_dir(&e) => {
                return Err(refused_link(
                    shm_dir,
                    "remove it and let the CommInsight agent create the directory",
                ));
            }
            Err(e) => return Err(io_err("open", shm_dir)(e)),
        };
        let pm = parent.metadata().map_err(io_err("fstat", shm_dir))?;
        if let Some(found) = shared_dir_problem(&pm, euid) {
            return Err(UserDirError::Refused {
                path: shm_dir.to_path_buf(),
                found,
                fix: "remove it and let the CommInsight agent create it (root-owned, mode 1777)"
                    .into(),
            });
        }
        let name = euid.to_string();
        let path = shm_dir.join(&name);
        let fix = format!(
            "remove it (rm -rf {}) as its owner or root; the plugin recreates it owned by uid {euid}, mode 0700",
            path.display()
        );
        let created =
            sys::mkdir_at(&parent, &name, USER_DIR_MODE).map_err(io_err("mkdirat", &path))?;
        let dir = match sys::open_dir_at(&parent, &name) {
            Ok(d) => d,
            Err(e) if is_not_a_dir(&e) => return Err(refused_link(&path, &fix)),
            Err(e) => return Err(io_err("openat", &path)(e)),
        };
        if created {
            dir.set_permissions(std::fs::Permissions::from_mode(USER_DIR_MODE))
                .map_err(io_err("fchmod", &path))?;
        }
        let m = dir.metadata().map_err(io_err("fstat", &path))?;
        if let Some(found) = user_dir_problem(&m, euid) {
            return Err(UserDirError::Refused { path, found, fix });
        }
        Ok(UserDir {
            dir: Arc::new(dir),
            path,
        })
    }

    /// `<shm_dir>/<euid>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn handle(&self) -> &Arc<File> {
        &self.dir
    }
}

/// `open(O_DIRECTORY|O_NOFOLLOW)` met a symlink (ELOOP) or a non-directory (ENOTDIR).
fn is_not_a_dir(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR))
}

fn refused_link(path: &Path, fix: &str) -> UserDirError {
    let found = match std::fs::symlink_metadata(path) {
        Ok(m) => describe(&m, "not a directory"),
        Err(_) => "not a directory".into(),
    };
    UserDirError::Refused {
        path: path.to_path_buf(),
        found,
        fix: fix.to_string(),
    }
}

//! Directory-relative file calls (`openat`, `mkdirat`, `renameat`, `unlinkat`) on a directory
//! opened without following symlinks, so a checked directory cannot be swapped for another one
//! between the check and the use. Every name is one path component (no `/`).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The effective user id of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// One path component as a C string: no `/`, no NUL, not `.` or `..`.
fn component(name: &str) -> io::Result<CString> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Open the directory `path` read-only without following a final symlink
/// (`O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC`).
pub(crate) fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn openat(dir: &File, name: &str, flags: libc::c_int, mode: u32) -> io::Result<File> {
    let c = component(name)?;
    // SAFETY: `dir` is an open descriptor for the duration of the call and `c` a NUL-terminated
    // string; openat returns a new descriptor we take sole ownership of below, or -1.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor returned by openat, owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Open the subdirectory `name` of `dir` without following a symlink.
pub(crate) fn open_dir_at(dir: &File, name: &str) -> io::Result<File> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    openat(dir, name, flags, 0)
}

/// Create the subdirectory `name` of `dir` with `mode` (less the umask). `Ok(false)` when
/// something by that name already exists.
pub(crate) fn mkdir_at(dir: &File, name: &str, mode: u32) -> io::Result<bool> {
    let c = component(name)?;
    // SAFETY: `dir` is open for the duration of the call and `c` is NUL-terminated.
    let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::AlreadyExists {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Create `name` in `dir` exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`), read-write, then
/// force its mode with `fchmod` so the umask can neither widen nor narrow it.
pub(crate) fn create_excl_at(
    dir: &File,
    name: &str,
    mode: u32,
) -> Result<File, (&'static str, io::Error)> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let file = openat(dir, name, flags, mode).map_err(|e| ("openat", e))?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| ("fchmod", e))?;
    Ok(file)
}

/// Rename `from` to `to`, both in `dir`.
pub(crate) fn rename_at(dir: &File, from: &str, to: &str) -> io::Result<()> {
    let (f, t) = (component(from)?, component(to)?);
    let fd = dir.as_raw_fd();
    // SAFETY: `dir` is open for the duration of the call; both names are NUL-terminated.
    let rc = unsafe { libc::renameat(fd, f.as_ptr(), fd, t.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Remove the file `name` from `dir`.
pub(crate) fn unlink_at(dir: &File, name: &str) -> io::Result<()> {
    let c = component(name)?;
    // SAFETY: `dir` is open for the duration of the call and `c` is NUL-terminated.
    let rc = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_one_component() {
        for bad in ["", ".", "..", "a/b", "/etc", "a\0b"] {
            assert!(component(bad).is_err(), "{bad:?}");
        }
        assert!(component("j.h.1.ring").is_ok());
    }

    #[test]
    fn calls_work_relative_to_the_directory_and_refuse_symlinks() {
        let t = crate::testutil::TempDir::new("at");
        let d = open_dir(t.path()).unwrap();
        assert!(mkdir_at(&d, "sub", 0o700).unwrap());
        assert!(!mkdir_at(&d, "sub", 0o700).unwrap());
        std::os::unix::fs::symlink(t.path().join("sub"), t.path().join("link")).unwrap();
        assert!(open_dir_at(&d, "link").is_err());
        assert!(open_dir(&t.path().join("link")).is_err());
        let sub = open_dir_at(&d, "sub").unwrap();
        drop(create_excl_at(&sub, "f.open", 0o600).unwrap());
        assert!(create_excl_at(&sub, "f.open", 0o600).is_err());
        rename_at(&sub, "f.open", "f").unwrap();
        let m = std::fs::metadata(t.path().join("sub/f")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o600);
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&m), euid());
        unlink_at(&sub, "f").unwrap();
        assert!(!t.path().join("sub/f").exists());
    }
}

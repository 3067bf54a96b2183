//! Opening files that other users can plant: job users own their segment directories, rings and
//! control files, and can create anything in a world-writable directory. A root reader must not
//! be led by a symbolic link to a file it alone may read, blocked by a FIFO, or fed a file that
//! someone else slipped into a user's directory.
//!
//! The rule, everywhere: the part of a path that configuration or the command line gave is
//! trusted (it may pass through symbolic links an administrator made); below it, no component is
//! a symbolic link (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel has
//! it, else one `openat(O_NOFOLLOW)` per component), every open is non-blocking, and before a
//! byte is read `fstat` says the file is regular and owned by the owner of its directory.
//! Files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` relative to an open directory.
//!
//! This module holds the crate's only `unsafe` outside `sys` (the `openat2`, `openat` and
//! `renameat` calls); each block has its `// SAFETY:` line.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

/// `openat2(2)`: 437 on every architecture Linux numbers with the generic table (x86_64 too).
const SYS_OPENAT2: libc::c_long = 437;

/// The kernel's `struct open_how` (linux/openat2.h); libc's is `non_exhaustive`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Who must own a file for it to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The owner of the directory the file is in (a job user's file in that user's directory).
    OfDir,
    /// Exactly this uid (and the directory's owner must be it too).
    Uid(u32),
}

/// Why a file was not opened: an I/O error, or a safety check refused it.
#[derive(Debug)]
pub enum OpenError {
    Io { path: PathBuf, source: io::Error },
    Refused { path: PathBuf, reason: String },
}

impl OpenError {
    /// The file (or a directory on the way) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, OpenError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
    /// A safety check refused it (as opposed to an I/O error).
    pub fn is_refused(&self) -> bool {
        matches!(self, OpenError::Refused { .. })
    }
    pub fn path(&self) -> &Path {
        match self {
            OpenError::Io { path, .. } | OpenError::Refused { path, .. } => path,
        }
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            OpenError::Refused { path, reason } => {
                write!(f, "{}: refused: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            OpenError::Refused { .. } => None,
        }
    }
}

/// An open directory; everything below it is reached relative to its descriptor.
#[derive(Debug)]
pub struct Dir {
    file: File,
    path: PathBuf,
    uid: u32,
}

fn cstr(path: &Path, s: &OsStr) -> Result<CString, OpenError> {
    CString::new(s.as_bytes()).map_err(|_| OpenError::Refused {
        path: path.to_path_buf(),
        reason: "the name contains a NUL byte".into(),
    })
}

fn last_os_error(path: &Path) -> OpenError {
    let source = io::Error::last_os_error();
    if source.raw_os_error() == Some(libc::ELOOP) {
        return OpenError::Refused {
            path: path.to_path_buf(),
            reason: "a symbolic link (never followed below a configured directory)".into(),
        };
    }
    if source.raw_os_error() == Some(libc::ENOTDIR) {
        return OpenError::Refused {
            path: path.to_path_buf(),
            reason:
                "not a directory (or a symbolic link, never followed below a configured directory)"
                    .into(),
        };
    }
    OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The relative components of `rel`; `..`, `/` and `.` are refused (nothing may climb out).
fn plain_components<'a>(path: &Path, rel: &'a Path) -> Result<Vec<&'a OsStr>, OpenError> {
    rel.components()
        .map(|c| match c {
            Component::Normal(s) => Ok(s),
            _ => Err(OpenError::Refused {
                path: path.to_path_buf(),
                reason: "the relative path climbs out of its directory".into(),
            }),
        })
        .collect()
}

impl Dir {
    /// Open a directory whose path is trusted (configuration, the command line): symbolic
    /// links in it are followed.
    pub fn open(path: &Path) -> Result<Dir, OpenError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags_dir()
            .open(path)
            .map_err(|source| OpenError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Dir::checked(file, path.to_path_buf())
    }

    fn checked(file: File, path: PathBuf) -> Result<Dir, OpenError> {
        let meta = file.metadata().map_err(|source| OpenError::Io {
            path: path.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(OpenError::Refused {
                path,
                reason: "not a directory".into(),
            });
        }
        Ok(Dir {
            file,
            path,
            uid: meta.uid(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's owner (from `fstat` at open).
    pub fn owner(&self) -> u32 {
        self.uid
    }

    /// The mode bits of the directory now (`fstat`).
    pub fn mode(&self) -> io::Result<u32> {
        Ok(self.file.metadata()?.mode() & 0o7777)
    }

    /// `openat2(self, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, or a walk of
    /// `openat(O_NOFOLLOW)` per component where the kernel lacks `openat2`.
    fn open_beneath(&self, rel: &Path, flags: libc::c_int) -> Result<File, OpenError> {
        let full = self.path.join(rel);
        let parts = plain_components(&full, rel)?;
        if parts.is_empty() {
            return Err(OpenError::Refused {
                path: full,
                reason: "an empty relative path".into(),
            });
        }
        let c = cstr(&full, rel.as_os_str())?;
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            mode: 0,
            resolve: libc::RESOLVE_BENEATH
                | libc::RESOLVE_NO_SYMLINKS
                | libc::RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: `c` is a NUL-terminated string and `how` a live `open_how` of the size passed;
        // the kernel reads both during the call only; the returned descriptor is ours.
        let fd = unsafe {
            libc::syscall(
                SYS_OPENAT2,
                self.file.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        #[cfg(test)]
        let fd = if tests::FORCE_WALK.with(std::cell::Cell::get) {
            if fd >= 0 {
                // SAFETY: close the descriptor just opened; the walk below opens its own.
                unsafe { libc::close(fd as libc::c_int) };
            }
            // SAFETY: setting errno, a thread-local, to simulate a kernel without openat2.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        } else {
            fd
        };
        if fd >= 0 {
            // SAFETY: `fd` is a fresh descriptor the kernel just gave us and nothing else owns.
            return Ok(unsafe { File::from_raw_fd(fd as libc::c_int) });
        }
        let err = io::Error::last_os_error().raw_os_error();
        if !matches!(err, Some(libc::ENOSYS | libc::EPERM | libc::E2BIG)) {
            return Err(last_os_error(&full));
        }
        // No openat2 (old kernel, or a seccomp filter): one component at a time.
        let mut at: Option<File> = None;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let f = if last {
                flags
            } else {
                libc::O_RDONLY | libc::O_DIRECTORY
            };
            let name = cstr(&full, part)?;
            let dirfd = at
                .as_ref()
                .map_or(self.file.as_raw_fd(), AsRawFd::as_raw_fd);
            // SAFETY: `dirfd` is an open descriptor we hold for the call and `name` is
            // NUL-terminated; the returned descriptor is ours.
            let fd = unsafe {
                libc::openat(dirfd, name.as_ptr(), f | libc::O_CLOEXEC | libc::O_NOFOLLOW)
            };
            if fd < 0 {
                return Err(last_os_error(&full));
            }
            // SAFETY: a fresh descriptor nothing else owns.
            at = Some(unsafe { File::from_raw_fd(fd) });
        }
        Ok(at.expect("at least one component"))
    }

    /// The directory `rel` below this one, no symbolic link on the way.
    pub fn dir(&self, rel: &Path) -> Result<Dir, OpenError> {
        let f = self.open_beneath(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        Dir::checked(f, self.path.join(rel))
    }

    /// The regular file `rel` below this one, read-only, no symbolic link on the way, opened
    /// non-blocking (a FIFO cannot stall the reader), then checked with `fstat`: a regular
    /// file, owned as `owner` says (`OfDir`: the owner of the directory it is in).
    pub fn file(&self, rel: &Path, owner: Owner) -> Result<File, OpenError> {
        if let (Some(p), Some(name)) = (
            rel.parent().filter(|p| !p.as_os_str().is_empty()),
            rel.file_name(),
        ) {
            // One resolution of the directory, then the file relative to it: nothing can be
            // swapped between the owner check and the open.
            return self.dir(p)?.file(Path::new(name), owner);
        }
        let full = self.path.join(rel);
        let file = self.open_beneath(rel, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
        check_regular(&file, &full, self.uid, owner)?;
        Ok(file)
    }

    /// Create `name` in this directory exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`), write-only,
    /// with exactly `mode` (`fchmod` after the create, so the umask cannot change it).
    pub fn create_excl(&self, name: &OsStr, mode: u32) -> Result<File, OpenError> {
        let full = self.path.join(name);
        if Path::new(name).components().count() != 1 || name == ".." || name == "." {
            return Err(OpenError::Refused {
                path: full,
                reason: "not a plain file name".into(),
            });
        }
        let c = cstr(&full, name)?;
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: `c` is NUL-terminated, the directory descriptor is open for the call; the
        // returned descriptor is ours.
        let fd = unsafe {
            libc::openat(
                self.file.as_raw_fd(),
                c.as_ptr(),
                flags,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(last_os_error(&full));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|source| OpenError::Io { path: full, source })?;
        Ok(file)
    }

    /// `renameat(self/from, self/to)`: replaces `to` (a symbolic link there is replaced, never
    /// followed).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> Result<(), OpenError> {
        let full = self.path.join(to);
        let (a, b) = (cstr(&full, from)?, cstr(&full, to)?);
        let fd = self.file.as_raw_fd();
        // SAFETY: both names are NUL-terminated and the descriptor is open for the call.
        let rc = unsafe { libc::renameat(fd, a.as_ptr(), fd, b.as_ptr()) };
        if rc != 0 {
            return Err(last_os_error(&full));
        }
        Ok(())
    }

    /// `unlinkat(self/name)` (best effort cleanup of a temporary file).
    pub fn remove(&self, name: &OsStr) {
        if let Ok(c) = cstr(&self.path, name) {
            // SAFETY: NUL-terminated name, open descriptor; no memory is retained.
            unsafe { libc::unlinkat(self.file.as_raw_fd(), c.as_ptr(), 0) };
        }
    }

    /// `fsync` the directory (a rename in it survives a crash).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// `fstat` checks of an opened file: regular, owned as `owner` requires given its directory's
/// owner `dir_uid`.
fn check_regular(file: &File, path: &Path, dir_uid: u32, owner: Owner) -> Result<(), OpenError> {
    let meta = file.metadata().map_err(|source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let refuse = |reason: String| {
        Err(OpenError::Refused {
            path: path.to_path_buf(),
            reason,
        })
    };
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return refuse(format!("{what}, not a regular file"));
    }
    let want = match owner {
        Owner::OfDir => dir_uid,
        Owner::Uid(u) if u != dir_uid => {
            return refuse(format!(
                "its directory is owned by uid {dir_uid}, expected uid {u}"
            ))
        }
        Owner::Uid(u) => u,
    };
    if meta.uid() != want {
        return refuse(format!(
            "owned by uid {}, not uid {want} (the owner of its directory)",
            meta.uid()
        ));
    }
    Ok(())
}

/// Open `path` read-only, trusting every component except the last `below` ones (`below = 1`:
/// only the file itself; 4 for `<job>/<host>/<pid>/seg-*.cis` under a log root): those are
/// never symbolic links, the file is regular and owned as `owner` says.
pub fn open_below(path: &Path, below: usize, owner: Owner) -> Result<File, OpenError> {
    let comps: Vec<Component> = path.components().collect();
    let below = below.clamp(1, comps.len().max(1));
    let split = comps.len().saturating_sub(below);
    let base: PathBuf = if split == 0 {
        PathBuf::from(".")
    } else {
        comps[..split].iter().collect()
    };
    let rel: PathBuf = comps[split..].iter().collect();
    // An I/O error names the file asked for; a refusal names the component refused.
    let named = |e: OpenError| match e {
        OpenError::Io { source, .. } => OpenError::Io {
            path: path.to_path_buf(),
            source,
        },
        e => e,
    };
    Dir::open(&base)
        .map_err(named)?
        .file(&rel, owner)
        .map_err(named)
}

/// This process' effective uid.
pub fn euid() -> u32 {
    // SAFETY: `geteuid` has no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// [`open_below`] with `below = 1`: a file whose directory is trusted, owned like it.
pub fn open_untrusted(path: &Path) -> Result<File, OpenError> {
    open_below(path, 1, Owner::OfDir)
}

trait DirFlags {
    fn custom_flags_dir(&mut self) -> &mut Self;
}

impl DirFlags for std::fs::OpenOptions {
    fn custom_flags_dir(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ci-fsafe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("j/h/1")).unwrap();
        d
    }

    thread_local! {
        /// Make `open_beneath` take the per-component walk (a kernel without `openat2`).
        pub(super) static FORCE_WALK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[test]
    fn regular_files_open_and_symlinks_fifos_and_climbing_are_refused() {
        basic_checks("basic");
    }

    #[test]
    fn without_openat2_the_walk_refuses_the_same() {
        FORCE_WALK.with(|f| f.set(true));
        basic_checks("walk");
    }

    fn basic_checks(name: &str) {
        let d = tmp(name);
        std::fs::write(d.join("j/h/1/seg-000000.cis"), b"x").unwrap();
        std::fs::write(d.join("secret"), b"s").unwrap();
        assert!(open_below(&d.join("j/h/1/seg-000000.cis"), 4, Owner::OfDir).is_ok());
        symlink(d.join("secret"), d.join("j/h/1/seg-000001.cis")).unwrap();
        let e = open_below(&d.join("j/h/1/seg-000001.cis"), 4, Owner::OfDir).unwrap_err();
        assert!(e.is_refused(), "{e}");
        // A symlinked directory on the way is refused too.
        symlink(d.join("j/h/1"), d.join("j/h/2")).unwrap();
        let e = open_below(&d.join("j/h/2/seg-000000.cis"), 4, Owner::OfDir).unwrap_err();
        assert!(e.is_refused(), "{e}");
        // ... but above the trusted depth it is the administrator's business.
        assert!(open_below(&d.join("j/h/2/seg-000000.cis"), 1, Owner::OfDir).is_ok());
        let fifo = d.join("j/h/1/seg-000002.cis");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_untrusted(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = Dir::open(&d)
            .unwrap()
            .file(Path::new("../x"), Owner::OfDir)
            .unwrap_err();
        assert!(e.is_refused());
        assert!(open_untrusted(&d.join("nope")).unwrap_err().is_not_found());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_owned_by_someone_else_than_its_directory_is_refused() {
        let d = tmp("owner");
        let f = d.join("j/h/1/seg-000000.cis");
        std::fs::write(&f, b"x").unwrap();
        // SAFETY: plain syscall on a NUL-terminated path.
        let chowned = unsafe {
            let c = CString::new(f.as_os_str().as_bytes()).unwrap();
            libc::chown(c.as_ptr(), 12345, 12345) == 0
        };
        if chowned {
            let e = open_below(&f, 4, Owner::OfDir).unwrap_err();
            assert!(e.to_string().contains("uid 12345"), "{e}");
        }
        let me = Dir::open(&d).unwrap().owner();
        let e = open_below(&f, 4, Owner::Uid(me.wrapping_add(1))).unwrap_err();
        assert!(e.is_refused());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn create_excl_never_follows_or_replaces_and_rename_replaces_a_link() {
        let d = tmp("create");
        let dir = Dir::open(&d).unwrap();
        std::fs::write(d.join("victim"), b"root's").unwrap();
        symlink(d.join("victim"), d.join("x.tmp")).unwrap();
        assert!(dir.create_excl(OsStr::new("x.tmp"), 0o600).is_err());
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"root's");
        let mut f = dir.create_excl(OsStr::new("y.tmp"), 0o640).unwrap();
        io::Write::write_all(&mut f, b"new").unwrap();
        assert_eq!(
            std::fs::metadata(d.join("y.tmp")).unwrap().mode() & 0o777,
            0o640
        );
        dir.rename(OsStr::new("y.tmp"), OsStr::new("x.tmp"))
            .unwrap();
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"root's");
        assert_eq!(std::fs::read(d.join("x.tmp")).unwrap(), b"new");
        assert!(dir.create_excl(OsStr::new("../z"), 0o600).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

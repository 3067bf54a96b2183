//! The crate's only `unsafe`: file creation flags, `mmap` / `munmap`, and the view of a mapping as
//! a slice of `AtomicU64` words (STYLE.md §7.8).
//!
//! Everything above this module reaches shared memory only through [`Mapping::words`], so every
//! access to bytes another process may write is an atomic 64-bit operation.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

mod at;
mod sigbus;
pub(crate) use at::{create_excl_at, euid, mkdir_at, open_dir, open_dir_at, rename_at, unlink_at};

/// Create `path` exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`), read-write, then force its mode
/// with `fchmod` so the umask can neither widen nor narrow it.
pub(crate) fn create_excl(path: &Path, mode: u32) -> Result<File, (&'static str, io::Error)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true) // O_CREAT | O_EXCL; std adds O_CLOEXEC
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ("open", e))?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| ("fchmod", e))?;
    Ok(file)
}

/// Size `file` to `len` bytes and reserve its blocks, so that a full tmpfs fails here with
/// `ENOSPC` instead of raising `SIGBUS` in a producer touching a page later.
pub(crate) fn size_and_reserve(file: &File, len: u64) -> Result<(), (&'static str, io::Error)> {
    file.set_len(len).map_err(|e| ("ftruncate", e))?;
    let off_len = libc::off_t::try_from(len).map_err(|_| {
        (
            "posix_fallocate",
            io::Error::from(io::ErrorKind::InvalidInput),
        )
    })?;
    // SAFETY: plain syscall on a file descriptor we own for the duration of the call; no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, off_len) };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate support: the size is set, pages come on demand.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(("posix_fallocate", io::Error::from_raw_os_error(e))),
    }
}

/// A memory mapping, unmapped on drop. Its length is a multiple of 8 and it is page aligned.
pub(crate) struct Mapping {
    ptr: NonNull<AtomicU64>,
    len: usize,
    /// Set for a mapping of a file another user may truncate ([`Mapping::shared_untrusted`]).
    guard: Option<sigbus::Guard>,
}

// SAFETY: the mapping is plain memory owned by this value; all access goes through `&[AtomicU64]`,
// which is itself Send + Sync, and the pointer is only freed in `Drop`.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access is only ever through atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `MAP_SHARED` mapping of the first `len` bytes of `file`, writable or read-only.
    pub(crate) fn shared(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        Self::map(len, prot, libc::MAP_SHARED, file.as_raw_fd())
    }

    /// Read-only `MAP_SHARED` mapping of the first `len` bytes of a file its owner may truncate
    /// while it is mapped: a page past the file's end reads as zeros instead of raising `SIGBUS`
    /// ([`sigbus`]), and [`Mapping::faults`] counts such pages.
    pub(crate) fn shared_untrusted(file: &File, len: usize) -> io::Result<Mapping> {
        let mut m = Self::map(len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd())?;
        m.guard = Some(sigbus::Guard::register(m.ptr.as_ptr() as usize, len)?);
        Ok(m)
    }

    /// Pages of a [`Mapping::shared_untrusted`] mapping found past the file's end (truncated
    /// by its owner) so far; 0 for other mappings.
    pub(crate) fn faults(&self) -> usize {
        self.guard.as_ref().map_or(0, sigbus::Guard::faults)
    }

    /// Anonymous private read-write mapping (zero-filled).
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        Self::map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
        )
    }

    fn map(
        len: usize,
        prot: libc::c_int,
        flags: libc::c_int,
        fd: libc::c_int,
    ) -> io::Result<Mapping> {
        if len == 0 || len & 7 != 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL), so it aliases no Rust object;
        // `fd` is either -1 (anonymous) or a descriptor borrowed for the duration of the call.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<AtomicU64>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Mapping {
            ptr,
            len,
            guard: None,
        })
    }

    /// The mapping as 64-bit atomic words.
    ///
    /// A read-only mapping must only be read with `Ordering::Relaxed` loads (Rust allows small
    /// relaxed atomic loads on read-only memory); callers add fences for ordering.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is page aligned (so aligned for AtomicU64), `len` bytes are mapped for as
        // long as `self` lives, `len` is a multiple of 8, any bit pattern is a valid u64, and every
        // access, by this or another process, is atomic (interior mutability through AtomicU64).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len / 8) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unregistered before the range is unmapped (and possibly reused by another mapping).
        self.guard = None;
        // SAFETY: `ptr`/`len` are exactly what mmap returned; no reference from `words()` can
        // outlive `self`, so nothing uses the range after this.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (0 if the clock cannot be read).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// This process' id.
pub(crate) fn pid() -> u32 {
    std::process::id()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn anonymous_mapping_is_zeroed_and_writable() {
        let m = Mapping::anonymous(8192).unwrap();
        assert_eq!(m.words().len(), 1024);
        assert!(m.words().iter().all(|w| w.load(Ordering::Relaxed) == 0));
        m.words()[1023].store(7, Ordering::Relaxed);
        assert_eq!(m.words()[1023].load(Ordering::Relaxed), 7);
    }

    #[test]
    fn zero_or_unaligned_length_is_rejected() {
        assert!(Mapping::anonymous(0).is_err());
        assert!(Mapping::anonymous(12).is_err());
    }
}

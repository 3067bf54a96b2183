//! The few raw calls the plugin makes (clock, pid, host name, C strings, NCCL's logger, library
//! pinning, atexit, zeroed slab memory). Everything `unsafe` outside the ABI arms lives here.

use core::ffi::{c_char, c_int, c_void};

use crate::abi::{LogFn, SUBSYS_PROFILE};

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes it.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC, ns.
#[inline]
pub fn mono_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME, ns.
pub fn real_ns() -> u64 {
    clock(libc::CLOCK_REALTIME)
}

/// This process' id.
pub fn pid() -> u32 {
    std::process::id()
}

/// This process' effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// `gethostname()`, or "unknown-host".
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for 255 writable bytes and stays NUL-terminated (last byte 0).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast::<c_char>(), buf.len() - 1) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(0);
    if n == 0 {
        return "unknown-host".into();
    }
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The bytes of a C string NCCL handed us, at most `max` bytes, without the NUL; empty for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string (or at least `max` readable bytes) that stays
/// valid for `'a`.
#[inline]
pub unsafe fn cstr_bytes<'a>(p: *const c_char, max: usize) -> &'a [u8] {
    if p.is_null() {
        return &[];
    }
    let mut n = 0;
    // SAFETY: the caller guarantees the bytes up to the NUL (or `max`) are readable.
    while n < max && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: the `n` bytes just scanned are readable and live for `'a` (caller's contract).
    unsafe { core::slice::from_raw_parts(p.cast::<u8>(), n) }
}

/// Log one line through NCCL's logger (`"%s"` format, subsystem NCCL_PROFILE). No logger: nothing.
pub fn log(logfn: Option<LogFn>, level: c_int, msg: &str) {
    let Some(f) = logfn else { return };
    let mut bytes: Vec<u8> = msg.bytes().filter(|&b| b != 0).collect();
    bytes.push(0);
    // SAFETY: NCCL's logger is a C-variadic function taking (level, flags, file, line, fmt, ...);
    // we pass the fixed format "%s" and exactly one NUL-terminated string for it, and a static
    // file name. All pointers are valid for the duration of the call.
    unsafe {
        f(
            level,
            SUBSYS_PROFILE,
            c"comminsight".as_ptr(),
            0,
            c"%s".as_ptr(),
            bytes.as_ptr().cast::<c_char>(),
        );
    }
}

/// Pin the shared object containing `addr` (RTLD_NODELETE), so NCCL's `dlclose` after the last
/// communicator leaves our code, statics and atexit handler mapped. Returns whether it worked.
pub fn pin_library(addr: usize) -> bool {
    let addr = addr as *const c_void;
    let mut info = libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    // SAFETY: `info` is a valid out-parameter; dladdr only looks the address up, never reads it.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: `dli_fname` is the NUL-terminated path of an object that is loaded (it contains
    // `addr`); RTLD_NOLOAD never loads anything new, it only adds NODELETE to the existing one.
    let h = unsafe {
        libc::dlopen(
            info.dli_fname,
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    };
    !h.is_null()
}

/// Register an exit handler (`atexit`). Returns whether it was accepted.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain `extern "C" fn()` that never unwinds (its body catches panics) and
    // lives as long as this object, which is pinned before registration.
    unsafe { libc::atexit(f) == 0 }
}

/// Marker: the all-zero bit pattern is a valid value (atomics, integers, arrays of them).
///
/// # Safety
/// Implement only for types whose every field is valid when zeroed.
pub unsafe trait Zeroable: Sized {}

/// `n` zeroed `T`s in memory of their own: an anonymous private mapping, whose pages the kernel
/// supplies zeroed on first touch (untouched slots cost no memory; `calloc` cannot promise that
/// for the 64-byte alignment of the op slots, where the allocator falls back to `memset`), or, if
/// `mmap` fails, a zeroed heap allocation. Unmapped / freed on drop.
pub struct ZeroedSlice<T> {
    ptr: core::ptr::NonNull<T>,
    len: usize,
    /// Bytes mapped (`munmap` on drop); 0 = heap (or empty).
    mapped: usize,
}

// SAFETY: a `ZeroedSlice<T>` owns its `T`s exactly like a `Box<[T]>` does.
unsafe impl<T: Send> Send for ZeroedSlice<T> {}
// SAFETY: shared access only hands out `&[T]`, as `Box<[T]>` does.
unsafe impl<T: Sync> Sync for ZeroedSlice<T> {}

impl<T: Zeroable> ZeroedSlice<T> {
    /// `None` when no memory for `n` `T`s can be had (neither mapped nor from the heap).
    pub fn new(n: usize) -> Option<ZeroedSlice<T>> {
        let layout = std::alloc::Layout::array::<T>(n).ok()?;
        if layout.size() == 0 {
            return Some(ZeroedSlice {
                ptr: core::ptr::NonNull::dangling(),
                len: n,
                mapped: 0,
            });
        }
        let page = 4096;
        if layout.align() <= page {
            let bytes = layout.size().checked_add(page - 1)? & !(page - 1);
            // SAFETY: a fresh anonymous private mapping at an address of the kernel's choosing:
            // no existing memory is affected. The result is checked for MAP_FAILED below.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                if let Some(ptr) = core::ptr::NonNull::new(p.cast::<T>()) {
                    return Some(ZeroedSlice {
                        ptr,
                        len: n,
                        mapped: bytes,
                    });
                }
            }
        }
        ZeroedSlice::heap(n, layout)
    }

    /// The fallback: a zeroed heap block (`layout` = `Layout::array::<T>(n)`, non-zero size).
    fn heap(n: usize, layout: std::alloc::Layout) -> Option<ZeroedSlice<T>> {
        debug_assert!(layout.size() != 0 && Ok(layout) == std::alloc::Layout::array::<T>(n));
        // SAFETY: `layout` has a non-zero size (both callers check it).
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
        Some(ZeroedSlice {
            ptr: core::ptr::NonNull::new(p)?,
            len: n,
            mapped: 0,
        })
    }
}

impl<T> core::ops::Deref for ZeroedSlice<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is valid for `len` properly aligned `T`s (page-aligned mapping, or a heap
        // block of `Layout::array::<T>(len)`, or dangling with a zero-sized layout), all
        // initialised (zero is a valid `T`: `Zeroable`), owned by `self` until drop.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for ZeroedSlice<T> {
    fn drop(&mut self) {
        // The `T`s are `Zeroable` plain data (atomics, integers): nothing to drop in place.
        if self.mapped != 0 {
            // SAFETY: exactly the mapping `new` made; no reference into it outlives `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast::<c_void>(), self.mapped) };
        } else if let Ok(layout) = std::alloc::Layout::array::<T>(self.len) {
            if layout.size() != 0 {
                // SAFETY: the heap block `new` allocated with this very layout.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cstr_bytes_stops_at_nul_and_limit_and_accepts_null() {
        let s = c"AllReduce";
        // SAFETY: a static C string.
        assert_eq!(unsafe { cstr_bytes(s.as_ptr(), 64) }, b"AllReduce");
        // SAFETY: as above; the limit cuts before the NUL.
        assert_eq!(unsafe { cstr_bytes(s.as_ptr(), 3) }, b"All");
        // SAFETY: NULL is accepted.
        assert_eq!(unsafe { cstr_bytes(core::ptr::null(), 8) }, b"");
    }

    #[test]
    fn zeroed_slices_are_zero_writable_and_lazily_backed() {
        use std::sync::atomic::{AtomicU64, Ordering};
        #[repr(C, align(64))]
        struct Line([AtomicU64; 8]);
        // SAFETY: atomics are valid when zeroed.
        unsafe impl Zeroable for Line {}
        let rss = || -> u64 {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap();
            s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
        };
        let n = 1 << 18; // 16 MiB of 64-byte-aligned lines
        let before = rss();
        let z = ZeroedSlice::<Line>::new(n).unwrap();
        let after = rss();
        assert_eq!(z.len(), n);
        assert_eq!(z.as_ptr() as usize % 64, 0);
        // Other tests run concurrently: allow them some growth, far below the 16 MiB.
        assert!(after < before + (4 << 20), "{before} -> {after}");
        assert_eq!(z[n - 1].0[7].load(Ordering::Relaxed), 0);
        z[n / 2].0[3].store(7, Ordering::Relaxed);
        assert_eq!(z[n / 2].0[3].load(Ordering::Relaxed), 7);
        drop(z);
        assert_eq!(ZeroedSlice::<Line>::new(0).unwrap().len(), 0);
        // The heap fallback (mmap failed): zeroed, aligned, freed on drop.
        let h =
            ZeroedSlice::<Line>::heap(64, std::alloc::Layout::array::<Line>(64).unwrap()).unwrap();
        assert_eq!(h.as_ptr() as usize % 64, 0);
        assert!(h.iter().all(|l| l.0[5].load(Ordering::Relaxed) == 0));
        h[63].0[0].store(1, Ordering::Relaxed);
        drop(h);
    }

    #[test]
    fn hostname_and_clocks_work() {
        assert!(!hostname().is_empty());
        assert!(mono_ns() > 0 && real_ns() > 0);
    }

    static LOGGED: std::sync::Mutex<Vec<(c_int, core::ffi::c_ulong, String, String)>> =
        std::sync::Mutex::new(Vec::new());

    /// Stands in for NCCL's variadic logger. With the SysV x86-64 convention the first variadic
    /// argument arrives exactly where a sixth fixed pointer argument would.
    extern "C" fn fake_logger(
        level: c_int,
        flags: core::ffi::c_ulong,
        _file: *const c_char,
        _line: c_int,
        fmt: *const c_char,
        arg: *const c_char,
    ) {
        // SAFETY: `sys::log` passes two NUL-terminated strings.
        let (f, a) = unsafe {
            (
                core::ffi::CStr::from_ptr(fmt),
                core::ffi::CStr::from_ptr(arg),
            )
        };
        LOGGED.lock().unwrap().push((
            level,
            flags,
            f.to_string_lossy().into_owned(),
            a.to_string_lossy().into_owned(),
        ));
    }

    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn log_uses_a_fixed_format_and_the_profile_subsystem() {
        // SAFETY: same calling convention for the arguments we pass (see fake_logger).
        let f: LogFn =
            unsafe { core::mem::transmute::<*const (), LogFn>(fake_logger as *const ()) };
        log(Some(f), crate::abi::LOG_WARN, "bad %s value\0 with NUL");
        log(None, crate::abi::LOG_WARN, "dropped silently");
        let got = LOGGED.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![(
                2,
                0x4000,
                "%s".to_string(),
                "bad %s value with NUL".to_string()
            )]
        );
    }
}

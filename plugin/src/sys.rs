//! The few raw calls the plugin makes (clock, pid, host name, C strings, NCCL's logger, library
//! pinning, atexit, zeroed slabs). Everything `unsafe` outside the ABI arms lives here.

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

/// A boxed slice of `n` zeroed `T`, allocated with `calloc` semantics (untouched pages cost no
/// memory). `None` when the allocation fails.
pub fn zeroed_slice<T: Zeroable>(n: usize) -> Option<Box<[T]>> {
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: `layout` has non-zero size (n > 0 and T is not a ZST in our uses; a ZST layout of
    // size 0 is rejected below before use).
    if layout.size() == 0 {
        return None;
    }
    // SAFETY: non-zero-sized layout, as checked above.
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is a fresh allocation of `n` properly aligned `T`s from the global allocator
    // with this exact layout, all zero, which is a valid `T` (Zeroable); Box takes ownership.
    Some(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(p, n)) })
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

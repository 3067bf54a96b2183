//! Finding the real NCCL functions behind ours, and this library's own location.
//!
//! `dlsym(RTLD_NEXT, name)` finds libnccl when it is in the global scope (linked, or `dlopen`ed
//! with `RTLD_GLOBAL`). PyTorch and ctypes load it later with `RTLD_LOCAL`, out of that scope: then
//! every loaded object (`dl_iterate_phdr`) other than this library is reopened with
//! `RTLD_NOLOAD` and asked for the name; the first definition outside this library wins. A hit is
//! cached; a miss is retried at the next call (libnccl may be loaded by then).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A real NCCL function, resolved at its first use.
pub struct RealFn {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl RealFn {
    /// A function named `name`, not resolved yet.
    pub const fn new(name: &'static CStr) -> RealFn {
        RealFn {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The function's name.
    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// Its address, or None when no loaded object other than this library defines it.
    pub fn get(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return Some(a);
        }
        let a = resolve(self.name)?;
        self.addr.store(a, Ordering::Release);
        Some(a)
    }
}

/// Base address and file name of the object holding `addr` (`dladdr`).
fn object_of(addr: usize) -> Option<(usize, Option<PathBuf>)> {
    // SAFETY: Dl_info is plain data; all-zero is a valid value for it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address value and writes `info`, which we own.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return None;
    }
    let name = (!info.dli_fname.is_null()).then(|| {
        // SAFETY: dladdr returned a NUL-terminated name owned by the loader, alive while the
        // object is loaded (this library, or one we are looking at).
        let s = unsafe { CStr::from_ptr(info.dli_fname) };
        PathBuf::from(s.to_string_lossy().into_owned())
    });
    Some((info.dli_fbase as usize, name))
}

fn anchor() {}

/// This library's base address and path.
pub fn self_object() -> Option<(usize, Option<PathBuf>)> {
    object_of(anchor as fn() as usize)
}

unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `Vec<CString>` passed by `loaded_objects`, alive for the walk.
    let out = unsafe { &mut *data.cast::<Vec<CString>>() };
    // SAFETY: the loader hands a valid `dl_phdr_info` for the duration of the callback.
    let name = unsafe { (*info).dlpi_name };
    if !name.is_null() && out.len() < 4096 {
        // SAFETY: `dlpi_name` is a NUL-terminated string owned by the loader.
        let s = unsafe { CStr::from_ptr(name) };
        if !s.is_empty() {
            out.push(s.to_owned());
        }
    }
    0
}

/// Paths of every loaded object (the main program, whose name is empty, left out).
fn loaded_objects() -> Vec<CString> {
    let mut v: Vec<CString> = Vec::new();
    // SAFETY: `collect` matches the callback type, only pushes into `v` (passed as `data`) and
    // does not call back into the loader.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&raw mut v).cast::<c_void>()) };
    v
}

fn resolve(name: &CStr) -> Option<usize> {
    let me = self_object().map(|(b, _)| b);
    let ours = |a: usize| object_of(a).map(|(b, _)| b) == me;
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only reads.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if a != 0 && !ours(a) {
        return Some(a);
    }
    for path in loaded_objects() {
        // SAFETY: RTLD_NOLOAD never loads anything: it returns a handle (one more reference) to
        // an object already loaded, or NULL. `path` is NUL-terminated.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if h.is_null() {
            continue;
        }
        // SAFETY: `h` is a live handle from dlopen; the name is NUL-terminated.
        let a = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        // SAFETY: drops the reference RTLD_NOLOAD added; the object stays loaded (its owner holds it).
        unsafe { libc::dlclose(h) };
        if a != 0 && !ours(a) {
            return Some(a);
        }
    }
    None
}

/// Whether the loader finds `file` by its bare name (`dlopen(file, RTLD_LAZY|RTLD_LOCAL)`); the
/// handle is closed again.
pub fn loader_finds(file: &str) -> bool {
    let Ok(c) = CString::new(file) else {
        return false;
    };
    // SAFETY: a NUL-terminated name; the handle, if any, is closed right away.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if h.is_null() {
        return false;
    }
    // SAFETY: `h` came from dlopen above.
    unsafe { libc::dlclose(h) };
    true
}

/// Read a C string of at most `max` bytes: `Err` says why not (NULL, too long, not UTF-8).
///
/// # Safety
/// `p` is NULL or points to readable bytes up to a NUL or at least `max + 1` bytes.
pub unsafe fn c_str<'a>(p: *const c_char, max: usize) -> Result<&'a str, &'static str> {
    if p.is_null() {
        return Err("NULL");
    }
    let mut n = 0;
    // SAFETY: the caller guarantees the bytes up to the NUL or `max + 1` are readable.
    while unsafe { *p.add(n) } != 0 {
        if n == max {
            return Err("longer than the limit");
        }
        n += 1;
    }
    // SAFETY: the `n` bytes just scanned are readable for `'a` (caller's contract).
    let b = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) };
    std::str::from_utf8(b).map_err(|_| "not UTF-8")
}

//! NCCL-style logging to stderr (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`), and the C-variadic logger
//! (`csrc/logger.c`) handed to profiler plugins as `ncclDebugLogger_t`.

use std::ffi::{c_char, c_int, c_ulong, CStr};
use std::io::Write;
use std::sync::OnceLock;

/// `NCCL_LOG_WARN`.
pub const LEVEL_WARN: c_int = 2;
/// `NCCL_LOG_INFO`.
pub const LEVEL_INFO: c_int = 3;
/// `NCCL_LOG_TRACE`.
pub const LEVEL_TRACE: c_int = 5;

/// `NCCL_INIT`.
pub const SUB_INIT: c_ulong = 0x1;
/// `NCCL_COLL`.
pub const SUB_COLL: c_ulong = 0x2;
/// `NCCL_NET`.
pub const SUB_NET: c_ulong = 0x10;
/// `NCCL_ENV`.
pub const SUB_ENV: c_ulong = 0x80;
/// `NCCL_BOOTSTRAP`.
pub const SUB_BOOTSTRAP: c_ulong = 0x1000;
/// `NCCL_PROFILE`.
pub const SUB_PROFILE: c_ulong = 0x4000;
/// `NCCL_DESTROY`.
pub const SUB_DESTROY: c_ulong = 0x10000;

const SUBSYS_NAMES: &[(&str, c_ulong)] = &[
    ("INIT", 0x1),
    ("COLL", 0x2),
    ("P2P", 0x4),
    ("SHM", 0x8),
    ("NET", 0x10),
    ("GRAPH", 0x20),
    ("TUNING", 0x40),
    ("ENV", 0x80),
    ("ALLOC", 0x100),
    ("CALL", 0x200),
    ("PROXY", 0x400),
    ("NVLS", 0x800),
    ("BOOTSTRAP", 0x1000),
    ("REG", 0x2000),
    ("PROFILE", 0x4000),
    ("RAS", 0x8000),
    ("DESTROY", 0x10000),
    ("ALLOC_HOST", 0x20000),
    ("ALL", !0),
];

struct Settings {
    level: c_int,
    mask: c_ulong,
    prefix: String,
}

/// Parses `NCCL_DEBUG` into a level (0 = none).
pub fn parse_level(v: Option<&str>) -> c_int {
    match v.map(|s| s.to_ascii_uppercase()) {
        Some(s) if s == "VERSION" => 1,
        Some(s) if s == "WARN" => LEVEL_WARN,
        Some(s) if s == "INFO" => LEVEL_INFO,
        Some(s) if s == "ABORT" => 4,
        Some(s) if s == "TRACE" => LEVEL_TRACE,
        _ => 0,
    }
}

/// Parses `NCCL_DEBUG_SUBSYS` (default `INIT,BOOTSTRAP,ENV`; `^X` inverts the list).
pub fn parse_subsys(v: Option<&str>) -> c_ulong {
    let Some(v) = v else {
        return SUB_INIT | SUB_BOOTSTRAP | SUB_ENV;
    };
    let (invert, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let mut mask: c_ulong = 0;
    for tok in list.split(',') {
        let t = tok.trim().to_ascii_uppercase();
        if let Some((_, bit)) = SUBSYS_NAMES.iter().find(|(n, _)| *n == t) {
            mask |= bit;
        }
    }
    if invert {
        !mask
    } else {
        mask
    }
}

fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| {
        let host = crate::env::hostname();
        Settings {
            level: parse_level(std::env::var("NCCL_DEBUG").ok().as_deref()),
            mask: parse_subsys(std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref()),
            prefix: format!("{}:{}", host, std::process::id()),
        }
    })
}

fn tid() -> i64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Writes one line if `level`/`flags` pass the `NCCL_DEBUG` filters.
pub fn log(level: c_int, flags: c_ulong, msg: &str) {
    let s = settings();
    if level > s.level || level <= 0 {
        return;
    }
    if level >= LEVEL_INFO && (flags & s.mask) == 0 {
        return;
    }
    let tag = match level {
        1 => "VERSION",
        LEVEL_WARN => "WARN",
        4 => "ABORT",
        LEVEL_TRACE => "TRACE",
        _ => "INFO",
    };
    let line = format!("{}:{} [0] NCCL {} {}\n", s.prefix, tid(), tag, msg);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

static LAST_ERROR: std::sync::Mutex<[u8; 1024]> = std::sync::Mutex::new([0; 1024]);

/// `WARN(...)`; also remembered for `ncclGetLastError`.
pub fn warn(msg: &str) {
    if let Ok(mut b) = LAST_ERROR.lock() {
        let n = msg.len().min(b.len() - 1);
        b[..n].copy_from_slice(&msg.as_bytes()[..n]);
        b[n] = 0;
    }
    log(LEVEL_WARN, !0, msg);
}

/// `ncclGetLastError`: the last WARN text (a process-wide buffer, as NCCL's).
pub fn last_error() -> *const c_char {
    match LAST_ERROR.lock() {
        // The buffer is a static: the pointer stays valid after the guard is dropped.
        Ok(b) => b.as_ptr().cast(),
        Err(_) => c"".as_ptr(),
    }
}

/// `INFO(flags, ...)`.
pub fn info(flags: c_ulong, msg: &str) {
    log(LEVEL_INFO, flags, msg);
}

/// `ncclDebugLogger_t`: `void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...)`.
/// Rust cannot express the variadic tail; the pointer is passed through as an opaque function address.
pub type DebugLogger = unsafe extern "C" fn();

extern "C" {
    fn nccl_standin_debug_log();
}

/// The logger handed to profiler plugins (the C function in `csrc/logger.c`).
pub fn debug_logger() -> DebugLogger {
    nccl_standin_debug_log
}

/// Called by `csrc/logger.c` with the formatted line.
///
/// # Safety
/// `msg` must be a NUL-terminated string (it is: vsnprintf output).
#[no_mangle]
pub unsafe extern "C" fn nccl_standin_log_line(
    level: c_int,
    flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    msg: *const c_char,
) {
    if msg.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: non-null, NUL-terminated per the caller.
        let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
        log(level, flags, &m);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsys_default_and_inversion() {
        assert_eq!(parse_subsys(None), SUB_INIT | SUB_BOOTSTRAP | SUB_ENV);
        assert_eq!(parse_subsys(Some("PROFILE,init")), SUB_PROFILE | SUB_INIT);
        assert_eq!(parse_subsys(Some("^INIT")) & SUB_INIT, 0);
        assert_ne!(parse_subsys(Some("ALL")) & SUB_PROFILE, 0);
    }

    #[test]
    fn level_names() {
        assert_eq!(parse_level(Some("info")), LEVEL_INFO);
        assert_eq!(parse_level(Some("WARN")), LEVEL_WARN);
        assert_eq!(parse_level(None), 0);
    }
}

//! The link to `libcomminsight-preload.so`: its queued warnings (bad announcements, an unknown
//! `COMMINSIGHT_COMM_ROLE`, ...) are logged through NCCL's logger at each `init`.
//!
//! The shim exports `int comminsight_preload_take_warning(char* buf, int len)`; it is looked up in
//! the global scope (where `LD_PRELOAD` puts it). Without the shim: nothing happens.

use ::core::ffi::{c_char, c_int};

use crate::abi::{LogFn, LOG_WARN};
use crate::sys;

type TakeWarning = unsafe extern "C" fn(*mut c_char, c_int) -> c_int;

/// Most warnings logged per `init` (the shim queues at most 16).
const MAX_PER_INIT: usize = 64;

/// Drain the shim's warnings and log each through `logfn` at WARN. No shim: nothing.
pub fn drain(logfn: Option<LogFn>) {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads.
    let p = unsafe {
        libc::dlsym(
            libc::RTLD_DEFAULT,
            c"comminsight_preload_take_warning".as_ptr(),
        )
    };
    if p.is_null() {
        return;
    }
    // SAFETY: the shim defines this symbol with exactly this C signature.
    let take: TakeWarning = unsafe { ::core::mem::transmute::<*mut libc::c_void, TakeWarning>(p) };
    let mut buf = [0 as c_char; 512];
    for _ in 0..MAX_PER_INIT {
        // SAFETY: `buf` is writable for its whole length.
        let n = unsafe { take(buf.as_mut_ptr(), buf.len() as c_int) };
        if n <= 0 {
            break;
        }
        let n = (n as usize).min(buf.len() - 1);
        // SAFETY: the shim wrote `n` bytes (and a NUL) into `buf`.
        let bytes = unsafe { ::core::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        sys::log(
            logfn,
            LOG_WARN,
            &format!("CommInsight preload: {}", String::from_utf8_lossy(bytes)),
        );
    }
}

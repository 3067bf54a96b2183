//! Name-pointer → code caches for the strings NCCL hands the profiler.

use core::ffi::c_char;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::cstr_bytes;

/// Longest NCCL name string we look at.
const NAME_MAX: usize = 32;
const CACHE_SLOTS: usize = 16;

/// Remembers which code a name *pointer* maps to. NCCL passes the same static literals every
/// time (research/nccl-abi.md §2.2), so after the first op a lookup is one load and a compare
/// instead of a string scan. Entries are `ptr << 8 | code` (pointers above 2^56 bypass it).
pub struct NameCache {
    slots: [AtomicU64; CACHE_SLOTS],
}

impl NameCache {
    pub const fn new() -> NameCache {
        NameCache {
            slots: [const { AtomicU64::new(0) }; CACHE_SLOTS],
        }
    }

    /// The code of the string at `p` in `names` (0 = unknown or NULL): one load and a compare
    /// when `p` was seen before.
    #[inline]
    pub(crate) fn code(&self, p: *const c_char, names: &[&str]) -> u8 {
        let a = p as usize as u64;
        let e = self.slot(a).load(Ordering::Relaxed);
        // A zero entry never matches: NULL (a = 0) and uncacheable pointers take the slow path.
        if e >> 8 == a && a != 0 {
            return e as u8;
        }
        self.code_slow(p, names)
    }

    #[inline]
    fn slot(&self, a: u64) -> &AtomicU64 {
        &self.slots[(a as usize >> 3) % CACHE_SLOTS]
    }

    /// Compare the text with every name; remember the pointer.
    #[cold]
    #[inline(never)]
    fn code_slow(&self, p: *const c_char, names: &[&str]) -> u8 {
        let a = p as usize as u64;
        // SAFETY: NCCL passes static NUL-terminated literals (or NULL) in the active descriptor
        // arm; at most NAME_MAX bytes are read.
        let b = unsafe { cstr_bytes(p, NAME_MAX) };
        let code = names
            .iter()
            .position(|n| n.as_bytes() == b)
            .map_or(0, |i| i as u8);
        if a != 0 && a >> 56 == 0 {
            self.slot(a)
                .store(a << 8 | u64::from(code), Ordering::Relaxed);
        }
        code
    }
}

impl Default for NameCache {
    fn default() -> Self {
        NameCache::new()
    }
}

/// One cache per name table.
#[derive(Default)]
pub struct NameCaches {
    pub func: NameCache,
    pub dtype: NameCache,
    pub algo: NameCache,
    pub proto: NameCache,
}

#[cfg(test)]
mod tests {
    use super::*;
    use comminsight_wire::names::Func;

    #[test]
    fn cached_and_uncached_lookups_agree() {
        let c = NameCache::new();
        for _ in 0..3 {
            assert_eq!(
                c.code(c"AllReduce".as_ptr(), Func::NAMES),
                Func::ALL_REDUCE.0
            );
            assert_eq!(c.code(c"Send".as_ptr(), Func::NAMES), Func::SEND.0);
            assert_eq!(c.code(c"Nope".as_ptr(), Func::NAMES), 0);
            assert_eq!(c.code(core::ptr::null(), Func::NAMES), 0);
        }
        // A different pointer with the same text, and a pointer that reuses a slot.
        let copy = std::ffi::CString::new("AllReduce").unwrap();
        assert_eq!(c.code(copy.as_ptr(), Func::NAMES), Func::ALL_REDUCE.0);
        assert_eq!(
            c.code(c"AllReduce".as_ptr(), Func::NAMES),
            Func::ALL_REDUCE.0
        );
        let other = std::ffi::CString::new("Send").unwrap();
        for _ in 0..2 {
            assert_eq!(c.code(other.as_ptr(), Func::NAMES), Func::SEND.0);
            assert_eq!(c.code(copy.as_ptr(), Func::NAMES), Func::ALL_REDUCE.0);
        }
    }
}

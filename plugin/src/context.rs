//! Per-communicator context (what `init` returns to NCCL as `void* context`).

use core::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// Marks a live context (checked in debug paths; never relied on for safety).
pub const CONTEXT_MAGIC: u64 = 0x434f_4d4d_494e_5349; // "COMMINSI"
/// Longest communicator name kept.
pub const MAX_NAME: usize = 255;

/// One communicator NCCL initialised with us.
pub struct Context {
    pub magic: u64,
    /// Unique per process, never reused (slots record it, finalize sweeps by it).
    pub id: u32,
    pub comm_hash: u64,
    pub rank: i32,
    pub nranks: i32,
    pub nnodes: i32,
    pub abi: u8,
    /// Copy of `commName` taken in `init` (empty when NULL).
    pub name: Vec<u8>,
    /// Coll/P2p operations that got a slot.
    pub ops_started: AtomicU64,
    /// Header flags of every record of this communicator (`FLAG_HCCL` for communicators the
    /// preload's HCCL interposition opened through [`crate::external`]; 0 for NCCL's).
    pub flags: u16,
    p2p: P2pOrdinals,
}

std::thread_local! {
    /// Flags the next `init` on this thread gives its context (set by [`crate::external`]).
    static NEXT_FLAGS: core::cell::Cell<u16> = const { core::cell::Cell::new(0) };
}

/// Run `f` (an `init`) with `flags` as the source flags of the context it makes.
pub fn with_init_flags<T>(flags: u16, f: impl FnOnce() -> T) -> T {
    NEXT_FLAGS.with(|c| c.set(flags));
    let r = f();
    NEXT_FLAGS.with(|c| c.set(0));
    r
}

/// The source flags for a context made now on this thread.
pub fn init_flags() -> u16 {
    NEXT_FLAGS.with(core::cell::Cell::get)
}

impl Context {
    pub fn new(
        id: u32,
        comm_hash: u64,
        rank: i32,
        nranks: i32,
        nnodes: i32,
        abi: u8,
        name: &[u8],
    ) -> Context {
        let name = name[..name.len().min(MAX_NAME)].to_vec();
        Context {
            magic: CONTEXT_MAGIC,
            id,
            comm_hash,
            rank,
            nranks,
            nnodes,
            abi,
            name,
            ops_started: AtomicU64::new(0),
            flags: 0,
            p2p: P2pOrdinals::new(nranks),
        }
    }

    /// The next 0-based ordinal of (peer, func); `u64::MAX` if the table is full.
    #[inline]
    pub fn next_p2p_ordinal(&self, peer: i32, func: u8) -> u64 {
        self.p2p.next(peer, func)
    }

    pub fn into_raw(self: Box<Self>) -> *mut c_void {
        Box::into_raw(self).cast()
    }
}

/// Fixed-size open-addressing table of per-(peer, func) counters, lock-free.
struct P2pOrdinals {
    /// `key + 1` (0 = empty).
    keys: Box<[AtomicU64]>,
    counts: Box<[AtomicU64]>,
}

impl P2pOrdinals {
    fn new(nranks: i32) -> P2pOrdinals {
        // Send and Recv to every peer fit without collisions piling up, capped at 8192 entries.
        let want = (nranks.clamp(1, 2048) as usize * 4)
            .next_power_of_two()
            .max(16);
        P2pOrdinals {
            keys: (0..want).map(|_| AtomicU64::new(0)).collect(),
            counts: (0..want).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn next(&self, peer: i32, func: u8) -> u64 {
        let key = ((u64::from(peer as u32) << 8) | u64::from(func)) + 1;
        let mask = self.keys.len() - 1;
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & mask;
        for _ in 0..self.keys.len() {
            let k = self.keys[i].load(Ordering::Acquire);
            if k == key {
                return self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
            if k == 0 {
                match self.keys[i].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return self.counts[i].fetch_add(1, Ordering::Relaxed),
                    Err(other) if other == key => {
                        return self.counts[i].fetch_add(1, Ordering::Relaxed)
                    }
                    Err(_) => {}
                }
            }
            i = (i + 1) & mask;
        }
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2p_ordinals_count_per_peer_and_func_from_zero() {
        let c = Context::new(1, 7, 0, 4, 1, 6, b"pp");
        let send = 7;
        let recv = 8;
        assert_eq!(c.next_p2p_ordinal(1, send), 0);
        assert_eq!(c.next_p2p_ordinal(1, send), 1);
        assert_eq!(c.next_p2p_ordinal(1, recv), 0);
        assert_eq!(c.next_p2p_ordinal(2, send), 0);
        assert_eq!(c.next_p2p_ordinal(1, send), 2);
        assert_eq!(c.next_p2p_ordinal(-5, send), 0, "odd peers still count");
    }

    #[test]
    fn p2p_table_full_gives_unknown_not_a_hang() {
        let c = Context::new(1, 7, 0, 1, 1, 6, b"");
        let mut unknown = 0;
        for peer in 0..100 {
            if c.next_p2p_ordinal(peer, 7) == u64::MAX {
                unknown += 1;
            }
        }
        assert_eq!(unknown, 100 - 16);
    }

    #[test]
    fn p2p_ordinals_are_exact_under_concurrency() {
        let c = std::sync::Arc::new(Context::new(1, 7, 0, 8, 1, 6, b""));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .map(|_| c.next_p2p_ordinal(3, 7))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = ts.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort();
        assert_eq!(all, (0..4000).collect::<Vec<_>>());
    }
}

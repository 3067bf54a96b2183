//! Fixed slabs of in-flight slots, allocated once (an anonymous mapping: zero pages, touched
//! lazily, so slots never used cost nothing), with a lock-free free list (Treiber stack whose
//! head carries an ABA tag) and a bump index for slots never used yet. Taking or returning a slot is one CAS; a full slab returns `None` (the caller
//! drops the event and counts it): nothing blocks, spins unboundedly or allocates.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sys::{Zeroable, ZeroedSlice};

const NIL: u32 = u32::MAX;
/// Lost CAS races after which `alloc` gives up (counted as a drop by the caller).
const MAX_TRIES: u32 = 64;

/// A slab of `T` with a free list.
pub struct Slab<T> {
    slots: ZeroedSlice<T>,
    next: ZeroedSlice<AtomicU32>,
    /// Low 32 bits: index of the first free slot (NIL = empty); high 32 bits: ABA tag.
    head: AtomicU64,
    /// Slots `[0, bump)` have been handed out at least once.
    bump: AtomicU32,
}

impl<T: Zeroable> Slab<T> {
    /// `None` when memory for `n` slots cannot be had.
    pub fn new(n: u32) -> Option<Slab<T>> {
        Some(Slab {
            slots: ZeroedSlice::new(n as usize)?,
            next: ZeroedSlice::new(n as usize)?,
            head: AtomicU64::new(u64::from(NIL)),
            bump: AtomicU32::new(0),
        })
    }
}

// SAFETY: AtomicU32 is valid when zeroed.
unsafe impl Zeroable for AtomicU32 {}
// SAFETY: AtomicU64 is valid when zeroed.
unsafe impl Zeroable for AtomicU64 {}

impl<T> Slab<T> {
    pub fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Slots ever handed out (scans need not look beyond).
    pub fn high_water(&self) -> u32 {
        self.bump.load(Ordering::Acquire).min(self.capacity())
    }

    #[inline]
    pub fn get(&self, i: u32) -> Option<&T> {
        self.slots.get(i as usize)
    }

    /// Take a free slot index.
    #[inline]
    pub fn alloc(&self) -> Option<u32> {
        let mut head = self.head.load(Ordering::Acquire);
        for _ in 0..MAX_TRIES {
            let idx = head as u32;
            if idx == NIL {
                break;
            }
            let next = self.next[idx as usize].load(Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | u64::from(next);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(idx),
                Err(h) => head = h,
            }
        }
        // Never-used slots.
        let cap = self.capacity();
        if self.bump.load(Ordering::Relaxed) >= cap {
            return None;
        }
        let i = self.bump.fetch_add(1, Ordering::AcqRel);
        if i < cap {
            Some(i)
        } else {
            None
        }
    }

    /// Return a slot index taken with `alloc`.
    #[inline]
    pub fn free(&self, idx: u32) {
        if idx >= self.capacity() {
            return;
        }
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.next[idx as usize].store(head as u32, Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | u64::from(idx);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Iterate over slots ever handed out.
    pub fn used(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots[..self.high_water() as usize]
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, s))
    }

    /// Free-list length (tests; O(n), not concurrent-safe in meaning).
    pub fn free_len(&self) -> usize {
        let mut n = 0;
        let mut i = self.head.load(Ordering::Acquire) as u32;
        while i != NIL && n <= self.slots.len() {
            n += 1;
            i = self.next[i as usize].load(Ordering::Relaxed);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn alloc_until_full_then_reuse_freed() {
        let s: Slab<AtomicU64> = Slab::new(4).unwrap();
        let got: Vec<u32> = (0..4).map(|_| s.alloc().unwrap()).collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(s.alloc(), None);
        s.free(2);
        s.free(0);
        assert_eq!(s.alloc(), Some(0));
        assert_eq!(s.alloc(), Some(2));
        assert_eq!(s.alloc(), None);
    }

    #[test]
    fn concurrent_alloc_free_never_hands_out_a_slot_twice() {
        let s: Arc<Slab<AtomicU64>> = Arc::new(Slab::new(64).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(i) = s.alloc() {
                            // Mark as owned; a double hand-out would see the mark set.
                            let prev = s.get(i).unwrap().swap(1, Ordering::AcqRel);
                            assert_eq!(prev, 0, "slot {i} handed out twice");
                            s.get(i).unwrap().store(0, Ordering::Release);
                            s.free(i);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut seen = HashSet::new();
        while let Some(i) = s.alloc() {
            assert!(seen.insert(i));
        }
        assert_eq!(seen.len(), 64);
    }
}

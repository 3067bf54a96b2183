//! Fixed slabs of in-flight slots, allocated once (an anonymous mapping: zero pages, touched
//! lazily, so slots never used cost nothing), with a lock-free free list (Treiber stack) and a
//! bump index for slots never used yet. Taking or returning a slot is one CAS; a full slab returns
//! `None` (the caller drops the event and counts it): nothing blocks, spins unboundedly or
//! allocates.
//!
//! The free list's head word is `tickets:42 | index:22`. Every `alloc` advances `tickets` by one
//! in the same CAS that pops the slot (or, when no slot is free, in a CAS / `fetch_add` of its
//! own), so `alloc` also hands out a process-wide ticket — the op's `coll_local_sn` — without a
//! second locked instruction. The ticket count is also the free list's ABA tag: a stale pop could
//! only succeed if the head came back to the same index, which takes a pop, which moves `tickets`
//! (pushes alone never bring an index back to the top). Tickets are extended from 42 to 64 bits
//! against a reference value refreshed every 2^40 tickets, so they never wrap in practice.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sys::{Zeroable, ZeroedSlice};

const IDX_BITS: u32 = 22;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
/// Empty list (above the largest slot index, 2^21 - 1).
const NIL: u32 = IDX_MASK as u32;
/// One ticket in the head word.
const TICK: u64 = 1 << IDX_BITS;
/// Ticket bits kept in the head word.
const LO_BITS: u32 = 64 - IDX_BITS;
const LO_MASK: u64 = (1 << LO_BITS) - 1;
/// The 64-bit reference is refreshed by the taker of every ticket that is a multiple of this.
const REBASE: u64 = 1 << (LO_BITS - 2);
/// Lost CAS races after which `alloc` gives up on the free list.
const MAX_TRIES: u32 = 64;

/// A slab of `T` with a free list.
pub struct Slab<T> {
    slots: ZeroedSlice<T>,
    next: ZeroedSlice<AtomicU32>,
    /// Low 22 bits: index of the first free slot (NIL = empty); high 42 bits: tickets taken.
    head: AtomicU64,
    /// A recent full (64-bit) ticket: the high bits of tickets are taken from it.
    ticket_base: AtomicU64,
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
            ticket_base: AtomicU64::new(0),
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
        self.alloc_ticket().0
    }

    /// Take a free slot index (`None`: none free) and, in the same step, the next ticket: 0, 1,
    /// 2 … in the order of the `alloc` calls, each handed out once (failed allocs included).
    #[inline]
    pub fn alloc_ticket(&self) -> (Option<u32>, u64) {
        let mut head = self.head.load(Ordering::Acquire);
        for _ in 0..MAX_TRIES {
            let idx = (head & IDX_MASK) as u32;
            let new = if idx == NIL {
                // Nothing on the list: take just the ticket, then a never-used slot.
                head.wrapping_add(TICK)
            } else {
                let next = self.next[idx as usize].load(Ordering::Relaxed);
                (head & !IDX_MASK).wrapping_add(TICK) | u64::from(next)
            };
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) if idx == NIL => return (self.bump(), self.ticket(head)),
                Ok(_) => return (Some(idx), self.ticket(head)),
                Err(h) => head = h,
            }
        }
        // Contended beyond reason: a ticket alone (adding TICK leaves the index alone), then a
        // never-used slot if any remain.
        let head = self.head.fetch_add(TICK, Ordering::AcqRel);
        (self.bump(), self.ticket(head))
    }

    /// A never-used slot, if any remain.
    #[inline]
    fn bump(&self) -> Option<u32> {
        let cap = self.capacity();
        if self.bump.load(Ordering::Relaxed) >= cap {
            return None;
        }
        let i = self.bump.fetch_add(1, Ordering::AcqRel);
        (i < cap).then_some(i)
    }

    /// The full ticket of the head word `head` read by a successful `alloc` step.
    #[inline]
    fn ticket(&self, head: u64) -> u64 {
        let lo = head >> IDX_BITS;
        // `base` is a ticket already handed out, at most about REBASE behind this one (it is
        // refreshed every REBASE tickets), so the difference fits the low bits exactly.
        let base = self.ticket_base.load(Ordering::Relaxed);
        let full = base.wrapping_add(lo.wrapping_sub(base) & LO_MASK);
        if lo.is_multiple_of(REBASE) {
            self.ticket_base.store(full, Ordering::Relaxed);
        }
        full
    }

    /// Start the tickets at `t` (tests: the 42-bit wrap).
    #[cfg(test)]
    fn set_ticket(&self, t: u64) {
        let idx = self.head.load(Ordering::Relaxed) & IDX_MASK;
        self.head
            .store(((t & LO_MASK) << IDX_BITS) | idx, Ordering::Relaxed);
        self.ticket_base.store(t, Ordering::Relaxed);
    }

    /// Return a slot index taken with `alloc`.
    #[inline]
    pub fn free(&self, idx: u32) {
        if idx >= self.capacity() {
            return;
        }
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.next[idx as usize].store((head & IDX_MASK) as u32, Ordering::Relaxed);
            let new = (head & !IDX_MASK) | u64::from(idx);
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
        let mut i = (self.head.load(Ordering::Acquire) & IDX_MASK) as u32;
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
    fn tickets_count_every_alloc_and_cross_the_42_bit_wrap() {
        let s: Slab<AtomicU64> = Slab::new(2).unwrap();
        assert_eq!(s.alloc_ticket(), (Some(0), 0));
        assert_eq!(s.alloc_ticket(), (Some(1), 1));
        assert_eq!(s.alloc_ticket(), (None, 2));
        s.free(1);
        assert_eq!(s.alloc_ticket(), (Some(1), 3));
        s.free(0);
        s.free(1);
        let start = (1u64 << 42) * 3 - 5;
        s.set_ticket(start);
        for k in 0..20 {
            let (i, t) = s.alloc_ticket();
            assert_eq!(t, start + k);
            s.free(i.unwrap());
        }
        // A base a whole REBASE behind still extends correctly.
        s.ticket_base.store(start + 20 - REBASE, Ordering::Relaxed);
        assert_eq!(s.alloc_ticket().1, start + 20);
    }

    #[test]
    fn concurrent_alloc_free_never_hands_out_a_slot_twice() {
        let s: Arc<Slab<AtomicU64>> = Arc::new(Slab::new(64).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut tickets = Vec::with_capacity(20_000);
                    for _ in 0..20_000 {
                        let (got, t) = s.alloc_ticket();
                        tickets.push(t);
                        if let Some(i) = got {
                            // Mark as owned; a double hand-out would see the mark set.
                            let prev = s.get(i).unwrap().swap(1, Ordering::AcqRel);
                            assert_eq!(prev, 0, "slot {i} handed out twice");
                            s.get(i).unwrap().store(0, Ordering::Release);
                            s.free(i);
                        }
                    }
                    tickets
                })
            })
            .collect();
        let mut all: Vec<u64> = Vec::new();
        for t in threads {
            let mine = t.join().unwrap();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "a thread's tickets rise"
            );
            all.extend(mine);
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..8 * 20_000).collect::<Vec<u64>>(),
            "each ticket once"
        );
        let mut seen = HashSet::new();
        while let Some(i) = s.alloc() {
            assert!(seen.insert(i));
        }
        assert_eq!(seen.len(), 64);
    }
}

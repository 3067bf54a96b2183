//! Coll / P2p operations and their KernelCh children: the hot path.
//!
//! A slot's `ctl` word: `gen:32 | COLL_STOPPED:1 | done:10 | (unused):10 | refs:11`.
//! `refs` = 1 for the Coll/P2p event itself + `expected` KernelCh channels (the descriptor's
//! `nChannels` when KernelCh is in the mask) + 1 per KernelCh started beyond `expected`.
//! Whoever takes `refs` to 0 completes the op: it bumps the generation in the same CAS (every
//! outstanding handle turns stale), builds the record, pushes it, and frees the slot.
//!
//! Timestamp folds (first start = min, last stop = max), the per-channel started/stopped bits
//! (used only to refuse doubled KernelCh starts/stops) and the per-communicator op count use a
//! load and a plain store rather than a locked read-modify-write: NCCL delivers all KernelCh
//! events of an operation from its one proxy progress thread and launches one communicator's
//! work from one thread at a time, so these never race; if two threads ever did race, a time
//! could be off by the gap between the two events, a doubled event could go unnoticed or a
//! count could miss one — values only, never memory. What decides completion (`ctl`) and the
//! process-wide `coll_local_sn` (the op slab's ticket, taken with the slot) stay atomic
//! read-modify-writes.

use core::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use comminsight_wire::names::{Algo, DataType, Func, Proto};
use comminsight_wire::record::{OpRecord, Timing, FLAG_HCCL, FLAG_INCOMPLETE};

use crate::abi::{CollDescr, P2pDescr, EV_KERNEL_CH};
use crate::context::Context;
use crate::core::Shared;
use crate::handle::{Handle, TAG_COLL, TAG_KERNEL_CH, TAG_P2P};
use crate::sys::Zeroable;

const REFS_MASK: u64 = (1 << 11) - 1;
const DONE_SHIFT: u32 = 21;
const CNT_MASK: u64 = (1 << 10) - 1;
const COLL_STOPPED: u64 = 1 << 31;
const NONE_MIN: u64 = u64::MAX;
/// Bit of the meta word saying the op's communicator is an HCCL one (record flag `FLAG_HCCL`).
const HCCL_BIT: u32 = 57;

/// The source flags of a slot's records (`FLAG_HCCL` or 0).
#[inline]
fn source_flags(s: &OpSlot) -> u16 {
    if (s.meta.load(Ordering::Relaxed) >> HCCL_BIT) & 1 == 1 {
        FLAG_HCCL
    } else {
        0
    }
}

#[inline]
fn gen_of(c: u64) -> u32 {
    (c >> 32) as u32
}
#[inline]
fn refs_of(c: u64) -> u64 {
    c & REFS_MASK
}
/// KernelCh channels started so far (the started bits; racy reads are fine for reports).
#[inline]
fn started_count(s: &OpSlot) -> u64 {
    s.kch_started
        .iter()
        .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
        .sum()
}
#[inline]
fn done_of(c: u64) -> u64 {
    (c >> DONE_SHIFT) & CNT_MASK
}

/// One in-flight Coll or P2p operation. Every field is atomic: the drain thread reads slots
/// concurrently (seqlock-style, validated by `ctl`).
#[repr(C, align(64))]
pub struct OpSlot {
    pub ctl: AtomicU64,
    /// func | dtype<<8 | algo<<16 | proto<<24 | nchannels<<32 | nwarps<<40 | expected<<48 | p2p<<56
    /// | hccl<<57
    meta: AtomicU64,
    comm_hash: AtomicU64,
    /// ctx id << 32 | rank (u32)
    ctx_rank: AtomicU64,
    coll_sn: AtomicU64,
    local_sn: AtomicU64,
    count: AtomicU64,
    /// root (u32) << 32 | peer (u32)
    root_peer: AtomicU64,
    enqueue_ns: AtomicU64,
    first_start_ns: AtomicU64,
    last_stop_ns: AtomicU64,
    gpu_start: AtomicU64,
    gpu_end: AtomicU64,
    /// KernelCh channels started (the number of started bits; kept so the hot path needs no
    /// population count, which baseline x86-64 has no instruction for).
    kch_count: AtomicU64,
    kch_started: [AtomicU64; 4],
    kch_stopped: [AtomicU64; 4],
    /// Inspector-compat only: low 32 bits of each channel's GPU start timer (channels < 64) and
    /// the longest per-channel GPU duration (Inspector's exec time).
    ch_start: [AtomicU32; PER_CHANNEL],
    max_ch_ns: AtomicU64,
}

/// Channels whose GPU start timer is kept for Inspector's per-channel exec time.
pub const PER_CHANNEL: usize = 64;

// SAFETY: every field is an atomic integer (or an array of them): all-zero is valid.
unsafe impl Zeroable for OpSlot {}

/// A consistent copy of a live slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpSnapshot {
    pub index: u32,
    pub gen: u32,
    pub ctx_id: u32,
    pub op: OpRecord,
    pub is_p2p: bool,
    pub started: u8,
    pub done: u8,
    pub coll_stopped: bool,
    /// Source flags of the op's records (`FLAG_HCCL` or 0).
    pub flags: u16,
}

#[derive(Clone, Copy)]
struct Meta {
    func: u8,
    dtype: u8,
    algo: u8,
    proto: u8,
    nchannels: u8,
    nwarps: u8,
    expected: u8,
    p2p: bool,
}

impl Meta {
    fn pack(self) -> u64 {
        u64::from(self.func)
            | u64::from(self.dtype) << 8
            | u64::from(self.algo) << 16
            | u64::from(self.proto) << 24
            | u64::from(self.nchannels) << 32
            | u64::from(self.nwarps) << 40
            | u64::from(self.expected) << 48
            | u64::from(self.p2p) << 56
    }
    fn unpack(v: u64) -> Meta {
        Meta {
            func: v as u8,
            dtype: (v >> 8) as u8,
            algo: (v >> 16) as u8,
            proto: (v >> 24) as u8,
            nchannels: (v >> 32) as u8,
            nwarps: (v >> 40) as u8,
            expected: (v >> 48) as u8,
            p2p: (v >> 56) & 1 == 1,
        }
    }
}

struct NewOp {
    meta: Meta,
    coll_sn: u64,
    count: u64,
    root: i32,
    peer: i32,
}

/// Coll start: take a slot, copy the descriptor, read the clock once.
#[inline]
pub fn start_coll(sh: &Shared, ctx: &Context, d: &CollDescr) -> *mut c_void {
    let kch = sh.mask() & EV_KERNEL_CH as u32 != 0;
    let meta = Meta {
        func: sh.names.func.code(d.func, Func::NAMES),
        dtype: sh.names.dtype.code(d.datatype, DataType::NAMES),
        algo: sh.names.algo.code(d.algo, Algo::NAMES),
        proto: sh.names.proto.code(d.proto, Proto::NAMES),
        nchannels: d.n_channels,
        nwarps: d.n_warps,
        expected: if kch { d.n_channels } else { 0 },
        p2p: false,
    };
    let op = NewOp {
        meta,
        coll_sn: d.seq_number,
        count: d.count as u64,
        root: d.root,
        peer: -1,
    };
    start_op(sh, ctx, op, TAG_COLL)
}

/// P2p start: as Coll; `coll_sn` is the per-(comm, peer, func) ordinal.
#[inline]
pub fn start_p2p(sh: &Shared, ctx: &Context, d: &P2pDescr) -> *mut c_void {
    let kch = sh.mask() & EV_KERNEL_CH as u32 != 0;
    let func = sh.names.func.code(d.func, Func::NAMES);
    let meta = Meta {
        func,
        dtype: sh.names.dtype.code(d.datatype, DataType::NAMES),
        algo: 0,
        proto: 0,
        nchannels: d.n_channels,
        nwarps: 0,
        expected: if kch { d.n_channels } else { 0 },
        p2p: true,
    };
    let op = NewOp {
        meta,
        coll_sn: ctx.next_p2p_ordinal(d.peer, func),
        count: d.count as u64,
        root: -1,
        peer: d.peer,
    };
    start_op(sh, ctx, op, TAG_P2P)
}

/// Always inlined: the descriptor fields then stay in registers instead of a `NewOp` on the stack.
#[inline(always)]
fn start_op(sh: &Shared, ctx: &Context, op: NewOp, tag: u8) -> *mut c_void {
    // The slot and the op's `coll_local_sn` (the slab's ticket) come from one CAS.
    let (idx, local_sn) = sh.ops.alloc_ticket();
    let Some(idx) = idx else {
        sh.counters.pool_drops.fetch_add(1, Ordering::Relaxed);
        return core::ptr::null_mut();
    };
    let Some(s) = sh.ops.get(idx) else {
        return core::ptr::null_mut();
    };
    let now = sh.clock.now();
    let gen = gen_of(s.ctl.load(Ordering::Acquire));
    let src = u64::from(ctx.flags & FLAG_HCCL != 0) << HCCL_BIT;
    s.meta.store(op.meta.pack() | src, Ordering::Relaxed);
    s.comm_hash.store(ctx.comm_hash, Ordering::Relaxed);
    s.ctx_rank.store(
        u64::from(ctx.id) << 32 | u64::from(ctx.rank as u32),
        Ordering::Relaxed,
    );
    s.coll_sn.store(op.coll_sn, Ordering::Relaxed);
    s.local_sn.store(local_sn, Ordering::Relaxed);
    s.count.store(op.count, Ordering::Relaxed);
    s.root_peer.store(
        u64::from(op.root as u32) << 32 | u64::from(op.peer as u32),
        Ordering::Relaxed,
    );
    s.enqueue_ns.store(now, Ordering::Relaxed);
    s.first_start_ns.store(NONE_MIN, Ordering::Relaxed);
    s.last_stop_ns.store(0, Ordering::Relaxed);
    s.gpu_start.store(NONE_MIN, Ordering::Relaxed);
    s.gpu_end.store(0, Ordering::Relaxed);
    s.max_ch_ns.store(0, Ordering::Relaxed);
    s.kch_count.store(0, Ordering::Relaxed);
    for i in 0..4 {
        s.kch_started[i].store(0, Ordering::Relaxed);
        s.kch_stopped[i].store(0, Ordering::Relaxed);
    }
    // Per-communicator count for `comm_fini`; a plain load/store: NCCL launches one
    // communicator's work from one thread at a time (see the module doc).
    ctx.ops_started.store(
        ctx.ops_started.load(Ordering::Relaxed) + 1,
        Ordering::Relaxed,
    );
    // Publish: refs = 1 (the event) + expected channels.
    s.ctl.store(
        u64::from(gen) << 32 | (1 + u64::from(op.meta.expected)),
        Ordering::Release,
    );
    Handle::new(tag, 0, idx, gen).to_ptr()
}

/// Apply `f` to a live slot's `ctl` if its generation is `gen`; complete it when refs reach 0.
/// Returns false when the handle was stale (or `f` refused).
#[inline]
fn update(
    sh: &Shared,
    idx: u32,
    gen: u32,
    now: impl Fn() -> u64,
    f: impl Fn(u64) -> Option<u64>,
) -> bool {
    let Some(s) = sh.ops.get(idx) else {
        return false;
    };
    let mut c = s.ctl.load(Ordering::Acquire);
    loop {
        if gen_of(c) != gen || refs_of(c) == 0 {
            return false;
        }
        let Some(computed) = f(c) else {
            return false;
        };
        let last = refs_of(computed) == 0;
        // Retiring happens in the same step: every handle of this op turns stale at once.
        let n = if last {
            u64::from(gen.wrapping_add(1)) << 32
        } else {
            computed
        };
        match s
            .ctl
            .compare_exchange_weak(c, n, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                if last {
                    complete(sh, idx, computed, now(), false);
                }
                return true;
            }
            Err(x) => c = x,
        }
    }
}

/// Coll/P2p stop (= enqueued).
#[inline]
pub fn stop_op(sh: &Shared, h: Handle) {
    let ok = update(
        sh,
        h.index,
        h.gen,
        || sh.clock.now(),
        |c| {
            if c & COLL_STOPPED != 0 {
                None
            } else {
                Some((c | COLL_STOPPED) - 1)
            }
        },
    );
    if !ok {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
    }
}

/// KernelCh start: parent is our Coll/P2p handle.
///
/// A channel within the op's `expected` count needs no `ctl` update (its reference was taken at
/// Coll/P2p start, and it cannot be released before this channel stops), so the common case is
/// lock-free loads and stores; a channel beyond `expected` takes a reference with a CAS *before*
/// anything is written, which also proves the op is still the one the handle names.
#[inline]
pub fn start_kernel_ch(sh: &Shared, parent: Handle, channel: u8, ptimer: u64) -> *mut c_void {
    let (idx, gen) = (parent.index, parent.gen);
    let Some(s) = sh.ops.get(idx) else {
        return ignored(sh);
    };
    let c = s.ctl.load(Ordering::Acquire);
    if gen_of(c) != gen || refs_of(c) == 0 {
        return ignored(sh);
    }
    let bit = 1u64 << (channel & 63);
    let w = usize::from(channel >> 6);
    let prev = s.kch_started[w].load(Ordering::Relaxed);
    if prev & bit != 0 {
        // Second start of one channel.
        return ignored(sh);
    }
    let before = s.kch_count.load(Ordering::Relaxed);
    let expected = u64::from(Meta::unpack(s.meta.load(Ordering::Relaxed)).expected);
    if before >= expected && !update(sh, idx, gen, || 0, |c| Some(c + 1)) {
        return ignored(sh);
    }
    s.kch_started[w].store(prev | bit, Ordering::Relaxed);
    s.kch_count.store(before + 1, Ordering::Relaxed);
    let first = before == 0;
    let now = sh.clock.now();
    if first {
        s.first_start_ns.store(now, Ordering::Relaxed);
        if ptimer != 0 {
            s.gpu_start.store(ptimer, Ordering::Relaxed);
        }
    } else {
        store_min(&s.first_start_ns, now);
        if ptimer != 0 {
            store_min(&s.gpu_start, ptimer);
        }
    }
    if sh.cfg.inspector_compat {
        if let Some(a) = s.ch_start.get(usize::from(channel)) {
            // 0 = no start timer for this channel (a real low half of 0 only loses one sample).
            a.store(ptimer as u32, Ordering::Relaxed);
        }
    }
    Handle::new(TAG_KERNEL_CH, channel, idx, gen).to_ptr()
}

/// KernelCh state 22 (`KernelChStop`): GPU stop timer.
#[inline]
pub fn kernel_ch_stop_timer(sh: &Shared, h: Handle, ptimer: u64) {
    let Some(s) = sh.ops.get(h.index) else { return };
    let c = s.ctl.load(Ordering::Acquire);
    if gen_of(c) != h.gen || refs_of(c) == 0 {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if ptimer != 0 {
        store_max(&s.gpu_end, ptimer);
        if sh.cfg.inspector_compat {
            if let Some(a) = s.ch_start.get(usize::from(h.sub)) {
                // Wrapping 32-bit difference: exact for channel durations below 4.29 s (the
                // drain falls back to the whole GPU span for longer operations).
                let start = a.load(Ordering::Relaxed);
                if start != 0 {
                    let d = (ptimer as u32).wrapping_sub(start);
                    store_max(&s.max_ch_ns, u64::from(d));
                }
            }
        }
    }
}

/// KernelCh stop: host last-stop, one channel done.
#[inline]
pub fn stop_kernel_ch(sh: &Shared, h: Handle) {
    let Some(s) = sh.ops.get(h.index) else { return };
    let c = s.ctl.load(Ordering::Acquire);
    let bit = 1u64 << (h.sub & 63);
    let w = usize::from(h.sub >> 6);
    if gen_of(c) != h.gen
        || refs_of(c) == 0
        || s.kch_started[w].load(Ordering::Relaxed) & bit == 0
        || !set_stopped_bit(&s.kch_stopped[w], bit)
    {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let now = sh.clock.now();
    store_max(&s.last_stop_ns, now);
    let ok = update(
        sh,
        h.index,
        h.gen,
        || now,
        |c| {
            let d = if done_of(c) < CNT_MASK {
                1 << DONE_SHIFT
            } else {
                0
            };
            Some(c + d - 1)
        },
    );
    if !ok {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
    }
}

/// `a = min(a, v)` without a locked instruction (see the module doc).
#[inline]
fn store_min(a: &AtomicU64, v: u64) {
    if v < a.load(Ordering::Relaxed) {
        a.store(v, Ordering::Relaxed);
    }
}

/// `a = max(a, v)` without a locked instruction (see the module doc).
#[inline]
fn store_max(a: &AtomicU64, v: u64) {
    if v > a.load(Ordering::Relaxed) {
        a.store(v, Ordering::Relaxed);
    }
}

/// Set a channel's stopped bit; false if it was already set (a doubled stop).
#[inline]
fn set_stopped_bit(w: &AtomicU64, bit: u64) -> bool {
    let prev = w.load(Ordering::Relaxed);
    if prev & bit != 0 {
        return false;
    }
    w.store(prev | bit, Ordering::Relaxed);
    true
}

fn ignored(sh: &Shared) -> *mut c_void {
    sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
    core::ptr::null_mut()
}

/// Read a slot's fields into a record (no validation).
fn read_record(s: &OpSlot, c: u64, now: u64, incomplete: bool) -> (OpRecord, Meta, u32) {
    let meta = Meta::unpack(s.meta.load(Ordering::Relaxed));
    let ctx_rank = s.ctx_rank.load(Ordering::Relaxed);
    let root_peer = s.root_peer.load(Ordering::Relaxed);
    let enqueue_ns = s.enqueue_ns.load(Ordering::Relaxed);
    let first = s.first_start_ns.load(Ordering::Relaxed);
    let last = s.last_stop_ns.load(Ordering::Relaxed);
    let gs = s.gpu_start.load(Ordering::Relaxed);
    let ge = s.gpu_end.load(Ordering::Relaxed);
    let count = s.count.load(Ordering::Relaxed);
    let dtype = DataType(meta.dtype);
    let timing = if gs != NONE_MIN && ge != 0 && ge >= gs {
        Timing::KernelGpu
    } else if first != NONE_MIN {
        Timing::KernelCpu
    } else {
        Timing::Enqueue
    };
    // A reversed GPU pair (the GPU timer stepped between the first channel's start and the
    // last one's stop) is no span: it is left out, or readers reject the whole record as
    // implausible and the op is lost. The host times and `timing` (kernel_cpu) stay.
    let (gpu_start_ns, gpu_end_ns) = match (gs, ge) {
        (NONE_MIN, _) => (0, ge),
        (gs, ge) if ge != 0 && ge < gs => (0, 0),
        (gs, ge) => (gs, ge),
    };
    let start_ns = if first != NONE_MIN { first } else { enqueue_ns };
    let op = OpRecord {
        comm_hash: s.comm_hash.load(Ordering::Relaxed),
        coll_sn: s.coll_sn.load(Ordering::Relaxed),
        coll_local_sn: s.local_sn.load(Ordering::Relaxed),
        count,
        bytes: count.wrapping_mul(dtype.size()),
        enqueue_ns,
        start_ns,
        // Never before the start: two host clock reads of one op may come out reversed (the
        // TSC line switching under a preempted reader, threads on two CPUs), and readers reject
        // a reversed span as implausible, losing the op. Such an op is no longer than 0 ns.
        end_ns: if incomplete {
            0
        } else if last != 0 {
            last.max(start_ns)
        } else {
            now.max(start_ns)
        },
        gpu_start_ns,
        gpu_end_ns,
        api_ns: 0,
        rank: ctx_rank as u32 as i32,
        root: (root_peer >> 32) as u32 as i32,
        peer: root_peer as u32 as i32,
        func: Func(meta.func),
        datatype: dtype,
        algo: Algo(meta.algo),
        proto: Proto(meta.proto),
        nchannels: meta.nchannels,
        nwarps: meta.nwarps,
        timing,
        channels_done: done_of(c).min(255) as u8,
    };
    (op, meta, (ctx_rank >> 32) as u32)
}

/// Build and push the record of a retired slot, then free it. `c` is the final `ctl` counts.
fn complete(sh: &Shared, idx: u32, c: u64, now: u64, incomplete: bool) {
    let Some(s) = sh.ops.get(idx) else { return };
    let (op, meta, _) = read_record(s, c, now, incomplete);
    let max_ch = s.max_ch_ns.load(Ordering::Relaxed);
    let src = source_flags(s);
    sh.ops.free(idx);
    if !incomplete && max_ch != 0 {
        sh.push_channel_time(op.coll_local_sn, max_ch);
    }
    let flags = src | if incomplete { FLAG_INCOMPLETE } else { 0 };
    sh.push_raw(&crate::encode::op_record(meta.p2p, flags, &op));
}

mod scan;
pub use scan::{live, local_sn_of, snapshot, sweep};

#[cfg(test)]
mod tests;

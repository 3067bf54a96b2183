//! Event handlers: the shared state every entry point works on and the dispatch of start / stop /
//! record by event type and handle tag. No I/O, no locks, no allocation on the event paths.

use core::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use comminsight_wire::record::{Body, CommDevice, CommFini, CommInit, RawRecord, Record, StrField};
use comminsight_wire::ring::ShmRing;

use crate::abi::{
    Descr, Event, LogFn, StateArgs, ST_KERNEL_CH_STOP, ST_NET_PLUGIN_UPDATE,
    ST_PROXY_OP_IN_PROGRESS_V4,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::context::{Context, CONTEXT_MAGIC};
use crate::handle::{
    Handle, TAG_COLL, TAG_KERNEL_CH, TAG_NET, TAG_P2P, TAG_PROXY_OP, TAG_PROXY_STEP, TAG_SENTINEL,
};
use crate::pool::Slab;
use crate::{op, proxy, sys};

/// Self-accounting counters (all failures of observation end up here and in `stats` records).
#[derive(Default)]
pub struct Counters {
    /// Coll/P2p starts dropped: no free slot.
    pub pool_drops: AtomicU64,
    /// ProxyOp/NetPlugin starts dropped: no free slot.
    pub proxy_drops: AtomicU64,
    /// Stale, doubled, foreign or malformed events.
    pub events_ignored: AtomicU64,
    /// Records produced while no ring existed.
    pub no_ring_drops: AtomicU64,
    /// `overdue` records written.
    pub overdue_emitted: AtomicU64,
    /// Panics caught at the FFI boundary.
    pub panics: AtomicU64,
    /// Rings that fell back to private memory (/dev/shm unusable).
    pub shm_fallbacks: AtomicU64,
    /// Inspector-compat lines not written (I/O error).
    pub inspector_errors: AtomicU64,
    /// Control files ignored for their owner, mode or type ([`crate::control`]).
    pub ctl_refused: AtomicU64,
    /// Event-mask changes accepted from the control file.
    pub mask_changes: AtomicU64,
}

/// State shared by every entry point of one loaded plugin image.
pub struct Shared {
    pub cfg: Config,
    pub clock: Clock,
    pub pid: u32,
    pub ops: Slab<op::OpSlot>,
    pub proxies: Slab<proxy::ProxySlot>,
    /// `Arc::into_raw` of the current ring, or NULL.
    ring: AtomicPtr<ShmRing>,
    pub counters: Counters,
    /// The activation mask we ask NCCL for.
    mask: AtomicU32,
    /// NCCL's `int* eActivationMask` (process-global inside libnccl); NULL when no comm is live.
    pub mask_ptr: AtomicPtr<c_int>,
    /// NCCL's logger (`LogFn` as usize; 0 = none).
    logfn: AtomicUsize,
    next_ctx_id: AtomicU32,
    /// ABI version of the last `init`.
    pub abi: AtomicU32,
    /// Name-pointer → code caches.
    pub names: crate::names::NameCaches,
    /// Inspector compat: (coll_local_sn, longest per-channel GPU time) for the drain, which has
    /// no field for it in the op record. A private ring, present only in compat mode.
    pub channel_times: Option<ShmRing>,
}

impl Shared {
    /// `None` if the slabs cannot be allocated.
    pub fn new(cfg: Config, clock: Clock) -> Option<Shared> {
        let n = cfg.max_inflight;
        Some(Shared {
            mask: AtomicU32::new(cfg.event_mask),
            ops: Slab::new(n)?,
            proxies: Slab::new(n)?,
            cfg,
            clock,
            pid: sys::pid(),
            ring: AtomicPtr::new(core::ptr::null_mut()),
            counters: Counters::default(),
            mask_ptr: AtomicPtr::new(core::ptr::null_mut()),
            logfn: AtomicUsize::new(0),
            next_ctx_id: AtomicU32::new(1),
            abi: AtomicU32::new(0),
            names: crate::names::NameCaches::default(),
            channel_times: None,
        })
        .map(|mut s| {
            if s.cfg.inspector_compat {
                s.channel_times = ShmRing::private(CHANNEL_TIMES).ok();
            }
            s
        })
    }

    #[inline]
    pub fn mask(&self) -> u32 {
        self.mask.load(Ordering::Relaxed)
    }

    /// Change the mask we request and write it through NCCL's pointer (if a comm is live).
    pub fn set_mask(&self, m: u32) {
        self.mask.store(m, Ordering::Relaxed);
        self.write_mask();
    }

    /// Store our mask into NCCL's `int` (atomically: NCCL reads it with relaxed atomic loads).
    pub fn write_mask(&self) {
        let p = self.mask_ptr.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: `p` is the `int* eActivationMask` NCCL gave `init`: a properly aligned,
            // process-global int in libnccl that stays valid while a communicator is live (we
            // clear `mask_ptr` before the last finalize returns). NCCL accesses it atomically.
            unsafe { core::sync::atomic::AtomicI32::from_ptr(p) }
                .store(self.mask() as i32, Ordering::Relaxed);
        }
    }

    pub fn set_logfn(&self, f: Option<LogFn>) {
        if let Some(f) = f {
            self.logfn.store(f as usize, Ordering::Relaxed);
        }
    }

    pub fn logfn(&self) -> Option<LogFn> {
        let v = self.logfn.load(Ordering::Relaxed);
        if v == 0 {
            return None;
        }
        // SAFETY: the only non-zero values stored are `LogFn` pointers (set_logfn); a fn
        // pointer round-trips through usize.
        Some(unsafe { core::mem::transmute::<usize, LogFn>(v) })
    }

    pub fn log(&self, level: c_int, msg: &str) {
        sys::log(self.logfn(), level, msg);
    }

    /// Install a ring (or remove it with `None`); returns the previous one.
    pub fn swap_ring(&self, ring: Option<Arc<ShmRing>>) -> Option<Arc<ShmRing>> {
        let new = ring.map_or(core::ptr::null_mut(), |r| Arc::into_raw(r).cast_mut());
        let old = self.ring.swap(new, Ordering::AcqRel);
        if old.is_null() {
            None
        } else {
            // SAFETY: non-NULL values in `ring` come from `Arc::into_raw` above and are taken out
            // exactly once, here.
            Some(unsafe { Arc::from_raw(old) })
        }
    }

    /// The current ring, for the drain thread and stats.
    pub fn with_ring<R>(&self, f: impl FnOnce(&ShmRing) -> R) -> Option<R> {
        let p = self.ring.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-NULL pointer is a live `Arc<ShmRing>` owned by `ring`; the runtime keeps
        // every ring it removes alive (retired) until the following stop, long after any thread
        // that loaded the pointer before the swap has finished its push.
        Some(f(unsafe { &*p }))
    }

    /// Push one encoded record; never blocks. False = dropped (counted).
    #[inline]
    pub fn push_raw(&self, raw: &RawRecord) -> bool {
        match self.with_ring(|r| r.push(raw)) {
            Some(ok) => ok,
            None => {
                self.counters.no_ring_drops.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    #[inline]
    pub fn push_body(&self, body: Body, flags: u16) -> bool {
        let raw = Record {
            seq: 0,
            flags,
            body,
        }
        .encode();
        self.push_raw(&raw)
    }

    /// Hand the drain Inspector's exec time of an op (compat mode; dropped silently when full:
    /// the drain then uses the GPU span).
    pub fn push_channel_time(&self, local_sn: u64, ns: u64) {
        if let Some(q) = &self.channel_times {
            let mut raw = RawRecord::ZERO;
            raw.0[16..24].copy_from_slice(&local_sn.to_le_bytes());
            raw.0[24..32].copy_from_slice(&ns.to_le_bytes());
            q.push(&raw);
        }
    }

    pub fn next_ctx_id(&self) -> u32 {
        self.next_ctx_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Capacity of the Inspector channel-time queue (records).
const CHANNEL_TIMES: usize = 1 << 14;

const S_GROUP_API: u8 = 1;
const S_COLL_API: u8 = 2;
const S_P2P_API: u8 = 3;
const S_KERNEL_LAUNCH: u8 = 4;
const S_GROUP: u8 = 5;
const S_PROXY_CTRL: u8 = 6;

fn sentinel(sub: u8) -> *mut c_void {
    Handle::sentinel(sub).to_ptr()
}

/// The constant handle of a stateless event type (what [`start_event`] returns for it), or
/// `None` for every other type. `abi` is the descriptor's version (API events exist from v5).
#[inline]
pub fn sentinel_for(abi: u8, ty: u64) -> Option<*mut c_void> {
    // Indexed by the type's bit number (types are single bits): the sentinel kind, 0 = none.
    const SUBS: [u8; 12] = [
        S_GROUP,
        0,
        0,
        0,
        0,
        S_PROXY_CTRL,
        0,
        0, // Group … NetPlugin
        S_GROUP_API,
        S_COLL_API,
        S_P2P_API,
        S_KERNEL_LAUNCH, // v5+ API events
    ];
    if !ty.is_power_of_two() {
        return None;
    }
    let bit = ty.trailing_zeros() as usize;
    let sub = match SUBS.get(bit) {
        Some(&s) if s != 0 && (bit < 8 || abi >= 5) => s,
        _ => return None,
    };
    Some(sentinel(sub))
}

/// `startEvent`: returns the handle to store in `*eHandle` (NULL = not tracked).
///
/// # Safety
/// `ctx` is NULL, a context returned by our `init` and not yet finalized, or (ProxyOp only) a
/// foreign process' pointer, which is never dereferenced. String pointers in `d`'s active arm
/// are NUL-terminated; `NetPlugin.data` is NULL or a live net descriptor.
#[inline]
pub unsafe fn start_event<D: Descr>(sh: &Shared, ctx: *mut c_void, d: &D) -> *mut c_void {
    if ctx.is_null() {
        return core::ptr::null_mut();
    }
    let local_ctx = || {
        // SAFETY: the caller's contract: a non-NULL context of a non-PXN event is one of ours.
        let c = unsafe { &*ctx.cast::<Context>() };
        debug_assert_eq!(c.magic, CONTEXT_MAGIC);
        c
    };
    match d.event() {
        Event::GroupApi => sentinel(S_GROUP_API),
        Event::CollApi => sentinel(S_COLL_API),
        Event::P2pApi => sentinel(S_P2P_API),
        Event::KernelLaunch => sentinel(S_KERNEL_LAUNCH),
        Event::Group => sentinel(S_GROUP),
        Event::ProxyCtrl => sentinel(S_PROXY_CTRL),
        Event::Coll(c) => op::start_coll(sh, local_ctx(), &c),
        Event::P2p(p) => op::start_p2p(sh, local_ctx(), &p),
        Event::KernelCh { channel_id, ptimer } => {
            match Handle::from_ptr(d.parent()).filter(|h| h.tag == TAG_COLL || h.tag == TAG_P2P) {
                Some(parent) => op::start_kernel_ch(sh, parent, channel_id, ptimer),
                None => ignored(sh),
            }
        }
        Event::ProxyOp(p) => {
            // PXN: check the pid FIRST; a foreign op's context and parent belong to another
            // process and are not touched at all.
            if p.pid as u32 != sh.pid {
                return proxy::start_proxy_op(sh, &p, d.rank(), 0, u64::MAX, false);
            }
            let c = local_ctx();
            let parent_sn = Handle::from_ptr(d.parent())
                .and_then(|h| op::local_sn_of(sh, h))
                .unwrap_or(u64::MAX);
            proxy::start_proxy_op(sh, &p, d.rank(), c.comm_hash, parent_sn, true)
        }
        Event::ProxyStep { step } => match Handle::from_ptr(d.parent()) {
            Some(parent) => proxy::start_proxy_step(sh, parent, step),
            None => ignored(sh),
        },
        Event::NetPlugin { id, data } => {
            proxy::start_net(sh, Handle::from_ptr(d.parent()), d.rank(), id, data)
        }
        Event::Ce | Event::Unknown(_) => ignored(sh),
    }
}

fn ignored(sh: &Shared) -> *mut c_void {
    sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
    core::ptr::null_mut()
}

/// `stopEvent`.
#[inline]
pub fn stop_event(sh: &Shared, h: *mut c_void) {
    let Some(h) = Handle::from_ptr(h) else { return };
    match h.tag {
        TAG_SENTINEL => {
            if !h.is_sentinel() {
                sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
            }
        }
        TAG_COLL | TAG_P2P => op::stop_op(sh, h),
        TAG_KERNEL_CH => op::stop_kernel_ch(sh, h),
        TAG_PROXY_OP => proxy::stop_proxy_op(sh, h),
        TAG_PROXY_STEP => proxy::stop_proxy_step(sh, h),
        TAG_NET => proxy::stop_net(sh, h),
        _ => {
            sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `recordEventState`.
///
/// # Safety
/// `args` is NULL or points to a readable `ncclProfilerEventStateArgs_vN_t`.
#[inline]
pub unsafe fn record_state(sh: &Shared, h: *mut c_void, state: c_int, args: *const StateArgs) {
    let Some(h) = Handle::from_ptr(h) else { return };
    let read = || -> Option<StateArgs> {
        if args.is_null() {
            None
        } else {
            // SAFETY: caller's contract; the union is plain integers/pointers (any bits valid).
            Some(unsafe { args.read_unaligned() })
        }
    };
    match h.tag {
        TAG_KERNEL_CH if state == ST_KERNEL_CH_STOP => {
            // SAFETY: state 22 carries `kernelCh.pTimer` (u64: any bits valid).
            let t = read().map_or(0, |a| unsafe { a.kernel_ch_ptimer });
            op::kernel_ch_stop_timer(sh, h, t);
        }
        TAG_PROXY_STEP => {
            // SAFETY: step states carry `proxyStep.transSize` (usize: any bits valid).
            let n = read().map(|a| unsafe { a.proxy_step_trans_size });
            proxy::record_proxy_step(sh, h, state, n);
        }
        TAG_PROXY_OP if state == ST_PROXY_OP_IN_PROGRESS_V4 => proxy::touch(sh, h),
        TAG_NET if state == ST_NET_PLUGIN_UPDATE => proxy::touch(sh, h),
        // GroupApi states 23/24 (args NULL), ProxyCtrl states, anything else: nothing to keep.
        _ => {}
    }
}

/// Geometry `init` reports.
#[derive(Clone, Copy, Debug)]
pub struct InitArgs {
    pub abi: u8,
    pub comm_hash: u64,
    pub comm_name: *const c_char,
    pub nnodes: c_int,
    pub nranks: c_int,
    pub rank: c_int,
}

/// Make a context (copying `commName` now: NCCL's pointer may dangle later) and record it.
///
/// # Safety
/// `a.comm_name` is NULL or a NUL-terminated string valid during the call.
pub unsafe fn new_context(sh: &Shared, a: &InitArgs) -> Box<Context> {
    // SAFETY: caller's contract; at most MAX_NAME bytes are read.
    let name = unsafe { sys::cstr_bytes(a.comm_name, crate::context::MAX_NAME) };
    let mut ctx = Box::new(Context::new(
        sh.next_ctx_id(),
        a.comm_hash,
        a.rank,
        a.nranks,
        a.nnodes,
        a.abi,
        name,
    ));
    ctx.flags = crate::context::init_flags();
    sh.abi.store(u32::from(a.abi), Ordering::Relaxed);
    sh.push_body(Body::CommInit(comm_init(sh, &ctx)), ctx.flags);
    // Once per communicator, off the hot path: which GPU this rank runs on.
    let dev = crate::cuda::current_device();
    sh.push_body(
        Body::CommDevice(CommDevice {
            comm_hash: ctx.comm_hash,
            time_ns: sh.clock.now(),
            pci: dev.pci,
            rank: ctx.rank,
            device: dev.ordinal,
            source: dev.source,
            uuid: dev.uuid,
        }),
        ctx.flags,
    );
    ctx
}

/// The `comm_init` body of a context.
pub fn comm_init(sh: &Shared, ctx: &Context) -> CommInit {
    CommInit {
        comm_hash: ctx.comm_hash,
        nranks: ctx.nranks.max(0) as u32,
        rank: ctx.rank,
        nnodes: ctx.nnodes.max(0) as u32,
        local_rank: sh.cfg.local_rank_env,
        // The device is in the `comm_device` record that follows.
        device: -1,
        abi_version: ctx.abi,
        time_ns: sh.clock.now(),
        comm_name: StrField::from_bytes(&ctx.name),
    }
}

/// Retire the context's open ops (incomplete records) and write `comm_fini`.
pub fn end_context(sh: &Shared, ctx: &Context) {
    let open = op::sweep(sh, Some(ctx.id), true);
    let started = ctx.ops_started.load(Ordering::Relaxed);
    sh.push_body(
        Body::CommFini(CommFini {
            comm_hash: ctx.comm_hash,
            rank: ctx.rank,
            time_ns: sh.clock.now(),
            ops: started.saturating_sub(open),
            open_ops: open,
        }),
        ctx.flags,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn the_entry_fast_path_gives_exactly_the_handles_start_event_gives() {
        let (sh, _ring) = fixture(small_cfg());
        let ctx = context(sh, 1, 0, 2);
        for bit in 0..16 {
            let ty = 1u64 << bit;
            // SAFETY: a descriptor is integers and raw pointers: all-zero is a valid value
            // (NULL strings and data, pid 0).
            let mut d: crate::abi::v6::DescrV6 = unsafe { core::mem::zeroed() };
            d.type_ = ty;
            let h = start(sh, &ctx, &d);
            let is_sentinel = Handle::from_ptr(h).is_some_and(|h| h.is_sentinel());
            assert_eq!(
                sentinel_for(6, ty),
                is_sentinel.then_some(h),
                "type {ty:#x}"
            );
            if is_sentinel {
                stop_event(sh, h);
            }
        }
        // API events do not exist before v5.
        assert_eq!(sentinel_for(4, crate::abi::EV_GROUP_API), None);
        assert!(sentinel_for(4, crate::abi::EV_GROUP).is_some());
    }
}

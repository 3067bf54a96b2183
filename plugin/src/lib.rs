//! CommInsight NCCL profiler plugin: `libnccl-profiler-comminsight.so`.
//!
//! This file is the whole C surface: the exported tables `ncclProfiler_v6`, `ncclProfiler_v5`,
//! `ncclProfiler_v4` and their `extern "C"` entry points. Each entry point catches panics,
//! converts pointers and calls a handler in [`core`] / [`runtime`]; every one returns
//! `ncclSuccess` (a failing `init` means different things to different NCCL releases, so opting a
//! communicator out is done with a NULL context instead).
//!
//! Modules: [`abi`] (C layouts per ABI version), [`handle`] (handle encoding), [`pool`] (slabs),
//! [`op`] / [`proxy`] (event state), [`encode`] (hot-path record encoder), [`core`] (dispatch), [`drain`] (background thread),
//! [`runtime`] (start/stop), [`pace`] (drain sleeps), [`config`], [`clock`], [`inspector`], [`sys`] (raw calls),
//! [`ep`] (MoE EP wait rows pushed by the process: `comminsight_ep_stats_push`).

use ::core::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

pub mod abi;
pub mod clock;
pub mod config;
pub mod context;
pub mod control;
pub mod core;
pub mod cuda;
pub mod drain;
pub mod encode;
pub mod ep;
pub mod external;
pub mod handle;
pub mod inspector;
pub mod names;
pub mod op;
pub mod pace;
pub mod pool;
pub mod preload_link;
pub mod proxy;
pub mod runtime;
pub mod shm;
pub mod sys;
#[cfg(test)]
mod testutil;

use crate::abi::v4::{DescrV4, ProfilerV4};
use crate::abi::v5::{DescrV5, ProfilerV5};
use crate::abi::v6::{DescrV6, ProfilerV6};
use crate::abi::{Descr, LogFn, NcclResult, StateArgs, NCCL_SUCCESS};
use crate::core::InitArgs;
use crate::runtime::RUNTIME;

/// Plugin name NCCL logs.
const NAME: &::core::ffi::CStr = c"CommInsight";

/// ABI v6 table (NCCL 2.29+).
#[no_mangle]
pub static ncclProfiler_v6: ProfilerV6 = ProfilerV6 {
    name: NAME.as_ptr(),
    init: Some(init_v6),
    start_event: Some(start_event_v6),
    stop_event: Some(stop_event),
    record_event_state: Some(record_event_state),
    finalize: Some(finalize),
};

/// ABI v5 table (NCCL 2.28).
#[no_mangle]
pub static ncclProfiler_v5: ProfilerV5 = ProfilerV5 {
    name: NAME.as_ptr(),
    init: Some(init_v5),
    start_event: Some(start_event_v5),
    stop_event: Some(stop_event),
    record_event_state: Some(record_event_state),
    finalize: Some(finalize),
};

/// ABI v4 table (NCCL 2.27).
#[no_mangle]
pub static ncclProfiler_v4: ProfilerV4 = ProfilerV4 {
    name: NAME.as_ptr(),
    init: Some(init_v4),
    start_event: Some(start_event_v4),
    stop_event: Some(stop_event),
    record_event_state: Some(record_event_state),
    finalize: Some(finalize),
};

/// An address inside this object (for pinning it).
pub(crate) fn pin_anchor() -> usize {
    (&raw const ncclProfiler_v6) as usize
}

/// Run `f`, swallowing (and counting) a panic: nothing unwinds into NCCL.
#[inline]
fn guard(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        if let Some(sh) = RUNTIME.shared() {
            sh.counters.panics.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Shared body of the three `init`s.
///
/// # Safety
/// Pointers as NCCL passes them: `ctx` writable or NULL, `name` NULL or a C string, `mask` NULL or
/// NCCL's mask int.
unsafe fn init_common(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    a: InitArgs,
    logfn: Option<LogFn>,
) -> NcclResult {
    if !ctx.is_null() {
        // SAFETY: NCCL passes a writable `void**` (checked non-NULL).
        unsafe { ctx.write(::core::ptr::null_mut()) };
    }
    guard(|| {
        // Warnings the LD_PRELOAD shim queued (bad announcements) go to NCCL's log.
        preload_link::drain(logfn);
        // SAFETY: forwarded contract on `name`/`mask`.
        let c = unsafe { RUNTIME.init(a, mask, logfn, true) };
        if ctx.is_null() {
            // Nowhere to return it: undo.
            // SAFETY: `c` is the context just made (or NULL).
            unsafe { RUNTIME.finalize(c) };
        } else {
            // SAFETY: as above.
            unsafe { ctx.write(c) };
        }
    });
    NCCL_SUCCESS
}

/// v5/v6 `init(ctx, commId, mask, commName, nNodes, nranks, rank, logfn)`.
#[allow(clippy::too_many_arguments, reason = "the C signature")]
unsafe extern "C" fn init_v6(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<LogFn>,
) -> NcclResult {
    let a = InitArgs {
        abi: 6,
        comm_hash: comm_id,
        comm_name: name,
        nnodes,
        nranks,
        rank,
    };
    // SAFETY: NCCL's arguments, forwarded.
    unsafe { init_common(ctx, mask, a, logfn) }
}

/// v5 `init` (same order as v6).
#[allow(clippy::too_many_arguments, reason = "the C signature")]
unsafe extern "C" fn init_v5(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<LogFn>,
) -> NcclResult {
    let a = InitArgs {
        abi: 5,
        comm_hash: comm_id,
        comm_name: name,
        nnodes,
        nranks,
        rank,
    };
    // SAFETY: NCCL's arguments, forwarded.
    unsafe { init_common(ctx, mask, a, logfn) }
}

/// v4 `init(ctx, mask, commName, commHash, nNodes, nranks, rank, logfn)` — a different order.
#[allow(clippy::too_many_arguments, reason = "the C signature")]
unsafe extern "C" fn init_v4(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    name: *const c_char,
    comm_hash: u64,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<LogFn>,
) -> NcclResult {
    let a = InitArgs {
        abi: 4,
        comm_hash,
        comm_name: name,
        nnodes,
        nranks,
        rank,
    };
    // SAFETY: NCCL's arguments, forwarded.
    unsafe { init_common(ctx, mask, a, logfn) }
}

/// Shared body of the three `startEvent`s.
///
/// # Safety
/// `handle` NULL or writable; `d` NULL or a readable descriptor; `ctx` as in `core::start_event`.
#[inline]
unsafe fn start_common<D: Descr>(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    d: *const D,
) -> NcclResult {
    if handle.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: NCCL passes a writable `void**` (checked non-NULL).
    unsafe { handle.write(::core::ptr::null_mut()) };
    if d.is_null() {
        return NCCL_SUCCESS;
    }
    // Stateless events (API, Group, ProxyCtrl: three of the five starts of a collective) get
    // their constant handle here, outside the heavier guarded dispatch; nothing below can panic.
    // SAFETY: `d` is NCCL's live descriptor for this call (non-NULL); only `type` is read.
    if let Some(h) = core::sentinel_for(D::ABI, unsafe { (*d).type_bits() }) {
        if !ctx.is_null() && RUNTIME.shared().is_some() {
            // SAFETY: checked non-NULL above.
            unsafe { handle.write(h) };
        }
        return NCCL_SUCCESS;
    }
    // SAFETY: forwarded contract.
    unsafe { start_tracked(ctx, handle, d) };
    NCCL_SUCCESS
}

/// The guarded dispatch of a start that may carry state (out of line: the stateless fast path
/// above stays a small leaf function).
///
/// # Safety
/// As `start_common`, with `handle` and `d` non-NULL.
#[inline(never)]
unsafe fn start_tracked<D: Descr>(ctx: *mut c_void, handle: *mut *mut c_void, d: *const D) {
    guard(|| {
        let Some(sh) = RUNTIME.shared() else { return };
        // SAFETY: `d` is NCCL's live descriptor for this call (non-NULL); we only read it.
        let d = unsafe { &*d };
        // SAFETY: forwarded contract on `ctx` and the descriptor's pointers.
        let h = unsafe { core::start_event(sh, ctx, d) };
        // SAFETY: checked non-NULL by the caller.
        unsafe { handle.write(h) };
    });
}

unsafe extern "C" fn start_event_v6(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    d: *mut DescrV6,
) -> NcclResult {
    // SAFETY: NCCL's arguments, forwarded.
    unsafe { start_common(ctx, handle, d) }
}

unsafe extern "C" fn start_event_v5(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    d: *mut DescrV5,
) -> NcclResult {
    // SAFETY: NCCL's arguments, forwarded.
    unsafe { start_common(ctx, handle, d) }
}

unsafe extern "C" fn start_event_v4(
    ctx: *mut c_void,
    handle: *mut *mut c_void,
    d: *mut DescrV4,
) -> NcclResult {
    // SAFETY: NCCL's arguments, forwarded.
    unsafe { start_common(ctx, handle, d) }
}

/// `stopEvent` (all versions). Handles are decoded, never dereferenced.
unsafe extern "C" fn stop_event(handle: *mut c_void) -> NcclResult {
    if handle.is_null() || handle::is_sentinel_raw(handle as usize as u64) {
        // Our stateless handles: nothing to do (and nothing that could panic).
        return NCCL_SUCCESS;
    }
    stop_tracked(handle);
    NCCL_SUCCESS
}

/// The guarded part of `stopEvent` (out of line, as `start_tracked`).
#[inline(never)]
fn stop_tracked(handle: *mut c_void) {
    guard(|| {
        if let Some(sh) = RUNTIME.shared() {
            core::stop_event(sh, handle);
        }
    });
}

/// `recordEventState` (all versions; the args union is identical).
unsafe extern "C" fn record_event_state(
    handle: *mut c_void,
    state: c_int,
    args: *mut StateArgs,
) -> NcclResult {
    if handle.is_null() {
        return NCCL_SUCCESS;
    }
    guard(|| {
        if let Some(sh) = RUNTIME.shared() {
            // SAFETY: `args` is NULL or NCCL's state-args union for this call.
            unsafe { core::record_state(sh, handle, state, args) };
        }
    });
    NCCL_SUCCESS
}

/// `finalize` (all versions). NULL: no-op.
unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    if ctx.is_null() {
        return NCCL_SUCCESS;
    }
    guard(|| {
        // SAFETY: `ctx` is a context our `init` returned; NCCL finalizes each once.
        unsafe { RUNTIME.finalize(ctx) };
    });
    NCCL_SUCCESS
}

/// `int comminsight_ep_abi_version(void)`: the version of `struct ci_ep_row` and of
/// `comminsight_ep_stats_push` ([`ep::EP_ABI_VERSION`]).
#[no_mangle]
pub extern "C" fn comminsight_ep_abi_version() -> c_int {
    ep::EP_ABI_VERSION as c_int
}

/// `int comminsight_ep_stats_push(const struct ci_ep_row* head, const uint64_t* values, int n)`:
/// one rank's MoE EP wait row (`n` = the EP size) for one phase and window, as `ep_stats`
/// records in this process's stream. Returns the records that went in (fewer than
/// `ceil(n / 5)` when the ring was full: the rest are counted as ring drops), or
/// [`ep::code`]: -1 not running (no ring: before NCCL's first `init` or after the last
/// `finalize`), -2 bad arguments (counted in `events_ignored`), -3 a caught panic. Never blocks.
///
/// # Safety
/// `head` NULL or a readable `struct ci_ep_row` of at least its `size` field's 4 bytes (the
/// rest is read only once `size` matches); `values` NULL or `n` readable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn comminsight_ep_stats_push(
    head: *const ep::CiEpRow,
    values: *const u64,
    n: c_int,
) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let Some(sh) = RUNTIME.shared().filter(|s| s.with_ring(|_| ()).is_some()) else {
            return ep::code::NOT_RUNNING;
        };
        let len = usize::try_from(n).unwrap_or(0);
        if head.is_null() || values.is_null() || len == 0 || len > 1 << 16 {
            sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
            return ep::code::BAD_ARGS;
        }
        // SAFETY: `head` is non-NULL and the caller guarantees its first 4 bytes are readable.
        let size = unsafe { head.cast::<u32>().read_unaligned() };
        if size as usize != ::core::mem::size_of::<ep::CiEpRow>() {
            sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
            return ep::code::BAD_ARGS;
        }
        // SAFETY: the caller's struct is `size` bytes, which is ours (checked just above).
        let row = unsafe { head.read_unaligned() };
        // SAFETY: non-NULL, `len` (= n, checked positive and bounded) readable u64s by contract.
        let vals = unsafe { ::core::slice::from_raw_parts(values, len) };
        match ep::push_row(sh, &row, vals) {
            Ok(k) => k as c_int,
            Err(_) => ep::code::BAD_ARGS,
        }
    }));
    r.unwrap_or_else(|_| {
        if let Some(sh) = RUNTIME.shared() {
            sh.counters.panics.fetch_add(1, Ordering::Relaxed);
        }
        ep::code::INTERNAL
    })
}

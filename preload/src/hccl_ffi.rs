//! The interposed HCCL entry points (signatures written from CANN's public HCCL API reference:
//! `hccl.h` / `hccl_types.h` as documented on hiascend.com; see preload/README.md, "HCCL").
//!
//! Every entry point forwards to the real HCCL (`dlsym(RTLD_NEXT)`, else the loaded objects),
//! whatever happens to the recording; `COMMINSIGHT_DISABLE=1` forwards only. Panics in the shim's
//! own work are caught and counted. Not found anywhere: `HCCL_E_NOT_FOUND` and a warning.

#![allow(non_snake_case, reason = "HCCL's C names")]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

use crate::hccl::{self, Counter, Func, OpArgs, HCCL_E_NOT_FOUND, HCCL_SUCCESS};
use crate::sym::RealFn;
use crate::{acl, recorder, shim};

/// `HcclComm`.
pub type Comm = *mut c_void;
/// `aclrtStream`.
pub type Stream = *mut c_void;
/// `HcclResult`.
pub type HcclResult = c_int;

/// `HcclRootInfo`: 4108 opaque bytes.
#[repr(C)]
pub struct RootInfo {
    /// Opaque bytes.
    pub internal: [c_char; hccl::ROOT_INFO_BYTES],
}

type InitRootFn = unsafe extern "C" fn(u32, *const RootInfo, u32, *mut Comm) -> HcclResult;
type InitRootCfgFn =
    unsafe extern "C" fn(u32, *const RootInfo, u32, *const c_void, *mut Comm) -> HcclResult;
type InitClusterFn = unsafe extern "C" fn(*const c_char, u32, *mut Comm) -> HcclResult;
type InitClusterCfgFn =
    unsafe extern "C" fn(*const c_char, u32, *mut c_void, *mut Comm) -> HcclResult;
type CommFn = unsafe extern "C" fn(Comm) -> HcclResult;
type CommU32Fn = unsafe extern "C" fn(Comm, *mut u32) -> HcclResult;
type AllReduceFn =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u64, c_int, c_int, Comm, Stream) -> HcclResult;
type BroadcastFn = unsafe extern "C" fn(*mut c_void, u64, c_int, u32, Comm, Stream) -> HcclResult;
type AllGatherFn =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u64, c_int, Comm, Stream) -> HcclResult;
type ReduceFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    u64,
    c_int,
    c_int,
    u32,
    Comm,
    Stream,
) -> HcclResult;
type AlltoAllFn = unsafe extern "C" fn(
    *const c_void,
    u64,
    c_int,
    *const c_void,
    u64,
    c_int,
    Comm,
    Stream,
) -> HcclResult;
type AlltoAllVFn = unsafe extern "C" fn(
    *const c_void,
    *const c_void,
    *const c_void,
    c_int,
    *const c_void,
    *const c_void,
    *const c_void,
    c_int,
    Comm,
    Stream,
) -> HcclResult;
type P2pFn = unsafe extern "C" fn(*mut c_void, u64, c_int, u32, Comm, Stream) -> HcclResult;
type BarrierFn = unsafe extern "C" fn(Comm, Stream) -> HcclResult;

static R_INIT_ROOT: RealFn = RealFn::new(c"HcclCommInitRootInfo");
static R_INIT_ROOT_CFG: RealFn = RealFn::new(c"HcclCommInitRootInfoConfig");
static R_INIT_CLUSTER: RealFn = RealFn::new(c"HcclCommInitClusterInfo");
static R_INIT_CLUSTER_CFG: RealFn = RealFn::new(c"HcclCommInitClusterInfoConfig");
static R_DESTROY: RealFn = RealFn::new(c"HcclCommDestroy");
static R_RANK_SIZE: RealFn = RealFn::new(c"HcclGetRankSize");
static R_RANK_ID: RealFn = RealFn::new(c"HcclGetRankId");
static R_ALL_REDUCE: RealFn = RealFn::new(c"HcclAllReduce");
static R_BROADCAST: RealFn = RealFn::new(c"HcclBroadcast");
static R_ALL_GATHER: RealFn = RealFn::new(c"HcclAllGather");
static R_REDUCE_SCATTER: RealFn = RealFn::new(c"HcclReduceScatter");
static R_REDUCE: RealFn = RealFn::new(c"HcclReduce");
static R_ALLTOALL: RealFn = RealFn::new(c"HcclAlltoAll");
static R_ALLTOALLV: RealFn = RealFn::new(c"HcclAlltoAllV");
static R_SEND: RealFn = RealFn::new(c"HcclSend");
static R_RECV: RealFn = RealFn::new(c"HcclRecv");
static R_BARRIER: RealFn = RealFn::new(c"HcclBarrier");

/// How long `HcclCommDestroy` waits for the poller to close the communicator's last ops.
const DESTROY_WAIT: Duration = Duration::from_secs(2);

fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        hccl::count(Counter::Panics);
        fallback
    })
}

/// The real function `r` as a `T` (its C signature), or None with a warning.
fn real<T: Copy>(r: &RealFn) -> Option<T> {
    let Some(a) = r.get() else {
        hccl::warn_once(format!(
            "{}: no loaded library defines it (is libhccl loaded?): returning HCCL_E_NOT_FOUND",
            r.name()
        ));
        return None;
    };
    debug_assert_eq!(size_of::<T>(), size_of::<usize>());
    // SAFETY: `T` is always the `unsafe extern "C" fn` type of HCCL's declaration of `r.name()`,
    // and `a` is that function's address in the real library (never this one).
    Some(unsafe { std::mem::transmute_copy::<usize, T>(&a) })
}

/// # Safety
/// `p` NULL or readable.
unsafe fn comm_at(p: *const Comm) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: HCCL wrote the new communicator there (caller-owned, readable).
        unsafe { *p as usize }
    }
}

/// A new communicator: open it in the recorder (first use loads the plugin).
fn opened(comm: usize, id: u64, caller_name: Option<String>, nranks: i32, rank: i32) {
    if comm == 0 || shim::disabled() {
        return;
    }
    guard((), || {
        let Some(rec) = recorder::get() else { return };
        let name = hccl::choose_name(caller_name, nranks, rank);
        let ctx = rec.init(id, &hccl::c_name(&name), nranks, rank, hccl::FLAGS);
        let acl_ctx = acl::get().map_or(0, acl::Acl::current_context);
        hccl::insert(comm, ctx, rank, nranks, acl_ctx);
    });
}

/// (nranks, rank) of a communicator HCCL made from a cluster file.
fn geometry(comm: usize) -> (i32, i32) {
    let ask = |r: &RealFn| {
        let f = real::<CommU32Fn>(r)?;
        let mut v = 0u32;
        // SAFETY: a live communicator and a writable u32.
        (unsafe { f(comm as Comm, &mut v) } == HCCL_SUCCESS).then_some(v as i32)
    };
    (
        ask(&R_RANK_SIZE).unwrap_or(0),
        ask(&R_RANK_ID).unwrap_or(-1),
    )
}

/// The caller's `HcclCommConfig` bytes (at most 512; None: NULL or implausible size).
///
/// # Safety
/// `p` NULL or an `HcclCommConfig` whose first `size` bytes are readable.
unsafe fn config_bytes(p: *const c_void) -> Option<Vec<u8>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every HcclCommConfig starts with its 24-byte header (size_t size first).
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    if !(24..=1 << 20).contains(&size) {
        return None;
    }
    // SAFETY: the caller's struct is `size` bytes long (its own header).
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size.min(512)) }.to_vec())
}

/// The identity of a communicator made from `file`: its contents (or its name) and how many
/// communicators this process made from it before (every rank makes them in the same order).
fn cluster_id(file: &str) -> u64 {
    static SEEN: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);
    let text = std::fs::read(file)
        .ok()
        .filter(|t| t.len() <= 1 << 20)
        .unwrap_or_else(|| file.as_bytes().to_vec());
    let base = hccl::hash(&text);
    let mut g = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let n = g.get_or_insert_with(HashMap::new).entry(base).or_insert(0);
    *n += 1;
    hccl::hash(&[base.to_le_bytes(), n.to_le_bytes()].concat())
}

/// # Safety
/// `root` NULL or a readable `HcclRootInfo`.
unsafe fn root_id(root: *const RootInfo) -> u64 {
    if root.is_null() {
        return 0;
    }
    // SAFETY: HcclRootInfo is 4108 readable bytes (caller's contract).
    hccl::hash(unsafe { std::slice::from_raw_parts(root.cast::<u8>(), hccl::ROOT_INFO_BYTES) })
}

/// Interposed `HcclCommInitRootInfo`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    n_ranks: u32,
    root: *const RootInfo,
    rank: u32,
    comm: *mut Comm,
) -> HcclResult {
    let Some(f) = real::<InitRootFn>(&R_INIT_ROOT) else {
        return HCCL_E_NOT_FOUND;
    };
    // SAFETY: forwarded arguments.
    let res = unsafe { f(n_ranks, root, rank, comm) };
    if res == HCCL_SUCCESS {
        // SAFETY: `root` and `comm` as passed to HCCL.
        let (id, c) = unsafe { (root_id(root), comm_at(comm)) };
        opened(c, id, None, n_ranks as i32, rank as i32);
    }
    res
}

/// Interposed `HcclCommInitRootInfoConfig`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfoConfig(
    n_ranks: u32,
    root: *const RootInfo,
    rank: u32,
    config: *const c_void,
    comm: *mut Comm,
) -> HcclResult {
    let Some(f) = real::<InitRootCfgFn>(&R_INIT_ROOT_CFG) else {
        return HCCL_E_NOT_FOUND;
    };
    // SAFETY: forwarded arguments.
    let res = unsafe { f(n_ranks, root, rank, config, comm) };
    if res == HCCL_SUCCESS {
        // SAFETY: the arguments as passed to HCCL.
        let (id, c, cfg) = unsafe { (root_id(root), comm_at(comm), config_bytes(config)) };
        let name = cfg.as_deref().and_then(hccl::config_name);
        opened(c, id, name, n_ranks as i32, rank as i32);
    }
    res
}

/// Interposed `HcclCommInitClusterInfo`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitClusterInfo(
    cluster: *const c_char,
    rank: u32,
    comm: *mut Comm,
) -> HcclResult {
    let Some(f) = real::<InitClusterFn>(&R_INIT_CLUSTER) else {
        return HCCL_E_NOT_FOUND;
    };
    // SAFETY: forwarded arguments.
    let res = unsafe { f(cluster, rank, comm) };
    if res == HCCL_SUCCESS {
        // SAFETY: as passed to HCCL.
        unsafe { cluster_opened(cluster, None, comm) };
    }
    res
}

/// Interposed `HcclCommInitClusterInfoConfig`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitClusterInfoConfig(
    cluster: *const c_char,
    rank: u32,
    config: *mut c_void,
    comm: *mut Comm,
) -> HcclResult {
    let Some(f) = real::<InitClusterCfgFn>(&R_INIT_CLUSTER_CFG) else {
        return HCCL_E_NOT_FOUND;
    };
    // SAFETY: forwarded arguments.
    let res = unsafe { f(cluster, rank, config, comm) };
    if res == HCCL_SUCCESS {
        // SAFETY: as passed to HCCL.
        unsafe { cluster_opened(cluster, Some(config), comm) };
    }
    res
}

/// # Safety
/// The arguments of a successful ClusterInfo init.
unsafe fn cluster_opened(cluster: *const c_char, config: Option<*mut c_void>, comm: *mut Comm) {
    if shim::disabled() {
        return;
    }
    guard((), || {
        // SAFETY: HCCL read it as a path: a C string.
        let file = unsafe { crate::sym::c_str(cluster, 4096) }.unwrap_or("");
        // SAFETY: as passed to HCCL.
        let cfg = config.and_then(|p| unsafe { config_bytes(p) });
        let name = cfg.as_deref().and_then(hccl::config_name);
        // SAFETY: `comm` as passed to HCCL.
        let c = unsafe { comm_at(comm) };
        let (n, r) = geometry(c);
        opened(c, cluster_id(file), name, n, r);
    });
}

/// Interposed `HcclCommDestroy`: forwarded, then (once the poller closed its last ops, at most
/// 2 s) the communicator's context is finalized in the recorder.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommDestroy(comm: Comm) -> HcclResult {
    let st = guard(None, || hccl::remove(comm as usize));
    let Some(f) = real::<CommFn>(&R_DESTROY) else {
        return HCCL_E_NOT_FOUND;
    };
    // SAFETY: forwarded argument.
    let res = unsafe { f(comm) };
    if let Some(st) = st {
        guard((), || {
            acl::wait_closed(&st, DESTROY_WAIT);
            if let Some(rec) = recorder::get() {
                rec.finalize(st.ctx);
            }
        });
    }
    res
}

/// One operation: recorded around the real call `call` (which is made whatever happens). Public
/// for the benchmark (`benches/hccl.rs`); the entry points are its only callers otherwise.
#[inline]
pub fn op(comm: Comm, stream: Stream, a: OpArgs, call: impl FnOnce() -> HcclResult) -> HcclResult {
    if shim::disabled() {
        return call();
    }
    let events = acl::get().is_some();
    let begun = guard(None, || hccl::begin(comm as usize, &a, events));
    let res = call();
    if let Some(b) = begun {
        guard((), || finish(b, res, stream as usize));
    }
    res
}

/// After the real call: the Coll / P2p stop (= enqueued); with the event path, an event on the
/// stream and the op handed to the poller; an op whose event could not be recorded is closed now.
fn finish(b: hccl::Begun, res: HcclResult, stream: usize) {
    if !b.child {
        b.rec.stop(b.handle);
        return;
    }
    let ev = if res == HCCL_SUCCESS {
        acl::get().and_then(|a| a.record(stream))
    } else {
        None
    };
    b.rec.stop(b.handle);
    match ev {
        Some(e) => acl::push(b, stream, e),
        None => {
            let c = hccl::start_child(&b);
            b.rec.stop(c);
        }
    }
}

/// The arguments of a collective without root or peer.
pub fn args(func: Func, count: u64, dtype: c_int, send: usize, recv: usize) -> OpArgs {
    OpArgs {
        func,
        count,
        dtype,
        root: -1,
        peer: -1,
        send,
        recv,
    }
}

mod ops;
pub use ops::*;

/// The shim's HCCL counters (`Counter` order: recorded, unrecorded, no recorder, event errors,
/// query errors, event-closed, panics) copied into `out` (at most `n`); returns how many exist.
///
/// # Safety
/// `out` NULL or writable for `n` u64s.
#[no_mangle]
pub unsafe extern "C" fn comminsight_preload_hccl_stats(out: *mut u64, n: c_int) -> c_int {
    let c = hccl::counts();
    if !out.is_null() && n > 0 {
        let k = (n as usize).min(c.len());
        // SAFETY: `out` is writable for `n` >= `k` u64s (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), out, k) };
    }
    c.len() as c_int
}

//! Every exported C symbol. Each wraps its body in `catch_unwind`, converts raw pointers, and calls a
//! safe handler returning `NcclResult`.
#![allow(
    clippy::missing_safety_doc,
    reason = "C ABI entry points; contracts are NCCL's documented ones"
)]

use crate::comm::{self, Comm};
use crate::group;
use crate::task::Op;
use crate::types::{
    error_string, to_code, Config, DataType, Func, NcclError, NcclResult, RedOp, UniqueId,
};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// `ncclComm_t`.
pub type CommT = *const Comm;

fn guard(f: impl FnOnce() -> NcclResult<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => to_code(r),
        Err(_) => NcclError::Internal.code(),
    }
}

/// Borrows the `Arc<Comm>` behind a handle without consuming it.
fn comm_ref(c: CommT) -> NcclResult<Arc<Comm>> {
    if c.is_null() {
        crate::log::warn("invalid comm (NULL)");
        return Err(NcclError::InvalidArgument);
    }
    // SAFETY: a non-null handle came from `Arc::into_raw` in this library and is alive until
    // destroy/abort (the application's contract); we add a strong count for our own clone.
    unsafe { Arc::increment_strong_count(c) };
    // SAFETY: we own the count added above.
    Ok(unsafe { Arc::from_raw(c) })
}

fn out_comm(out: *mut CommT, c: Option<Arc<Comm>>) {
    if out.is_null() {
        return;
    }
    let p = c.map(Arc::into_raw).unwrap_or(std::ptr::null());
    // SAFETY: `out` is the caller's non-null `ncclComm_t*`.
    unsafe { *out = p };
}

fn read_config(config: *const Config) -> NcclResult<Config> {
    let env = crate::env::get().comm_blocking;
    if config.is_null() {
        return Config::initializer().normalize(env);
    }
    // SAFETY: non-null `ncclConfig_t*` from the application, at least `size` bytes.
    unsafe { Config::read_from(config) }.normalize(env)
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    guard(|| {
        if version.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        // SAFETY: non-null out-pointer.
        unsafe { *version = crate::env::get().release.version_code() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(out: *mut UniqueId) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        let id = crate::net::new_unique_id();
        // SAFETY: non-null out-pointer to a 128-byte struct.
        unsafe { *out = id };
        Ok(())
    })
}

fn init_common(
    out: *mut CommT,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *const Config,
) -> NcclResult<()> {
    if out.is_null() {
        return Err(NcclError::InvalidArgument);
    }
    let cfg = read_config(config)?;
    let mut c = None;
    let r = comm::init(id, nranks, rank, cfg, &mut c);
    match r {
        Ok(()) | Err(NcclError::InProgress) => out_comm(out, c),
        Err(_) => out_comm(out, None),
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut CommT,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> c_int {
    guard(|| init_common(out, nranks, id, rank, std::ptr::null()))
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut CommT,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut Config,
) -> c_int {
    guard(|| init_common(out, nranks, id, rank, config))
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: CommT,
    color: c_int,
    key: c_int,
    out: *mut CommT,
    config: *mut Config,
) -> c_int {
    guard(|| {
        let parent = comm_ref(comm)?;
        if out.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        let cfg = if config.is_null() {
            None
        } else {
            Some(read_config(config)?)
        };
        let mut c = None;
        let r = comm::split(&parent, color, key, cfg, &mut c);
        match r {
            Ok(()) | Err(NcclError::InProgress) => out_comm(out, c),
            Err(_) => out_comm(out, None),
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: CommT,
    exclude: *mut c_int,
    n_exclude: c_int,
    out: *mut CommT,
    config: *mut Config,
    _flags: c_int,
) -> c_int {
    guard(|| {
        let parent = comm_ref(comm)?;
        if out.is_null() || n_exclude < 0 || (n_exclude > 0 && exclude.is_null()) {
            return Err(NcclError::InvalidArgument);
        }
        let ex: &[c_int] = if n_exclude == 0 {
            &[]
        } else {
            // SAFETY: NCCL's contract: `exclude` holds `n_exclude` ints (checked non-NULL).
            unsafe { std::slice::from_raw_parts(exclude, n_exclude as usize) }
        };
        let cfg = if config.is_null() {
            None
        } else {
            Some(read_config(config)?)
        };
        let mut c = None;
        let r = comm::shrink(&parent, ex, cfg, &mut c);
        match r {
            Ok(()) | Err(NcclError::InProgress) => out_comm(out, c),
            Err(_) => out_comm(out, None),
        }
        r
    })
}

fn take(c: CommT) -> NcclResult<Arc<Comm>> {
    if c.is_null() {
        return Err(NcclError::InvalidArgument);
    }
    // SAFETY: the handle's own strong count, released by destroy/abort exactly once (NCCL's contract).
    Ok(unsafe { Arc::from_raw(c) })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: CommT) -> c_int {
    guard(|| {
        if comm.is_null() {
            return Ok(());
        }
        comm::destroy(take(comm)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: CommT) -> c_int {
    guard(|| {
        if comm.is_null() {
            return Ok(());
        }
        comm::abort(take(comm)?);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: CommT) -> c_int {
    guard(|| {
        let c = comm_ref(comm)?;
        while c.pending.load(std::sync::atomic::Ordering::SeqCst) > 0 && !c.is_aborted() {
            crate::worker::wait_progress();
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: CommT, count: *mut c_int) -> c_int {
    guard(|| {
        let c = comm_ref(comm)?;
        if count.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        let n = c.ready()?.nranks as c_int;
        // SAFETY: non-null out-pointer.
        unsafe { *count = n };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: CommT, rank: *mut c_int) -> c_int {
    guard(|| {
        let c = comm_ref(comm)?;
        if rank.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        let r = c.ready()?.rank as c_int;
        // SAFETY: non-null out-pointer.
        unsafe { *rank = r };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: CommT, device: *mut c_int) -> c_int {
    guard(|| {
        comm_ref(comm)?;
        if device.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        // SAFETY: non-null out-pointer.
        unsafe { *device = 0 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: CommT, err: *mut c_int) -> c_int {
    guard(|| {
        let c = comm_ref(comm)?;
        if err.is_null() {
            return Err(NcclError::InvalidArgument);
        }
        let v = c.async_err.load(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: non-null out-pointer.
        unsafe { *err = v };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    error_string(result).as_ptr()
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: CommT) -> *const c_char {
    catch_unwind(crate::log::last_error).unwrap_or(c"".as_ptr())
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> c_int {
    guard(|| {
        group::group_start();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> c_int {
    guard(group::group_end)
}

#[allow(clippy::too_many_arguments, reason = "mirrors the C API")]
fn coll(
    func: Func,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    comm: CommT,
) -> c_int {
    guard(|| {
        let c = comm_ref(comm)?;
        let dt = DataType::from_c(dt).ok_or_else(|| {
            crate::log::warn(&format!(
                "{}: invalid type {dt}",
                func.nccl_str().to_string_lossy()
            ));
            NcclError::InvalidArgument
        })?;
        let op = RedOp::from_c(op).ok_or_else(|| {
            crate::log::warn(&format!(
                "{}: invalid reduction operation {op}",
                func.nccl_str().to_string_lossy()
            ));
            NcclError::InvalidArgument
        })?;
        let o = Op {
            func,
            send: send as usize,
            recv: recv as usize,
            count,
            dt,
            op,
            root,
        };
        group::enqueue(&c, o)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    s: *const c_void,
    r: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(Func::AllReduce, s, r, count, dt, op, 0, comm)
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    s: *const c_void,
    r: *mut c_void,
    count: usize,
    dt: c_int,
    root: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(Func::Broadcast, s, r, count, dt, 0, root, comm)
}

#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "NCCL's signature")]
pub unsafe extern "C" fn ncclReduce(
    s: *const c_void,
    r: *mut c_void,
    count: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(Func::Reduce, s, r, count, dt, op, root, comm)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    s: *const c_void,
    r: *mut c_void,
    sendcount: usize,
    dt: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(Func::AllGather, s, r, sendcount, dt, 0, 0, comm)
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    s: *const c_void,
    r: *mut c_void,
    recvcount: usize,
    dt: c_int,
    op: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(Func::ReduceScatter, s, r, recvcount, dt, op, 0, comm)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    s: *const c_void,
    r: *mut c_void,
    count: usize,
    dt: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    if crate::env::get().release == crate::env::Release::V2_27 {
        return alltoall_as_p2p(s, r, count, dt, comm);
    }
    coll(Func::AlltoAll, s, r, count, dt, 0, 0, comm)
}

/// NCCL 2.27 has no `ncclAlltoAll`; applications (e.g. PyTorch) issue grouped Send/Recv instead,
/// which is what the profiler of a 2.27 job sees. The stand-in does the same.
fn alltoall_as_p2p(
    s: *const c_void,
    r: *mut c_void,
    count: usize,
    dt: c_int,
    comm: CommT,
) -> c_int {
    let n = match comm_ref(comm).and_then(|c| Ok(c.ready()?.nranks)) {
        Ok(n) => n,
        Err(e) => return e.code(),
    };
    let es = DataType::from_c(dt).map(DataType::size).unwrap_or(0);
    let _ = ncclGroupStart();
    let mut rc = 0;
    for p in 0..n {
        let off = p * count * es;
        let so = (s as usize).wrapping_add(off) as *const c_void;
        let ro = (r as usize).wrapping_add(off) as *mut c_void;
        let a = coll(
            Func::Send,
            so,
            std::ptr::null_mut(),
            count,
            dt,
            0,
            p as c_int,
            comm,
        );
        let b = coll(
            Func::Recv,
            std::ptr::null(),
            ro,
            count,
            dt,
            0,
            p as c_int,
            comm,
        );
        if rc == 0 {
            rc = if a != 0 { a } else { b };
        }
    }
    let e = ncclGroupEnd();
    if rc != 0 {
        rc
    } else {
        e
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    s: *const c_void,
    count: usize,
    dt: c_int,
    peer: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(
        Func::Send,
        s,
        std::ptr::null_mut(),
        count,
        dt,
        0,
        peer,
        comm,
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    r: *mut c_void,
    count: usize,
    dt: c_int,
    peer: c_int,
    comm: CommT,
    _stream: *mut c_void,
) -> c_int {
    coll(Func::Recv, std::ptr::null(), r, count, dt, 0, peer, comm)
}

/// Test-bed extension: like `cudaStreamSynchronize` on the process' single stream.
#[no_mangle]
pub unsafe extern "C" fn ncclTestbedSynchronize(_comm: CommT) -> c_int {
    guard(|| {
        crate::worker::synchronize();
        Ok(())
    })
}

/// Test-bed extension: Coll + P2p start events delivered to the plugin so far.
#[no_mangle]
pub extern "C" fn ncclTestbedProfiledOps() -> u64 {
    crate::profiler::emit::PROFILED_OPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Test-bed extension: the comm hash given to the plugin's `init` (0 for an invalid comm).
#[no_mangle]
pub unsafe extern "C" fn ncclTestbedCommHash(comm: CommT) -> u64 {
    catch_unwind(|| {
        comm_ref(comm)
            .ok()
            .and_then(|c| c.geo.get().map(|g| g.id))
            .unwrap_or(0)
    })
    .unwrap_or(0)
}

/// Test-bed extension: profiler ABI version loaded (4, 5, 6), 0 when none.
#[no_mangle]
pub extern "C" fn ncclTestbedProfilerAbi() -> c_int {
    catch_unwind(crate::profiler::loader::loaded_abi).unwrap_or(0)
}

/// Test-bed extension, the stand-in for a MoE kernel's per-peer spin timer (DeepEP's
/// `*_wait_recv_cost_stats`, MC2's `performance_info`): for this rank's last all-to-all or grouped
/// send/recv with receives on `comm` (call after `ncclTestbedSynchronize`), writes up to `n`
/// values, one per comm rank: ns from its receive start until that peer's data had arrived (the
/// last frame read off the socket; 0 when it was already there, for itself and for peers it
/// received nothing from). Returns the values written, or -1 (invalid comm, NULL `out`, no such
/// operation yet).
#[no_mangle]
pub unsafe extern "C" fn ncclTestbedLastRecvTimes(comm: CommT, out: *mut u64, n: c_int) -> c_int {
    catch_unwind(|| {
        let Ok(c) = comm_ref(comm) else { return -1 };
        let w = c
            .last_recv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let k = w.len().min(usize::try_from(n).unwrap_or(0));
        if out.is_null() || w.is_empty() {
            return -1;
        }
        // SAFETY: the caller passes `n` writable u64s at `out` (checked non-NULL); k <= n.
        unsafe { std::ptr::copy_nonoverlapping(w.as_ptr(), out, k) };
        k as c_int
    })
    .unwrap_or(-1)
}

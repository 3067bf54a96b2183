//! The interposed HCCL operations (CANN's public signatures), each recorded by [`super::op`].

use std::ffi::{c_int, c_void};

use super::{
    args, op, real, AllGatherFn, AllReduceFn, AlltoAllFn, AlltoAllVFn, BarrierFn, BroadcastFn,
    Comm, HcclResult, P2pFn, ReduceFn, Stream, R_ALLTOALL, R_ALLTOALLV, R_ALL_GATHER, R_ALL_REDUCE,
    R_BARRIER, R_BROADCAST, R_RECV, R_REDUCE, R_REDUCE_SCATTER, R_SEND,
};
use crate::hccl::{self, Func, HCCL_E_NOT_FOUND};

/// Interposed `HcclAllReduce`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclAllReduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    dtype: c_int,
    red: c_int,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<AllReduceFn>(&R_ALL_REDUCE) else {
        return HCCL_E_NOT_FOUND;
    };
    let a = args(Func::AllReduce, count, dtype, send as usize, recv as usize);
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(send, recv, count, dtype, red, comm, stream)
    })
}

/// Interposed `HcclBroadcast`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclBroadcast(
    buf: *mut c_void,
    count: u64,
    dtype: c_int,
    root: u32,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<BroadcastFn>(&R_BROADCAST) else {
        return HCCL_E_NOT_FOUND;
    };
    let mut a = args(Func::Broadcast, count, dtype, buf as usize, buf as usize);
    a.root = root as i32;
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(buf, count, dtype, root, comm, stream)
    })
}

/// Interposed `HcclAllGather` (`count` = the send count).
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclAllGather(
    send: *mut c_void,
    recv: *mut c_void,
    send_count: u64,
    dtype: c_int,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<AllGatherFn>(&R_ALL_GATHER) else {
        return HCCL_E_NOT_FOUND;
    };
    let a = args(
        Func::AllGather,
        send_count,
        dtype,
        send as usize,
        recv as usize,
    );
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(send, recv, send_count, dtype, comm, stream)
    })
}

/// Interposed `HcclReduceScatter` (`count` = the receive count).
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclReduceScatter(
    send: *mut c_void,
    recv: *mut c_void,
    recv_count: u64,
    dtype: c_int,
    red: c_int,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<AllReduceFn>(&R_REDUCE_SCATTER) else {
        return HCCL_E_NOT_FOUND;
    };
    let a = args(
        Func::ReduceScatter,
        recv_count,
        dtype,
        send as usize,
        recv as usize,
    );
    // SAFETY: forwarded arguments (same C signature as HcclAllReduce).
    op(comm, stream, a, || unsafe {
        f(send, recv, recv_count, dtype, red, comm, stream)
    })
}

/// Interposed `HcclReduce`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub unsafe extern "C" fn HcclReduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    dtype: c_int,
    red: c_int,
    root: u32,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<ReduceFn>(&R_REDUCE) else {
        return HCCL_E_NOT_FOUND;
    };
    let mut a = args(Func::Reduce, count, dtype, send as usize, recv as usize);
    a.root = root as i32;
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(send, recv, count, dtype, red, root, comm, stream)
    })
}

/// Interposed `HcclAlltoAll` (`count` = the send count per peer).
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub unsafe extern "C" fn HcclAlltoAll(
    send: *const c_void,
    send_count: u64,
    send_type: c_int,
    recv: *const c_void,
    recv_count: u64,
    recv_type: c_int,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<AlltoAllFn>(&R_ALLTOALL) else {
        return HCCL_E_NOT_FOUND;
    };
    let a = args(
        Func::AlltoAll,
        send_count,
        send_type,
        send as usize,
        recv as usize,
    );
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(
            send, send_count, send_type, recv, recv_count, recv_type, comm, stream,
        )
    })
}

/// Interposed `HcclAlltoAllV` (recorded as `AlltoAll`, `count` = the sum of the send counts).
///
/// # Safety
/// HCCL's contract (`send_counts` holds the communicator's rank count of u64s).
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub unsafe extern "C" fn HcclAlltoAllV(
    send: *const c_void,
    send_counts: *const c_void,
    sdispls: *const c_void,
    send_type: c_int,
    recv: *const c_void,
    recv_counts: *const c_void,
    rdispls: *const c_void,
    recv_type: c_int,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<AlltoAllVFn>(&R_ALLTOALLV) else {
        return HCCL_E_NOT_FOUND;
    };
    let n = hccl::lookup(comm as usize).map_or(0, |s| s.nranks.clamp(0, 1 << 16) as usize);
    let total = if send_counts.is_null() || n == 0 {
        0
    } else {
        // SAFETY: HCCL reads `nranks` u64 counts there (its contract).
        let c = unsafe { std::slice::from_raw_parts(send_counts.cast::<u64>(), n) };
        c.iter().fold(0u64, |s, &v| s.saturating_add(v))
    };
    let a = args(
        Func::AlltoAll,
        total,
        send_type,
        send as usize,
        recv as usize,
    );
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(
            send,
            send_counts,
            sdispls,
            send_type,
            recv,
            recv_counts,
            rdispls,
            recv_type,
            comm,
            stream,
        )
    })
}

/// Interposed `HcclSend`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclSend(
    send: *mut c_void,
    count: u64,
    dtype: c_int,
    dest: u32,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<P2pFn>(&R_SEND) else {
        return HCCL_E_NOT_FOUND;
    };
    let mut a = args(Func::Send, count, dtype, send as usize, 0);
    a.peer = dest as i32;
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(send, count, dtype, dest, comm, stream)
    })
}

/// Interposed `HcclRecv`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclRecv(
    recv: *mut c_void,
    count: u64,
    dtype: c_int,
    src: u32,
    comm: Comm,
    stream: Stream,
) -> HcclResult {
    let Some(f) = real::<P2pFn>(&R_RECV) else {
        return HCCL_E_NOT_FOUND;
    };
    let mut a = args(Func::Recv, count, dtype, 0, recv as usize);
    a.peer = src as i32;
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe {
        f(recv, count, dtype, src, comm, stream)
    })
}

/// Interposed `HcclBarrier` (recorded as an `AllReduce` of count 0: HCCL's barrier is a small
/// all-reduce).
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclBarrier(comm: Comm, stream: Stream) -> HcclResult {
    let Some(f) = real::<BarrierFn>(&R_BARRIER) else {
        return HCCL_E_NOT_FOUND;
    };
    let a = args(Func::AllReduce, 0, -1, 0, 0);
    // SAFETY: forwarded arguments.
    op(comm, stream, a, || unsafe { f(comm, stream) })
}

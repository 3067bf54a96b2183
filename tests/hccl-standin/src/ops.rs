//! The HCCL operations of the stand-in (CANN's signatures): each enqueues the NCCL stand-in's
//! operation on its stream and returns (asynchronous, as on a device). `aclrtStream` arguments
//! name the process' one stream.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicU32;

use nccl::group;
use nccl::types::{Func, RedOp};

use crate::{
    code, comm_ref, datatype, enqueue, op, redop, HcclComm, HCCL_E_NOT_SUPPORT, HCCL_E_PARA,
    HCCL_SUCCESS,
};

type Stream = *mut c_void;

/// A collective with a reduction.
#[allow(clippy::too_many_arguments, reason = "the C arguments")]
fn reduce_like(
    func: Func,
    send: *const c_void,
    recv: *mut c_void,
    count: u64,
    dt: c_int,
    red: c_int,
    root: i32,
    comm: HcclComm,
) -> c_int {
    let (Some(dt), Some(red)) = (datatype(dt), redop(red)) else {
        return HCCL_E_NOT_SUPPORT;
    };
    enqueue(
        comm,
        op(func, send as usize, recv as usize, count, dt, red, root),
    )
}

/// `HcclAllReduce(sendBuf, recvBuf, count, dataType, op, comm, stream)`.
#[no_mangle]
pub extern "C" fn HcclAllReduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    dt: c_int,
    red: c_int,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    reduce_like(Func::AllReduce, send, recv, count, dt, red, 0, comm)
}

/// `HcclReduceScatter(sendBuf, recvBuf, recvCount, dataType, op, comm, stream)`.
#[no_mangle]
pub extern "C" fn HcclReduceScatter(
    send: *mut c_void,
    recv: *mut c_void,
    recv_count: u64,
    dt: c_int,
    red: c_int,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    reduce_like(
        Func::ReduceScatter,
        send,
        recv,
        recv_count,
        dt,
        red,
        0,
        comm,
    )
}

/// `HcclReduce(sendBuf, recvBuf, count, dataType, op, root, comm, stream)`.
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub extern "C" fn HcclReduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    dt: c_int,
    red: c_int,
    root: u32,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    reduce_like(Func::Reduce, send, recv, count, dt, red, root as i32, comm)
}

/// `HcclAllGather(sendBuf, recvBuf, sendCount, dataType, comm, stream)`.
#[no_mangle]
pub extern "C" fn HcclAllGather(
    send: *mut c_void,
    recv: *mut c_void,
    send_count: u64,
    dt: c_int,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    reduce_like(Func::AllGather, send, recv, send_count, dt, 0, 0, comm)
}

/// `HcclBroadcast(buf, count, dataType, root, comm, stream)`.
#[no_mangle]
pub extern "C" fn HcclBroadcast(
    buf: *mut c_void,
    count: u64,
    dt: c_int,
    root: u32,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    reduce_like(Func::Broadcast, buf, buf, count, dt, 0, root as i32, comm)
}

/// `HcclAlltoAll(sendBuf, sendCount, sendType, recvBuf, recvCount, recvType, comm, stream)`:
/// equal counts and types only.
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub extern "C" fn HcclAlltoAll(
    send: *const c_void,
    send_count: u64,
    send_type: c_int,
    recv: *const c_void,
    recv_count: u64,
    recv_type: c_int,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    if send_count != recv_count || send_type != recv_type {
        return HCCL_E_NOT_SUPPORT;
    }
    reduce_like(
        Func::AlltoAll,
        send,
        recv.cast_mut(),
        send_count,
        send_type,
        0,
        0,
        comm,
    )
}

/// `HcclAlltoAllV(sendBuf, sendCounts, sdispls, sendType, recvBuf, recvCounts, rdispls, recvType,
/// comm, stream)`: one grouped Send / Recv per peer (counts and displacements in elements).
///
/// # Safety
/// The four arrays hold the communicator's rank count of u64s.
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub unsafe extern "C" fn HcclAlltoAllV(
    send: *const c_void,
    send_counts: *const u64,
    sdispls: *const u64,
    send_type: c_int,
    recv: *const c_void,
    recv_counts: *const u64,
    rdispls: *const u64,
    recv_type: c_int,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    let (Some(st), Some(rt)) = (datatype(send_type), datatype(recv_type)) else {
        return HCCL_E_NOT_SUPPORT;
    };
    let n = match comm_ref(comm).and_then(|c| Ok(c.ready()?.nranks)) {
        Ok(n) => n,
        Err(e) => return code(Err(e)),
    };
    if [send_counts, sdispls, recv_counts, rdispls]
        .iter()
        .any(|p| p.is_null())
    {
        return HCCL_E_PARA;
    }
    // SAFETY: `n` u64s each (the caller's contract), checked non-NULL.
    let (sc, sd, rc, rd) = unsafe {
        (
            std::slice::from_raw_parts(send_counts, n),
            std::slice::from_raw_parts(sdispls, n),
            std::slice::from_raw_parts(recv_counts, n),
            std::slice::from_raw_parts(rdispls, n),
        )
    };
    group::group_start();
    let mut rcode = HCCL_SUCCESS;
    for p in 0..n {
        let so = send as usize + sd[p] as usize * st.size();
        let ro = recv as usize + rd[p] as usize * rt.size();
        for o in [
            op(Func::Send, so, 0, sc[p], st, RedOp::Sum, p as i32),
            op(Func::Recv, 0, ro, rc[p], rt, RedOp::Sum, p as i32),
        ] {
            let r = enqueue(comm, o);
            if rcode == HCCL_SUCCESS {
                rcode = r;
            }
        }
    }
    let e = code(group::group_end());
    if rcode != HCCL_SUCCESS {
        rcode
    } else {
        e
    }
}

/// `HcclSend(sendBuf, count, dataType, destRank, comm, stream)`.
#[no_mangle]
pub extern "C" fn HcclSend(
    send: *mut c_void,
    count: u64,
    dt: c_int,
    dest: u32,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    let Some(dt) = datatype(dt) else {
        return HCCL_E_NOT_SUPPORT;
    };
    enqueue(
        comm,
        op(
            Func::Send,
            send as usize,
            0,
            count,
            dt,
            RedOp::Sum,
            dest as i32,
        ),
    )
}

/// `HcclRecv(recvBuf, count, dataType, srcRank, comm, stream)`.
#[no_mangle]
pub extern "C" fn HcclRecv(
    recv: *mut c_void,
    count: u64,
    dt: c_int,
    src: u32,
    comm: HcclComm,
    _stream: Stream,
) -> c_int {
    let Some(dt) = datatype(dt) else {
        return HCCL_E_NOT_SUPPORT;
    };
    enqueue(
        comm,
        op(
            Func::Recv,
            0,
            recv as usize,
            count,
            dt,
            RedOp::Sum,
            src as i32,
        ),
    )
}

/// The barrier's operand (its value does not matter).
static BARRIER: [AtomicU32; 1] = [AtomicU32::new(0)];

/// `HcclBarrier(comm, stream)`: a one-element all-reduce on the stream.
#[no_mangle]
pub extern "C" fn HcclBarrier(comm: HcclComm, _stream: Stream) -> c_int {
    let p = BARRIER.as_ptr() as usize;
    enqueue(
        comm,
        op(
            Func::AllReduce,
            p,
            p,
            1,
            nccl::types::DataType::Int32,
            RedOp::Max,
            0,
        ),
    )
}

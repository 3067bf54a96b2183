//! ibverbs control path: an entry uprobe per function saves the arguments (and what they point
//! to, while it is still alive) in `VERBS_ENTRY`; its return probe adds what the call produced
//! and sends one `VerbsEvent`. Struct offsets: rdma-core 44 `verbs.h` on x86_64
//! (`shared/research/ebpf-nic.md` §5).

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_probe_read_user};
use aya_ebpf::macros::{uprobe, uretprobe};
use aya_ebpf::programs::{ProbeContext, RetProbeContext};
use comminsight_ebpf_common::{kind, verbs, EventHeader, VerbsEvent};

use crate::{count, current, tracked, EVENTS, VERBS_ENTRY};

// ibv_qp
const QP_CONTEXT: u64 = 0;
const QP_NUM: u64 = 52;
const QP_STATE: u64 = 56;
const QP_TYPE: u64 = 60;
// ibv_qp_attr
const ATTR_QP_STATE: u64 = 0;
const ATTR_PATH_MTU: u64 = 8;
const ATTR_DEST_QPN: u64 = 28;
const ATTR_DGID: u64 = 56;
const ATTR_DLID: u64 = 80;
const ATTR_PORT: u64 = 129;
// ibv_mr
const MR_LENGTH: u64 = 24;
const MR_LKEY: u64 = 36;
const MR_RKEY: u64 = 40;
// ibv_context -> device -> name
const CTX_DEVICE: u64 = 0;
const DEVICE_NAME: u64 = 24;
// ibv_async_event
const ASYNC_ELEMENT: u64 = 0;
const ASYNC_TYPE: u64 = 8;

/// Read a `T` at user address `base + off`; zero when it faults.
#[inline(always)]
fn read<T: Default>(base: u64, off: u64) -> T {
    if base == 0 {
        return T::default();
    }
    // SAFETY: bpf_probe_read_user copies from user memory and fails cleanly on a bad address.
    unsafe { bpf_probe_read_user((base + off) as *const T) }.unwrap_or_default()
}

/// The device name behind an `ibv_context *`.
#[inline(always)]
fn device_name(ctx_ptr: u64, out: &mut [u8; 32]) {
    let dev: u64 = read(ctx_ptr, CTX_DEVICE);
    if dev != 0 {
        // SAFETY: as in `read`.
        if let Ok(name) = unsafe { bpf_probe_read_user((dev + DEVICE_NAME) as *const [u8; 32]) } {
            *out = name;
        }
    }
}

/// The QP fields of an `ibv_qp *`.
#[inline(always)]
fn qp_fields(e: &mut VerbsEvent, qp: u64) {
    e.qp_num = read(qp, QP_NUM);
    e.qp_state = read(qp, QP_STATE);
    e.qp_type = read(qp, QP_TYPE);
    let ctx: u64 = read(qp, QP_CONTEXT);
    device_name(ctx, &mut e.device);
}

const ZERO: VerbsEvent = VerbsEvent {
    hdr: EventHeader {
        kind: kind::VERBS,
        tid: 0,
        pid: 0,
        what: 0,
        ts_ns: 0,
    },
    enter_ns: 0,
    ret: 0,
    args: [0; 4],
    qp_num: 0,
    qp_type: 0,
    qp_state: 0,
    new_state: 0,
    attr_mask: 0,
    dest_qp_num: 0,
    dlid: 0,
    port_num: 0,
    path_mtu: 0,
    lkey: 0,
    rkey: 0,
    _pad: 0,
    length: 0,
    dgid: [0; 16],
    device: [0; 32],
};

#[inline(always)]
fn enter(ctx: &ProbeContext, func: u32) -> u32 {
    let (pid, tid) = current();
    if !tracked(pid, kind::VERBS) {
        return 0;
    }
    let mut e = ZERO;
    e.hdr.tid = tid;
    e.hdr.pid = pid;
    e.hdr.what = func;
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    e.enter_ns = unsafe { bpf_ktime_get_ns() };
    let a0: u64 = ctx.arg(0).unwrap_or(0);
    let a1: u64 = ctx.arg(1).unwrap_or(0);
    let a2: u64 = ctx.arg(2).unwrap_or(0);
    let a3: u64 = ctx.arg(3).unwrap_or(0);
    e.args = [a0, a1, a2, a3];
    match func {
        verbs::OPEN_DEVICE => {
            // SAFETY: as in `read`.
            if let Ok(n) = unsafe { bpf_probe_read_user((a0 + DEVICE_NAME) as *const [u8; 32]) } {
                e.device = n;
            }
        }
        verbs::MODIFY_QP => {
            qp_fields(&mut e, a0);
            e.attr_mask = a2 as u32;
            e.new_state = read(a1, ATTR_QP_STATE);
            e.path_mtu = read::<u32>(a1, ATTR_PATH_MTU) as u8;
            e.dest_qp_num = read(a1, ATTR_DEST_QPN);
            e.dgid = read(a1, ATTR_DGID);
            e.dlid = read(a1, ATTR_DLID);
            e.port_num = read(a1, ATTR_PORT);
        }
        verbs::DESTROY_QP => qp_fields(&mut e, a0),
        verbs::ALLOC_PD | verbs::CREATE_CQ | verbs::CLOSE_DEVICE => device_name(a0, &mut e.device),
        verbs::DEREG_MR => {
            e.length = read(a0, MR_LENGTH);
            e.lkey = read(a0, MR_LKEY);
            e.rkey = read(a0, MR_RKEY);
        }
        _ => {}
    }
    let key = ((tid as u64) << 32) | func as u64;
    let _ = VERBS_ENTRY.insert(&key, &e, 0);
    0
}

#[inline(always)]
fn leave(ctx: &RetProbeContext, func: u32) -> u32 {
    let (_, tid) = current();
    let key = ((tid as u64) << 32) | func as u64;
    // SAFETY: the value is copied out before the entry is removed.
    let mut e = match unsafe { VERBS_ENTRY.get(&key) } {
        Some(e) => *e,
        None => return 0,
    };
    let _ = VERBS_ENTRY.remove(&key);
    let ret: u64 = ctx.ret();
    e.ret = ret as i64;
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    e.hdr.ts_ns = unsafe { bpf_ktime_get_ns() };
    match func {
        verbs::CREATE_QP => qp_fields(&mut e, ret),
        verbs::MODIFY_QP
        | verbs::DESTROY_QP
        | verbs::FORK_INIT
        | verbs::DEALLOC_PD
        | verbs::DEREG_MR
        | verbs::DESTROY_CQ
        | verbs::CLOSE_DEVICE
        | verbs::GET_ASYNC_EVENT => {
            // int-returning calls: sign-extend the low 32 bits.
            e.ret = ret as i32 as i64;
        }
        verbs::REG_MR | verbs::REG_MR_IOVA2 => {
            e.length = read(ret, MR_LENGTH);
            e.lkey = read(ret, MR_LKEY);
            e.rkey = read(ret, MR_RKEY);
        }
        verbs::OPEN_DEVICE | verbs::ALLOC_PD | verbs::CREATE_CQ => {}
        _ => {}
    }
    if func == verbs::GET_ASYNC_EVENT && e.ret == 0 {
        e.length = read(e.args[1], ASYNC_ELEMENT);
        e.lkey = read(e.args[1], ASYNC_TYPE);
        // For QP events the element is the ibv_qp *: name its QP.
        let element = e.length;
        qp_fields(&mut e, element);
    }
    if func == verbs::OPEN_DEVICE {
        device_name(ret, &mut e.device);
    }
    let lost = EVENTS.output::<VerbsEvent>(&e, 0).is_err();
    count(func, lost);
    0
}

macro_rules! probe_pair {
    ($enter:ident, $leave:ident, $func:expr) => {
        #[uprobe]
        pub fn $enter(ctx: ProbeContext) -> u32 {
            enter(&ctx, $func)
        }
        #[uretprobe]
        pub fn $leave(ctx: RetProbeContext) -> u32 {
            leave(&ctx, $func)
        }
    };
}

probe_pair!(
    ibv_get_device_list_enter,
    ibv_get_device_list_leave,
    verbs::GET_DEVICE_LIST
);
probe_pair!(
    ibv_free_device_list_enter,
    ibv_free_device_list_leave,
    verbs::FREE_DEVICE_LIST
);
probe_pair!(ibv_fork_init_enter, ibv_fork_init_leave, verbs::FORK_INIT);
probe_pair!(
    ibv_open_device_enter,
    ibv_open_device_leave,
    verbs::OPEN_DEVICE
);
probe_pair!(
    ibv_close_device_enter,
    ibv_close_device_leave,
    verbs::CLOSE_DEVICE
);
probe_pair!(ibv_alloc_pd_enter, ibv_alloc_pd_leave, verbs::ALLOC_PD);
probe_pair!(
    ibv_dealloc_pd_enter,
    ibv_dealloc_pd_leave,
    verbs::DEALLOC_PD
);
probe_pair!(ibv_reg_mr_enter, ibv_reg_mr_leave, verbs::REG_MR);
probe_pair!(
    ibv_reg_mr_iova2_enter,
    ibv_reg_mr_iova2_leave,
    verbs::REG_MR_IOVA2
);
probe_pair!(ibv_dereg_mr_enter, ibv_dereg_mr_leave, verbs::DEREG_MR);
probe_pair!(ibv_create_cq_enter, ibv_create_cq_leave, verbs::CREATE_CQ);
probe_pair!(
    ibv_destroy_cq_enter,
    ibv_destroy_cq_leave,
    verbs::DESTROY_CQ
);
probe_pair!(ibv_create_qp_enter, ibv_create_qp_leave, verbs::CREATE_QP);
probe_pair!(ibv_modify_qp_enter, ibv_modify_qp_leave, verbs::MODIFY_QP);
probe_pair!(
    ibv_destroy_qp_enter,
    ibv_destroy_qp_leave,
    verbs::DESTROY_QP
);
probe_pair!(
    ibv_get_async_event_enter,
    ibv_get_async_event_leave,
    verbs::GET_ASYNC_EVENT
);

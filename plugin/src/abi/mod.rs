//! NCCL profiler ABI: `#[repr(C)]` types per version (`v4`, `v5`, `v6`) and the [`Descr`] trait
//! that normalises them into one [`Event`] view (research/nccl-abi.md §1.2, §2).
//!
//! Every field offset of every version is asserted at compile time against the measured layout of
//! nccl-abi.md §2.6, and `tests/layout.rs` re-checks the whole table against the document itself.

use core::ffi::{c_char, c_int, c_ulong, c_void};

pub mod v4;
pub mod v5;
pub mod v6;

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclSystemError`.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;

/// `ncclDebugLogger_t`: `(level, flags, file, line, fmt, ...)`.
pub type LogFn = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);
/// `NCCL_LOG_WARN`.
pub const LOG_WARN: c_int = 2;
/// `NCCL_LOG_INFO`.
pub const LOG_INFO: c_int = 3;
/// `NCCL_PROFILE` debug subsystem.
pub const SUBSYS_PROFILE: c_ulong = 0x4000;

// Event-type bits (`eDescr->type`, activation mask).
pub const EV_GROUP: u64 = 1 << 0;
pub const EV_COLL: u64 = 1 << 1;
pub const EV_P2P: u64 = 1 << 2;
pub const EV_PROXY_OP: u64 = 1 << 3;
pub const EV_PROXY_STEP: u64 = 1 << 4;
pub const EV_PROXY_CTRL: u64 = 1 << 5;
pub const EV_KERNEL_CH: u64 = 1 << 6;
pub const EV_NET_PLUGIN: u64 = 1 << 7;
pub const EV_GROUP_API: u64 = 1 << 8;
pub const EV_COLL_API: u64 = 1 << 9;
pub const EV_P2P_API: u64 = 1 << 10;
pub const EV_KERNEL_LAUNCH: u64 = 1 << 11;
pub const EV_CE_COLL: u64 = 1 << 12;
pub const EV_CE_SYNC: u64 = 1 << 13;
pub const EV_CE_BATCH: u64 = 1 << 14;

/// The bit number of a single-bit event type (64 for anything else: 0, several bits). Descriptor
/// decoding matches on this dense number (a jump table) rather than on the sparse bit values (a
/// chain of compares).
#[inline]
pub const fn type_bit(ty: u64) -> u32 {
    if ty.is_power_of_two() {
        ty.trailing_zeros()
    } else {
        64
    }
}

/// `type_bit` of each `EV_*` constant, for match patterns.
pub mod bit {
    use super::*;
    pub const GROUP: u32 = type_bit(EV_GROUP);
    pub const COLL: u32 = type_bit(EV_COLL);
    pub const P2P: u32 = type_bit(EV_P2P);
    pub const PROXY_OP: u32 = type_bit(EV_PROXY_OP);
    pub const PROXY_STEP: u32 = type_bit(EV_PROXY_STEP);
    pub const PROXY_CTRL: u32 = type_bit(EV_PROXY_CTRL);
    pub const KERNEL_CH: u32 = type_bit(EV_KERNEL_CH);
    pub const NET_PLUGIN: u32 = type_bit(EV_NET_PLUGIN);
    pub const GROUP_API: u32 = type_bit(EV_GROUP_API);
    pub const COLL_API: u32 = type_bit(EV_COLL_API);
    pub const P2P_API: u32 = type_bit(EV_P2P_API);
    pub const KERNEL_LAUNCH: u32 = type_bit(EV_KERNEL_LAUNCH);
    pub const CE_COLL: u32 = type_bit(EV_CE_COLL);
    pub const CE_SYNC: u32 = type_bit(EV_CE_SYNC);
    pub const CE_BATCH: u32 = type_bit(EV_CE_BATCH);
}

// States (`ncclProfilerEventState_t`).
pub const ST_PROXY_OP_SEND_POSTED: c_int = 0;
pub const ST_PROXY_OP_SEND_REM_FIFO_WAIT: c_int = 1;
pub const ST_PROXY_OP_SEND_TRANSMITTED: c_int = 2;
pub const ST_PROXY_OP_SEND_DONE: c_int = 3;
pub const ST_PROXY_OP_RECV_POSTED: c_int = 4;
pub const ST_PROXY_OP_RECV_RECEIVED: c_int = 5;
pub const ST_PROXY_OP_RECV_TRANSMITTED: c_int = 6;
pub const ST_PROXY_OP_RECV_DONE: c_int = 7;
pub const ST_PROXY_STEP_SEND_GPU_WAIT: c_int = 8;
pub const ST_PROXY_STEP_SEND_WAIT: c_int = 9;
pub const ST_PROXY_STEP_RECV_WAIT: c_int = 10;
pub const ST_PROXY_STEP_RECV_FLUSH_WAIT: c_int = 11;
pub const ST_PROXY_STEP_RECV_GPU_WAIT: c_int = 12;
pub const ST_PROXY_CTRL_IDLE: c_int = 13;
pub const ST_PROXY_CTRL_ACTIVE: c_int = 14;
pub const ST_PROXY_CTRL_SLEEP: c_int = 15;
pub const ST_PROXY_CTRL_WAKEUP: c_int = 16;
pub const ST_PROXY_CTRL_APPEND: c_int = 17;
pub const ST_PROXY_CTRL_APPEND_END: c_int = 18;
pub const ST_PROXY_OP_IN_PROGRESS_V4: c_int = 19;
pub const ST_PROXY_STEP_SEND_PEER_WAIT_V4: c_int = 20;
pub const ST_NET_PLUGIN_UPDATE: c_int = 21;
pub const ST_KERNEL_CH_STOP: c_int = 22;
pub const ST_GROUP_START_API_STOP: c_int = 23;
pub const ST_GROUP_END_API_START: c_int = 24;
pub const ST_CE_COLL_START: c_int = 25;
pub const ST_CE_COLL_COMPLETE: c_int = 26;
pub const ST_CE_SYNC_START: c_int = 27;
pub const ST_CE_SYNC_COMPLETE: c_int = 28;
pub const ST_CE_BATCH_START: c_int = 29;
pub const ST_CE_BATCH_COMPLETE: c_int = 30;

/// `NCCL_PROFILER_NET_TYPE_IB`.
pub const NET_TYPE_IB: i64 = 1 << 16;
/// `NCCL_PROFILER_NET_TYPE_SOCK`.
pub const NET_TYPE_SOCK: i64 = 2 << 16;
/// `NCCL_PROFILER_NET_VER_MASK`.
pub const NET_VER_MASK: i64 = 0xffff;
/// `NCCL_PROFILER_NET_TYPE_MASK`.
pub const NET_TYPE_MASK: i64 = 0xffff_0000;

/// Every named constant of §2.6, for the layout test.
pub const CONSTANTS: &[(&str, i64)] = &[
    ("ncclProfileGroup", EV_GROUP as i64),
    ("ncclProfileColl", EV_COLL as i64),
    ("ncclProfileP2p", EV_P2P as i64),
    ("ncclProfileProxyOp", EV_PROXY_OP as i64),
    ("ncclProfileProxyStep", EV_PROXY_STEP as i64),
    ("ncclProfileProxyCtrl", EV_PROXY_CTRL as i64),
    ("ncclProfileKernelCh", EV_KERNEL_CH as i64),
    ("ncclProfileNetPlugin", EV_NET_PLUGIN as i64),
    ("ncclProfileGroupApi", EV_GROUP_API as i64),
    ("ncclProfileCollApi", EV_COLL_API as i64),
    ("ncclProfileP2pApi", EV_P2P_API as i64),
    ("ncclProfileKernelLaunch", EV_KERNEL_LAUNCH as i64),
    ("ncclProfileCeColl", EV_CE_COLL as i64),
    ("ncclProfileCeSync", EV_CE_SYNC as i64),
    ("ncclProfileCeBatch", EV_CE_BATCH as i64),
    (
        "ncclProfilerProxyOpSendPosted",
        ST_PROXY_OP_SEND_POSTED as i64,
    ),
    (
        "ncclProfilerProxyOpSendRemFifoWait",
        ST_PROXY_OP_SEND_REM_FIFO_WAIT as i64,
    ),
    (
        "ncclProfilerProxyOpSendTransmitted",
        ST_PROXY_OP_SEND_TRANSMITTED as i64,
    ),
    ("ncclProfilerProxyOpSendDone", ST_PROXY_OP_SEND_DONE as i64),
    (
        "ncclProfilerProxyOpRecvPosted",
        ST_PROXY_OP_RECV_POSTED as i64,
    ),
    (
        "ncclProfilerProxyOpRecvReceived",
        ST_PROXY_OP_RECV_RECEIVED as i64,
    ),
    (
        "ncclProfilerProxyOpRecvTransmitted",
        ST_PROXY_OP_RECV_TRANSMITTED as i64,
    ),
    ("ncclProfilerProxyOpRecvDone", ST_PROXY_OP_RECV_DONE as i64),
    (
        "ncclProfilerProxyStepSendGPUWait",
        ST_PROXY_STEP_SEND_GPU_WAIT as i64,
    ),
    (
        "ncclProfilerProxyStepSendWait",
        ST_PROXY_STEP_SEND_WAIT as i64,
    ),
    (
        "ncclProfilerProxyStepRecvWait",
        ST_PROXY_STEP_RECV_WAIT as i64,
    ),
    (
        "ncclProfilerProxyStepRecvFlushWait",
        ST_PROXY_STEP_RECV_FLUSH_WAIT as i64,
    ),
    (
        "ncclProfilerProxyStepRecvGPUWait",
        ST_PROXY_STEP_RECV_GPU_WAIT as i64,
    ),
    ("ncclProfilerProxyCtrlIdle", ST_PROXY_CTRL_IDLE as i64),
    ("ncclProfilerProxyCtrlActive", ST_PROXY_CTRL_ACTIVE as i64),
    ("ncclProfilerProxyCtrlSleep", ST_PROXY_CTRL_SLEEP as i64),
    ("ncclProfilerProxyCtrlWakeup", ST_PROXY_CTRL_WAKEUP as i64),
    ("ncclProfilerProxyCtrlAppend", ST_PROXY_CTRL_APPEND as i64),
    (
        "ncclProfilerProxyCtrlAppendEnd",
        ST_PROXY_CTRL_APPEND_END as i64,
    ),
    (
        "ncclProfilerProxyOpInProgress_v4",
        ST_PROXY_OP_IN_PROGRESS_V4 as i64,
    ),
    (
        "ncclProfilerProxyStepSendPeerWait_v4",
        ST_PROXY_STEP_SEND_PEER_WAIT_V4 as i64,
    ),
    ("ncclProfilerNetPluginUpdate", ST_NET_PLUGIN_UPDATE as i64),
    ("ncclProfilerKernelChStop", ST_KERNEL_CH_STOP as i64),
    (
        "ncclProfilerGroupStartApiStop",
        ST_GROUP_START_API_STOP as i64,
    ),
    (
        "ncclProfilerGroupEndApiStart",
        ST_GROUP_END_API_START as i64,
    ),
    ("ncclProfilerCeCollStart", ST_CE_COLL_START as i64),
    ("ncclProfilerCeCollComplete", ST_CE_COLL_COMPLETE as i64),
    ("ncclProfilerCeSyncStart", ST_CE_SYNC_START as i64),
    ("ncclProfilerCeSyncComplete", ST_CE_SYNC_COMPLETE as i64),
    ("ncclProfilerCeBatchStart", ST_CE_BATCH_START as i64),
    ("ncclProfilerCeBatchComplete", ST_CE_BATCH_COMPLETE as i64),
    ("NCCL_PROFILER_NET_TYPE_IB", NET_TYPE_IB),
    ("NCCL_PROFILER_NET_TYPE_SOCK", NET_TYPE_SOCK),
    ("NCCL_PROFILER_NET_VER_MASK", NET_VER_MASK),
    ("NCCL_PROFILER_NET_TYPE_MASK", NET_TYPE_MASK),
    ("ncclSuccess", NCCL_SUCCESS as i64),
    ("ncclSystemError", NCCL_SYSTEM_ERROR as i64),
    ("ncclInternalError", NCCL_INTERNAL_ERROR as i64),
];

/// One row of a layout table: (`type.member.path`, offset, size). A `SIZE` row uses the bare type
/// name with offset = alignment.
pub type LayoutRow = (&'static str, usize, usize);

/// Emit compile-time asserts and a `LAYOUT` table for one C type.
/// Rows: `("member.path", offset_expr, FieldType, expected_offset, expected_size)`.
macro_rules! layout {
    ($name:ident, $cname:literal, $T:ty, $size:literal, $align:literal,
     [ $( ($path:literal, $off:expr, $F:ty, $eo:literal, $es:literal) ),* $(,)? ]) => {
        const _: () = {
            assert!(core::mem::size_of::<$T>() == $size);
            assert!(core::mem::align_of::<$T>() == $align);
            $( assert!($off == $eo); assert!(core::mem::size_of::<$F>() == $es); )*
        };
        /// Layout of this type as the code sees it (size row first).
        pub const $name: &[$crate::abi::LayoutRow] = &[
            ($cname, core::mem::align_of::<$T>(), core::mem::size_of::<$T>()),
            $( (concat!($cname, ".", $path), $off, core::mem::size_of::<$F>()) ),*
        ];
    };
}
pub(crate) use layout;

/// `ncclProfilerEventStateArgs_v4/v5/v6_t` (identical in all three versions).
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgs {
    pub proxy_step_trans_size: usize,
    pub proxy_ctrl_appended_proxy_ops: c_int,
    pub net_plugin_data: *mut c_void,
    pub kernel_ch_ptimer: u64,
}

layout!(STATE_ARGS_V5, "ncclProfilerEventStateArgs_v5_t", StateArgs, 8, 8, [
    ("proxyStep.transSize", 0, usize, 0, 8),
    ("proxyCtrl.appendedProxyOps", 0, c_int, 0, 4),
    ("netPlugin.data", 0, *mut c_void, 0, 8),
    ("kernelCh.pTimer", 0, u64, 0, 8),
]);
layout!(STATE_ARGS_V4, "ncclProfilerEventStateArgs_v4_t", StateArgs, 8, 8, [
    ("proxyStep.transSize", 0, usize, 0, 8),
    ("proxyCtrl.appendedProxyOps", 0, c_int, 0, 4),
    ("netPlugin.data", 0, *mut c_void, 0, 8),
    ("kernelCh.pTimer", 0, u64, 0, 8),
]);
layout!(
    STATE_ARGS_V6,
    "ncclProfilerEventStateArgs_v6_t",
    StateArgs,
    8,
    8,
    []
);

/// `ncclProfilerNetIbDescr_v1_t` (`qp` arm; the only one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetIbDescrV1 {
    pub type_: u8,
    pub qp: NetIbQp,
}

/// `ncclProfilerNetIbDescr_v1_t.qp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetIbQp {
    pub device: c_int,
    pub wr_id: u64,
    pub opcode: c_int,
    pub qp_num: c_int,
    pub length: usize,
}

layout!(
    NET_IB_V1,
    "ncclProfilerNetIbDescr_v1_t",
    NetIbDescrV1,
    40,
    8,
    [
        ("type", core::mem::offset_of!(NetIbDescrV1, type_), u8, 0, 1),
        (
            "qp.device",
            core::mem::offset_of!(NetIbDescrV1, qp) + core::mem::offset_of!(NetIbQp, device),
            c_int,
            8,
            4
        ),
        (
            "qp.wr_id",
            core::mem::offset_of!(NetIbDescrV1, qp) + core::mem::offset_of!(NetIbQp, wr_id),
            u64,
            16,
            8
        ),
        (
            "qp.opcode",
            core::mem::offset_of!(NetIbDescrV1, qp) + core::mem::offset_of!(NetIbQp, opcode),
            c_int,
            24,
            4
        ),
        (
            "qp.qpNum",
            core::mem::offset_of!(NetIbDescrV1, qp) + core::mem::offset_of!(NetIbQp, qp_num),
            c_int,
            28,
            4
        ),
        (
            "qp.length",
            core::mem::offset_of!(NetIbDescrV1, qp) + core::mem::offset_of!(NetIbQp, length),
            usize,
            32,
            8
        ),
    ]
);

/// `ncclProfilerNetSockDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetSockDescrV1 {
    pub type_: u8,
    pub sock: NetSock,
}

/// `ncclProfilerNetSockDescr_v1_t.sock`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetSock {
    pub fd: c_int,
    pub op: c_int,
    pub length: usize,
}

layout!(
    NET_SOCK_V1,
    "ncclProfilerNetSockDescr_v1_t",
    NetSockDescrV1,
    24,
    8,
    [
        (
            "type",
            core::mem::offset_of!(NetSockDescrV1, type_),
            u8,
            0,
            1
        ),
        (
            "sock.fd",
            core::mem::offset_of!(NetSockDescrV1, sock) + core::mem::offset_of!(NetSock, fd),
            c_int,
            8,
            4
        ),
        (
            "sock.op",
            core::mem::offset_of!(NetSockDescrV1, sock) + core::mem::offset_of!(NetSock, op),
            c_int,
            12,
            4
        ),
        (
            "sock.length",
            core::mem::offset_of!(NetSockDescrV1, sock) + core::mem::offset_of!(NetSock, length),
            usize,
            16,
            8
        ),
    ]
);

/// The function-pointer table every version exports (48 bytes: name + 5 pointers).
#[repr(C)]
pub struct ProfilerTable<Init, Start, Record> {
    pub name: *const c_char,
    pub init: Option<Init>,
    pub start_event: Option<Start>,
    pub stop_event: Option<StopFn>,
    pub record_event_state: Option<Record>,
    pub finalize: Option<FinalizeFn>,
}

// SAFETY: the table is immutable static data (a pointer to a static C string and fn pointers);
// sharing it between threads cannot race.
unsafe impl<I, S, R> Sync for ProfilerTable<I, S, R> {}

/// `stopEvent(void* eHandle)` (all versions).
pub type StopFn = unsafe extern "C" fn(*mut c_void) -> NcclResult;
/// `finalize(void* context)` (all versions).
pub type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> NcclResult;
/// `recordEventState(void* eHandle, ncclProfilerEventState_t, ncclProfilerEventStateArgs_vN_t*)`.
pub type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut StateArgs) -> NcclResult;

/// Collective descriptor fields (raw; strings still NCCL's pointers, valid during the call).
#[derive(Clone, Copy, Debug)]
pub struct CollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// Point-to-point descriptor fields.
#[derive(Clone, Copy, Debug)]
pub struct P2pDescr {
    pub func: *const c_char,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
}

/// Proxy-operation descriptor fields.
#[derive(Clone, Copy, Debug)]
pub struct ProxyOpDescr {
    pub pid: i32,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

/// One start event, normalised across ABI versions. Only the arm `type` names was read.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    GroupApi,
    CollApi,
    P2pApi,
    KernelLaunch,
    Group,
    Coll(CollDescr),
    P2p(P2pDescr),
    ProxyOp(ProxyOpDescr),
    ProxyStep {
        step: c_int,
    },
    ProxyCtrl,
    KernelCh {
        channel_id: u8,
        ptimer: u64,
    },
    NetPlugin {
        id: i64,
        data: *mut c_void,
    },
    /// Copy-engine events (v6): not supported, ignored.
    Ce,
    /// Zero, several or unknown bits.
    Unknown(u64),
}

/// A version's event descriptor.
pub trait Descr {
    /// ABI version (4, 5, 6).
    const ABI: u8;
    /// `type` widened to 64 bits.
    fn type_bits(&self) -> u64;
    /// `parentObj`.
    fn parent(&self) -> *mut c_void;
    /// `rank`.
    fn rank(&self) -> c_int;
    /// Read the union arm that `type` names.
    fn event(&self) -> Event;
}

//! `#[repr(C)]` mirrors of NCCL's profiler ABI v4 and v5/v6 (nccl-abi.md §2.2/§2.6). v6's non-CE part is
//! byte-identical to v5, and the stand-in never emits CE events, so one descriptor type serves both.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// Event type bits.
pub mod bits {
    /// `ncclProfileGroup`.
    pub const GROUP: i32 = 1;
    /// `ncclProfileColl`.
    pub const COLL: i32 = 2;
    /// `ncclProfileP2p`.
    pub const P2P: i32 = 4;
    /// `ncclProfileProxyOp`.
    pub const PROXY_OP: i32 = 8;
    /// `ncclProfileProxyStep`.
    pub const PROXY_STEP: i32 = 16;
    /// `ncclProfileProxyCtrl`.
    pub const PROXY_CTRL: i32 = 32;
    /// `ncclProfileKernelCh`.
    pub const KERNEL_CH: i32 = 64;
    /// `ncclProfileNetPlugin`.
    pub const NET_PLUGIN: i32 = 128;
    /// `ncclProfileGroupApi`.
    pub const GROUP_API: i32 = 256;
    /// `ncclProfileCollApi`.
    pub const COLL_API: i32 = 512;
    /// `ncclProfileP2pApi`.
    pub const P2P_API: i32 = 1024;
    /// `ncclProfileKernelLaunch`.
    pub const KERNEL_LAUNCH: i32 = 2048;
    /// `ncclProfileCeColl | CeSync | CeBatch`.
    pub const CE_ALL: i32 = 4096 | 8192 | 16384;
}

/// `NCCL_PROFILER_NET_TYPE_SOCK`.
pub const NET_TYPE_SOCK: i64 = 2 << 16;

/// Group API arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApi {
    /// `graphCaptured`.
    pub graph_captured: bool,
    /// `groupDepth`.
    pub group_depth: c_int,
}

/// Coll API arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApi {
    /// `func`.
    pub func: *const c_char,
    /// `count`.
    pub count: usize,
    /// `datatype`.
    pub datatype: *const c_char,
    /// `root`.
    pub root: c_int,
    /// `stream`.
    pub stream: *mut c_void,
    /// `graphCaptured`.
    pub graph_captured: bool,
}

/// P2p API arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApi {
    /// `func`.
    pub func: *const c_char,
    /// `count`.
    pub count: usize,
    /// `datatype`.
    pub datatype: *const c_char,
    /// `stream`.
    pub stream: *mut c_void,
    /// `graphCaptured`.
    pub graph_captured: bool,
}

/// Coll arm (v5/v6: with `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Coll {
    /// `seqNumber`.
    pub seq_number: u64,
    /// `func`.
    pub func: *const c_char,
    /// `sendBuff`.
    pub send_buff: *const c_void,
    /// `recvBuff`.
    pub recv_buff: *mut c_void,
    /// `count`.
    pub count: usize,
    /// `root`.
    pub root: c_int,
    /// `datatype`.
    pub datatype: *const c_char,
    /// `nChannels`.
    pub n_channels: u8,
    /// `nWarps`.
    pub n_warps: u8,
    /// `algo`.
    pub algo: *const c_char,
    /// `proto`.
    pub proto: *const c_char,
    /// `parentGroup` (v5+).
    pub parent_group: *mut c_void,
}

/// P2p arm (v5/v6: with `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2p {
    /// `func`.
    pub func: *const c_char,
    /// `buff`.
    pub buff: *mut c_void,
    /// `datatype`.
    pub datatype: *const c_char,
    /// `count`.
    pub count: usize,
    /// `peer`.
    pub peer: c_int,
    /// `nChannels`.
    pub n_channels: u8,
    /// `parentGroup` (v5+).
    pub parent_group: *mut c_void,
}

/// ProxyOp arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOp {
    /// `pid`.
    pub pid: libc::pid_t,
    /// `channelId`.
    pub channel_id: u8,
    /// `peer`.
    pub peer: c_int,
    /// `nSteps`.
    pub n_steps: c_int,
    /// `chunkSize`.
    pub chunk_size: c_int,
    /// `isSend`.
    pub is_send: c_int,
}

/// KernelCh arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelCh {
    /// `channelId`.
    pub channel_id: u8,
    /// `pTimer`.
    pub p_timer: u64,
}

/// NetPlugin arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetPlugin {
    /// `id` = type | version.
    pub id: i64,
    /// `data` → `ncclProfilerNetSockDescr_v1_t`.
    pub data: *mut c_void,
}

/// The v5/v6 union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Arm5 {
    /// GroupApi.
    pub group_api: GroupApi,
    /// CollApi.
    pub coll_api: CollApi,
    /// P2pApi.
    pub p2p_api: P2pApi,
    /// KernelLaunch stream.
    pub kernel_launch_stream: *mut c_void,
    /// Coll.
    pub coll: Coll,
    /// P2p.
    pub p2p: P2p,
    /// ProxyOp.
    pub proxy_op: ProxyOp,
    /// ProxyStep step.
    pub proxy_step: c_int,
    /// KernelCh.
    pub kernel_ch: KernelCh,
    /// NetPlugin.
    pub net_plugin: NetPlugin,
    /// Size filler: v5/v6 union is 88 bytes.
    pub raw: [u64; 11],
}

/// `ncclProfilerEventDescr_v5_t` / `_v6_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Descr5 {
    /// `type`.
    pub ty: u64,
    /// `parentObj`.
    pub parent_obj: *mut c_void,
    /// `rank`.
    pub rank: c_int,
    /// The union.
    pub u: Arm5,
}

/// v4 Coll arm (no `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Coll4 {
    /// `seqNumber`.
    pub seq_number: u64,
    /// `func`.
    pub func: *const c_char,
    /// `sendBuff`.
    pub send_buff: *const c_void,
    /// `recvBuff`.
    pub recv_buff: *mut c_void,
    /// `count`.
    pub count: usize,
    /// `root`.
    pub root: c_int,
    /// `datatype`.
    pub datatype: *const c_char,
    /// `nChannels`.
    pub n_channels: u8,
    /// `nWarps`.
    pub n_warps: u8,
    /// `algo`.
    pub algo: *const c_char,
    /// `proto`.
    pub proto: *const c_char,
}

/// v4 P2p arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2p4 {
    /// `func`.
    pub func: *const c_char,
    /// `buff`.
    pub buff: *mut c_void,
    /// `datatype`.
    pub datatype: *const c_char,
    /// `count`.
    pub count: usize,
    /// `peer`.
    pub peer: c_int,
    /// `nChannels`.
    pub n_channels: u8,
}

/// The v4 union (80 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union Arm4 {
    /// Coll.
    pub coll: Coll4,
    /// P2p.
    pub p2p: P2p4,
    /// ProxyOp.
    pub proxy_op: ProxyOp,
    /// ProxyStep step.
    pub proxy_step: c_int,
    /// KernelCh.
    pub kernel_ch: KernelCh,
    /// NetPlugin.
    pub net_plugin: NetPlugin,
    /// Size filler.
    pub raw: [u64; 10],
}

/// `ncclProfilerEventDescr_v4_t` (104 bytes, `uint8_t type`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Descr4 {
    /// `type`.
    pub ty: u8,
    /// `parentObj`.
    pub parent_obj: *mut c_void,
    /// `rank`.
    pub rank: c_int,
    /// The union.
    pub u: Arm4,
}

/// `ncclProfilerEventStateArgs_v4/5/6_t`: 8 bytes, every member at offset 0.
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgs {
    /// proxyStep.transSize / kernelCh.pTimer / netPlugin.data / proxyCtrl.appendedProxyOps.
    pub u64_: u64,
    /// proxyCtrl.appendedProxyOps.
    pub int_: c_int,
}

/// The `sock` member of `ncclProfilerNetSockDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SockInfo {
    /// `sock.fd`.
    pub fd: c_int,
    /// `sock.op`: `NCCL_SOCKET_SEND` 0, `NCCL_SOCKET_RECV` 1.
    pub op: c_int,
    /// `sock.length`.
    pub length: usize,
}

/// `ncclProfilerNetSockDescr_v1_t` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SockDescr {
    /// `type` = `ncclProfileSocket` (1).
    pub ty: u8,
    /// `sock`.
    pub sock: SockInfo,
}

/// `init` v4: (ctx, mask, commName, commHash, nNodes, nranks, rank, logfn).
pub type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    crate::log::DebugLogger,
) -> c_int;
/// `init` v5/v6: (ctx, commId, mask, commName, nNodes, nranks, rank, logfn).
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    crate::log::DebugLogger,
) -> c_int;
/// `startEvent` (descriptor pointer typed per version by the caller).
pub type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
/// `stopEvent`.
pub type StopFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `recordEventState`.
pub type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut StateArgs) -> c_int;
/// `finalize`.
pub type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ncclProfiler_vN_t` as read from the plugin (init left untyped until the version is known).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Table {
    /// `name`.
    pub name: *const c_char,
    /// `init`.
    pub init: Option<unsafe extern "C" fn()>,
    /// `startEvent`.
    pub start_event: Option<StartFn>,
    /// `stopEvent`.
    pub stop_event: Option<StopFn>,
    /// `recordEventState`.
    pub record_event_state: Option<RecordFn>,
    /// `finalize`.
    pub finalize: Option<FinalizeFn>,
}

const _: () = assert!(size_of::<Table>() == 48);
const _: () = assert!(size_of::<Descr5>() == 112);
const _: () = assert!(size_of::<Descr4>() == 104);
const _: () = assert!(offset_of!(Descr5, u) == 24);
const _: () = assert!(offset_of!(Descr4, u) == 24);
const _: () = assert!(offset_of!(Descr5, rank) == 16);
const _: () = assert!(size_of::<CollApi>() == 48);
const _: () = assert!(offset_of!(CollApi, root) == 24);
const _: () = assert!(offset_of!(CollApi, graph_captured) == 40);
const _: () = assert!(size_of::<P2pApi>() == 40);
const _: () = assert!(size_of::<Coll>() == 88);
const _: () = assert!(offset_of!(Coll, n_channels) == 56);
const _: () = assert!(offset_of!(Coll, n_warps) == 57);
const _: () = assert!(offset_of!(Coll, algo) == 64);
const _: () = assert!(offset_of!(Coll, parent_group) == 80);
const _: () = assert!(size_of::<Coll4>() == 80);
const _: () = assert!(offset_of!(P2p, peer) == 32);
const _: () = assert!(offset_of!(P2p, n_channels) == 36);
const _: () = assert!(offset_of!(P2p, parent_group) == 40);
const _: () = assert!(size_of::<P2p4>() == 40);
const _: () = assert!(offset_of!(ProxyOp, channel_id) == 4);
const _: () = assert!(offset_of!(ProxyOp, peer) == 8);
const _: () = assert!(offset_of!(ProxyOp, is_send) == 20);
const _: () = assert!(offset_of!(KernelCh, p_timer) == 8);
const _: () = assert!(offset_of!(GroupApi, group_depth) == 4);
const _: () = assert!(size_of::<SockDescr>() == 24);
const _: () = assert!(offset_of!(SockDescr, sock) == 8);
const _: () = assert!(offset_of!(SockInfo, length) == 8);
const _: () = assert!(size_of::<StateArgs>() == 8);

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
const _: () = assert!(offset_of!(ProxyOp, channel_id) == 4);
const _: () = assert!(offset_of!(ProxyOp, peer) == 8);
const _: () = assert!(offset_of!(ProxyOp, is_send) == 20);
const _: () = assert!(offset_of!(KernelCh, p_timer) == 8);
const _: () = assert!(size_of::<SockDescr>() == 24);
const _: () = assert!(offset_of!(SockDescr, sock) == 8);
const _: () = assert!(offset_of!(SockInfo, length) == 8);
const _: () = assert!(size_of::<StateArgs>() == 8);

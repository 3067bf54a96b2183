//! ABI v5 (NCCL 2.28+): `uint64_t type`, API events, `parentGroup`; 112-byte descriptor.
//! The union arms defined here are shared with v6 (byte-identical) and partly with v4.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::{CollDescr, Descr, Event, NcclResult, P2pDescr, ProxyOpDescr};

/// `groupApi` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApi {
    pub graph_captured: u8,
    pub group_depth: c_int,
}

/// `collApi` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: u8,
}

/// `p2pApi` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApi {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: u8,
}

/// `kernelLaunch` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelLaunch {
    pub stream: *mut c_void,
}

/// `coll` arm (v5/v6: with `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Coll {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
}

/// `p2p` arm (v5/v6: with `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2p {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: *mut c_void,
}

/// `proxyOp` arm (all versions).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOp {
    pub pid: i32,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

/// `proxyStep` arm (all versions).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyStep {
    pub step: c_int,
}

/// `kernelCh` arm (v4+).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelCh {
    pub channel_id: u8,
    pub ptimer: u64,
}

/// `netPlugin` arm (all versions).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetPlugin {
    pub id: i64,
    pub data: *mut c_void,
}

/// The anonymous union of `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union U {
    pub group_api: GroupApi,
    pub coll_api: CollApi,
    pub p2p_api: P2pApi,
    pub kernel_launch: KernelLaunch,
    pub coll: Coll,
    pub p2p: P2p,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelCh,
    pub net_plugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DescrV5 {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: U,
}

/// `init` (v5, v6): `(ctx, commId, mask, commName, nNodes, nranks, rank, logfn)`.
pub type InitFn = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Option<super::LogFn>,
) -> NcclResult;
/// `startEvent` (v5).
pub type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut DescrV5) -> NcclResult;
/// `ncclProfiler_v5_t`.
pub type ProfilerV5 = super::ProfilerTable<InitFn, StartFn, super::RecordFn>;

/// Rows shared by v5 and v6 (`$D` = descriptor type).
macro_rules! descr_rows {
    ($layout:ident, $cname:literal, $D:ty, $size:literal, [ $($extra:tt)* ]) => {
        $crate::abi::layout!($layout, $cname, $D, $size, 8, [
            ("type", offset_of!($D, type_), u64, 0, 8),
            ("parentObj", offset_of!($D, parent_obj), *mut c_void, 8, 8),
            ("rank", offset_of!($D, rank), c_int, 16, 4),
            ("groupApi", offset_of!($D, u), GroupApi, 24, 8),
            ("groupApi.graphCaptured", offset_of!($D, u) + offset_of!(GroupApi, graph_captured), u8, 24, 1),
            ("groupApi.groupDepth", offset_of!($D, u) + offset_of!(GroupApi, group_depth), c_int, 28, 4),
            ("collApi", offset_of!($D, u), CollApi, 24, 48),
            ("collApi.func", offset_of!($D, u) + offset_of!(CollApi, func), *const c_char, 24, 8),
            ("collApi.count", offset_of!($D, u) + offset_of!(CollApi, count), usize, 32, 8),
            ("collApi.datatype", offset_of!($D, u) + offset_of!(CollApi, datatype), *const c_char, 40, 8),
            ("collApi.root", offset_of!($D, u) + offset_of!(CollApi, root), c_int, 48, 4),
            ("collApi.stream", offset_of!($D, u) + offset_of!(CollApi, stream), *mut c_void, 56, 8),
            ("collApi.graphCaptured", offset_of!($D, u) + offset_of!(CollApi, graph_captured), u8, 64, 1),
            ("p2pApi", offset_of!($D, u), P2pApi, 24, 40),
            ("p2pApi.func", offset_of!($D, u) + offset_of!(P2pApi, func), *const c_char, 24, 8),
            ("p2pApi.count", offset_of!($D, u) + offset_of!(P2pApi, count), usize, 32, 8),
            ("p2pApi.datatype", offset_of!($D, u) + offset_of!(P2pApi, datatype), *const c_char, 40, 8),
            ("p2pApi.stream", offset_of!($D, u) + offset_of!(P2pApi, stream), *mut c_void, 48, 8),
            ("p2pApi.graphCaptured", offset_of!($D, u) + offset_of!(P2pApi, graph_captured), u8, 56, 1),
            ("kernelLaunch", offset_of!($D, u), KernelLaunch, 24, 8),
            ("kernelLaunch.stream", offset_of!($D, u) + offset_of!(KernelLaunch, stream), *mut c_void, 24, 8),
            ("coll", offset_of!($D, u), Coll, 24, 88),
            ("coll.seqNumber", offset_of!($D, u) + offset_of!(Coll, seq_number), u64, 24, 8),
            ("coll.func", offset_of!($D, u) + offset_of!(Coll, func), *const c_char, 32, 8),
            ("coll.sendBuff", offset_of!($D, u) + offset_of!(Coll, send_buff), *const c_void, 40, 8),
            ("coll.recvBuff", offset_of!($D, u) + offset_of!(Coll, recv_buff), *mut c_void, 48, 8),
            ("coll.count", offset_of!($D, u) + offset_of!(Coll, count), usize, 56, 8),
            ("coll.root", offset_of!($D, u) + offset_of!(Coll, root), c_int, 64, 4),
            ("coll.datatype", offset_of!($D, u) + offset_of!(Coll, datatype), *const c_char, 72, 8),
            ("coll.nChannels", offset_of!($D, u) + offset_of!(Coll, n_channels), u8, 80, 1),
            ("coll.nWarps", offset_of!($D, u) + offset_of!(Coll, n_warps), u8, 81, 1),
            ("coll.algo", offset_of!($D, u) + offset_of!(Coll, algo), *const c_char, 88, 8),
            ("coll.proto", offset_of!($D, u) + offset_of!(Coll, proto), *const c_char, 96, 8),
            ("coll.parentGroup", offset_of!($D, u) + offset_of!(Coll, parent_group), *mut c_void, 104, 8),
            ("p2p", offset_of!($D, u), P2p, 24, 48),
            ("p2p.func", offset_of!($D, u) + offset_of!(P2p, func), *const c_char, 24, 8),
            ("p2p.buff", offset_of!($D, u) + offset_of!(P2p, buff), *mut c_void, 32, 8),
            ("p2p.datatype", offset_of!($D, u) + offset_of!(P2p, datatype), *const c_char, 40, 8),
            ("p2p.count", offset_of!($D, u) + offset_of!(P2p, count), usize, 48, 8),
            ("p2p.peer", offset_of!($D, u) + offset_of!(P2p, peer), c_int, 56, 4),
            ("p2p.nChannels", offset_of!($D, u) + offset_of!(P2p, n_channels), u8, 60, 1),
            ("p2p.parentGroup", offset_of!($D, u) + offset_of!(P2p, parent_group), *mut c_void, 64, 8),
            ("proxyOp", offset_of!($D, u), ProxyOp, 24, 24),
            ("proxyOp.pid", offset_of!($D, u) + offset_of!(ProxyOp, pid), i32, 24, 4),
            ("proxyOp.channelId", offset_of!($D, u) + offset_of!(ProxyOp, channel_id), u8, 28, 1),
            ("proxyOp.peer", offset_of!($D, u) + offset_of!(ProxyOp, peer), c_int, 32, 4),
            ("proxyOp.nSteps", offset_of!($D, u) + offset_of!(ProxyOp, n_steps), c_int, 36, 4),
            ("proxyOp.chunkSize", offset_of!($D, u) + offset_of!(ProxyOp, chunk_size), c_int, 40, 4),
            ("proxyOp.isSend", offset_of!($D, u) + offset_of!(ProxyOp, is_send), c_int, 44, 4),
            ("proxyStep", offset_of!($D, u), ProxyStep, 24, 4),
            ("proxyStep.step", offset_of!($D, u) + offset_of!(ProxyStep, step), c_int, 24, 4),
            ("kernelCh", offset_of!($D, u), KernelCh, 24, 16),
            ("kernelCh.channelId", offset_of!($D, u) + offset_of!(KernelCh, channel_id), u8, 24, 1),
            ("kernelCh.pTimer", offset_of!($D, u) + offset_of!(KernelCh, ptimer), u64, 32, 8),
            ("netPlugin", offset_of!($D, u), NetPlugin, 24, 16),
            ("netPlugin.id", offset_of!($D, u) + offset_of!(NetPlugin, id), i64, 24, 8),
            ("netPlugin.data", offset_of!($D, u) + offset_of!(NetPlugin, data), *mut c_void, 32, 8),
            $($extra)*
        ]);
    };
}
pub(crate) use descr_rows;

descr_rows!(DESCR_V5, "ncclProfilerEventDescr_v5_t", DescrV5, 112, []);

super::layout!(PROFILER_V5, "ncclProfiler_v5_t", ProfilerV5, 48, 8, [
    ("name", offset_of!(ProfilerV5, name), *const c_char, 0, 8),
    ("init", offset_of!(ProfilerV5, init), Option<InitFn>, 8, 8),
    ("startEvent", offset_of!(ProfilerV5, start_event), Option<StartFn>, 16, 8),
    ("stopEvent", offset_of!(ProfilerV5, stop_event), Option<super::StopFn>, 24, 8),
    ("recordEventState", offset_of!(ProfilerV5, record_event_state), Option<super::RecordFn>, 32, 8),
    ("finalize", offset_of!(ProfilerV5, finalize), Option<super::FinalizeFn>, 40, 8),
]);

const _: () = assert!(size_of::<U>() == 88);

/// Read the arms v5 and v6 share. `$u` is the union value.
macro_rules! common_event {
    ($ty:expr, $u:expr) => {{
        let u = $u;
        // SAFETY (all arms below): NCCL fills the arm named by `type`, which is the one we read;
        // every member is an integer or a raw pointer (C `bool` is `u8`), so any bit pattern is a
        // valid value even if an adapter left other bytes uninitialised. Pointers are not
        // dereferenced here.
        let ty: u64 = $ty;
        match $crate::abi::type_bit(ty) {
            $crate::abi::bit::GROUP_API => Event::GroupApi,
            $crate::abi::bit::COLL_API => Event::CollApi,
            $crate::abi::bit::P2P_API => Event::P2pApi,
            $crate::abi::bit::KERNEL_LAUNCH => Event::KernelLaunch,
            $crate::abi::bit::GROUP => Event::Group,
            $crate::abi::bit::COLL => {
                // SAFETY: see above (the `coll` arm is active).
                let c = unsafe { u.coll };
                Event::Coll(CollDescr {
                    seq_number: c.seq_number,
                    func: c.func,
                    count: c.count,
                    root: c.root,
                    datatype: c.datatype,
                    n_channels: c.n_channels,
                    n_warps: c.n_warps,
                    algo: c.algo,
                    proto: c.proto,
                })
            }
            $crate::abi::bit::P2P => {
                // SAFETY: see above (the `p2p` arm is active).
                let p = unsafe { u.p2p };
                Event::P2p(P2pDescr {
                    func: p.func,
                    datatype: p.datatype,
                    count: p.count,
                    peer: p.peer,
                    n_channels: p.n_channels,
                })
            }
            $crate::abi::bit::PROXY_OP => {
                // SAFETY: see above (the `proxyOp` arm is active).
                let p = unsafe { u.proxy_op };
                Event::ProxyOp(ProxyOpDescr {
                    pid: p.pid,
                    channel_id: p.channel_id,
                    peer: p.peer,
                    n_steps: p.n_steps,
                    chunk_size: p.chunk_size,
                    is_send: p.is_send,
                })
            }
            $crate::abi::bit::PROXY_STEP => Event::ProxyStep {
                // SAFETY: see above (the `proxyStep` arm is active).
                step: unsafe { u.proxy_step.step },
            },
            $crate::abi::bit::PROXY_CTRL => Event::ProxyCtrl,
            $crate::abi::bit::KERNEL_CH => {
                // SAFETY: see above (the `kernelCh` arm is active).
                let k = unsafe { u.kernel_ch };
                Event::KernelCh {
                    channel_id: k.channel_id,
                    ptimer: k.ptimer,
                }
            }
            $crate::abi::bit::NET_PLUGIN => {
                // SAFETY: see above (the `netPlugin` arm is active).
                let n = unsafe { u.net_plugin };
                Event::NetPlugin {
                    id: n.id,
                    data: n.data,
                }
            }
            $crate::abi::bit::CE_COLL | $crate::abi::bit::CE_SYNC | $crate::abi::bit::CE_BATCH => {
                Event::Ce
            }
            _ => Event::Unknown(ty),
        }
    }};
}
pub(crate) use common_event;

impl Descr for DescrV5 {
    const ABI: u8 = 5;
    fn type_bits(&self) -> u64 {
        self.type_
    }
    fn parent(&self) -> *mut c_void {
        self.parent_obj
    }
    fn rank(&self) -> c_int {
        self.rank
    }
    fn event(&self) -> Event {
        match common_event!(self.type_, &self.u) {
            // v5 has no copy-engine events: those bits are unknown here.
            Event::Ce => Event::Unknown(self.type_),
            e => e,
        }
    }
}

//! ABI v4 (NCCL 2.27+): `uint8_t type`, no API events, no `parentGroup`; 104-byte descriptor and
//! the v4 `init` argument order `(ctx, mask, commName, commHash, nNodes, nranks, rank, logfn)`.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::v5::{KernelCh, NetPlugin, ProxyOp, ProxyStep};
use super::{layout, CollDescr, Descr, Event, NcclResult, P2pDescr, ProxyOpDescr};

/// `coll` arm (v4: no `parentGroup`).
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
}

/// `p2p` arm (v4: no `parentGroup`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2p {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
}

/// The anonymous union of `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union U {
    pub coll: Coll,
    pub p2p: P2p,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelCh,
    pub net_plugin: NetPlugin,
}

/// `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DescrV4 {
    pub type_: u8,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: U,
}

/// `init` (v4): `(ctx, mask, commName, commHash, nNodes, nranks, rank, logfn)`.
pub type InitFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    Option<super::LogFn>,
) -> NcclResult;
/// `startEvent` (v4).
pub type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut DescrV4) -> NcclResult;
/// `ncclProfiler_v4_t`.
pub type ProfilerV4 = super::ProfilerTable<InitFn, StartFn, super::RecordFn>;

layout!(DESCR_V4, "ncclProfilerEventDescr_v4_t", DescrV4, 104, 8, [
    ("type", offset_of!(DescrV4, type_), u8, 0, 1),
    ("parentObj", offset_of!(DescrV4, parent_obj), *mut c_void, 8, 8),
    ("rank", offset_of!(DescrV4, rank), c_int, 16, 4),
    ("coll", offset_of!(DescrV4, u), Coll, 24, 80),
    ("coll.seqNumber", offset_of!(DescrV4, u) + offset_of!(Coll, seq_number), u64, 24, 8),
    ("coll.func", offset_of!(DescrV4, u) + offset_of!(Coll, func), *const c_char, 32, 8),
    ("coll.sendBuff", offset_of!(DescrV4, u) + offset_of!(Coll, send_buff), *const c_void, 40, 8),
    ("coll.recvBuff", offset_of!(DescrV4, u) + offset_of!(Coll, recv_buff), *mut c_void, 48, 8),
    ("coll.count", offset_of!(DescrV4, u) + offset_of!(Coll, count), usize, 56, 8),
    ("coll.root", offset_of!(DescrV4, u) + offset_of!(Coll, root), c_int, 64, 4),
    ("coll.datatype", offset_of!(DescrV4, u) + offset_of!(Coll, datatype), *const c_char, 72, 8),
    ("coll.nChannels", offset_of!(DescrV4, u) + offset_of!(Coll, n_channels), u8, 80, 1),
    ("coll.nWarps", offset_of!(DescrV4, u) + offset_of!(Coll, n_warps), u8, 81, 1),
    ("coll.algo", offset_of!(DescrV4, u) + offset_of!(Coll, algo), *const c_char, 88, 8),
    ("coll.proto", offset_of!(DescrV4, u) + offset_of!(Coll, proto), *const c_char, 96, 8),
    ("p2p", offset_of!(DescrV4, u), P2p, 24, 40),
    ("p2p.func", offset_of!(DescrV4, u) + offset_of!(P2p, func), *const c_char, 24, 8),
    ("p2p.buff", offset_of!(DescrV4, u) + offset_of!(P2p, buff), *mut c_void, 32, 8),
    ("p2p.datatype", offset_of!(DescrV4, u) + offset_of!(P2p, datatype), *const c_char, 40, 8),
    ("p2p.count", offset_of!(DescrV4, u) + offset_of!(P2p, count), usize, 48, 8),
    ("p2p.peer", offset_of!(DescrV4, u) + offset_of!(P2p, peer), c_int, 56, 4),
    ("p2p.nChannels", offset_of!(DescrV4, u) + offset_of!(P2p, n_channels), u8, 60, 1),
    ("proxyOp", offset_of!(DescrV4, u), ProxyOp, 24, 24),
    ("proxyOp.pid", offset_of!(DescrV4, u) + offset_of!(ProxyOp, pid), i32, 24, 4),
    ("proxyOp.channelId", offset_of!(DescrV4, u) + offset_of!(ProxyOp, channel_id), u8, 28, 1),
    ("proxyOp.peer", offset_of!(DescrV4, u) + offset_of!(ProxyOp, peer), c_int, 32, 4),
    ("proxyOp.nSteps", offset_of!(DescrV4, u) + offset_of!(ProxyOp, n_steps), c_int, 36, 4),
    ("proxyOp.chunkSize", offset_of!(DescrV4, u) + offset_of!(ProxyOp, chunk_size), c_int, 40, 4),
    ("proxyOp.isSend", offset_of!(DescrV4, u) + offset_of!(ProxyOp, is_send), c_int, 44, 4),
    ("proxyStep", offset_of!(DescrV4, u), ProxyStep, 24, 4),
    ("proxyStep.step", offset_of!(DescrV4, u) + offset_of!(ProxyStep, step), c_int, 24, 4),
    ("kernelCh", offset_of!(DescrV4, u), KernelCh, 24, 16),
    ("kernelCh.channelId", offset_of!(DescrV4, u) + offset_of!(KernelCh, channel_id), u8, 24, 1),
    ("kernelCh.pTimer", offset_of!(DescrV4, u) + offset_of!(KernelCh, ptimer), u64, 32, 8),
    ("netPlugin", offset_of!(DescrV4, u), NetPlugin, 24, 16),
    ("netPlugin.id", offset_of!(DescrV4, u) + offset_of!(NetPlugin, id), i64, 24, 8),
    ("netPlugin.data", offset_of!(DescrV4, u) + offset_of!(NetPlugin, data), *mut c_void, 32, 8),
]);

layout!(PROFILER_V4, "ncclProfiler_v4_t", ProfilerV4, 48, 8, [
    ("name", offset_of!(ProfilerV4, name), *const c_char, 0, 8),
    ("init", offset_of!(ProfilerV4, init), Option<InitFn>, 8, 8),
    ("startEvent", offset_of!(ProfilerV4, start_event), Option<StartFn>, 16, 8),
    ("stopEvent", offset_of!(ProfilerV4, stop_event), Option<super::StopFn>, 24, 8),
    ("recordEventState", offset_of!(ProfilerV4, record_event_state), Option<super::RecordFn>, 32, 8),
    ("finalize", offset_of!(ProfilerV4, finalize), Option<super::FinalizeFn>, 40, 8),
]);

const _: () = assert!(size_of::<U>() == 80);

impl Descr for DescrV4 {
    const ABI: u8 = 4;
    fn type_bits(&self) -> u64 {
        u64::from(self.type_)
    }
    fn parent(&self) -> *mut c_void {
        self.parent_obj
    }
    fn rank(&self) -> c_int {
        self.rank
    }
    fn event(&self) -> Event {
        let u = &self.u;
        // SAFETY (all arms): NCCL fills the arm named by `type`, the one we read; members are
        // integers or raw pointers, valid for any bit pattern; nothing is dereferenced here.
        let ty = u64::from(self.type_);
        match super::type_bit(ty) {
            super::bit::GROUP => Event::Group,
            super::bit::COLL => {
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
            super::bit::P2P => {
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
            super::bit::PROXY_OP => {
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
            super::bit::PROXY_STEP => Event::ProxyStep {
                // SAFETY: see above (the `proxyStep` arm is active).
                step: unsafe { u.proxy_step.step },
            },
            super::bit::PROXY_CTRL => Event::ProxyCtrl,
            super::bit::KERNEL_CH => {
                // SAFETY: see above (the `kernelCh` arm is active).
                let k = unsafe { u.kernel_ch };
                Event::KernelCh {
                    channel_id: k.channel_id,
                    ptimer: k.ptimer,
                }
            }
            super::bit::NET_PLUGIN => {
                // SAFETY: see above (the `netPlugin` arm is active).
                let n = unsafe { u.net_plugin };
                Event::NetPlugin {
                    id: n.id,
                    data: n.data,
                }
            }
            _ => Event::Unknown(ty),
        }
    }
}

//! `#[repr(C)]` mirror of NCCL's profiler ABI v5 (`ncclProfilerEventDescr_v5_t`, 112 bytes) — also the
//! non-CE part of v6, which is byte-identical (nccl-abi.md §1.1, §2.6); the stand-in never emits CE events.

use super::abi::{KernelCh, NetPlugin, ProxyOp, SockDescr, NET_TYPE_SOCK};
use super::emit::{ty, Descriptor, Ev};
use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

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

const _: () = assert!(size_of::<Descr5>() == 112);
const _: () = assert!(offset_of!(Descr5, u) == 24);
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
const _: () = assert!(offset_of!(P2p, peer) == 32);
const _: () = assert!(offset_of!(P2p, n_channels) == 36);
const _: () = assert!(offset_of!(P2p, parent_group) == 40);
const _: () = assert!(offset_of!(GroupApi, group_depth) == 4);

const ALGO: &std::ffi::CStr = c"RING";
const PROTO: &std::ffi::CStr = c"SIMPLE";

impl Descriptor for Descr5 {
    fn build(ev: &Ev<'_>) -> Option<Self> {
        Some(descr5(ev))
    }
}

/// The v5/v6 descriptor of an event (also the source of the v4 view's shared arms).
pub fn descr5(ev: &Ev<'_>) -> Descr5 {
    let mut d = Descr5 {
        ty: ty(ev) as u64,
        parent_obj: std::ptr::null_mut(),
        rank: 0,
        u: Arm5 { raw: [0; 11] },
    };
    match *ev {
        Ev::GroupApi { depth } => {
            d.u.group_api = GroupApi {
                graph_captured: false,
                group_depth: depth,
            };
        }
        Ev::CollApi {
            parent,
            func,
            count,
            dt,
            root,
        } => {
            d.parent_obj = parent.ptr();
            d.u.coll_api = CollApi {
                func: func.nccl_str().as_ptr(),
                count,
                datatype: dt.nccl_str().as_ptr(),
                root,
                stream: std::ptr::null_mut(),
                graph_captured: false,
            };
        }
        Ev::P2pApi {
            parent,
            func,
            count,
            dt,
        } => {
            d.parent_obj = parent.ptr();
            d.u.p2p_api = P2pApi {
                func: func.nccl_str().as_ptr(),
                count,
                datatype: dt.nccl_str().as_ptr(),
                stream: std::ptr::null_mut(),
                graph_captured: false,
            };
        }
        Ev::KernelLaunch { parent } => {
            d.parent_obj = parent.ptr();
            d.u.kernel_launch_stream = std::ptr::null_mut();
        }
        Ev::Group | Ev::ProxyCtrl => {}
        Ev::Coll {
            parent,
            group,
            rank,
            seq,
            func,
            send,
            recv,
            count,
            root,
            dt,
            nch,
        } => {
            d.parent_obj = parent.ptr();
            d.rank = rank;
            d.u.coll = Coll {
                seq_number: seq,
                func: func.nccl_str().as_ptr(),
                send_buff: send as *const c_void,
                recv_buff: recv as *mut c_void,
                count,
                root,
                datatype: dt.nccl_str().as_ptr(),
                n_channels: nch,
                n_warps: 16,
                algo: ALGO.as_ptr(),
                proto: PROTO.as_ptr(),
                parent_group: group.ptr(),
            };
        }
        Ev::P2p {
            parent,
            group,
            rank,
            func,
            buff,
            dt,
            count,
            peer,
            nch,
        } => {
            d.parent_obj = parent.ptr();
            d.rank = rank;
            d.u.p2p = P2p {
                func: func.nccl_str().as_ptr(),
                buff: buff as *mut c_void,
                datatype: dt.nccl_str().as_ptr(),
                count,
                peer,
                n_channels: nch,
                parent_group: group.ptr(),
            };
        }
        Ev::ProxyOp {
            parent,
            rank,
            ch,
            peer,
            nsteps,
            chunk,
            is_send,
        } => {
            d.parent_obj = parent.ptr();
            d.rank = rank;
            d.u.proxy_op = ProxyOp {
                pid: std::process::id() as libc::pid_t,
                channel_id: ch,
                peer,
                n_steps: nsteps,
                chunk_size: chunk,
                is_send: c_int::from(is_send),
            };
        }
        Ev::ProxyStep { parent, rank, step } => {
            d.parent_obj = parent.ptr();
            d.rank = rank;
            d.u.proxy_step = step;
        }
        Ev::KernelCh { parent, ch, ptimer } => {
            d.parent_obj = parent.ptr();
            d.u.kernel_ch = KernelCh {
                channel_id: ch,
                p_timer: ptimer,
            };
        }
        Ev::NetPlugin { parent, rank, sock } => {
            d.parent_obj = parent.ptr();
            d.rank = rank;
            d.u.net_plugin = NetPlugin {
                id: NET_TYPE_SOCK | 1,
                data: (sock as *const SockDescr).cast_mut().cast(),
            };
        }
    }
    d
}

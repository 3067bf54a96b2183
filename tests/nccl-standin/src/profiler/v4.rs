//! `#[repr(C)]` mirror of NCCL's profiler ABI v4 (`ncclProfilerEventDescr_v4_t`: `uint8_t type`, 104
//! bytes, no API events, no `parentGroup`) and the v4 rules: Coll/P2p parent = the Group handle.

use super::abi::{KernelCh, NetPlugin, ProxyOp};
use super::emit::{Descriptor, Ev};
use super::v5::descr5;
use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

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

const _: () = assert!(size_of::<Descr4>() == 104);
const _: () = assert!(offset_of!(Descr4, u) == 24);
const _: () = assert!(size_of::<Coll4>() == 80);
const _: () = assert!(size_of::<P2p4>() == 40);

impl Descriptor for Descr4 {
    fn build(ev: &Ev<'_>) -> Option<Self> {
        descr4(ev)
    }
}

/// The v4 view: `None` for events v4 does not have. Coll/P2p parent = the Group handle.
pub fn descr4(ev: &Ev<'_>) -> Option<Descr4> {
    if matches!(
        ev,
        Ev::GroupApi { .. } | Ev::CollApi { .. } | Ev::P2pApi { .. } | Ev::KernelLaunch { .. }
    ) {
        return None;
    }
    let d5 = descr5(ev);
    let mut d = Descr4 {
        ty: d5.ty as u8,
        parent_obj: d5.parent_obj,
        rank: d5.rank,
        u: Arm4 { raw: [0; 10] },
    };
    match *ev {
        Ev::Coll { group, .. } => {
            d.parent_obj = group.ptr();
            // SAFETY: d5 was built with the coll arm active.
            let c = unsafe { d5.u.coll };
            d.u.coll = Coll4 {
                seq_number: c.seq_number,
                func: c.func,
                send_buff: c.send_buff,
                recv_buff: c.recv_buff,
                count: c.count,
                root: c.root,
                datatype: c.datatype,
                n_channels: c.n_channels,
                n_warps: c.n_warps,
                algo: c.algo,
                proto: c.proto,
            };
        }
        Ev::P2p { group, .. } => {
            d.parent_obj = group.ptr();
            // SAFETY: d5 was built with the p2p arm active.
            let p = unsafe { d5.u.p2p };
            d.u.p2p = P2p4 {
                func: p.func,
                buff: p.buff,
                datatype: p.datatype,
                count: p.count,
                peer: p.peer,
                n_channels: p.n_channels,
            };
        }
        _ => {
            // Every other arm has the same layout in v4 and v5: copy the first 80 union bytes.
            // SAFETY: both unions are plain old data; `raw` covers the bytes written by descr5.
            let raw = unsafe { d5.u.raw };
            let mut r4 = [0u64; 10];
            r4.copy_from_slice(&raw[..10]);
            d.u.raw = r4;
        }
    }
    Some(d)
}

//! Test fixtures: a private-ring `Shared`, descriptor builders, record readers.

use ::core::ffi::{c_char, c_void};
use std::sync::Arc;

use comminsight_wire::record::{RawRecord, Record};
use comminsight_wire::ring::ShmRing;

use crate::abi::v5::{Coll, KernelCh, NetPlugin, P2p, ProxyOp, ProxyStep};
use crate::abi::v6::{DescrV6, U};
use crate::abi::{EV_COLL, EV_KERNEL_CH, EV_NET_PLUGIN, EV_P2P, EV_PROXY_OP, EV_PROXY_STEP};
use crate::clock::Clock;
use crate::config::Config;
use crate::context::Context;
use crate::core::{self, Shared};

/// A leaked `Shared` with a private ring installed.
pub fn fixture(cfg: Config) -> (&'static Shared, Arc<ShmRing>) {
    let sh: &'static Shared = Box::leak(Box::new(Shared::new(cfg, Clock::new()).unwrap()));
    let ring = Arc::new(ShmRing::private(1 << 12).unwrap());
    sh.swap_ring(Some(ring.clone()));
    (sh, ring)
}

pub fn small_cfg() -> Config {
    let mut c = Config::defaults();
    c.max_inflight = 64;
    c
}

pub fn context(sh: &Shared, hash: u64, rank: i32, nranks: i32) -> Box<Context> {
    let a = core::InitArgs {
        abi: 6,
        comm_hash: hash,
        comm_name: c"test".as_ptr(),
        nnodes: 1,
        nranks,
        rank,
    };
    // SAFETY: a static C string.
    unsafe { core::new_context(sh, &a) }
}

/// Every record currently in the ring, decoded.
pub fn records(ring: &ShmRing) -> Vec<Record> {
    let mut v: Vec<RawRecord> = Vec::new();
    ring.pop_into(&mut v, usize::MAX);
    v.iter().map(|r| Record::decode(r).unwrap()).collect()
}

fn descr(ty: u64, parent: *mut c_void, u: U) -> DescrV6 {
    DescrV6 {
        type_: ty,
        parent_obj: parent,
        rank: 0,
        u,
    }
}

pub fn coll(seq: u64, func: &'static ::core::ffi::CStr, count: usize, nch: u8) -> DescrV6 {
    descr(
        EV_COLL,
        ::core::ptr::null_mut(),
        U {
            coll: Coll {
                seq_number: seq,
                func: func.as_ptr(),
                send_buff: ::core::ptr::null(),
                recv_buff: ::core::ptr::null_mut(),
                count,
                root: 0,
                datatype: c"ncclFloat32".as_ptr(),
                n_channels: nch,
                n_warps: 8,
                algo: c"RING".as_ptr(),
                proto: c"SIMPLE".as_ptr(),
                parent_group: ::core::ptr::null_mut(),
            },
        },
    )
}

pub fn p2p(func: &'static ::core::ffi::CStr, peer: i32, count: usize, nch: u8) -> DescrV6 {
    descr(
        EV_P2P,
        ::core::ptr::null_mut(),
        U {
            p2p: P2p {
                func: func.as_ptr(),
                buff: ::core::ptr::null_mut(),
                datatype: c"ncclInt8".as_ptr() as *const c_char,
                count,
                peer,
                n_channels: nch,
                parent_group: ::core::ptr::null_mut(),
            },
        },
    )
}

pub fn kernel_ch(parent: *mut c_void, ch: u8, ptimer: u64) -> DescrV6 {
    descr(
        EV_KERNEL_CH,
        parent,
        U {
            kernel_ch: KernelCh {
                channel_id: ch,
                ptimer,
            },
        },
    )
}

pub fn proxy_op(parent: *mut c_void, pid: i32) -> DescrV6 {
    descr(
        EV_PROXY_OP,
        parent,
        U {
            proxy_op: ProxyOp {
                pid,
                channel_id: 1,
                peer: 3,
                n_steps: 4,
                chunk_size: 1 << 20,
                is_send: 1,
            },
        },
    )
}

pub fn proxy_step(parent: *mut c_void, step: i32) -> DescrV6 {
    descr(
        EV_PROXY_STEP,
        parent,
        U {
            proxy_step: ProxyStep { step },
        },
    )
}

pub fn net(parent: *mut c_void, id: i64, data: *mut c_void) -> DescrV6 {
    descr(
        EV_NET_PLUGIN,
        parent,
        U {
            net_plugin: NetPlugin { id, data },
        },
    )
}

/// `startEvent` through the core with a context.
pub fn start(sh: &Shared, ctx: &Context, d: &DescrV6) -> *mut c_void {
    let p = (ctx as *const Context).cast_mut().cast::<c_void>();
    // SAFETY: `ctx` is a live context; the descriptor's strings are static.
    unsafe { core::start_event(sh, p, d) }
}

/// `recordEventState` with a pTimer / transSize argument.
pub fn record(sh: &Shared, h: *mut c_void, state: i32, arg: u64) {
    let a = crate::abi::StateArgs {
        kernel_ch_ptimer: arg,
    };
    // SAFETY: a valid local union.
    unsafe { core::record_state(sh, h, state, &a) };
}

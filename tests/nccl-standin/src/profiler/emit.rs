//! Calling the loaded plugin: builds the version's descriptor on the stack (as NCCL does) and applies
//! the v4 adapter rules (no API events, Coll/P2p parent = Group handle, no states ≥ 23).

use super::abi::{self, bits, Descr4, Descr5, SockDescr, StateArgs};
use super::loader::{current, Plugin};
use crate::types::{DataType, Func};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

/// An event handle returned by the plugin (opaque; NULL = not tracked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct H(pub usize);

impl H {
    /// NULL.
    pub const NULL: H = H(0);
    /// As the C pointer.
    pub fn ptr(self) -> *mut c_void {
        self.0 as *mut c_void
    }
    /// Whether NULL.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// A comm's profiler context (opaque; NULL allowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Ctx(pub usize);

/// Events the stand-in emits, with NCCL's fields.
#[allow(
    missing_docs,
    reason = "fields are the NCCL descriptor fields of the same name"
)]
pub enum Ev<'a> {
    GroupApi {
        depth: i32,
    },
    CollApi {
        parent: H,
        func: Func,
        count: usize,
        dt: DataType,
        root: i32,
    },
    P2pApi {
        parent: H,
        func: Func,
        count: usize,
        dt: DataType,
    },
    KernelLaunch {
        parent: H,
    },
    Group,
    Coll {
        parent: H,
        group: H,
        rank: i32,
        seq: u64,
        func: Func,
        send: usize,
        recv: usize,
        count: usize,
        root: i32,
        dt: DataType,
        nch: u8,
    },
    P2p {
        parent: H,
        group: H,
        rank: i32,
        func: Func,
        buff: usize,
        dt: DataType,
        count: usize,
        peer: i32,
        nch: u8,
    },
    ProxyOp {
        parent: H,
        rank: i32,
        ch: u8,
        peer: i32,
        nsteps: i32,
        chunk: i32,
        is_send: bool,
    },
    ProxyStep {
        parent: H,
        rank: i32,
        step: i32,
    },
    ProxyCtrl,
    KernelCh {
        parent: H,
        ch: u8,
        ptimer: u64,
    },
    NetPlugin {
        parent: H,
        rank: i32,
        sock: &'a SockDescr,
    },
}

/// What the stand-in puts in the args union NCCL's v5 adapter leaves uninitialised.
const UNINIT_ARGS: u64 = 0xa5a5_a5a5_a5a5_a5a5;

/// Coll/P2p start events delivered so far (`ncclTestbedProfiledOps`).
pub static PROFILED_OPS: AtomicU64 = AtomicU64::new(0);

const ALGO: &std::ffi::CStr = c"RING";
const PROTO: &std::ffi::CStr = c"SIMPLE";

fn ty(ev: &Ev<'_>) -> i32 {
    match ev {
        Ev::GroupApi { .. } => bits::GROUP_API,
        Ev::CollApi { .. } => bits::COLL_API,
        Ev::P2pApi { .. } => bits::P2P_API,
        Ev::KernelLaunch { .. } => bits::KERNEL_LAUNCH,
        Ev::Group => bits::GROUP,
        Ev::Coll { .. } => bits::COLL,
        Ev::P2p { .. } => bits::P2P,
        Ev::ProxyOp { .. } => bits::PROXY_OP,
        Ev::ProxyStep { .. } => bits::PROXY_STEP,
        Ev::ProxyCtrl => bits::PROXY_CTRL,
        Ev::KernelCh { .. } => bits::KERNEL_CH,
        Ev::NetPlugin { .. } => bits::NET_PLUGIN,
    }
}

fn descr5(ev: &Ev<'_>) -> Descr5 {
    let mut d = Descr5 {
        ty: ty(ev) as u64,
        parent_obj: std::ptr::null_mut(),
        rank: 0,
        u: abi::Arm5 { raw: [0; 11] },
    };
    match *ev {
        Ev::GroupApi { depth } => {
            d.u.group_api = abi::GroupApi {
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
            d.u.coll_api = abi::CollApi {
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
            d.u.p2p_api = abi::P2pApi {
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
            d.u.coll = abi::Coll {
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
            d.u.p2p = abi::P2p {
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
            d.u.proxy_op = abi::ProxyOp {
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
            d.u.kernel_ch = abi::KernelCh {
                channel_id: ch,
                p_timer: ptimer,
            };
        }
        Ev::NetPlugin { parent, rank, sock } => {
            d.parent_obj = parent.ptr();
            d.rank = rank;
            d.u.net_plugin = abi::NetPlugin {
                id: abi::NET_TYPE_SOCK | 1,
                data: (sock as *const SockDescr).cast_mut().cast(),
            };
        }
    }
    d
}

/// The v4 view: `None` for events v4 does not have. Coll/P2p parent = the Group handle.
fn descr4(ev: &Ev<'_>) -> Option<Descr4> {
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
        u: abi::Arm4 { raw: [0; 10] },
    };
    match *ev {
        Ev::Coll { group, .. } => {
            d.parent_obj = group.ptr();
            // SAFETY: d5 was built with the coll arm active.
            let c = unsafe { d5.u.coll };
            d.u.coll = abi::Coll4 {
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
            d.u.p2p = abi::P2p4 {
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

fn call_start(p: &Plugin, ctx: Ctx, ev: &Ev<'_>) -> H {
    let Some(start) = p.table.start_event else {
        return H::NULL;
    };
    let mut h: *mut c_void = std::ptr::null_mut();
    let ctxp = ctx.0 as *mut c_void;
    if p.version == 4 {
        let Some(mut d) = descr4(ev) else {
            return H::NULL;
        };
        // SAFETY: plugin's startEvent with a live context, an out-pointer and a stack descriptor.
        unsafe { start(ctxp, &mut h, (&mut d as *mut Descr4).cast()) };
    } else {
        let mut d = descr5(ev);
        // SAFETY: as above, with the v5/v6 descriptor.
        unsafe { start(ctxp, &mut h, (&mut d as *mut Descr5).cast()) };
    }
    if matches!(ev, Ev::Coll { .. } | Ev::P2p { .. }) {
        PROFILED_OPS.fetch_add(1, Ordering::Relaxed);
    }
    H(h as usize)
}

/// `startEvent` through the current plugin; NULL when there is none.
pub fn start(ctx: Ctx, ev: &Ev<'_>) -> H {
    match current() {
        Some(p) => call_start(&p, ctx, ev),
        None => H::NULL,
    }
}

/// `stopEvent` (skipped for NULL handles, as NCCL does).
pub fn stop(h: H) {
    if h.is_null() {
        return;
    }
    if let Some(f) = current().and_then(|p| p.table.stop_event) {
        // SAFETY: a handle this plugin returned.
        unsafe { f(h.ptr()) };
    }
}

/// `recordEventState`; `arg = None` passes NULL args (GroupApi states). v4 never sees states ≥ 23.
pub fn record(h: H, state: c_int, arg: Option<u64>) {
    if h.is_null() {
        return;
    }
    let Some(p) = current() else { return };
    if p.version == 4 && state >= 23 {
        return;
    }
    let Some(f) = p.table.record_event_state else {
        return;
    };
    // NCCL >= 2.29 reaches v5 plugins through its v5 adapter, which always passes a pointer to its own
    // (for GroupApi states: uninitialised) args union; native v6 (and 2.28's native v5) get NULL.
    let adapter = p.version == 5 && crate::env::get().release == crate::env::Release::V2_30;
    let mut a = StateArgs {
        u64_: arg.unwrap_or(UNINIT_ARGS),
    };
    let ap = if arg.is_some() || adapter {
        &mut a as *mut StateArgs
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: a handle this plugin returned; args on our stack or NULL.
    unsafe { f(h.ptr(), state, ap) };
}

/// Whether any plugin is active.
pub fn active() -> bool {
    current().is_some()
}

/// Unix-epoch nanoseconds (stand-in for the GPU `%globaltimer`).
pub fn gpu_timer_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_coll_parent_is_the_group_and_api_events_vanish() {
        let ev = Ev::Coll {
            parent: H(7),
            group: H(9),
            rank: 1,
            seq: 3,
            func: Func::AllReduce,
            send: 0,
            recv: 0,
            count: 4,
            root: 0,
            dt: DataType::Float32,
            nch: 2,
        };
        let d4 = descr4(&ev).unwrap();
        assert_eq!(d4.parent_obj as usize, 9);
        assert_eq!(d4.ty, 2);
        let d5 = descr5(&ev);
        assert_eq!(d5.parent_obj as usize, 7);
        // SAFETY: coll arm active.
        assert_eq!(unsafe { d5.u.coll.parent_group } as usize, 9);
        assert!(descr4(&Ev::GroupApi { depth: 1 }).is_none());
    }

    #[test]
    fn v4_copies_shared_arms() {
        let d4 = descr4(&Ev::KernelCh {
            parent: H(3),
            ch: 2,
            ptimer: 55,
        })
        .unwrap();
        // SAFETY: kernelCh arm copied.
        let k = unsafe { d4.u.kernel_ch };
        assert_eq!((k.channel_id, k.p_timer), (2, 55));
    }
}

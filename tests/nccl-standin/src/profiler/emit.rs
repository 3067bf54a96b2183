//! Calling the loaded plugin: builds the version's descriptor on the stack (as NCCL does) and applies
//! the v4 adapter rules (no API events, Coll/P2p parent = Group handle, no states ≥ 23).

use super::abi::{bits, SockDescr, StateArgs};
use super::loader::{current, Plugin};
use super::v4::Descr4;
use super::v5::Descr5;
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

/// The event's type bit.
pub fn ty(ev: &Ev<'_>) -> i32 {
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

/// A version's event descriptor, built on the caller's stack from an [`Ev`] (`None`: the version has
/// no such event, nothing is delivered).
pub trait Descriptor: Sized {
    /// The descriptor for `ev`.
    fn build(ev: &Ev<'_>) -> Option<Self>;
}

fn start_with<D: Descriptor>(p: &Plugin, ctx: Ctx, ev: &Ev<'_>) -> H {
    let Some(start) = p.table.start_event else {
        return H::NULL;
    };
    let Some(mut d) = D::build(ev) else {
        return H::NULL;
    };
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: the plugin's startEvent with its context, an out-pointer and a descriptor of the
    // plugin's ABI version living on our stack for the call (as in NCCL).
    unsafe { start(ctx.0 as *mut c_void, &mut h, (&mut d as *mut D).cast()) };
    if matches!(ev, Ev::Coll { .. } | Ev::P2p { .. }) {
        PROFILED_OPS.fetch_add(1, Ordering::Relaxed);
    }
    H(h as usize)
}

fn call_start(p: &Plugin, ctx: Ctx, ev: &Ev<'_>) -> H {
    match p.version {
        4 => start_with::<Descr4>(p, ctx, ev),
        _ => start_with::<Descr5>(p, ctx, ev),
    }
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
    use crate::profiler::v4::descr4;
    use crate::profiler::v5::descr5;

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

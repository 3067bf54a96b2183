//! The recorder behind the HCCL interposition: the CommInsight profiler plugin
//! (`libnccl-profiler-comminsight.so`), `dlopen`ed on the first HCCL communicator and driven
//! through its real `ncclProfiler_v6` table exactly as NCCL drives it (Coll / P2p starts and
//! stops, KernelCh children, `finalize`), after opening each communicator with the plugin's
//! `comminsight_external_init_v1` (NCCL's v6 `init` plus the record flags, `FLAG_HCCL`). The
//! plugin writes every record (ring, segments, op tracking, `overdue`); nothing is recorded here.
//!
//! Which file: `COMMINSIGHT_PLUGIN_PATH` when set, else the plugin next to this library (its
//! directory from `dladdr`), else `dlopen` by the bare file name (the loader's path). Not found:
//! HCCL calls are only forwarded (one warning, counted).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use crate::env::PLUGIN_FILE;
use crate::hccl::{self, Counter};
use crate::sym;

/// `ncclProfileColl`, `ncclProfileP2p`, `ncclProfileKernelCh` (NCCL's event type bits).
pub const EV_COLL: u64 = 1 << 1;
/// P2p event bit.
pub const EV_P2P: u64 = 1 << 2;
/// KernelCh event bit.
pub const EV_KERNEL_CH: u64 = 1 << 6;

type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut Descr) -> c_int;
type HandleFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type ExtInitFn = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    u32,
) -> c_int;

/// `ncclProfiler_v6_t` as NCCL declares it (name + five function pointers).
#[repr(C)]
struct TableV6 {
    name: *const c_char,
    init: Option<unsafe extern "C" fn()>,
    start_event: Option<StartFn>,
    stop_event: Option<HandleFn>,
    record_event_state: Option<unsafe extern "C" fn()>,
    finalize: Option<HandleFn>,
}

/// The `coll` arm of `ncclProfilerEventDescr_v6_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollArm {
    /// Per-(comm, func) sequence number.
    pub seq_number: u64,
    /// Function name (static C string).
    pub func: *const c_char,
    /// Send buffer.
    pub send_buff: *const c_void,
    /// Receive buffer.
    pub recv_buff: *mut c_void,
    /// Element count.
    pub count: usize,
    /// Root (-1 none).
    pub root: c_int,
    /// Datatype name (static C string or NULL).
    pub datatype: *const c_char,
    /// Channels (1: one KernelCh child).
    pub n_channels: u8,
    /// Warps (0).
    pub n_warps: u8,
    /// Algorithm (NULL).
    pub algo: *const c_char,
    /// Protocol (NULL).
    pub proto: *const c_char,
    /// Parent group (NULL).
    pub parent_group: *mut c_void,
}

/// The `p2p` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pArm {
    /// "Send" / "Recv".
    pub func: *const c_char,
    /// Buffer.
    pub buff: *mut c_void,
    /// Datatype name.
    pub datatype: *const c_char,
    /// Element count.
    pub count: usize,
    /// Peer rank in the communicator.
    pub peer: c_int,
    /// Channels (1).
    pub n_channels: u8,
    /// Parent group (NULL).
    pub parent_group: *mut c_void,
}

/// The `kernelCh` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChArm {
    /// Channel (0).
    pub channel_id: u8,
    /// GPU timer (0: none).
    pub ptimer: u64,
}

/// The union of `ncclProfilerEventDescr_v6_t` (88 bytes; only these arms are used).
#[repr(C)]
#[derive(Clone, Copy)]
pub union Arm {
    /// Coll.
    pub coll: CollArm,
    /// P2p.
    pub p2p: P2pArm,
    /// KernelCh.
    pub kernel_ch: KernelChArm,
    raw: [u64; 11],
}

/// `ncclProfilerEventDescr_v6_t` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Descr {
    /// Event type bit.
    pub type_: u64,
    /// Parent handle (KernelCh: its Coll / P2p).
    pub parent_obj: *mut c_void,
    /// Rank.
    pub rank: c_int,
    /// The arm `type_` names.
    pub u: Arm,
}

const _: () = {
    assert!(size_of::<Descr>() == 112);
    assert!(std::mem::offset_of!(Descr, u) == 24);
    assert!(std::mem::offset_of!(CollArm, datatype) == 48);
    assert!(std::mem::offset_of!(CollArm, n_channels) == 56);
    assert!(std::mem::offset_of!(CollArm, parent_group) == 80);
    assert!(std::mem::offset_of!(P2pArm, peer) == 32);
    assert!(std::mem::offset_of!(P2pArm, n_channels) == 36);
    assert!(std::mem::offset_of!(KernelChArm, ptimer) == 8);
    assert!(size_of::<TableV6>() == 48);
};

/// The loaded plugin's entry points.
pub struct Recorder {
    ext_init: ExtInitFn,
    start: StartFn,
    stop: HandleFn,
    finalize: HandleFn,
    /// The event mask the plugin writes at `init` (NCCL's `int* eActivationMask`).
    mask: &'static AtomicI32,
}

// SAFETY: function pointers into a loaded (and never unloaded) library and a leaked atomic.
unsafe impl Sync for Recorder {}
// SAFETY: as above.
unsafe impl Send for Recorder {}

static RECORDER: OnceLock<Option<Recorder>> = OnceLock::new();

/// The plugin, loaded on first use (None: not found, or `COMMINSIGHT_DISABLE=1`).
pub fn get() -> Option<&'static Recorder> {
    RECORDER.get_or_init(load).as_ref()
}

fn candidates() -> Vec<CString> {
    let mut v = Vec::new();
    if let Ok(p) = std::env::var("COMMINSIGHT_PLUGIN_PATH") {
        if !p.is_empty() {
            v.extend(CString::new(p));
        }
    }
    if let Some(d) = sym::self_object()
        .and_then(|(_, p)| p)
        .and_then(|p| p.parent().map(|d| d.join(PLUGIN_FILE)))
    {
        v.extend(CString::new(d.to_string_lossy().into_owned()));
    }
    v.extend(CString::new(PLUGIN_FILE));
    v
}

fn load() -> Option<Recorder> {
    if crate::shim::disabled() {
        return None;
    }
    for path in candidates() {
        // SAFETY: a NUL-terminated path; the handle is kept for the life of the process.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            continue;
        }
        // SAFETY: `h` is a live handle; the names are NUL-terminated.
        let table = unsafe { libc::dlsym(h, c"ncclProfiler_v6".as_ptr()) };
        // SAFETY: as above.
        let ext = unsafe { libc::dlsym(h, c"comminsight_external_init_v1".as_ptr()) };
        if table.is_null() || ext.is_null() {
            hccl::warn_once(format!(
                "HCCL: {} lacks ncclProfiler_v6 / comminsight_external_init_v1 (an older plugin?): HCCL calls are only forwarded",
                path.to_string_lossy()
            ));
            continue;
        }
        // SAFETY: the plugin exports `ncclProfiler_v6` as a static `ncclProfiler_v6_t`, never
        // freed (the handle is never closed).
        let t = unsafe { &*table.cast::<TableV6>() };
        let (Some(start), Some(stop), Some(finalize)) = (t.start_event, t.stop_event, t.finalize)
        else {
            continue;
        };
        // SAFETY: the plugin defines the symbol with exactly this C signature
        // (plugin/src/external.rs).
        let ext_init = unsafe { std::mem::transmute::<*mut c_void, ExtInitFn>(ext) };
        return Some(Recorder {
            ext_init,
            start,
            stop,
            finalize,
            mask: Box::leak(Box::new(AtomicI32::new(0))),
        });
    }
    hccl::warn_once(format!(
        "HCCL: cannot load {PLUGIN_FILE} (next to the preload, COMMINSIGHT_PLUGIN_PATH, or on the loader path): HCCL calls are only forwarded"
    ));
    hccl::count(Counter::NoRecorder);
    None
}

impl Recorder {
    /// The event mask the plugin asked for.
    #[inline]
    pub fn mask(&self) -> u64 {
        self.mask.load(Ordering::Relaxed) as u32 as u64
    }

    /// Open a communicator: its context (NULL: not tracked).
    pub fn init(&self, comm_id: u64, name: &CString, nranks: i32, rank: i32, flags: u16) -> usize {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ctx` is writable, the mask int is leaked (outlives every communicator), the
        // name is NUL-terminated and alive during the call (the plugin copies it).
        unsafe {
            (self.ext_init)(
                &mut ctx,
                comm_id,
                self.mask.as_ptr(),
                name.as_ptr(),
                0,
                nranks,
                rank,
                u32::from(flags),
            )
        };
        ctx as usize
    }

    /// Start an event; the handle (0: not tracked).
    #[inline]
    pub fn start(&self, ctx: usize, d: &mut Descr) -> usize {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ctx` is a context from `init` (or NULL); `d` is a complete descriptor whose
        // strings are static; `h` is writable.
        unsafe { (self.start)(ctx as *mut c_void, &mut h, d) };
        h as usize
    }

    /// Stop an event (0: nothing).
    #[inline]
    pub fn stop(&self, h: usize) {
        if h != 0 {
            // SAFETY: a handle the plugin returned; the plugin validates stale ones.
            unsafe { (self.stop)(h as *mut c_void) };
        }
    }

    /// Close a communicator's context (0: nothing).
    pub fn finalize(&self, ctx: usize) {
        if ctx != 0 {
            // SAFETY: a context from `init`, finalized once (the caller removed it from its table).
            unsafe { (self.finalize)(ctx as *mut c_void) };
        }
    }
}

/// A KernelCh descriptor under `parent`.
pub fn kernel_ch(parent: usize, rank: i32) -> Descr {
    Descr {
        type_: EV_KERNEL_CH,
        parent_obj: parent as *mut c_void,
        rank,
        u: Arm {
            kernel_ch: KernelChArm {
                channel_id: 0,
                ptimer: 0,
            },
        },
    }
}

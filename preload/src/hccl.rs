//! HCCL interposition, the safe part: HCCL's enums, the per-communicator state (context,
//! sequence numbers), names, hashes, counters, and what one operation hands the recorder.
//! [`crate::hccl_ffi`] holds the C entry points; [`crate::recorder`] the plugin; [`crate::acl`]
//! the stream events. Declarations follow CANN's public HCCL / AscendCL documentation (see
//! preload/README.md, "HCCL").

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use comminsight_wire::record::FLAG_HCCL;

use crate::recorder::{self, Arm, CollArm, Descr, P2pArm, Recorder, EV_COLL, EV_KERNEL_CH, EV_P2P};
use crate::state::{current_group, with_registry};

/// `HcclResult`: `HCCL_SUCCESS`.
pub const HCCL_SUCCESS: i32 = 0;
/// `HCCL_E_NOT_FOUND`: returned when the real function cannot be found.
pub const HCCL_E_NOT_FOUND: i32 = 6;
/// `HCCL_ROOT_INFO_BYTES`: size of `HcclRootInfo`.
pub const ROOT_INFO_BYTES: usize = 4108;
/// `HcclCommConfig`: the header's magic word (`HCCL_COMM_CONFIG_MAGIC_WORD`).
pub const CONFIG_MAGIC: u32 = 0xf0f0_f0f0;
/// `HcclCommConfig`: offset of `hcclCommName` (after the 24-byte header and two u32 fields).
pub const CONFIG_NAME_OFFSET: usize = 32;
/// `COMM_NAME_MAX_LENGTH`.
pub const CONFIG_NAME_BYTES: usize = 128;

/// The operations interposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `HcclBroadcast`.
    Broadcast,
    /// `HcclReduce`.
    Reduce,
    /// `HcclAllGather`.
    AllGather,
    /// `HcclReduceScatter`.
    ReduceScatter,
    /// `HcclAllReduce` and `HcclBarrier` (HCCL's barrier is a small all-reduce).
    AllReduce,
    /// `HcclAlltoAll`, `HcclAlltoAllV`.
    AlltoAll,
    /// `HcclSend`.
    Send,
    /// `HcclRecv`.
    Recv,
}

impl Func {
    /// NCCL's spelling (the plugin's function names).
    pub fn name(self) -> &'static CStr {
        match self {
            Func::Broadcast => c"Broadcast",
            Func::Reduce => c"Reduce",
            Func::AllGather => c"AllGather",
            Func::ReduceScatter => c"ReduceScatter",
            Func::AllReduce => c"AllReduce",
            Func::AlltoAll => c"AlltoAll",
            Func::Send => c"Send",
            Func::Recv => c"Recv",
        }
    }

    /// Index of the collective's per-communicator sequence counter (None: P2P).
    pub fn seq_index(self) -> Option<usize> {
        match self {
            Func::Broadcast => Some(0),
            Func::Reduce => Some(1),
            Func::AllGather => Some(2),
            Func::ReduceScatter => Some(3),
            Func::AllReduce => Some(4),
            Func::AlltoAll => Some(5),
            Func::Send | Func::Recv => None,
        }
    }
}

/// `HcclDataType` -> (the plugin's datatype name, element-count multiplier). Types NCCL has are
/// named as NCCL names them; int16 / uint16 / int128 are counted in bytes as `ncclInt8` (as NCCL
/// reports its converted tasks), so `bytes` stays right; unknown types: no name (bytes 0).
pub fn datatype(t: i32) -> (Option<&'static CStr>, u64) {
    match t {
        0 => (Some(c"ncclInt8"), 1),
        1 | 8 => (Some(c"ncclInt8"), 2),
        2 => (Some(c"ncclInt32"), 1),
        3 => (Some(c"ncclFloat16"), 1),
        4 => (Some(c"ncclFloat32"), 1),
        5 => (Some(c"ncclInt64"), 1),
        6 => (Some(c"ncclUint64"), 1),
        7 => (Some(c"ncclUint8"), 1),
        9 => (Some(c"ncclUint32"), 1),
        10 => (Some(c"ncclFloat64"), 1),
        11 => (Some(c"ncclBfloat16"), 1),
        12 => (Some(c"ncclInt8"), 16),
        _ => (None, 1),
    }
}

/// Failure and activity counters (`comminsight_preload_hccl_stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Operations handed to the recorder.
    Recorded = 0,
    /// Operations forwarded without a record (no recorder, unknown communicator, mask off).
    Unrecorded = 1,
    /// The plugin could not be loaded.
    NoRecorder = 2,
    /// Stream events that could not be created or recorded (op closed at return).
    EventErrors = 3,
    /// Event queries that failed (op closed when seen).
    QueryErrors = 4,
    /// Operations closed by a completed stream event.
    EventClosed = 5,
    /// Panics caught in the shim's HCCL code.
    Panics = 6,
}

/// Number of counters.
pub const COUNTERS: usize = 7;
static COUNTS: [AtomicU64; COUNTERS] = [const { AtomicU64::new(0) }; COUNTERS];

/// Count one event.
#[inline]
pub fn count(c: Counter) {
    COUNTS[c as usize].fetch_add(1, Ordering::Relaxed);
}

/// The counters, in [`Counter`] order.
pub fn counts() -> [u64; COUNTERS] {
    std::array::from_fn(|i| COUNTS[i].load(Ordering::Relaxed))
}

/// Queue a warning (printed to stderr now: no NCCL logger in an HCCL process).
pub fn warn_once(msg: String) {
    crate::state::warn(msg);
    crate::shim::flush_warnings_to_stderr();
}

/// FNV-1a 64 of `bytes` (the communicator's hash: equal on every rank of it).
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The caller's `hcclCommName` from an `HcclCommConfig`'s bytes (None: no valid header, empty).
pub fn config_name(cfg: &[u8]) -> Option<String> {
    if cfg.len() < CONFIG_NAME_OFFSET + CONFIG_NAME_BYTES {
        return None;
    }
    let magic = u32::from_ne_bytes(cfg[8..12].try_into().ok()?);
    if magic != CONFIG_MAGIC {
        return None;
    }
    let f = &cfg[CONFIG_NAME_OFFSET..CONFIG_NAME_OFFSET + CONFIG_NAME_BYTES];
    let n = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    let s = std::str::from_utf8(&f[..n]).ok()?.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// The record name of a new communicator: the caller's `hcclCommName` wins; else the preload's
/// naming (current group, the announcement of its size and rank, `COMMINSIGHT_COMM_ROLE`); else
/// none. The caller's config is never changed (HCCL requires unique names per process).
pub fn choose_name(caller: Option<String>, nranks: i32, rank: i32) -> String {
    if let Some(n) = caller {
        return n;
    }
    with_registry(|r| {
        let Some(c) = r.choose(current_group(), Some((nranks, rank))) else {
            return String::new();
        };
        r.count_named(c.ann);
        c.name
    })
}

/// One HCCL communicator the recorder knows.
#[derive(Debug)]
pub struct CommState {
    /// The plugin's context.
    pub ctx: usize,
    /// This rank in the communicator.
    pub rank: i32,
    /// Ranks in the communicator.
    pub nranks: i32,
    /// Ops handed to the event poller and not closed yet.
    pub pending: AtomicU64,
    /// Collective sequence numbers per function (`Func::seq_index`).
    seq: [AtomicU64; 6],
    /// The AscendCL context current at init (0: none), made current on the event poller.
    pub acl_ctx: usize,
}

static COMMS: RwLock<Option<HashMap<usize, Arc<CommState>>>> = RwLock::new(None);
/// Bumped at every insert and remove: a thread's cached lookup is valid only in its epoch.
static EPOCH: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// This thread's last lookup: (comm, epoch, state). Ops of one communicator come in runs.
    static LAST: std::cell::RefCell<Option<(usize, u64, Arc<CommState>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Remember communicator `comm`.
pub fn insert(comm: usize, ctx: usize, rank: i32, nranks: i32, acl_ctx: usize) {
    let st = Arc::new(CommState {
        ctx,
        rank,
        nranks,
        pending: AtomicU64::new(0),
        seq: Default::default(),
        acl_ctx,
    });
    let mut g = COMMS.write().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(HashMap::new).insert(comm, st);
    EPOCH.fetch_add(1, Ordering::Release);
}

/// The state of `comm`.
#[inline]
pub fn lookup(comm: usize) -> Option<Arc<CommState>> {
    let epoch = EPOCH.load(Ordering::Acquire);
    // `try_with`: no cache (rather than a panic) in a thread's TLS destructors.
    let hit = LAST
        .try_with(|l| match l.try_borrow().as_deref() {
            Ok(Some((c, e, st))) if *c == comm && *e == epoch => Some(st.clone()),
            _ => None,
        })
        .ok()
        .flatten();
    if hit.is_some() {
        return hit;
    }
    let st = {
        let g = COMMS.read().unwrap_or_else(|p| p.into_inner());
        g.as_ref()?.get(&comm).cloned()?
    };
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = Some((comm, epoch, st.clone()));
        }
    });
    Some(st)
}

/// Forget `comm`; its state.
pub fn remove(comm: usize) -> Option<Arc<CommState>> {
    let mut g = COMMS.write().unwrap_or_else(|p| p.into_inner());
    let st = g.as_mut()?.remove(&comm);
    EPOCH.fetch_add(1, Ordering::Release);
    st
}

/// One operation's arguments, as the record needs them.
#[derive(Clone, Copy, Debug)]
pub struct OpArgs {
    /// The function.
    pub func: Func,
    /// HCCL's count (AlltoAllV: the sum of the send counts).
    pub count: u64,
    /// `HcclDataType`.
    pub dtype: i32,
    /// Root (Broadcast, Reduce) or -1.
    pub root: i32,
    /// Peer (Send, Recv) or -1.
    pub peer: i32,
    /// Send buffer.
    pub send: usize,
    /// Receive buffer.
    pub recv: usize,
}

/// An operation handed to the recorder: its Coll / P2p handle and whether a KernelCh child is
/// expected (the event path).
#[derive(Debug)]
pub struct Begun {
    /// The recorder.
    pub rec: &'static Recorder,
    /// The communicator.
    pub comm: Arc<CommState>,
    /// The Coll / P2p handle.
    pub handle: usize,
    /// A KernelCh child is expected (closed by the event poller).
    pub child: bool,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

fn cptr(s: Option<&'static CStr>) -> *const c_char {
    s.map_or(std::ptr::null(), CStr::as_ptr)
}

/// The descriptor of `a` on `st` (`child`: announce one KernelCh channel).
pub fn descriptor(st: &CommState, a: &OpArgs, child: bool) -> Descr {
    let (dt, mul) = datatype(a.dtype);
    let count = a.count.saturating_mul(mul) as usize;
    let n_channels = u8::from(child);
    let (type_, u) = match a.func.seq_index() {
        Some(i) => (
            EV_COLL,
            Arm {
                coll: CollArm {
                    seq_number: st.seq[i].fetch_add(1, Ordering::Relaxed),
                    func: a.func.name().as_ptr(),
                    send_buff: a.send as *const _,
                    recv_buff: a.recv as *mut _,
                    count,
                    root: a.root,
                    datatype: cptr(dt),
                    n_channels,
                    n_warps: 0,
                    algo: std::ptr::null(),
                    proto: std::ptr::null(),
                    parent_group: std::ptr::null_mut(),
                },
            },
        ),
        None => (
            EV_P2P,
            Arm {
                p2p: P2pArm {
                    func: a.func.name().as_ptr(),
                    buff: a.send.max(a.recv) as *mut _,
                    datatype: cptr(dt),
                    count,
                    peer: a.peer,
                    n_channels,
                    parent_group: std::ptr::null_mut(),
                },
            },
        ),
    };
    Descr {
        type_,
        parent_obj: std::ptr::null_mut(),
        rank: st.rank,
        u,
    }
}

/// Before the real call: the Coll / P2p start (one clock read, in the plugin). None: not
/// recorded (no recorder, unknown communicator, the event type masked off).
#[inline]
pub fn begin(comm: usize, a: &OpArgs, events: bool) -> Option<Begun> {
    let Some(rec) = recorder::get() else {
        count(Counter::Unrecorded);
        return None;
    };
    let Some(st) = lookup(comm) else {
        count(Counter::Unrecorded);
        return None;
    };
    let mask = rec.mask();
    let bit = if a.func.seq_index().is_some() {
        EV_COLL
    } else {
        EV_P2P
    };
    if mask & bit == 0 || st.ctx == 0 {
        // NCCL's seqNumber advances with every collective, profiled or not.
        if let Some(i) = a.func.seq_index() {
            st.seq[i].fetch_add(1, Ordering::Relaxed);
        }
        count(Counter::Unrecorded);
        return None;
    }
    let child = events && mask & EV_KERNEL_CH != 0;
    let mut d = descriptor(&st, a, child);
    let handle = rec.start(st.ctx, &mut d);
    if handle == 0 {
        // The plugin dropped it (no free slot; counted there): no event, nothing to close.
        count(Counter::Unrecorded);
        return None;
    }
    count(Counter::Recorded);
    Some(Begun {
        rec,
        comm: st,
        handle,
        child,
    })
}

/// The KernelCh child of `b` (started by the poller when the op reaches its stream's head, or at
/// once when the event path failed).
pub fn start_child(b: &Begun) -> usize {
    let mut d = recorder::kernel_ch(b.handle, b.comm.rank);
    b.rec.start(b.comm.ctx, &mut d)
}

/// The name for the plugin (`CString`; a name with a NUL is cut there).
pub fn c_name(name: &str) -> CString {
    let n = name.split('\0').next().unwrap_or("");
    CString::new(n).unwrap_or_default()
}

/// Record flags of HCCL communicators.
pub const FLAGS: u16 = FLAG_HCCL;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatypes_map_to_the_plugins_names_with_bytes_kept() {
        assert_eq!(datatype(4), (Some(c"ncclFloat32"), 1));
        assert_eq!(datatype(11), (Some(c"ncclBfloat16"), 1));
        assert_eq!(datatype(1), (Some(c"ncclInt8"), 2), "int16 in bytes");
        assert_eq!(datatype(12), (Some(c"ncclInt8"), 16), "int128 in bytes");
        assert_eq!(datatype(99), (None, 1));
    }

    #[test]
    fn config_names_need_the_magic_and_a_non_empty_name() {
        let mut cfg = vec![0u8; 400];
        cfg[0..8].copy_from_slice(&(400u64).to_ne_bytes());
        assert_eq!(config_name(&cfg), None, "no magic");
        cfg[8..12].copy_from_slice(&CONFIG_MAGIC.to_ne_bytes());
        assert_eq!(config_name(&cfg), None, "empty name");
        cfg[32..36].copy_from_slice(b"tp:x");
        assert_eq!(config_name(&cfg).as_deref(), Some("tp:x"));
        assert_eq!(config_name(&cfg[..100]), None, "too short");
    }

    #[test]
    fn collectives_count_per_function_and_p2p_leaves_it_to_the_plugin() {
        let st = CommState {
            ctx: 1,
            rank: 3,
            nranks: 4,
            pending: AtomicU64::new(0),
            seq: Default::default(),
            acl_ctx: 0,
        };
        let a = |func| OpArgs {
            func,
            count: 10,
            dtype: 1,
            root: -1,
            peer: 2,
            send: 0x1000,
            recv: 0x2000,
        };
        let seq = |d: &Descr| {
            // SAFETY: a Coll descriptor's coll arm was written by `descriptor`.
            unsafe { d.u.coll.seq_number }
        };
        assert_eq!(seq(&descriptor(&st, &a(Func::AllReduce), true)), 0);
        assert_eq!(seq(&descriptor(&st, &a(Func::AllReduce), true)), 1);
        assert_eq!(seq(&descriptor(&st, &a(Func::AllGather), true)), 0);
        let d = descriptor(&st, &a(Func::AllReduce), false);
        assert_eq!(seq(&d), 2);
        assert_eq!(d.type_, EV_COLL);
        assert_eq!(d.rank, 3);
        // SAFETY: as above.
        let c = unsafe { d.u.coll };
        assert_eq!((c.count, c.n_channels), (20, 0), "int16: bytes as int8");
        let p = descriptor(&st, &a(Func::Send), true);
        assert_eq!(p.type_, EV_P2P);
        // SAFETY: a P2p descriptor's p2p arm was written by `descriptor`.
        let p = unsafe { p.u.p2p };
        assert_eq!((p.peer, p.n_channels, p.count), (2, 1, 20));
    }

    #[test]
    fn lookups_follow_inserts_and_removes_at_one_address() {
        let comm = 0x7e57_0000;
        assert!(lookup(comm).is_none());
        insert(comm, 11, 0, 2, 0);
        assert_eq!(lookup(comm).map(|s| s.ctx), Some(11));
        assert_eq!(lookup(comm).map(|s| s.ctx), Some(11), "cached");
        assert_eq!(remove(comm).map(|s| s.ctx), Some(11));
        assert!(lookup(comm).is_none(), "removed: the cache is stale");
        insert(comm, 12, 1, 2, 0);
        assert_eq!(lookup(comm).map(|s| s.ctx), Some(12), "the address reused");
        remove(comm);
    }

    #[test]
    fn the_callers_name_wins_and_hashes_differ() {
        assert_eq!(choose_name(Some("mine".into()), 4, 1), "mine");
        assert_ne!(hash(b"a"), hash(b"b"));
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(c_name("a\0b").as_bytes(), b"a");
    }
}

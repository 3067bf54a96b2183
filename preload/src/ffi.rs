//! The C surface: the interposed NCCL entry points, the announcement ABI, the constructor.
//!
//! Every entry point catches panics (a panic while deciding means "forward untouched"), never
//! writes into the caller's structs, and takes the shim's mutex only around its own decisions,
//! never across the real call (the plugin's `init` runs inside it and drains the warnings).

#![allow(non_snake_case, reason = "NCCL's C names")]

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::config::{self, CallerConfig, ConfigBuf};
use crate::shim::{self, Caller, Plan};
use crate::state::{self, MAX_INPUT_BYTES};
use crate::sym::{self, RealFn};

/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclSystemError`: returned when the real function cannot be found.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInProgress` (nonblocking communicators).
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// Opaque bytes.
    pub internal: [c_char; 128],
}

type InitRankFn = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult;
type InitRankConfigFn =
    unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut c_void) -> NcclResult;
type InitRankScalableFn =
    unsafe extern "C" fn(*mut Comm, c_int, c_int, c_int, *mut UniqueId, *mut c_void) -> NcclResult;
type InitAllFn = unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult;
type SplitFn = unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> NcclResult;
type ShrinkFn =
    unsafe extern "C" fn(Comm, *mut c_int, c_int, *mut Comm, *mut c_void, c_int) -> NcclResult;
type GrowFn =
    unsafe extern "C" fn(Comm, c_int, *const UniqueId, c_int, *mut Comm, *mut c_void) -> NcclResult;
type CommFn = unsafe extern "C" fn(Comm) -> NcclResult;
type VersionFn = unsafe extern "C" fn(*mut c_int) -> NcclResult;

static R_INIT_RANK: RealFn = RealFn::new(c"ncclCommInitRank");
static R_INIT_RANK_CONFIG: RealFn = RealFn::new(c"ncclCommInitRankConfig");
static R_INIT_RANK_SCALABLE: RealFn = RealFn::new(c"ncclCommInitRankScalable");
static R_INIT_ALL: RealFn = RealFn::new(c"ncclCommInitAll");
static R_SPLIT: RealFn = RealFn::new(c"ncclCommSplit");
static R_SHRINK: RealFn = RealFn::new(c"ncclCommShrink");
static R_GROW: RealFn = RealFn::new(c"ncclCommGrow");
static R_DESTROY: RealFn = RealFn::new(c"ncclCommDestroy");
static R_ABORT: RealFn = RealFn::new(c"ncclCommAbort");
static R_VERSION: RealFn = RealFn::new(c"ncclGetVersion");

/// Run `f`; a panic gives `fallback`.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The real function `r` as a `T` (a function pointer type of its C signature), or None with a
/// warning queued.
fn real<T: Copy>(r: &RealFn) -> Option<T> {
    let Some(a) = r.get() else {
        state::warn(format!(
            "{}: no loaded library defines it (is libnccl loaded?): returning ncclSystemError",
            r.name()
        ));
        shim::flush_warnings_to_stderr();
        return None;
    };
    debug_assert_eq!(size_of::<T>(), size_of::<usize>());
    // SAFETY: `T` is always the `unsafe extern "C" fn` type of NCCL's declaration of `r.name()`,
    // and `a` is the address of that function in the real library (never this one).
    Some(unsafe { std::mem::transmute_copy::<usize, T>(&a) })
}

/// Make sure the NCCL version is known (naming needs >= 2.27).
fn ensure_version() {
    if shim::nccl_version() != 0 || shim::disabled() {
        return;
    }
    if let Some(a) = R_VERSION.get() {
        // SAFETY: ncclGetVersion(int*) of the real library; `v` is a valid int.
        let f: VersionFn = unsafe { std::mem::transmute::<usize, VersionFn>(a) };
        let mut v: c_int = 0;
        // SAFETY: as above.
        if unsafe { f(&mut v) } == NCCL_SUCCESS && v > 0 {
            shim::set_nccl_version(v as u32);
        }
    }
}

/// Read the caller's config pointer.
///
/// # Safety
/// `p` is NULL or an `ncclConfig_t*` whose first `size` bytes are readable (NCCL's contract).
unsafe fn read_caller(p: *const c_void) -> Caller {
    if p.is_null() {
        return Caller::Null;
    }
    let mut hdr = [0u8; 16];
    // SAFETY: every ncclConfig_t has at least `size`, `magic`, `version` (16 bytes).
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), hdr.as_mut_ptr(), 16) };
    let size = config::header_size(&hdr);
    if !(16..=config::MAX_SIZE).contains(&size) {
        return Caller::Config(CallerConfig::Untouched);
    }
    // SAFETY: the caller's struct is `size` bytes long (its own `size` field).
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size) };
    let mut named = false;
    if size >= config::MIN_NAMED_SIZE {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[config::COMM_NAME_OFFSET..config::COMM_NAME_OFFSET + 8]);
        let name = usize::from_ne_bytes(w) as *const c_char;
        // SAFETY: a non-NULL commName is a C string (NCCL reads it the same way).
        named = !name.is_null() && unsafe { *name } != 0;
    }
    Caller::Config(ConfigBuf::from_caller(bytes, named))
}

fn ok(res: NcclResult) -> bool {
    res == NCCL_SUCCESS || res == NCCL_IN_PROGRESS
}

/// # Safety
/// `p` NULL or readable.
unsafe fn comm_at(p: *const Comm) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: NCCL wrote the new communicator there (caller-owned, readable).
        unsafe { *p as usize }
    }
}

/// Plan with panics caught and the version known.
fn plan(f: impl FnOnce() -> Plan) -> Plan {
    ensure_version();
    guard(Plan::Forward, f)
}

fn after(plan: Plan, res: NcclResult, newcomm: usize) {
    guard((), || {
        shim::finish(plan, ok(res), newcomm);
        shim::flush_warnings_to_stderr();
    });
}

fn cfg_ptr(plan: &mut Plan, caller: *mut c_void) -> *mut c_void {
    match plan {
        Plan::Forward | Plan::Remember(_) => caller,
        Plan::Config { cfg, .. } => cfg.as_mut_ptr().cast(),
    }
}

/// Interposed `ncclCommInitRank`: with a name, NCCL's own equivalent `ncclCommInitRankConfig`
/// with a default config carrying it.
///
/// # Safety
/// NCCL's contract for `ncclCommInitRank`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    let mut p = plan(|| shim::plan_init(Caller::Null, Some((nranks, rank))));
    let res = match &mut p {
        Plan::Forward | Plan::Remember(_) => match real::<InitRankFn>(&R_INIT_RANK) {
            // SAFETY: forwarded arguments.
            Some(f) => unsafe { f(comm, nranks, id, rank) },
            None => return NCCL_SYSTEM_ERROR,
        },
        Plan::Config { cfg, .. } => match real::<InitRankConfigFn>(&R_INIT_RANK_CONFIG) {
            // SAFETY: forwarded arguments; `cfg` is a complete config alive during the call.
            Some(f) => unsafe { f(comm, nranks, id, rank, cfg.as_mut_ptr().cast()) },
            None => return NCCL_SYSTEM_ERROR,
        },
    };
    // SAFETY: `comm` as passed to NCCL.
    after(p, res, unsafe { comm_at(comm) });
    res
}

/// Interposed `ncclCommInitRankConfig`.
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract on `config`.
    let mut p = plan(|| shim::plan_init(unsafe { read_caller(config) }, Some((nranks, rank))));
    let Some(f) = real::<InitRankConfigFn>(&R_INIT_RANK_CONFIG) else {
        return NCCL_SYSTEM_ERROR;
    };
    let c = cfg_ptr(&mut p, config);
    // SAFETY: forwarded arguments; our config outlives the call.
    let res = unsafe { f(comm, nranks, id, rank, c) };
    // SAFETY: `comm` as passed to NCCL.
    after(p, res, unsafe { comm_at(comm) });
    res
}

/// Interposed `ncclCommInitRankScalable`.
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    comm: *mut Comm,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    ids: *mut UniqueId,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract on `config`.
    let mut p = plan(|| shim::plan_init(unsafe { read_caller(config) }, Some((nranks, myrank))));
    let Some(f) = real::<InitRankScalableFn>(&R_INIT_RANK_SCALABLE) else {
        return NCCL_SYSTEM_ERROR;
    };
    let c = cfg_ptr(&mut p, config);
    // SAFETY: forwarded arguments; our config outlives the call.
    let res = unsafe { f(comm, nranks, myrank, n_id, ids, c) };
    // SAFETY: `comm` as passed to NCCL.
    after(p, res, unsafe { comm_at(comm) });
    res
}

/// Interposed `ncclCommInitAll`: forwarded untouched (no config argument: such communicators stay
/// unnamed).
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut Comm,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    let Some(f) = real::<InitAllFn>(&R_INIT_ALL) else {
        return NCCL_SYSTEM_ERROR;
    };
    // SAFETY: forwarded arguments.
    unsafe { f(comms, ndev, devlist) }
}

/// Interposed `ncclCommSplit`.
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: Comm,
    color: c_int,
    key: c_int,
    newcomm: *mut Comm,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract on `config`.
    let mut p = plan(|| shim::plan_split(comm as usize, unsafe { read_caller(config) }));
    let Some(f) = real::<SplitFn>(&R_SPLIT) else {
        return NCCL_SYSTEM_ERROR;
    };
    let c = cfg_ptr(&mut p, config);
    // SAFETY: forwarded arguments; our config outlives the call.
    let res = unsafe { f(comm, color, key, newcomm, c) };
    // SAFETY: `newcomm` as passed to NCCL.
    after(p, res, unsafe { comm_at(newcomm) });
    res
}

/// Interposed `ncclCommShrink` (NCCL 2.27+).
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: Comm,
    exclude: *mut c_int,
    n_exclude: c_int,
    newcomm: *mut Comm,
    config: *mut c_void,
    flags: c_int,
) -> NcclResult {
    // SAFETY: NCCL's contract on `config`.
    let mut p = plan(|| shim::plan_shrink(comm as usize, unsafe { read_caller(config) }));
    let Some(f) = real::<ShrinkFn>(&R_SHRINK) else {
        return NCCL_SYSTEM_ERROR;
    };
    let c = cfg_ptr(&mut p, config);
    // SAFETY: forwarded arguments; our config outlives the call.
    let res = unsafe { f(comm, exclude, n_exclude, newcomm, c, flags) };
    // SAFETY: `newcomm` as passed to NCCL.
    after(p, res, unsafe { comm_at(newcomm) });
    res
}

/// Interposed `ncclCommGrow` (NCCL 2.28+): existing members keep the parent's name, new ranks
/// (`comm` NULL) are named like an init.
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGrow(
    comm: Comm,
    nranks: c_int,
    id: *const UniqueId,
    rank: c_int,
    newcomm: *mut Comm,
    config: *mut c_void,
) -> NcclResult {
    let mut p = plan(|| {
        // SAFETY: NCCL's contract on `config`.
        let caller = unsafe { read_caller(config) };
        if comm.is_null() {
            shim::plan_init(caller, Some((nranks, rank)))
        } else {
            shim::plan_shrink(comm as usize, caller)
        }
    });
    let Some(f) = real::<GrowFn>(&R_GROW) else {
        return NCCL_SYSTEM_ERROR;
    };
    let c = cfg_ptr(&mut p, config);
    // SAFETY: forwarded arguments; our config outlives the call.
    let res = unsafe { f(comm, nranks, id, rank, newcomm, c) };
    // SAFETY: `newcomm` as passed to NCCL.
    after(p, res, unsafe { comm_at(newcomm) });
    res
}

/// Interposed `ncclCommDestroy`: forgets the shim's state for `comm`, then forwards.
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: Comm) -> NcclResult {
    guard((), || shim::forget(comm as usize));
    let Some(f) = real::<CommFn>(&R_DESTROY) else {
        return NCCL_SYSTEM_ERROR;
    };
    // SAFETY: forwarded argument.
    unsafe { f(comm) }
}

/// Interposed `ncclCommAbort`: forgets the shim's state for `comm`, then forwards.
///
/// # Safety
/// NCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: Comm) -> NcclResult {
    guard((), || shim::forget(comm as usize));
    let Some(f) = real::<CommFn>(&R_ABORT) else {
        return NCCL_SYSTEM_ERROR;
    };
    // SAFETY: forwarded argument.
    unsafe { f(comm) }
}

/// The announcement ABI's version (1).
#[no_mangle]
pub extern "C" fn comminsight_preload_version() -> c_int {
    1
}

/// Register a process group this process belongs to; returns its id or -1 (one warning queued
/// per distinct problem). See preload/README.md.
///
/// # Safety
/// Strings NULL or NUL-terminated; `ranks` NULL or `nranks` readable ints.
#[no_mangle]
pub unsafe extern "C" fn comminsight_announce_group(
    role: *const c_char,
    group_desc: *const c_char,
    group_name: *const c_char,
    ranks: *const c_int,
    nranks: c_int,
    my_rank: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's contract on the arguments.
        let r = unsafe { announce(role, group_desc, group_name, ranks, nranks, my_rank) };
        r.unwrap_or_else(|e| {
            state::warn(e.to_string());
            -1
        })
    })
}

/// # Safety
/// As `comminsight_announce_group`.
unsafe fn announce(
    role: *const c_char,
    desc: *const c_char,
    name: *const c_char,
    ranks: *const c_int,
    nranks: c_int,
    my_rank: c_int,
) -> Result<c_int, state::AnnounceError> {
    use state::AnnounceError::{BadSize, BadString};
    let s = |p, field| {
        // SAFETY: the caller's contract.
        unsafe { sym::c_str(p, MAX_INPUT_BYTES) }.map_err(|why| BadString { field, why })
    };
    let role = if role.is_null() {
        None
    } else {
        Some(s(role, "role")?)
    };
    let desc = s(desc, "group_desc")?;
    let name = s(name, "group_name")?;
    if nranks < 1 || nranks as usize > state::MAX_GROUP_RANKS || ranks.is_null() {
        return Err(BadSize(nranks.into()));
    }
    // SAFETY: `ranks` holds `nranks` ints (caller's contract), checked non-NULL and in range.
    let ranks = unsafe { std::slice::from_raw_parts(ranks, nranks as usize) };
    state::with_registry(|r| r.announce(role, desc, name, ranks, my_rank))
}

/// Set this thread's current group (-1 or an unknown id clears it).
#[no_mangle]
pub extern "C" fn comminsight_set_current_group(id: c_int) {
    guard((), || state::set_current_group(id));
}

/// Communicators named from announcement `id` so far; -1 for an unknown id.
#[no_mangle]
pub extern "C" fn comminsight_group_comms(id: c_int) -> c_int {
    guard(-1, || state::with_registry(|r| r.group_comms(id)))
}

/// Copy the next queued warning into `buf` (NUL-terminated, truncated to `len - 1` bytes) and
/// return its length; 0 when none (or `buf` NULL / `len` < 1, and then nothing is taken).
///
/// # Safety
/// `buf` NULL or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn comminsight_preload_take_warning(buf: *mut c_char, len: c_int) -> c_int {
    if buf.is_null() || len < 1 {
        return 0;
    }
    guard(0, || {
        let Some(m) = state::with_warnings(|w| w.pop()) else {
            return 0;
        };
        let n = m.len().min(len as usize - 1);
        // SAFETY: `buf` is writable for `len` > n bytes (caller's contract); `m` has `n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
        n as c_int
    })
}

/// Load-time setup (see [`crate::env`]).
extern "C" fn constructor() {
    guard((), || {
        let dir = sym::self_object()
            .and_then(|(_, p)| p)
            .and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let plan = crate::env::plan(
            |k| std::env::var(k).ok(),
            dir.as_deref(),
            || sym::loader_finds(crate::env::PLUGIN_FILE),
            |p| p.exists(),
        );
        shim::set_disabled(plan.disabled);
        // Runs before main (single-threaded): setenv is safe to call here.
        if let Some(v) = &plan.profiler_plugin {
            std::env::set_var("NCCL_PROFILER_PLUGIN", v);
        }
        // A PYTHONPATH that is not UTF-8 was read as unset: leave it alone rather than replace it.
        let py_unreadable =
            std::env::var_os("PYTHONPATH").is_some() && std::env::var("PYTHONPATH").is_err();
        if let Some(v) = plan.pythonpath.as_ref().filter(|_| !py_unreadable) {
            std::env::set_var("PYTHONPATH", v);
        }
        state::with_registry(|r| r.env_role = plan.env_role);
        for w in plan.warnings {
            state::warn(w);
        }
    });
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

//! CPU stand-in for `libhccl.so` (Ascend's collective library) for the test bed: HCCL's public C
//! API subset (signatures as CANN's HCCL API reference documents them) over the NCCL stand-in's
//! communicators, bootstrap, TCP transport and single in-order stream (`comminsight-nccl-standin`,
//! linked as a Rust library: its internal Rust API is called, never its C entry points, so the
//! LD_PRELOAD shim's `nccl*` wrappers are never involved). Operations are enqueued on that stream
//! and run asynchronously, as on a device; [`acl`] adds the AscendCL streams and events.
//!
//! HCCL has no profiler plugin: the library settles the NCCL stand-in's settings with no plugin
//! at load ([`nccl::env::without_profiler`]), whatever `NCCL_PROFILER_PLUGIN` says. Contract:
//! docs/contracts.md, "CPU test bed: the HCCL stand-in".

#![allow(non_snake_case, reason = "HCCL's C names")]

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use nccl::comm::{self, Comm};
use nccl::group;
use nccl::task::Op;
use nccl::types::{Config, DataType, Func, NcclError, RedOp, UniqueId};

pub mod acl;
mod ops;
pub use ops::*;

/// `HCCL_SUCCESS`.
pub const HCCL_SUCCESS: c_int = 0;
/// `HCCL_E_PARA`.
pub const HCCL_E_PARA: c_int = 1;
/// `HCCL_E_PTR`.
pub const HCCL_E_PTR: c_int = 2;
/// `HCCL_E_INTERNAL`.
pub const HCCL_E_INTERNAL: c_int = 4;
/// `HCCL_E_NOT_SUPPORT`.
pub const HCCL_E_NOT_SUPPORT: c_int = 5;
/// `HCCL_E_TIMEOUT`.
pub const HCCL_E_TIMEOUT: c_int = 9;
/// `HCCL_E_OPEN_FILE_FAILURE`.
pub const HCCL_E_OPEN_FILE_FAILURE: c_int = 10;
/// `HCCL_E_NETWORK`.
pub const HCCL_E_NETWORK: c_int = 19;
/// `HCCL_ROOT_INFO_BYTES`.
pub const ROOT_INFO_BYTES: usize = 4108;
/// `HCCL_COMM_CONFIG_MAGIC_WORD`.
pub const CONFIG_MAGIC: u32 = 0xf0f0_f0f0;

/// `HcclComm` (an `Arc<Comm>` of the NCCL stand-in, as its `ncclComm_t`).
pub type HcclComm = *const Comm;

/// `HcclRootInfo`.
#[repr(C)]
pub struct HcclRootInfo {
    /// Opaque bytes: the NCCL stand-in's unique id first, zeros after.
    pub internal: [c_char; ROOT_INFO_BYTES],
}

extern "C" fn at_load() {
    nccl::env::without_profiler();
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

/// `HcclResult` of a stand-in result.
pub fn code(r: Result<(), NcclError>) -> c_int {
    match r {
        Ok(()) => HCCL_SUCCESS,
        Err(NcclError::InvalidArgument | NcclError::InvalidUsage) => HCCL_E_PARA,
        Err(NcclError::Remote) => HCCL_E_NETWORK,
        Err(NcclError::Timeout) => HCCL_E_TIMEOUT,
        Err(_) => HCCL_E_INTERNAL,
    }
}

fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(HCCL_E_INTERNAL)
}

/// `HcclDataType` -> the stand-in's type (None: not supported here).
pub fn datatype(t: c_int) -> Option<DataType> {
    Some(match t {
        0 => DataType::Int8,
        2 => DataType::Int32,
        3 => DataType::Float16,
        4 => DataType::Float32,
        5 => DataType::Int64,
        6 => DataType::Uint64,
        7 => DataType::Uint8,
        9 => DataType::Uint32,
        10 => DataType::Float64,
        11 => DataType::Bfloat16,
        _ => return None,
    })
}

/// `HcclReduceOp` (sum, prod, max, min: NCCL's values).
pub fn redop(op: c_int) -> Option<RedOp> {
    match op {
        0..=3 => RedOp::from_c(op),
        _ => None,
    }
}

/// Borrow the `Arc<Comm>` behind a handle.
pub(crate) fn comm_ref(c: HcclComm) -> Result<Arc<Comm>, NcclError> {
    if c.is_null() {
        return Err(NcclError::InvalidArgument);
    }
    // SAFETY: a non-NULL handle came from `Arc::into_raw` in `init` and stays alive until
    // `HcclCommDestroy` (the application's contract); we add a count for our clone.
    unsafe { Arc::increment_strong_count(c) };
    // SAFETY: we own the count added above.
    Ok(unsafe { Arc::from_raw(c) })
}

/// Enqueue one stand-in operation on `comm`.
pub(crate) fn enqueue(comm: HcclComm, op: Op) -> c_int {
    guard(|| code(comm_ref(comm).and_then(|c| group::enqueue(&c, op))))
}

/// An op of `func` (`peer_or_root` = root or peer).
pub fn op(
    func: Func,
    send: usize,
    recv: usize,
    count: u64,
    dt: DataType,
    red: RedOp,
    peer_or_root: i32,
) -> Op {
    Op {
        func,
        send,
        recv,
        count: count as usize,
        dt,
        op: red,
        root: peer_or_root,
    }
}

/// `HcclGetRootInfo(HcclRootInfo* rootInfo)`.
///
/// # Safety
/// `root` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(root: *mut HcclRootInfo) -> c_int {
    if root.is_null() {
        return HCCL_E_PTR;
    }
    guard(|| {
        let id = nccl::net::new_unique_id();
        // SAFETY: checked non-NULL; 4108 writable bytes (caller's contract).
        let out = unsafe { &mut *root };
        out.internal.fill(0);
        out.internal[..id.internal.len()].copy_from_slice(&id.internal);
        HCCL_SUCCESS
    })
}

fn init(id: UniqueId, nranks: u32, rank: u32, out: *mut HcclComm) -> c_int {
    if out.is_null() {
        return HCCL_E_PTR;
    }
    guard(|| {
        let mut c = None;
        // Blocking, as HCCL's init.
        let cfg = match Config::initializer().normalize(Some(1)) {
            Ok(c) => c,
            Err(e) => return code(Err(e)),
        };
        let r = comm::init(id, nranks as i32, rank as i32, cfg, &mut c);
        let p = match (&r, c) {
            (Ok(()), Some(c)) => Arc::into_raw(c),
            _ => std::ptr::null(),
        };
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { *out = p };
        code(r)
    })
}

/// # Safety
/// `root` NULL or readable.
unsafe fn unique_id(root: *const HcclRootInfo) -> Option<UniqueId> {
    if root.is_null() {
        return None;
    }
    let mut id = UniqueId {
        internal: [0; nccl::types::UNIQUE_ID_BYTES],
    };
    // SAFETY: 4108 readable bytes (caller's contract).
    let r = unsafe { &*root };
    id.internal
        .copy_from_slice(&r.internal[..nccl::types::UNIQUE_ID_BYTES]);
    Some(id)
}

/// `HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo* rootInfo, uint32_t rank,
/// HcclComm* comm)`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    nranks: u32,
    root: *const HcclRootInfo,
    rank: u32,
    out: *mut HcclComm,
) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { unique_id(root) } {
        Some(id) => init(id, nranks, rank, out),
        None => HCCL_E_PTR,
    }
}

/// Whether a non-NULL `HcclCommConfig` has HCCL's magic word (NULL: fine).
///
/// # Safety
/// `config` NULL or at least 24 readable bytes.
unsafe fn config_ok(config: *const c_void) -> bool {
    if config.is_null() {
        return true;
    }
    // SAFETY: the 24-byte header (size_t size, u32 magic, u32 version, u64 reserved).
    let magic = unsafe { config.cast::<u8>().add(8).cast::<u32>().read_unaligned() };
    magic == CONFIG_MAGIC
}

/// `HcclCommInitRootInfoConfig(nRanks, rootInfo, rank, const HcclCommConfig* config, comm)`:
/// the config is checked (magic word) and otherwise ignored.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfoConfig(
    nranks: u32,
    root: *const HcclRootInfo,
    rank: u32,
    config: *const c_void,
    out: *mut HcclComm,
) -> c_int {
    // SAFETY: the caller's contract.
    if !unsafe { config_ok(config) } {
        return HCCL_E_PARA;
    }
    // SAFETY: as above.
    unsafe { HcclCommInitRootInfo(nranks, root, rank, out) }
}

/// The stand-in's rank table: a JSON file with `"comminsight_root_info"` (hex of the root info's
/// first 128 bytes, from `HcclGetRootInfo`) and `"rank_count"`.
fn cluster(file: *const c_char) -> Result<(UniqueId, u32), c_int> {
    if file.is_null() {
        return Err(HCCL_E_PTR);
    }
    // SAFETY: a C string (HCCL's contract: the rank table's path).
    let path = unsafe { std::ffi::CStr::from_ptr(file) }.to_string_lossy();
    let text = std::fs::read_to_string(&*path).map_err(|_| HCCL_E_OPEN_FILE_FAILURE)?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|_| HCCL_E_PARA)?;
    let hex = v["comminsight_root_info"].as_str().ok_or(HCCL_E_PARA)?;
    let n = v["rank_count"].as_u64().ok_or(HCCL_E_PARA)? as u32;
    let mut id = UniqueId {
        internal: [0; nccl::types::UNIQUE_ID_BYTES],
    };
    if hex.len() != 2 * id.internal.len() {
        return Err(HCCL_E_PARA);
    }
    for (i, b) in id.internal.iter_mut().enumerate() {
        let byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| HCCL_E_PARA)?;
        *b = byte as c_char;
    }
    Ok((id, n))
}

/// `HcclCommInitClusterInfo(const char* clusterInfo, uint32_t rank, HcclComm* comm)`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitClusterInfo(
    file: *const c_char,
    rank: u32,
    out: *mut HcclComm,
) -> c_int {
    match cluster(file) {
        Ok((id, n)) => init(id, n, rank, out),
        Err(e) => e,
    }
}

/// `HcclCommInitClusterInfoConfig(clusterInfo, rank, HcclCommConfig* config, comm)`.
///
/// # Safety
/// HCCL's contract.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitClusterInfoConfig(
    file: *const c_char,
    rank: u32,
    config: *mut c_void,
    out: *mut HcclComm,
) -> c_int {
    // SAFETY: the caller's contract.
    if !unsafe { config_ok(config) } {
        return HCCL_E_PARA;
    }
    // SAFETY: as above.
    unsafe { HcclCommInitClusterInfo(file, rank, out) }
}

/// `HcclCommDestroy(HcclComm comm)`: waits for the communicator's enqueued work, then frees it.
///
/// # Safety
/// A communicator from an init, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn HcclCommDestroy(c: HcclComm) -> c_int {
    if c.is_null() {
        return HCCL_E_PTR;
    }
    guard(|| {
        // SAFETY: made by `Arc::into_raw` in `init`, destroyed once (caller's contract).
        comm::destroy(unsafe { Arc::from_raw(c) });
        HCCL_SUCCESS
    })
}

fn geo_u32(c: HcclComm, out: *mut u32, f: impl Fn(&nccl::comm::Geo) -> usize) -> c_int {
    if out.is_null() {
        return HCCL_E_PTR;
    }
    guard(
        || match comm_ref(c).and_then(|c| c.ready().map(|g| f(g) as u32)) {
            Ok(v) => {
                // SAFETY: checked non-NULL.
                unsafe { *out = v };
                HCCL_SUCCESS
            }
            Err(e) => code(Err(e)),
        },
    )
}

/// `HcclGetRankSize(HcclComm comm, uint32_t* rankSize)`.
#[no_mangle]
pub extern "C" fn HcclGetRankSize(c: HcclComm, out: *mut u32) -> c_int {
    geo_u32(c, out, |g| g.nranks)
}

/// `HcclGetRankId(HcclComm comm, uint32_t* rank)`.
#[no_mangle]
pub extern "C" fn HcclGetRankId(c: HcclComm, out: *mut u32) -> c_int {
    geo_u32(c, out, |g| g.rank)
}

/// `HcclGetErrorString(HcclResult code)`: a static description.
#[no_mangle]
pub extern "C" fn HcclGetErrorString(code: c_int) -> *const c_char {
    match code {
        HCCL_SUCCESS => c"success",
        HCCL_E_PARA => c"parameter error",
        HCCL_E_PTR => c"empty pointer",
        HCCL_E_NOT_SUPPORT => c"not supported",
        HCCL_E_TIMEOUT => c"timeout",
        HCCL_E_NETWORK => c"network error",
        _ => c"internal error",
    }
    .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_tables_give_the_root_and_the_size() {
        let dir = std::env::temp_dir().join(format!("hccl-standin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("table.json");
        let hex: String = (0..128u32).map(|i| format!("{:02x}", i as u8)).collect();
        std::fs::write(
            &f,
            format!(r#"{{"comminsight_root_info":"{hex}","rank_count":4}}"#),
        )
        .unwrap();
        let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
        let (id, n) = cluster(c.as_ptr()).expect("parsed");
        assert_eq!(n, 4);
        assert_eq!(id.internal[5] as u8, 5);
        std::fs::write(&f, r#"{"comminsight_root_info":"zz","rank_count":4}"#).unwrap();
        assert_eq!(cluster(c.as_ptr()).err(), Some(HCCL_E_PARA));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(cluster(c.as_ptr()).err(), Some(HCCL_E_OPEN_FILE_FAILURE));
        assert_eq!(cluster(std::ptr::null()).err(), Some(HCCL_E_PTR));
    }

    #[test]
    fn datatypes_and_an_event_on_an_idle_stream() {
        assert_eq!(datatype(4), Some(DataType::Float32));
        assert_eq!(datatype(11), Some(DataType::Bfloat16));
        assert_eq!(datatype(1), None, "int16: not in the NCCL stand-in");
        assert_eq!(redop(3), Some(RedOp::Min));
        assert_eq!(redop(4), None, "HCCL has no average");
        let mut e: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        // SAFETY: valid out-pointers; the event is ours and destroyed once.
        unsafe {
            assert_eq!(acl::aclrtCreateEvent(&mut e), 0);
            assert_eq!(acl::aclrtQueryEventStatus(e, &mut status), 0);
            assert_eq!(status, 0, "never recorded: not ready");
            assert_eq!(acl::aclrtRecordEvent(e, std::ptr::null_mut()), 0);
            assert_eq!(acl::aclrtQueryEventStatus(e, &mut status), 0);
            assert_eq!(status, 1, "nothing submitted before it: complete");
            assert_eq!(acl::aclrtDestroyEvent(e), 0);
        }
    }
}

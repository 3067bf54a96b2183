//! NCCL's public C types: result codes, datatypes, reduction ops, `ncclUniqueId`, `ncclConfig_t`
//! (layout of NCCL 2.30.7 `src/nccl.h.in`, see README.md), and the static strings NCCL hands to profilers.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::fmt;

/// `ncclResult_t` values (an `int`-sized C enum).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclError {
    /// `ncclUnhandledCudaError` = 1.
    UnhandledCuda = 1,
    /// `ncclSystemError` = 2.
    System = 2,
    /// `ncclInternalError` = 3.
    Internal = 3,
    /// `ncclInvalidArgument` = 4.
    InvalidArgument = 4,
    /// `ncclInvalidUsage` = 5.
    InvalidUsage = 5,
    /// `ncclRemoteError` = 6.
    Remote = 6,
    /// `ncclInProgress` = 7 (not an error for nonblocking comms).
    InProgress = 7,
    /// `ncclTimeout` = 8.
    Timeout = 8,
}

/// `ncclSuccess`.
pub const NCCL_SUCCESS: c_int = 0;

impl NcclError {
    /// The C value.
    pub fn code(self) -> c_int {
        self as c_int
    }

    /// From a non-zero C value (unknown values map to `ncclInternalError`).
    pub fn from_code(c: c_int) -> Self {
        match c {
            1 => Self::UnhandledCuda,
            2 => Self::System,
            4 => Self::InvalidArgument,
            5 => Self::InvalidUsage,
            6 => Self::Remote,
            7 => Self::InProgress,
            8 => Self::Timeout,
            _ => Self::Internal,
        }
    }
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(error_string(self.code()).to_str().unwrap_or("?"))
    }
}

impl std::error::Error for NcclError {}

/// Result of the safe handlers behind the C API.
pub type NcclResult<T> = Result<T, NcclError>;

/// Converts a handler result into the C return value.
pub fn to_code(r: NcclResult<()>) -> c_int {
    match r {
        Ok(()) => NCCL_SUCCESS,
        Err(e) => e.code(),
    }
}

/// `ncclGetErrorString` texts (NCCL 2.30.7 `src/init.cc`).
pub fn error_string(code: c_int) -> &'static CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"timeout",
        _ => c"unknown result code",
    }
}

/// `ncclDataType_t` (NCCL enum values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// `ncclInt8` = 0.
    Int8,
    /// `ncclUint8` = 1.
    Uint8,
    /// `ncclInt32` = 2.
    Int32,
    /// `ncclUint32` = 3.
    Uint32,
    /// `ncclInt64` = 4.
    Int64,
    /// `ncclUint64` = 5.
    Uint64,
    /// `ncclFloat16` = 6.
    Float16,
    /// `ncclFloat32` = 7.
    Float32,
    /// `ncclFloat64` = 8.
    Float64,
    /// `ncclBfloat16` = 9.
    Bfloat16,
}

impl DataType {
    /// From the C enum value; `None` for unsupported or invalid values.
    pub fn from_c(v: c_int) -> Option<Self> {
        Some(match v {
            0 => Self::Int8,
            1 => Self::Uint8,
            2 => Self::Int32,
            3 => Self::Uint32,
            4 => Self::Int64,
            5 => Self::Uint64,
            6 => Self::Float16,
            7 => Self::Float32,
            8 => Self::Float64,
            9 => Self::Bfloat16,
            _ => return None,
        })
    }

    /// Element size in bytes.
    pub fn size(self) -> usize {
        match self {
            Self::Int8 | Self::Uint8 => 1,
            Self::Float16 | Self::Bfloat16 => 2,
            Self::Int32 | Self::Uint32 | Self::Float32 => 4,
            Self::Int64 | Self::Uint64 | Self::Float64 => 8,
        }
    }

    /// NCCL's `ncclDatatypeToString` (2.30.7). NCCL has no case for `ncclUint8`: it reports "Unknown".
    pub fn nccl_str(self) -> &'static CStr {
        match self {
            Self::Int8 => c"ncclInt8",
            Self::Uint8 => c"Unknown",
            Self::Int32 => c"ncclInt32",
            Self::Uint32 => c"ncclUint32",
            Self::Int64 => c"ncclInt64",
            Self::Uint64 => c"ncclUint64",
            Self::Float16 => c"ncclFloat16",
            Self::Float32 => c"ncclFloat32",
            Self::Float64 => c"ncclFloat64",
            Self::Bfloat16 => c"ncclBfloat16",
        }
    }
}

/// `ncclRedOp_t` built-in operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    /// `ncclSum` = 0.
    Sum,
    /// `ncclProd` = 1.
    Prod,
    /// `ncclMax` = 2.
    Max,
    /// `ncclMin` = 3.
    Min,
    /// `ncclAvg` = 4.
    Avg,
}

impl RedOp {
    /// From the C enum value.
    pub fn from_c(v: c_int) -> Option<Self> {
        Some(match v {
            0 => Self::Sum,
            1 => Self::Prod,
            2 => Self::Max,
            3 => Self::Min,
            4 => Self::Avg,
            _ => return None,
        })
    }
}

/// NCCL's function names (`ncclFuncToString`), also the per-comm `seqNumber` index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    /// "Broadcast".
    Broadcast,
    /// "Reduce".
    Reduce,
    /// "AllGather".
    AllGather,
    /// "ReduceScatter".
    ReduceScatter,
    /// "AllReduce".
    AllReduce,
    /// "AlltoAll".
    AlltoAll,
    /// "Send".
    Send,
    /// "Recv".
    Recv,
}

impl Func {
    /// Static string as NCCL passes it to the profiler.
    pub fn nccl_str(self) -> &'static CStr {
        match self {
            Self::Broadcast => c"Broadcast",
            Self::Reduce => c"Reduce",
            Self::AllGather => c"AllGather",
            Self::ReduceScatter => c"ReduceScatter",
            Self::AllReduce => c"AllReduce",
            Self::AlltoAll => c"AlltoAll",
            Self::Send => c"Send",
            Self::Recv => c"Recv",
        }
    }

    /// Index into the per-comm sequence counters / wire code.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: `struct { char internal[128]; }`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// Opaque bytes.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `NCCL_API_MAGIC`.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;

/// `ncclConfig_t` as in NCCL 2.30.7 (`ncclConfig_v23000`), 96 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_snake_case, reason = "NCCL's field names")]
pub struct Config {
    /// `sizeof(ncclConfig_t)` of the caller's header.
    pub size: usize,
    /// `NCCL_API_MAGIC`.
    pub magic: c_uint,
    /// `NCCL_VERSION_CODE` of the caller's header.
    pub version: c_uint,
    /// 1 blocking (default), 0 nonblocking.
    pub blocking: c_int,
    /// Ignored by the stand-in.
    pub cgaClusterSize: c_int,
    /// Ignored by the stand-in.
    pub minCTAs: c_int,
    /// Ignored by the stand-in.
    pub maxCTAs: c_int,
    /// Ignored by the stand-in.
    pub netName: *const c_char,
    /// Ignored by the stand-in.
    pub splitShare: c_int,
    /// Ignored by the stand-in.
    pub trafficClass: c_int,
    /// Communicator name handed to the profiler `init` (pointer stored, not copied, like NCCL).
    pub commName: *const c_char,
    /// Ignored.
    pub collnetEnable: c_int,
    /// Ignored.
    pub CTAPolicy: c_int,
    /// Ignored.
    pub shrinkShare: c_int,
    /// Ignored.
    pub nvlsCTAs: c_int,
    /// Ignored (2.28+).
    pub nChannelsPerNetPeer: c_int,
    /// Ignored (2.28+).
    pub nvlinkCentricSched: c_int,
    /// Ignored (2.29+).
    pub graphUsageMode: c_int,
    /// Ignored (2.29+).
    pub numRmaCtx: c_int,
    /// Ignored (2.30+).
    pub maxP2pPeers: c_int,
    /// Ignored (2.30.5+).
    pub graphStreamOrdering: c_int,
}

const _: () = assert!(std::mem::size_of::<Config>() == 96);
const _: () = assert!(std::mem::offset_of!(Config, blocking) == 16);
const _: () = assert!(std::mem::offset_of!(Config, netName) == 32);
const _: () = assert!(std::mem::offset_of!(Config, commName) == 48);
const _: () = assert!(std::mem::offset_of!(Config, nChannelsPerNetPeer) == 72);
const _: () = assert!(std::mem::offset_of!(Config, graphStreamOrdering) == 92);
const _: () = assert!(std::mem::size_of::<UniqueId>() == 128);

// SAFETY: the raw pointers are the application's, only read (commName) while the comm lives, as NCCL does.
unsafe impl Send for Config {}
// SAFETY: see `Send`; the struct is never mutated through shared references.
unsafe impl Sync for Config {}

/// `NCCL_VERSION(X,Y,Z)` for X=2, Y>8.
const fn ver(y: c_uint, z: c_uint) -> c_uint {
    20000 + y * 100 + z
}

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` of NCCL 2.30.7.
    pub const fn initializer() -> Self {
        Self {
            size: std::mem::size_of::<Config>(),
            magic: NCCL_API_MAGIC,
            version: 23007,
            blocking: CONFIG_UNDEF_INT,
            cgaClusterSize: CONFIG_UNDEF_INT,
            minCTAs: CONFIG_UNDEF_INT,
            maxCTAs: CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: CONFIG_UNDEF_INT,
            trafficClass: CONFIG_UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: CONFIG_UNDEF_INT,
            CTAPolicy: CONFIG_UNDEF_INT,
            shrinkShare: CONFIG_UNDEF_INT,
            nvlsCTAs: CONFIG_UNDEF_INT,
            nChannelsPerNetPeer: CONFIG_UNDEF_INT,
            nvlinkCentricSched: CONFIG_UNDEF_INT,
            graphUsageMode: CONFIG_UNDEF_INT,
            numRmaCtx: CONFIG_UNDEF_INT,
            maxP2pPeers: CONFIG_UNDEF_INT,
            graphStreamOrdering: CONFIG_UNDEF_INT,
        }
    }

    /// NCCL's `parseCommConfig` on the first `size` bytes the caller provided (already copied into
    /// `self` by the FFI layer, the rest left at the initializer's values): magic check, version-based
    /// resets, `blocking` validation and `NCCL_COMM_BLOCKING` override.
    pub fn normalize(mut self, blocking_env: Option<c_int>) -> NcclResult<Self> {
        let d = Self::initializer();
        if self.magic != NCCL_API_MAGIC {
            crate::log::warn("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
            return Err(NcclError::InvalidArgument);
        }
        let v = self.version;
        if v < ver(14, 0) {
            self.blocking = d.blocking;
        }
        if v < ver(17, 0) {
            self.cgaClusterSize = d.cgaClusterSize;
            self.minCTAs = d.minCTAs;
            self.maxCTAs = d.maxCTAs;
            self.netName = d.netName;
        }
        if v < ver(25, 0) {
            self.trafficClass = d.trafficClass;
        }
        if v < ver(27, 0) {
            self.collnetEnable = d.collnetEnable;
            self.CTAPolicy = d.CTAPolicy;
            self.shrinkShare = d.shrinkShare;
            self.nvlsCTAs = d.nvlsCTAs;
        }
        if v < ver(28, 0) {
            self.nChannelsPerNetPeer = d.nChannelsPerNetPeer;
            self.nvlinkCentricSched = d.nvlinkCentricSched;
        }
        if v < ver(29, 0) {
            self.graphUsageMode = d.graphUsageMode;
            self.numRmaCtx = d.numRmaCtx;
        }
        if v < ver(30, 0) {
            self.maxP2pPeers = d.maxP2pPeers;
        }
        if v < ver(30, 5) {
            self.graphStreamOrdering = d.graphStreamOrdering;
        }
        if self.blocking != CONFIG_UNDEF_INT && self.blocking != 0 && self.blocking != 1 {
            crate::log::warn(&format!(
                "Invalid config blocking attribute value {}",
                self.blocking
            ));
            return Err(NcclError::InvalidArgument);
        }
        if let Some(b @ (0 | 1)) = blocking_env {
            self.blocking = b;
        }
        if self.blocking == CONFIG_UNDEF_INT {
            self.blocking = 1;
        }
        Ok(self)
    }

    /// Copies the caller's struct honouring its `size` (NCCL: `min(size, sizeof(ncclConfig_t))` bytes).
    ///
    /// # Safety
    /// `p` must point to at least `size_t` readable bytes, and to `size` readable bytes per its first field.
    pub unsafe fn read_from(p: *const Config) -> Self {
        let mut out = Self::initializer();
        // SAFETY: caller guarantees the first 8 bytes are readable.
        let size = unsafe { std::ptr::read_unaligned(p.cast::<usize>()) };
        let n = size.min(std::mem::size_of::<Config>());
        // SAFETY: caller guarantees `size` readable bytes; we copy at most that many into our own struct.
        unsafe {
            std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut out as *mut Config).cast::<u8>(), n)
        };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_version_fields_reset_to_defaults() {
        let mut c = Config::initializer();
        c.version = 22703;
        c.nChannelsPerNetPeer = 4;
        c.blocking = 0;
        let n = c.normalize(None).unwrap();
        assert_eq!(n.nChannelsPerNetPeer, CONFIG_UNDEF_INT);
        assert_eq!(n.blocking, 0);
    }

    #[test]
    fn bad_magic_and_bad_blocking_are_invalid_arguments() {
        let mut c = Config::initializer();
        c.magic = 1;
        assert_eq!(c.normalize(None).unwrap_err(), NcclError::InvalidArgument);
        let mut c = Config::initializer();
        c.blocking = 7;
        assert_eq!(c.normalize(None).unwrap_err(), NcclError::InvalidArgument);
    }

    #[test]
    fn blocking_defaults_to_one_and_env_overrides() {
        assert_eq!(Config::initializer().normalize(None).unwrap().blocking, 1);
        assert_eq!(
            Config::initializer().normalize(Some(0)).unwrap().blocking,
            0
        );
    }

    #[test]
    fn short_size_leaves_trailing_fields_default() {
        let mut c = Config::initializer();
        c.size = 72;
        c.nvlinkCentricSched = 5;
        // SAFETY: `c` is a whole Config.
        let r = unsafe { Config::read_from(&c) };
        assert_eq!(r.nvlinkCentricSched, CONFIG_UNDEF_INT);
    }
}

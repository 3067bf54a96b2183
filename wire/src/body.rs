//! The kind-specific bodies of a record (see [`crate::record`] for the header and layout notes).
//! Encoding and decoding live in `codec.rs`.

pub use crate::gpu::{CommDevice, GpuLink, GpuSample, GpuXid};
pub use crate::host::{HostPort, HostQp, HostTcp, HostThread};
pub use crate::moe::EpStats;
use crate::names::{Algo, DataType, Func, Proto};
use crate::record::Kind;

/// A short string carried in a record (comm name, host, job id).
/// Kept as bytes so decoding never fails and re-encoding is exact.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct StrField(pub Vec<u8>);

impl StrField {
    pub fn from_bytes(b: &[u8]) -> Self {
        StrField(b.to_vec())
    }
    pub fn as_str_lossy(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for StrField {
    fn from(s: &str) -> Self {
        StrField(s.as_bytes().to_vec())
    }
}

impl core::fmt::Debug for StrField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.as_str_lossy())
    }
}

/// First record of every segment file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Segment file format version (`crate::segment::SEGMENT_FORMAT`).
    pub format: u32,
    pub record_size: u32,
    pub segment_index: u64,
    pub pid: u32,
    /// Where the records come from ([`crate::segment::SOURCE_LIVE`] = 0: a plugin or agent
    /// stream; otherwise the importer that converted another tool's data, `SOURCE_*`).
    /// Segments of older writers have 0 here (the byte was padding).
    pub source: u8,
    pub created_real_ns: u64,
    pub created_mono_ns: u64,
}

/// Process start: identity and the clock calibration pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcStart {
    pub pid: u32,
    /// `RANK` from the environment, -1 if absent.
    pub rank: i32,
    /// `LOCAL_RANK`, -1 if absent.
    pub local_rank: i32,
    /// `WORLD_SIZE`, -1 if absent.
    pub world_size: i32,
    pub mono_ns: u64,
    pub real_ns: u64,
    /// Profiler ABI version negotiated with NCCL (4, 5, 6; 0 before the first init).
    pub abi_version: u8,
    pub host: StrField,
    pub job: StrField,
}

/// A communicator as the plugin's `init` saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommInit {
    pub comm_hash: u64,
    pub nranks: u32,
    pub rank: i32,
    pub nnodes: u32,
    pub local_rank: i32,
    pub device: i32,
    pub abi_version: u8,
    pub time_ns: u64,
    pub comm_name: StrField,
}

/// A communicator finalized (destroy or abort).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommFini {
    pub comm_hash: u64,
    pub rank: i32,
    pub time_ns: u64,
    /// Coll/P2p operations recorded on this communicator.
    pub ops: u64,
    /// Operations still open when it was finalized.
    pub open_ops: u64,
}

/// How an operation's duration was measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Timing {
    /// Only enqueue (Coll/P2p stop) was seen.
    #[default]
    Enqueue = 0,
    /// GPU timers of KernelCh events.
    KernelGpu = 1,
    /// Host times of KernelCh start/stop.
    KernelCpu = 2,
    /// Host times of the Coll/P2p event.
    CollectiveCpu = 3,
}

impl Timing {
    pub fn from_u8(v: u8) -> Timing {
        match v {
            1 => Timing::KernelGpu,
            2 => Timing::KernelCpu,
            3 => Timing::CollectiveCpu,
            _ => Timing::Enqueue,
        }
    }
    /// Inspector's `*_timing_source` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Timing::Enqueue => "enqueue",
            Timing::KernelGpu => "kernel_gpu",
            Timing::KernelCpu => "kernel_cpu",
            Timing::CollectiveCpu => "collective_cpu",
        }
    }
    pub fn from_name(s: &str) -> Option<Timing> {
        [
            Timing::Enqueue,
            Timing::KernelGpu,
            Timing::KernelCpu,
            Timing::CollectiveCpu,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }
}

/// One collective (`coll`) or point-to-point (`p2p`) operation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpRecord {
    pub comm_hash: u64,
    /// Collectives: NCCL's per-comm, per-func `seqNumber` (0-based). P2P: per-(comm, peer, func) ordinal.
    pub coll_sn: u64,
    /// The plugin's 0-based per-process counter over every Coll and P2p event received.
    pub coll_local_sn: u64,
    pub count: u64,
    pub bytes: u64,
    /// Host time of the Coll/P2p start event (enqueue).
    pub enqueue_ns: u64,
    /// Effective start: first KernelCh start seen on the host, else `enqueue_ns`.
    pub start_ns: u64,
    /// Effective end: last KernelCh stop seen on the host, else completion time; 0 if unfinished.
    pub end_ns: u64,
    pub gpu_start_ns: u64,
    pub gpu_end_ns: u64,
    /// Host time of the CollApi/P2pApi event when tracked, else 0.
    pub api_ns: u64,
    pub rank: i32,
    pub root: i32,
    /// P2P peer; -1 for collectives.
    pub peer: i32,
    pub func: Func,
    pub datatype: DataType,
    pub algo: Algo,
    pub proto: Proto,
    pub nchannels: u8,
    pub nwarps: u8,
    pub timing: Timing,
    /// KernelCh events that stopped.
    pub channels_done: u8,
}

/// A proxy operation summary (one per ProxyOp, with its ProxySteps folded in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyRecord {
    pub comm_hash: u64,
    /// `coll_local_sn` of the parent Coll/P2p; `u64::MAX` when not known (PXN, lost parent).
    pub parent_local_sn: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Sum of `transSize` over its steps.
    pub bytes: u64,
    /// Time spent in send-side wait states (SendWait, SendPeerWait).
    pub send_wait_ns: u64,
    /// Time spent in receive-side wait states (RecvWait, RecvFlushWait, RecvGPUWait).
    pub recv_wait_ns: u64,
    pub pid: u32,
    pub rank: i32,
    pub peer: i32,
    pub nsteps: i32,
    pub chunk_size: i32,
    pub steps_done: u32,
    pub channel: u8,
    pub is_send: u8,
}

/// A network plugin event (IB QP work request or socket operation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetRecord {
    pub comm_hash: u64,
    pub parent_local_sn: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub wr_id: u64,
    pub length: u64,
    /// `NCCL_PROFILER_NET_TYPE_*` (high 16 bits of the event id).
    pub net_type: u32,
    /// Net profiler descriptor version (low 16 bits).
    pub net_version: u32,
    pub rank: i32,
    pub device: i32,
    pub qp_num: u32,
    pub opcode: i32,
    pub fd: i32,
    pub sock_op: i32,
}

/// An operation enqueued or started but not finished after the threshold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overdue {
    pub comm_hash: u64,
    pub coll_sn: u64,
    pub coll_local_sn: u64,
    pub enqueue_ns: u64,
    /// First KernelCh start, 0 if the kernel never started.
    pub start_ns: u64,
    /// When this record was written.
    pub now_ns: u64,
    pub count: u64,
    pub bytes: u64,
    pub age_ms: u32,
    /// 0 for the first report of this operation, then 1, 2, ... (backoff).
    pub repeat: u32,
    pub threshold_ms: u32,
    pub rank: i32,
    pub peer: i32,
    pub func: Func,
    /// 0 enqueued, kernel not started; 1 kernel running; 2 some channels done.
    pub phase: u8,
    pub channels_started: u8,
    pub channels_done: u8,
    /// 1 when the operation is P2P.
    pub is_p2p: u8,
    pub nchannels: u8,
}

/// Plugin self-accounting, written periodically and at exit; carries a fresh calibration pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub time_ns: u64,
    pub mono_ns: u64,
    pub real_ns: u64,
    pub records_pushed: u64,
    pub ring_drops: u64,
    pub pool_drops: u64,
    pub bytes_written: u64,
    pub records_lost_io: u64,
    pub events_ignored: u64,
    pub overdue_emitted: u64,
    pub segments_sealed: u32,
    pub segments_deleted: u32,
    pub io_errors: u32,
    pub event_mask: u32,
    pub writer_failed: u8,
    /// Control files (`<ring>.ctl`) ignored because of their owner, mode or type (issue 16):
    /// someone else tried to change this process' event mask. 0 in records of older plugins.
    pub ctl_refused: u32,
    /// Event-mask changes accepted from the control file. 0 in records of older plugins.
    pub mask_changes: u32,
}

/// Kind-specific part of a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Segment(SegmentHeader),
    ProcStart(ProcStart),
    CommInit(CommInit),
    CommFini(CommFini),
    Coll(OpRecord),
    P2p(OpRecord),
    Proxy(ProxyRecord),
    Net(NetRecord),
    Overdue(Overdue),
    Stats(Stats),
    Thread(HostThread),
    Qp(HostQp),
    Tcp(HostTcp),
    Port(HostPort),
    CommDevice(CommDevice),
    Gpu(GpuSample),
    GpuLink(GpuLink),
    Xid(GpuXid),
    EpStats(EpStats),
}

impl Body {
    pub fn kind(&self) -> Kind {
        match self {
            Body::Segment(_) => Kind::Segment,
            Body::ProcStart(_) => Kind::ProcStart,
            Body::CommInit(_) => Kind::CommInit,
            Body::CommFini(_) => Kind::CommFini,
            Body::Coll(_) => Kind::Coll,
            Body::P2p(_) => Kind::P2p,
            Body::Proxy(_) => Kind::Proxy,
            Body::Net(_) => Kind::Net,
            Body::Overdue(_) => Kind::Overdue,
            Body::Stats(_) => Kind::Stats,
            Body::Thread(_) => Kind::Thread,
            Body::Qp(_) => Kind::Qp,
            Body::Tcp(_) => Kind::Tcp,
            Body::Port(_) => Kind::Port,
            Body::CommDevice(_) => Kind::CommDevice,
            Body::Gpu(_) => Kind::Gpu,
            Body::GpuLink(_) => Kind::GpuLink,
            Body::Xid(_) => Kind::Xid,
            Body::EpStats(_) => Kind::EpStats,
        }
    }
}

//! The record: 128 bytes, little-endian, a 16-byte header then a 112-byte kind-specific body.
//!
//! ```text
//! off size  header
//!   0   2   magic   = b"CI"
//!   2   1   version = RECORD_VERSION
//!   3   1   kind    (Kind)
//!   4   2   len     = RECORD_SIZE (room for larger records in a later version)
//!   6   2   flags   (FLAG_*)
//!   8   8   seq     per-process sequence, assigned by the ring (gaps = records lost)
//! ```
//! Host times (`*_ns`) are CLOCK_REALTIME nanoseconds obtained as CLOCK_MONOTONIC + a per-process
//! offset fixed at `proc_start` (so they never jump); `stats` records carry fresh calibration pairs
//! so a reader can correct drift. `gpu_*_ns` are the GPU timer (`%globaltimer`) as NCCL reports it.

use crate::names::{Algo, DataType, Func, Proto};

/// Size of every record, in bytes.
pub const RECORD_SIZE: usize = 128;
/// Size of the header.
pub const HEADER_SIZE: usize = 16;
/// Size of the body.
pub const BODY_SIZE: usize = RECORD_SIZE - HEADER_SIZE;
/// `b"CI"` little-endian.
pub const MAGIC: u16 = u16::from_le_bytes(*b"CI");
/// Current record format version.
pub const RECORD_VERSION: u8 = 1;

/// This record repeats one written earlier (segment preamble: `proc_start`, live `comm_init`s).
pub const FLAG_REPEAT: u16 = 1 << 0;
/// A string field was truncated to fit.
pub const FLAG_TRUNCATED: u16 = 1 << 1;
/// The operation had not finished when the record was written (finalize, exit).
pub const FLAG_INCOMPLETE: u16 = 1 << 2;
/// Proxy operation created by another process (PXN).
pub const FLAG_PXN: u16 = 1 << 3;
/// Written by the synthetic test bed, not by the plugin.
pub const FLAG_SYNTHETIC: u16 = 1 << 4;
/// The communicator was aborted (`comm_fini`).
pub const FLAG_ABORTED: u16 = 1 << 5;

/// A raw record as it sits in the ring and in segment files.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct RawRecord(pub [u8; RECORD_SIZE]);

impl RawRecord {
    pub const ZERO: RawRecord = RawRecord([0; RECORD_SIZE]);

    /// The per-process sequence number in the header.
    pub fn seq(&self) -> u64 {
        u64::from_le_bytes(self.0[8..16].try_into().expect("8 bytes"))
    }

    /// Overwrite the sequence number (the ring does this when it accepts a record).
    pub fn set_seq(&mut self, seq: u64) {
        self.0[8..16].copy_from_slice(&seq.to_le_bytes());
    }

    /// The kind byte, without validating anything else.
    pub fn kind_byte(&self) -> u8 {
        self.0[3]
    }
}

impl core::fmt::Debug for RawRecord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "RawRecord(kind={}, seq={})",
            self.kind_byte(),
            self.seq()
        )
    }
}

/// Record kinds (DESIGN.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Segment = 1,
    ProcStart = 2,
    CommInit = 3,
    CommFini = 4,
    Coll = 5,
    P2p = 6,
    Proxy = 7,
    Net = 8,
    Overdue = 9,
    Stats = 10,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Segment,
        Kind::ProcStart,
        Kind::CommInit,
        Kind::CommFini,
        Kind::Coll,
        Kind::P2p,
        Kind::Proxy,
        Kind::Net,
        Kind::Overdue,
        Kind::Stats,
    ];

    pub fn from_u8(v: u8) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| *k as u8 == v)
    }

    /// The name used in JSON (`"kind"`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Segment => "segment",
            Kind::ProcStart => "proc_start",
            Kind::CommInit => "comm_init",
            Kind::CommFini => "comm_fini",
            Kind::Coll => "coll",
            Kind::P2p => "p2p",
            Kind::Proxy => "proxy",
            Kind::Net => "net",
            Kind::Overdue => "overdue",
            Kind::Stats => "stats",
        }
    }

    pub fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.name() == s)
    }
}

/// Why a byte block is not a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic(u16),
    UnsupportedVersion(u8),
    UnknownKind(u8),
    BadLength(u16),
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DecodeError::BadMagic(m) => {
                write!(f, "bad record magic 0x{m:04x} (expected 0x{MAGIC:04x})")
            }
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported record version {v} (this build reads {RECORD_VERSION})"
                )
            }
            DecodeError::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            DecodeError::BadLength(l) => {
                write!(f, "bad record length {l} (expected {RECORD_SIZE})")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// A string stored in a fixed-size field: at most `N` bytes, cut at a UTF-8 boundary.
fn fit_str(s: &str, max: usize) -> (&str, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

/// Little-endian writer over a body.
struct W<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl W<'_> {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.b[self.at] = v;
        self.at += 1;
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.b[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
        self
    }
    /// A length byte then a fixed field of `n` bytes; returns whether it was truncated.
    fn str_field(&mut self, s: &str, n: usize) -> bool {
        let (fit, cut) = fit_str(s, n.min(255));
        self.u8(fit.len() as u8);
        self.b[self.at..self.at + fit.len()].copy_from_slice(fit.as_bytes());
        self.at += n;
        cut
    }
}

/// Little-endian reader over a body.
struct R<'a> {
    b: &'a [u8],
    at: usize,
}

impl R<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let v: [u8; N] = self.b[self.at..self.at + N].try_into().expect("in bounds");
        self.at += N;
        v
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn str_field(&mut self, n: usize) -> StrField {
        let len = self.u8() as usize;
        let s = &self.b[self.at..self.at + len.min(n)];
        self.at += n;
        StrField::from_bytes(s)
    }
}

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

fn str_bytes(s: &StrField) -> &str {
    // Fields built from &str are UTF-8; decoded fields may not be, and are written back verbatim.
    core::str::from_utf8(&s.0).unwrap_or("")
}

/// Write raw bytes of a decoded (possibly non-UTF-8) field back exactly.
fn put_str(w: &mut W<'_>, s: &StrField, n: usize) -> bool {
    if core::str::from_utf8(&s.0).is_ok() {
        w.str_field(str_bytes(s), n)
    } else {
        let len = s.0.len().min(n).min(255);
        w.u8(len as u8);
        w.b[w.at..w.at + len].copy_from_slice(&s.0[..len]);
        w.at += n;
        len < s.0.len()
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
        }
    }
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub flags: u16,
    pub body: Body,
}

impl Record {
    pub fn new(body: Body) -> Record {
        Record {
            seq: 0,
            flags: 0,
            body,
        }
    }

    pub fn kind(&self) -> Kind {
        self.body.kind()
    }

    /// Encode into a raw record. Strings that do not fit are cut and `FLAG_TRUNCATED` is set.
    pub fn encode(&self) -> RawRecord {
        let mut raw = RawRecord::ZERO;
        let (head, body) = raw.0.split_at_mut(HEADER_SIZE);
        let mut w = W { b: body, at: 0 };
        let truncated = encode_body(&self.body, &mut w);
        debug_assert!(w.at <= BODY_SIZE);
        let flags = self.flags | if truncated { FLAG_TRUNCATED } else { 0 };
        let mut h = W { b: head, at: 0 };
        h.u16(MAGIC)
            .u8(RECORD_VERSION)
            .u8(self.kind() as u8)
            .u16(RECORD_SIZE as u16)
            .u16(flags)
            .u64(self.seq);
        raw
    }

    /// Decode a raw record, validating the header.
    pub fn decode(raw: &RawRecord) -> Result<Record, DecodeError> {
        let mut h = R {
            b: &raw.0[..HEADER_SIZE],
            at: 0,
        };
        let magic = h.u16();
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let version = h.u8();
        if version != RECORD_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let kind_b = h.u8();
        let kind = Kind::from_u8(kind_b).ok_or(DecodeError::UnknownKind(kind_b))?;
        let len = h.u16();
        if len as usize != RECORD_SIZE {
            return Err(DecodeError::BadLength(len));
        }
        let flags = h.u16();
        let seq = h.u64();
        let mut r = R {
            b: &raw.0[HEADER_SIZE..],
            at: 0,
        };
        Ok(Record {
            seq,
            flags,
            body: decode_body(kind, &mut r),
        })
    }
}

const NAME_LEN: usize = 71;
const HOST_LEN: usize = 39;
const JOB_LEN: usize = 38;

fn encode_op(o: &OpRecord, w: &mut W<'_>) {
    w.u64(o.comm_hash)
        .u64(o.coll_sn)
        .u64(o.coll_local_sn)
        .u64(o.count)
        .u64(o.bytes)
        .u64(o.enqueue_ns)
        .u64(o.start_ns)
        .u64(o.end_ns)
        .u64(o.gpu_start_ns)
        .u64(o.gpu_end_ns)
        .u64(o.api_ns)
        .i32(o.rank)
        .i32(o.root)
        .i32(o.peer)
        .u8(o.func.0)
        .u8(o.datatype.0)
        .u8(o.algo.0)
        .u8(o.proto.0)
        .u8(o.nchannels)
        .u8(o.nwarps)
        .u8(o.timing as u8)
        .u8(o.channels_done);
}

fn decode_op(r: &mut R<'_>) -> OpRecord {
    OpRecord {
        comm_hash: r.u64(),
        coll_sn: r.u64(),
        coll_local_sn: r.u64(),
        count: r.u64(),
        bytes: r.u64(),
        enqueue_ns: r.u64(),
        start_ns: r.u64(),
        end_ns: r.u64(),
        gpu_start_ns: r.u64(),
        gpu_end_ns: r.u64(),
        api_ns: r.u64(),
        rank: r.i32(),
        root: r.i32(),
        peer: r.i32(),
        func: Func(r.u8()),
        datatype: DataType(r.u8()),
        algo: Algo(r.u8()),
        proto: Proto(r.u8()),
        nchannels: r.u8(),
        nwarps: r.u8(),
        timing: Timing::from_u8(r.u8()),
        channels_done: r.u8(),
    }
}

/// Returns whether a string field was truncated.
fn encode_body(body: &Body, w: &mut W<'_>) -> bool {
    match body {
        Body::Segment(s) => {
            w.u32(s.format)
                .u32(s.record_size)
                .u64(s.segment_index)
                .u32(s.pid)
                .u32(0)
                .u64(s.created_real_ns)
                .u64(s.created_mono_ns);
            false
        }
        Body::ProcStart(p) => {
            w.u32(p.pid)
                .i32(p.rank)
                .i32(p.local_rank)
                .i32(p.world_size)
                .u64(p.mono_ns)
                .u64(p.real_ns)
                .u8(p.abi_version);
            let a = put_str(w, &p.host, HOST_LEN);
            let b = put_str(w, &p.job, JOB_LEN);
            a || b
        }
        Body::CommInit(c) => {
            w.u64(c.comm_hash)
                .u32(c.nranks)
                .i32(c.rank)
                .u32(c.nnodes)
                .i32(c.local_rank)
                .i32(c.device)
                .u8(c.abi_version)
                .bytes(&[0; 3])
                .u64(c.time_ns);
            put_str(w, &c.comm_name, NAME_LEN)
        }
        Body::CommFini(c) => {
            w.u64(c.comm_hash)
                .i32(c.rank)
                .u32(0)
                .u64(c.time_ns)
                .u64(c.ops)
                .u64(c.open_ops);
            false
        }
        Body::Coll(o) | Body::P2p(o) => {
            encode_op(o, w);
            false
        }
        Body::Proxy(p) => {
            w.u64(p.comm_hash)
                .u64(p.parent_local_sn)
                .u64(p.start_ns)
                .u64(p.end_ns)
                .u64(p.bytes)
                .u64(p.send_wait_ns)
                .u64(p.recv_wait_ns)
                .u32(p.pid)
                .i32(p.rank)
                .i32(p.peer)
                .i32(p.nsteps)
                .i32(p.chunk_size)
                .u32(p.steps_done)
                .u8(p.channel)
                .u8(p.is_send);
            false
        }
        Body::Net(n) => {
            w.u64(n.comm_hash)
                .u64(n.parent_local_sn)
                .u64(n.start_ns)
                .u64(n.end_ns)
                .u64(n.wr_id)
                .u64(n.length)
                .u32(n.net_type)
                .u32(n.net_version)
                .i32(n.rank)
                .i32(n.device)
                .u32(n.qp_num)
                .i32(n.opcode)
                .i32(n.fd)
                .i32(n.sock_op);
            false
        }
        Body::Overdue(o) => {
            w.u64(o.comm_hash)
                .u64(o.coll_sn)
                .u64(o.coll_local_sn)
                .u64(o.enqueue_ns)
                .u64(o.start_ns)
                .u64(o.now_ns)
                .u64(o.count)
                .u64(o.bytes)
                .u32(o.age_ms)
                .u32(o.repeat)
                .u32(o.threshold_ms)
                .i32(o.rank)
                .i32(o.peer)
                .u8(o.func.0)
                .u8(o.phase)
                .u8(o.channels_started)
                .u8(o.channels_done)
                .u8(o.is_p2p)
                .u8(o.nchannels);
            false
        }
        Body::Stats(s) => {
            w.u64(s.time_ns)
                .u64(s.mono_ns)
                .u64(s.real_ns)
                .u64(s.records_pushed)
                .u64(s.ring_drops)
                .u64(s.pool_drops)
                .u64(s.bytes_written)
                .u64(s.records_lost_io)
                .u64(s.events_ignored)
                .u64(s.overdue_emitted)
                .u32(s.segments_sealed)
                .u32(s.segments_deleted)
                .u32(s.io_errors)
                .u32(s.event_mask)
                .u8(s.writer_failed);
            false
        }
    }
}

fn decode_body(kind: Kind, r: &mut R<'_>) -> Body {
    match kind {
        Kind::Segment => {
            let format = r.u32();
            let record_size = r.u32();
            let segment_index = r.u64();
            let pid = r.u32();
            let _ = r.u32();
            Body::Segment(SegmentHeader {
                format,
                record_size,
                segment_index,
                pid,
                created_real_ns: r.u64(),
                created_mono_ns: r.u64(),
            })
        }
        Kind::ProcStart => Body::ProcStart(ProcStart {
            pid: r.u32(),
            rank: r.i32(),
            local_rank: r.i32(),
            world_size: r.i32(),
            mono_ns: r.u64(),
            real_ns: r.u64(),
            abi_version: r.u8(),
            host: r.str_field(HOST_LEN),
            job: r.str_field(JOB_LEN),
        }),
        Kind::CommInit => {
            let comm_hash = r.u64();
            let nranks = r.u32();
            let rank = r.i32();
            let nnodes = r.u32();
            let local_rank = r.i32();
            let device = r.i32();
            let abi_version = r.u8();
            let _ = r.take::<3>();
            let time_ns = r.u64();
            Body::CommInit(CommInit {
                comm_hash,
                nranks,
                rank,
                nnodes,
                local_rank,
                device,
                abi_version,
                time_ns,
                comm_name: r.str_field(NAME_LEN),
            })
        }
        Kind::CommFini => {
            let comm_hash = r.u64();
            let rank = r.i32();
            let _ = r.u32();
            Body::CommFini(CommFini {
                comm_hash,
                rank,
                time_ns: r.u64(),
                ops: r.u64(),
                open_ops: r.u64(),
            })
        }
        Kind::Coll => Body::Coll(decode_op(r)),
        Kind::P2p => Body::P2p(decode_op(r)),
        Kind::Proxy => Body::Proxy(ProxyRecord {
            comm_hash: r.u64(),
            parent_local_sn: r.u64(),
            start_ns: r.u64(),
            end_ns: r.u64(),
            bytes: r.u64(),
            send_wait_ns: r.u64(),
            recv_wait_ns: r.u64(),
            pid: r.u32(),
            rank: r.i32(),
            peer: r.i32(),
            nsteps: r.i32(),
            chunk_size: r.i32(),
            steps_done: r.u32(),
            channel: r.u8(),
            is_send: r.u8(),
        }),
        Kind::Net => Body::Net(NetRecord {
            comm_hash: r.u64(),
            parent_local_sn: r.u64(),
            start_ns: r.u64(),
            end_ns: r.u64(),
            wr_id: r.u64(),
            length: r.u64(),
            net_type: r.u32(),
            net_version: r.u32(),
            rank: r.i32(),
            device: r.i32(),
            qp_num: r.u32(),
            opcode: r.i32(),
            fd: r.i32(),
            sock_op: r.i32(),
        }),
        Kind::Overdue => Body::Overdue(Overdue {
            comm_hash: r.u64(),
            coll_sn: r.u64(),
            coll_local_sn: r.u64(),
            enqueue_ns: r.u64(),
            start_ns: r.u64(),
            now_ns: r.u64(),
            count: r.u64(),
            bytes: r.u64(),
            age_ms: r.u32(),
            repeat: r.u32(),
            threshold_ms: r.u32(),
            rank: r.i32(),
            peer: r.i32(),
            func: Func(r.u8()),
            phase: r.u8(),
            channels_started: r.u8(),
            channels_done: r.u8(),
            is_p2p: r.u8(),
            nchannels: r.u8(),
        }),
        Kind::Stats => Body::Stats(Stats {
            time_ns: r.u64(),
            mono_ns: r.u64(),
            real_ns: r.u64(),
            records_pushed: r.u64(),
            ring_drops: r.u64(),
            pool_drops: r.u64(),
            bytes_written: r.u64(),
            records_lost_io: r.u64(),
            events_ignored: r.u64(),
            overdue_emitted: r.u64(),
            segments_sealed: r.u32(),
            segments_deleted: r.u32(),
            io_errors: r.u32(),
            event_mask: r.u32(),
            writer_failed: r.u8(),
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One record of every kind with every field non-default (shared with the JSON tests).
    pub(crate) fn samples() -> Vec<Record> {
        let op = OpRecord {
            comm_hash: 0xdead_beef_0123_4567,
            coll_sn: 41,
            coll_local_sn: 1234,
            count: 1 << 20,
            bytes: 4 << 20,
            enqueue_ns: 1_764_425_999_123_456_789,
            start_ns: 1_764_425_999_123_460_000,
            end_ns: 1_764_425_999_124_000_001,
            gpu_start_ns: 1_764_425_999_000_000_000,
            gpu_end_ns: 1_764_425_999_000_500_000,
            api_ns: 1_764_425_999_123_400_000,
            rank: 3,
            root: -1,
            peer: -1,
            func: Func::ALL_REDUCE,
            datatype: DataType::from_name("ncclFloat32"),
            algo: Algo::from_name("RING"),
            proto: Proto::from_name("SIMPLE"),
            nchannels: 4,
            nwarps: 16,
            timing: Timing::KernelGpu,
            channels_done: 4,
        };
        let bodies = vec![
            Body::Segment(SegmentHeader {
                format: 1,
                record_size: 128,
                segment_index: 7,
                pid: 4242,
                created_real_ns: 99,
                created_mono_ns: 98,
            }),
            Body::ProcStart(ProcStart {
                pid: 4242,
                rank: 5,
                local_rank: 1,
                world_size: 8,
                mono_ns: 1000,
                real_ns: 2000,
                abi_version: 6,
                host: "node-017".into(),
                job: "job-xyz".into(),
            }),
            Body::CommInit(CommInit {
                comm_hash: 7,
                nranks: 8,
                rank: 5,
                nnodes: 2,
                local_rank: 1,
                device: 1,
                abi_version: 5,
                time_ns: 77,
                comm_name: "dp:pp_stage3".into(),
            }),
            Body::CommFini(CommFini {
                comm_hash: 7,
                rank: 5,
                time_ns: 88,
                ops: 100,
                open_ops: 1,
            }),
            Body::Coll(op.clone()),
            Body::P2p(OpRecord {
                func: Func::SEND,
                peer: 6,
                root: 0,
                ..op
            }),
            Body::Proxy(ProxyRecord {
                comm_hash: 7,
                parent_local_sn: 1234,
                start_ns: 1,
                end_ns: 2,
                bytes: 3,
                send_wait_ns: 4,
                recv_wait_ns: 5,
                pid: 6,
                rank: 7,
                peer: 8,
                nsteps: 9,
                chunk_size: 10,
                steps_done: 11,
                channel: 12,
                is_send: 1,
            }),
            Body::Net(NetRecord {
                comm_hash: 7,
                parent_local_sn: 8,
                start_ns: 9,
                end_ns: 10,
                wr_id: 11,
                length: 12,
                net_type: 1,
                net_version: 1,
                rank: 2,
                device: 3,
                qp_num: 4,
                opcode: 5,
                fd: -1,
                sock_op: 0,
            }),
            Body::Overdue(Overdue {
                comm_hash: 7,
                coll_sn: 3,
                coll_local_sn: 4,
                enqueue_ns: 5,
                start_ns: 6,
                now_ns: 7,
                count: 8,
                bytes: 9,
                age_ms: 31_000,
                repeat: 2,
                threshold_ms: 30_000,
                rank: 1,
                peer: -1,
                func: Func::ALL_REDUCE,
                phase: 1,
                channels_started: 2,
                channels_done: 1,
                is_p2p: 0,
                nchannels: 2,
            }),
            Body::Stats(Stats {
                time_ns: 1,
                mono_ns: 2,
                real_ns: 3,
                records_pushed: 4,
                ring_drops: 5,
                pool_drops: 6,
                bytes_written: 7,
                records_lost_io: 8,
                events_ignored: 9,
                overdue_emitted: 10,
                segments_sealed: 11,
                segments_deleted: 12,
                io_errors: 13,
                event_mask: 0x747,
                writer_failed: 1,
            }),
        ];
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Record {
                seq: 100 + i as u64,
                flags: FLAG_REPEAT,
                body,
            })
            .collect()
    }

    #[test]
    fn every_kind_round_trips_through_binary() {
        for rec in samples() {
            let raw = rec.encode();
            assert_eq!(raw.seq(), rec.seq);
            let back = Record::decode(&raw).unwrap();
            assert_eq!(back, rec, "{:?}", rec.kind());
            assert_eq!(back.encode(), raw);
        }
    }

    #[test]
    fn header_is_validated() {
        let mut raw = samples()[4].encode();
        raw.0[0] = 0;
        assert!(matches!(
            Record::decode(&raw),
            Err(DecodeError::BadMagic(_))
        ));
        let mut raw = samples()[4].encode();
        raw.0[2] = 9;
        assert_eq!(
            Record::decode(&raw),
            Err(DecodeError::UnsupportedVersion(9))
        );
        let mut raw = samples()[4].encode();
        raw.0[3] = 77;
        assert_eq!(Record::decode(&raw), Err(DecodeError::UnknownKind(77)));
    }

    #[test]
    fn long_names_are_cut_at_a_char_boundary_and_flagged() {
        let name = "é".repeat(60); // 120 bytes
        let rec = Record::new(Body::CommInit(CommInit {
            comm_name: name.as_str().into(),
            ..Default::default()
        }));
        let back = Record::decode(&rec.encode()).unwrap();
        assert_ne!(back.flags & FLAG_TRUNCATED, 0);
        let Body::CommInit(c) = back.body else {
            panic!()
        };
        assert_eq!(c.comm_name.0.len(), 70);
        assert!(std::str::from_utf8(&c.comm_name.0).is_ok());
    }
}

//! The hang tracer's data: what one agent knows about the ranks of a job at one moment
//! ([`JobSnapshot`], the unit the agents send the master and archive as evidence), and what the
//! analysis concludes ([`Verdict`], the `hang --json` schema).
//!
//! Times are µs on the job's aligned timeline (process clock correction plus the host's offset to
//! the master, as far as the agent knew it when it took the snapshot).

use serde::{Deserialize, Serialize};

use crate::stacks::{ProcState, ProcessStacks};

/// Suffix of an archived snapshot (`<job>/<event>/<host>.snapshot.json`).
pub const SNAPSHOT_SUFFIX: &str = ".snapshot.json";

/// Version of [`JobSnapshot`] (bumped on incompatible changes; older bundles are rejected with
/// the version they carry).
pub const SNAPSHOT_VERSION: u32 = 1;

/// A communicator of the job: identity, role and members.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommView {
    /// NCCL's comm hash, `0x%016x`.
    #[serde(with = "hex_u64")]
    pub hash: u64,
    /// The name the communicator was created with (may be empty).
    #[serde(default)]
    pub name: String,
    /// Inferred or named role (`dp`, `tp`, `pp`, `ep`, `cp`, `world`, ... or empty).
    #[serde(default)]
    pub role: String,
    pub nranks: u32,
    /// `(rank in the comm, global rank)`, sorted by comm rank; only the members this snapshot saw.
    pub members: Vec<(i32, i64)>,
}

/// An operation a rank has entered and not finished (an `overdue` record not followed by its
/// completion, or an op record flagged incomplete at exit).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenOp {
    #[serde(with = "hex_u64")]
    pub comm: u64,
    /// NCCL function name (`AllReduce`, `Send`, `Recv`, ...).
    pub func: String,
    /// `coll_sn` (collectives: NCCL's per-comm sequence number).
    pub seq: u64,
    pub coll_local_sn: u64,
    /// P2P: the peer's rank in the comm; -1 for collectives.
    pub peer: i32,
    /// P2P: 0-based order of this op among this rank's ops of the same (comm, peer, func).
    #[serde(default)]
    pub p2p_ord: u64,
    pub count: u64,
    pub bytes: u64,
    pub enqueue_us: u64,
    /// 0 when the kernel never started.
    pub start_us: u64,
    /// Latest age report (µs on the aligned timeline of the report).
    pub seen_us: u64,
    /// 0 enqueued, 1 kernel running, 2 some channels done (the plugin's phase).
    pub phase: u8,
    /// The data type as the source names it (NCCL's `ncclBfloat16`, ...), when the source says
    /// (imported Flight Recorder entries do; the plugin's overdue reports do not).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dtype: String,
}

/// How far a rank got with one collective function on one communicator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollProgress {
    #[serde(with = "hex_u64")]
    pub comm: u64,
    pub func: String,
    /// Highest `coll_sn` finished (NCCL's per-comm, per-function counter).
    pub last_seq: u64,
    /// Count of that op (for mismatch tie-breaks).
    pub last_count: u64,
}

/// Finished P2P ops of a rank with one peer, per function.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2pProgress {
    #[serde(with = "hex_u64")]
    pub comm: u64,
    /// The peer's rank in the comm.
    pub peer: i32,
    pub func: String,
    pub done: u64,
}

/// One rank as an agent saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankView {
    /// Global rank (`RANK`), -1 when unknown.
    pub rank: i64,
    pub host: String,
    pub pid: u32,
    /// `job/host/pid` of the stream.
    pub stream: String,
    /// When the last finished op ended (0: none finished).
    pub last_end_us: u64,
    /// The latest time anything was heard from this rank (op start/end, overdue report, stats).
    pub last_heard_us: u64,
    /// When the snapshot this view came from was taken (µs), set where several snapshots are
    /// merged: a rank's silence is known only up to then (0: the snapshot's own `taken_us`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_us: u64,
    /// Its stream ended (the process finalised or its ring is gone).
    #[serde(default)]
    pub ended: bool,
    pub colls: Vec<CollProgress>,
    pub p2p: Vec<P2pProgress>,
    pub open: Vec<OpenOp>,
    /// Process state from procfs (only the agent on the rank's host can say).
    #[serde(default)]
    pub proc_state: Option<ProcState>,
    /// Python and native stacks, when captured.
    #[serde(default)]
    pub stacks: Option<ProcessStacks>,
    /// What the host probes say about the process (thread states, queue pairs, TCP), when
    /// the agent's host stream names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_context: Option<crate::host::context::HostView>,
    /// The GPUs it runs on (latest sample, XIDs), when its plugin named them and the GPU
    /// samples cover them (issue 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<crate::host::gpu::context::GpuView>,
}

/// Longest normal quiet interval the job has shown (for the phase-aware threshold).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GapStats {
    /// Longest finished op (end - enqueue) seen, µs.
    pub max_op_us: u64,
    /// Longest gap between one op's end and the next op's enqueue on a rank, µs.
    pub max_idle_us: u64,
    /// The plugin's overdue threshold as its records state it, ms (0: none seen).
    pub plugin_threshold_ms: u32,
}

/// What one agent (or an offline pass) knows about one job now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    pub v: u32,
    pub job: String,
    /// Hosts whose ranks this snapshot describes.
    pub hosts: Vec<String>,
    /// When it was taken (aligned µs).
    pub taken_us: u64,
    /// The job's world size as the processes stated it (0: unknown).
    pub world: u32,
    pub comms: Vec<CommView>,
    pub ranks: Vec<RankView>,
    pub gaps: GapStats,
}

/// The kind of a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerdictKind {
    /// Ranks wait on ranks that stopped in compute / host code.
    Hang,
    /// A source rank's process is gone or a zombie.
    Failure,
    /// Ranks entered the same comm instance with different function, size or type.
    Mismatch,
}

/// The communicator of a verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictComm {
    #[serde(with = "hex_u64")]
    pub hash: u64,
    pub name: String,
    pub role: String,
}

/// One link of a wait-for chain: `rank` waits in `(comm, func, seq)` for `waits_for`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainLink {
    pub rank: i64,
    #[serde(with = "hex_u64")]
    pub comm: u64,
    pub func: String,
    pub seq: u64,
    pub waits_for: Vec<i64>,
}

/// One conclusion of the analysis (the `hang --json` schema, `verdicts[]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    #[serde(default)]
    pub job: String,
    pub kind: VerdictKind,
    /// The ranks the wait-for graph ends in, most likely first.
    pub source_ranks: Vec<i64>,
    /// The first non-progressing comm instance.
    pub comm: VerdictComm,
    pub func: String,
    pub seq: u64,
    pub entered_ranks: Vec<i64>,
    pub absent_ranks: Vec<i64>,
    /// Wait-for edges from the waiters of the first instance down to the sources.
    pub chain: Vec<ChainLink>,
    /// When the first non-progressing instance was entered (aligned µs).
    pub since_us: u64,
    /// An XID a source rank's GPU raised, one line (`rank 3: GPU 0000:2a:00.0 raised XID 79
    /// at ...`): a hardware fault said first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fault: Option<String>,
    /// The verdict in PyTorch Flight Recorder's own mismatch terms: `missing` (ranks never joined
    /// the first non-progressing instance), `size` (its members entered it with different sizes),
    /// `collective` (with different functions), `type` (with different data types); absent when
    /// none applies (every member entered and one is stuck inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    pub evidence: serde_json::Value,
}

/// A wait that would have been a hang online but ended: the job went on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedStall {
    pub job: String,
    pub comm: VerdictComm,
    pub func: String,
    pub seq: u64,
    /// Ranks that waited in it.
    pub ranks: Vec<i64>,
    pub since_us: u64,
    pub until_us: u64,
    /// The longest wait of a rank in it.
    pub wait_us: u64,
    /// What a hang needed then (learned gaps before it).
    pub threshold_us: u64,
}

/// The `hang --json` document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangReport {
    pub verdicts: Vec<Verdict>,
    /// Stalls that crossed the hang threshold but finished (offline input only).
    #[serde(default)]
    pub resolved: Vec<ResolvedStall>,
    /// MoE EP windows some rank never reported (offline input only): evidence of a rank that
    /// stopped, beside the communication verdicts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ep_incomplete: Vec<EpMissing>,
}

/// An MoE EP window that never got the rows of some EP ranks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpMissing {
    pub job: String,
    /// `0x%016x`.
    pub ep_group: String,
    pub phase: String,
    pub window_seq: u64,
    /// When the window ended (ns since the epoch, the rows' clock).
    pub ts_ns: u64,
    /// EP-group ranks that sent no row.
    pub missing_ep_ranks: Vec<u32>,
    /// Their global ranks, from the streams their earlier rows came from (-1: never seen).
    pub missing_ranks: Vec<i64>,
}

/// Serde for a `u64` written as `"0x%016x"` (and read back from that or a plain number).
pub mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("0x{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            S(String),
            N(u64),
        }
        match Either::deserialize(d)? {
            Either::N(n) => Ok(n),
            Either::S(s) => {
                let t = s.trim_start_matches("0x");
                u64::from_str_radix(t, 16).map_err(serde::de::Error::custom)
            }
        }
    }
}

impl Verdict {
    /// The verdict as one log line.
    pub fn one_line(&self) -> String {
        let fault = self
            .gpu_fault
            .as_ref()
            .map(|f| format!("GPU fault: {f}; "))
            .unwrap_or_default();
        format!(
            "{fault}{:?} in job {}: source rank(s) {:?}; first non-progressing {} seq {} on {} comm 0x{:016x} ({}); entered {:?}, absent {:?}",
            self.kind,
            self.job,
            self.source_ranks,
            self.func,
            self.seq,
            if self.comm.role.is_empty() { "?" } else { &self.comm.role },
            self.comm.hash,
            self.comm.name,
            self.entered_ranks.len(),
            self.absent_ranks,
        )
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

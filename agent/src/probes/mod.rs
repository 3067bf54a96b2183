//! eBPF host probes (aya): ibverbs control-path uprobes, scheduler and TCP tracepoints for the
//! processes of registered ranks, filtered in the kernel by the `PIDS` map.
//!
//! The BPF object (`ebpf/probes`, built by `cargo xtask build-ebpf`) is embedded when the agent is
//! built with `COMMINSIGHT_BPF_OBJECT` set (`cfg(comminsight_bpf)`); without it everything else
//! works and [`HostProbes::start`] says "eBPF not built in". Every probe is optional: one that
//! cannot attach is reported in [`ProbeStatus`] and the others run.

pub mod events;
#[cfg(comminsight_bpf)]
mod loader;
pub mod sockets;
pub mod symbols;
pub mod threads;
pub mod tracefs;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use events::{QpInfo, QpTable, QpTransition, TcpPeerStats, TcpRecord, VerbsCall};
#[cfg(comminsight_bpf)]
pub use loader::HostProbes;
pub use threads::ThreadSample;

/// True when this agent binary carries the BPF object.
pub const BUILT_IN: bool = cfg!(comminsight_bpf);

/// Default of `[probes] interval_ms`.
pub const DEFAULT_INTERVAL_MS: u64 = 1000;

/// `[probes]`: the eBPF host probes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbesConfig {
    /// Load the BPF probes at all (needs root or CAP_BPF + CAP_PERFMON).
    pub enabled: bool,
    /// The libibverbs the ranks load (empty: `libibverbs.so.1` found in the usual library
    /// directories).
    pub libibverbs: PathBuf,
    /// ibverbs control-path uprobes (device, PD, MR, CQ, QP lifecycle, async events).
    pub verbs: bool,
    /// Scheduler tracepoints: per-thread on-CPU / runnable / blocked time.
    pub sched: bool,
    /// TCP tracepoints: retransmits and state changes of the ranks' sockets.
    pub tcp: bool,
    /// Mount tracefs at /sys/kernel/tracing when it is not mounted (tracepoints need it).
    pub mount_tracefs: bool,
    /// How often the ranks' thread states, QPs and TCP counters are written into the host
    /// stream (ms).
    pub interval_ms: u64,
}

impl Default for ProbesConfig {
    fn default() -> Self {
        ProbesConfig {
            enabled: true,
            libibverbs: PathBuf::new(),
            verbs: true,
            sched: true,
            tcp: true,
            mount_tracefs: true,
            interval_ms: DEFAULT_INTERVAL_MS,
        }
    }
}

/// Why the probes (or one of them) could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("eBPF not built in: this agent was built without the BPF object; build it with `cargo xtask build` (which runs `cargo xtask build-ebpf`)")]
    NotBuiltIn,
    #[error("the BPF object's ABI_VERSION is {object}, this agent reads {agent}; rebuild both with `cargo xtask build`")]
    Abi { object: u32, agent: u32 },
    #[error("cannot load the BPF object: {0}; run as root or grant CAP_BPF and CAP_PERFMON, with RLIMIT_MEMLOCK unlimited on kernels before 5.11 (see packaging/comminsight-agent.service)")]
    Load(String),
    #[error("BPF map {map}: {reason}")]
    Map { map: &'static str, reason: String },
    #[error("process {pid}: {reason}")]
    Process { pid: u32, reason: String },
}

/// One probe group's state after start: attached or why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeStatus {
    /// `verbs:ibv_create_qp`, `sched:sched_switch`, `tcp:tcp_retransmit_skb`, `tracefs`.
    pub name: String,
    pub ok: bool,
    /// Where it is attached (`/usr/lib/.../libibverbs.so.1+0x114e0 (ibv_get_device_list@@IBVERBS_1.1)`)
    /// or the one-line reason and fix.
    pub detail: String,
}

/// Everything one probe session saw, as written by `comminsight-agent probe --out`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProbeReport {
    pub pids: Vec<u32>,
    pub statuses: Vec<ProbeStatus>,
    pub verbs: Vec<VerbsCall>,
    pub qps: Vec<QpInfo>,
    pub tcp: Vec<TcpRecord>,
    /// Per tracked process and connection: retransmits and state changes.
    #[serde(default)]
    pub tcp_peers: Vec<TcpPeerStats>,
    /// TCP events of sockets no tracked process owns (dropped).
    #[serde(default)]
    pub tcp_unowned: u64,
    /// Last sample of every tracked thread.
    pub threads: Vec<ThreadSample>,
    /// Per probe: hits and records lost to a full ring buffer.
    pub counts: Vec<ProbeCount>,
}

/// Hits and lost records of one probe (the `COUNTS` map summed over CPUs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeCount {
    pub name: String,
    pub hits: u64,
    pub lost: u64,
}

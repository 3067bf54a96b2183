//! The straggler index's inputs and outputs (DESIGN.md §5, issue 7): what the collector hands
//! the analysis per (rank, step), and the report every reader (CLI, master, HTML report) uses.
//! `--json` of `comminsight-agent straggler` is [`StragglerReport`] serialised as is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which instance of an operation an arrival belongs to; equal keys on two ranks (inside one
/// step) are the same operation instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InstanceKey {
    /// A collective: NCCL's `(comm, func, seqNumber)`.
    Coll { comm: u64, func: u8, seq: u64 },
    /// A point-to-point transfer: the sender's and receiver's ranks in `comm` and the transfer's
    /// ordinal on that (comm, sender, receiver) pair (the records' per-(comm, peer, func)
    /// `coll_sn`). A `send` and its `recv` get the same key.
    P2p {
        comm: u64,
        src: u32,
        dst: u32,
        seq: u64,
    },
}

/// One rank's arrival at one operation instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arrival {
    pub key: InstanceKey,
    /// Arrival: the operation's start on the aligned job timeline, µs.
    pub start_us: u64,
    /// The operation's duration on this rank, µs (0 when it never finished).
    pub dur_us: u64,
}

/// One rank's step as the analysis sees it: the step summary's facts plus the arrivals of the
/// step's operations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStep {
    /// Global rank.
    pub rank: i64,
    pub host: String,
    /// Step number (calibrated when the job's calibration is applied).
    pub step: u64,
    pub duration_us: u64,
    pub coverage_complete: bool,
    /// Error bound of this rank's alignment onto the job timeline, µs: a wait between two ranks
    /// shorter than the sum of their bounds is not attributed.
    pub err_us: u64,
    pub arrivals: Vec<Arrival>,
    /// End of this rank's last operation before the step (the previous step's last one) on
    /// the job timeline, µs: where the step's compute began. `None` at a stream's first step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_end_us: Option<u64>,
}

/// One rank in one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankIndex {
    pub rank: i64,
    /// StragglerIndex(r, s) = min(100, AvgCause(r, s) / AvgStep(s) × 100).
    pub index: f64,
    /// AvgCause(r, s), µs.
    pub avg_cause_us: f64,
    pub coverage_complete: bool,
    /// Root-cause index (issue 17, [`super::root`]): root cost in percent of the step, the
    /// seed's scale.
    #[serde(default)]
    pub root_index: f64,
    /// The rank's own excess self time over its role peers, % of the step.
    #[serde(default)]
    pub root_delay: f64,
    /// What removing this rank's excess would save of the step, % (the step's top ranks by
    /// root cost only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saves_pct: Option<f64>,
}

/// One step across the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepIndex {
    pub step: u64,
    /// AvgStep(s): mean step duration over the ranks with a summary of the step, µs.
    pub avg_step_us: f64,
    /// Every rank with a summary of the step, highest root index first, then highest index
    /// (ties: lower rank first).
    pub ranks: Vec<RankIndex>,
    /// Share of the step's waiting charged to no rank (pipeline bubbles, schedule), %.
    #[serde(default)]
    pub structural: f64,
}

/// Another rank in a rank's explanation: net wait (µs, summed over the steps considered).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerWait {
    pub rank: i64,
    pub wait_us: u64,
    /// Steps in which the net wait was positive.
    pub steps: u64,
}

/// Classification hint for a culprit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StragglerClass {
    /// Arrives late at its operations, whose durations are normal.
    ComputeSlow,
    /// Arrives on time, its operations take long.
    CommSlow,
    /// Compute-slow, and its main thread waited for a CPU (run queue, cgroup throttling) far
    /// more than its peers' (host context, [`super::host`]).
    CpuStarved,
    /// Compute-slow, and its main thread sat in uninterruptible (I/O) sleep far more than its
    /// peers'.
    BlockedIo,
    /// Comm-slow (or waited for), and its TCP connections retransmitted far more than its
    /// peers' over the analysed steps: a lossy link or an overloaded peer (host context).
    Retransmits,
    /// Comm-slow (or waited for), and a port under its traffic (its queue pairs' port, or
    /// the host's data ports for the socket transport) went down or counted errors over the
    /// analysed steps (host context); taken before `retransmits`.
    LinkErrors,
    /// Compute-slow (or waited for), and its GPU's clocks were held down (HW slowdown,
    /// thermal, power brake, power cap) far more than its peers' over the analysed steps
    /// (GPU samples, [`super::gpu`]); taken before the CPU rules.
    GpuThrottled,
    /// Comm-slow (or waited for), and its GPU's NVLinks counted CRC / replay / recovery
    /// errors over the analysed steps (GPU samples); taken before the port and TCP rules.
    NvlinkErrors,
    /// The whole stage / role group it belongs to is late in most steps.
    Structural,
    /// Index below the threshold: not a culprit.
    #[default]
    None,
}

/// One rank over the steps considered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    pub rank: i64,
    pub host: String,
    /// Arithmetic mean of the per-step index over this rank's `coverage_complete` steps.
    pub index: f64,
    /// Steps that entered the mean.
    pub complete_steps: u64,
    pub max_index: f64,
    /// Steps in which the index was above the threshold.
    pub steps_over_threshold: u64,
    /// Who this rank waited for most (top 10); never feeds back into the index.
    pub top_causes: Vec<PeerWait>,
    /// Who this rank made wait most (top 10).
    pub top_victims: Vec<PeerWait>,
    pub class: StragglerClass,
    /// One line: the numbers behind `class`.
    pub class_reason: String,
    /// Median root-cause index over the complete steps (what verdicts rank by; the median, not
    /// the mean: sporadic one-step delays, as from preemption, do not make a straggler).
    #[serde(default)]
    pub root_index: f64,
    #[serde(default)]
    pub root_max_index: f64,
    /// Steps in which the root index was above `root_threshold`.
    #[serde(default)]
    pub root_steps_over: u64,
    /// Median own excess self time over the role peers, % of the step.
    #[serde(default)]
    pub root_delay: f64,
    /// Median share of the step that removing this rank's excess would save, %.
    #[serde(default)]
    pub saves_pct: f64,
    /// Who waited for this rank's own slowness directly (root cost µs, summed over steps).
    #[serde(default)]
    pub root_direct: Vec<PeerWait>,
    /// Through which waiting ranks the rest of its root cost reached others.
    #[serde(default)]
    pub root_via: Vec<PeerWait>,
    /// One line: the chain that explains the root index.
    #[serde(default)]
    pub chain: String,
    /// Of the waits this rank made others wait (as their delayer), the share that neither its
    /// own excess over its role peers nor waits it inherited explain, % (charged to no rank:
    /// bubbles, or its whole role is slower than the rest).
    #[serde(default)]
    pub structural_share: f64,
    /// Mean over the steps of how much this rank's role group (its peers: same program) is
    /// slower than every rank's median over the whole step, % of the step (a stage or role
    /// slower than the rest: data or schedule imbalance); steps in which it was above
    /// `root_min_delay`.
    #[serde(default)]
    pub role_excess: f64,
    #[serde(default)]
    pub role_steps_over: u64,
    /// Its main thread's on-CPU / runnable / blocked shares over the analysed steps, when the
    /// host streams cover them (issue 19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_shares: Option<HostShares>,
    /// Its TCP retransmits over the analysed steps, when the host streams cover it (issue 19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_tcp: Option<HostTcpEvidence>,
    /// The errors and link-downs of the ports under its traffic over the analysed steps, when
    /// the host streams cover it (issue 19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_links: Option<HostLinkEvidence>,
    /// Its GPUs over the analysed steps (clock slowdowns, NVLink errors, XIDs), when the GPU
    /// samples cover them (issue 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_gpu: Option<HostGpuEvidence>,
}

/// One job's straggler analysis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StragglerReport {
    pub job: String,
    /// The index threshold used for `steps_over_threshold` and the classification.
    pub threshold: f64,
    /// The root-index threshold: a rank above it is a straggler (verdicts use it).
    #[serde(default)]
    pub root_threshold: f64,
    /// ...and the own excess (`root_delay`) it must also have, % of the step.
    #[serde(default)]
    pub root_min_delay: f64,
    pub steps: Vec<StepIndex>,
    /// Every rank, highest root index first, then highest index (ties: lower rank first).
    pub ranks: Vec<RankSummary>,
}

impl StragglerReport {
    /// `r` is a straggler by the root-cause rule (its medians over the steps). A structural
    /// rank never is: the class is given only to ranks under the rule.
    pub fn is_straggler(&self, r: &RankSummary) -> bool {
        super::root_over(
            r.root_index,
            r.root_delay,
            self.root_threshold,
            self.root_min_delay,
        )
    }
}

/// A main thread's time shares over a window (%), and the time the samples cover.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostShares {
    pub on_cpu_pct: f64,
    pub runnable_pct: f64,
    pub blocked_pct: f64,
    pub blocked_io_pct: f64,
    pub covered_s: f64,
}

/// A rank's TCP retransmits over a window: in all, and on the connections that had most.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostTcpEvidence {
    pub retransmits: u64,
    /// Up to [`HostTcpEvidence::MAX_CONNECTIONS`] connections, most retransmits first.
    pub connections: Vec<TcpRetransmits>,
}

/// The errors and link-downs of the ports under a rank's traffic over a window: in all, and
/// per port (link-downs then errors most first, at most [`HostLinkEvidence::MAX_PORTS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLinkEvidence {
    pub errors: u64,
    pub link_downed: u64,
    pub ports: Vec<crate::host::windows::PortErrors>,
}

impl HostLinkEvidence {
    /// Ports kept in the evidence.
    pub const MAX_PORTS: usize = 4;

    /// The evidence of per-port counts, link-downs then errors most first.
    pub fn of(per: &[crate::host::windows::PortErrors]) -> HostLinkEvidence {
        HostLinkEvidence {
            errors: per.iter().map(|p| p.errors).fold(0, u64::saturating_add),
            link_downed: per.iter().map(|p| p.link_downed).sum(),
            ports: per.iter().take(Self::MAX_PORTS).cloned().collect(),
        }
    }

    /// Its ports, one line: `mlx5_0/1: 1 link-downs, 40 errors; ...`.
    pub fn ports_line(&self) -> String {
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|p| {
                format!(
                    "{}/{}: {} link-downs, {} errors",
                    p.device, p.port, p.link_downed, p.errors
                )
            })
            .collect();
        ports.join("; ")
    }
}

/// Per rank of a job: its main thread's shares, its TCP retransmits and its ports' errors over
/// its analysed steps — the host evidence [`super::host::refine`] applies.
#[derive(Clone, Debug, Default)]
pub struct RanksHost {
    pub shares: BTreeMap<i64, HostShares>,
    pub tcp: BTreeMap<i64, HostTcpEvidence>,
    pub links: BTreeMap<i64, HostLinkEvidence>,
    pub gpu: BTreeMap<i64, HostGpuEvidence>,
}

impl RanksHost {
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
            && self.tcp.is_empty()
            && self.links.is_empty()
            && self.gpu.is_empty()
    }
}

/// One connection's retransmits (`ip:port` each end).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpRetransmits {
    pub local: String,
    pub remote: String,
    pub retransmits: u64,
}

impl HostTcpEvidence {
    /// Connections kept in the evidence.
    pub const MAX_CONNECTIONS: usize = 4;

    /// The evidence of per-connection counts `(local, remote, count)`, most first.
    pub fn of(per: &[(String, String, u64)]) -> HostTcpEvidence {
        HostTcpEvidence {
            retransmits: per.iter().map(|c| c.2).sum(),
            connections: per
                .iter()
                .take(Self::MAX_CONNECTIONS)
                .map(|(local, remote, n)| TcpRetransmits {
                    local: local.clone(),
                    remote: remote.clone(),
                    retransmits: *n,
                })
                .collect(),
        }
    }
}

impl RankStep {
    /// The span `[from, to]` (µs) of this rank's step: from the end of its previous step (or
    /// its first arrival) to the end of its last operation; what its host windows are read over.
    pub fn span_us(&self) -> Option<(u64, u64)> {
        let lo = self
            .prev_end_us
            .or_else(|| self.arrivals.iter().map(|x| x.start_us).min());
        let hi = self.arrivals.iter().map(|x| x.start_us + x.dur_us).max();
        lo.zip(hi)
    }
}

impl HostShares {
    /// The shares of `t`, covering `covered_ns`.
    pub fn of(t: &crate::host::context::CpuTimes, covered_ns: u64) -> HostShares {
        let s = t.shares();
        HostShares {
            on_cpu_pct: s.on_cpu_pct,
            runnable_pct: s.runnable_pct,
            blocked_pct: s.blocked_pct,
            blocked_io_pct: s.blocked_io_pct,
            covered_s: (covered_ns as f64 / 1e8).round() / 10.0,
        }
    }
}

/// One NVLink's errors in the evidence.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvlinkErrors {
    /// The GPU (`dddd:bb:dd.f`).
    pub gpu: String,
    pub link: u8,
    pub errors: u64,
}

/// A rank's GPUs over its analysed steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostGpuEvidence {
    /// Time the GPU samples cover (s), and the share of it the clocks were held down (%).
    pub covered_s: f64,
    pub slowdown_pct: f64,
    /// Slowdown reasons seen (`hw_slowdown`, `hw_thermal`, ...).
    pub reasons: Vec<String>,
    /// Lowest SM clock sampled (MHz; 0: none).
    pub min_sm_clock_mhz: u16,
    pub nvlink_errors: u64,
    /// Up to [`HostGpuEvidence::MAX_LINKS`] links, most errors first.
    pub links: Vec<NvlinkErrors>,
    /// XIDs raised over the steps.
    pub xids: Vec<u64>,
}

impl HostGpuEvidence {
    /// Links kept in the evidence.
    pub const MAX_LINKS: usize = 4;

    pub fn of(w: &crate::host::windows::GpuWindow) -> HostGpuEvidence {
        let pct = if w.covered_ns == 0 {
            0.0
        } else {
            (w.slowdown_ns as f64 * 1000.0 / w.covered_ns as f64).round() / 10.0
        };
        HostGpuEvidence {
            covered_s: (w.covered_ns as f64 / 1e8).round() / 10.0,
            slowdown_pct: pct,
            reasons: comminsight_wire::gpu::throttle::names(w.reasons)
                .into_iter()
                .map(String::from)
                .collect(),
            min_sm_clock_mhz: w.min_sm_clock_mhz,
            nvlink_errors: w.nvlink_errors(),
            links: w
                .nvlink
                .iter()
                .filter(|l| l.2 > 0)
                .take(Self::MAX_LINKS)
                .map(|(p, link, errors)| NvlinkErrors {
                    gpu: comminsight_wire::gpu::pci::format(*p),
                    link: *link,
                    errors: *errors,
                })
                .collect(),
            xids: w.xids.iter().map(|x| x.2).collect(),
        }
    }

    /// The clocks part, one line: `clocks held down 38.0 % of 12.0 s (hw_slowdown,
    /// hw_thermal), SM clock down to 1100 MHz`.
    pub fn clocks_line(&self) -> String {
        let reasons = if self.reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.reasons.join(", "))
        };
        let clock = if self.min_sm_clock_mhz > 0 {
            format!(", SM clock down to {} MHz", self.min_sm_clock_mhz)
        } else {
            String::new()
        };
        format!(
            "GPU clocks held down {:.1} % of {:.1} s{reasons}{clock}",
            self.slowdown_pct, self.covered_s
        )
    }

    /// The NVLink part, one line: `NVLink 3 of 0000:2a:00.0 +1204 errors; ...`.
    pub fn links_line(&self) -> String {
        self.links
            .iter()
            .map(|l| {
                let link = if l.link == comminsight_wire::gpu::ALL_LINKS {
                    "NVLinks (all)".to_string()
                } else {
                    format!("NVLink {}", l.link)
                };
                format!("{link} of {} +{} errors", l.gpu, l.errors)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The median of `v` (0 for none): the peers' median the host and GPU rules compare with.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

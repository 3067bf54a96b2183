//! The straggler index's inputs and outputs (DESIGN.md §5, issue 7): what the collector hands
//! the analysis per (rank, step), and the report every reader (CLI, master, HTML report) uses.
//! `--json` of `comminsight-agent straggler` is [`StragglerReport`] serialised as is.

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
}

/// One rank in one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankIndex {
    pub rank: i64,
    /// StragglerIndex(r, s) = min(100, AvgCause(r, s) / AvgStep(s) × 100).
    pub index: f64,
    /// AvgCause(r, s), µs.
    pub avg_cause_us: f64,
    pub coverage_complete: bool,
}

/// One step across the job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepIndex {
    pub step: u64,
    /// AvgStep(s): mean step duration over the ranks with a summary of the step, µs.
    pub avg_step_us: f64,
    /// Every rank with a summary of the step, highest index first (ties: lower rank first).
    pub ranks: Vec<RankIndex>,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StragglerClass {
    /// Arrives late at its operations, whose durations are normal.
    ComputeSlow,
    /// Arrives on time, its operations take long.
    CommSlow,
    /// The whole stage / role group it belongs to is late in most steps.
    Structural,
    /// Index below the threshold: not a culprit.
    None,
}

/// One rank over the steps considered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
}

/// One job's straggler analysis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StragglerReport {
    pub job: String,
    /// The index threshold used for `steps_over_threshold` and the classification.
    pub threshold: f64,
    pub steps: Vec<StepIndex>,
    /// Every rank, highest index first (ties: lower rank first).
    pub ranks: Vec<RankSummary>,
}

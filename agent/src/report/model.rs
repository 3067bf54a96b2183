//! What the HTML report shows, as one serialisable value ([`ReportModel`]): gathered from the
//! offline analyses by [`super::gather`], rendered by [`super::render`], embedded in the page as
//! JSON. Large per-rank data is columnar (arrays indexed by the rank's position in
//! [`ReportModel::ranks`], indices quantised to tenths as integers) so that 4096 ranks × 100 steps
//! stay a few MB.

use serde::{Deserialize, Serialize};

use crate::hang::model::{ChainLink, VerdictComm, VerdictKind};
use crate::stacks::{ProcState, ProcessStacks};

/// Version of the embedded data (bumped when the page's script must change with it).
pub const MODEL_VERSION: u32 = 1;

/// A straggler index in tenths (`index × 10`, rounded); `-1` where the rank has no value.
pub type Tenths = i32;

/// Quantise an index (0..=100) to [`Tenths`].
pub fn tenths(index: f64) -> Tenths {
    if index.is_finite() {
        (index * 10.0).round().clamp(0.0, 1000.0) as Tenths
    } else {
        0
    }
}

/// The parallel grid (group size per dimension, 1 when absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridView {
    pub tp: u32,
    pub cp: u32,
    pub pp: u32,
    pub dp: u32,
    pub ep: u32,
}

/// One rank's place on the grid: `[tp, cp, pp, dp, ep]` coordinates.
pub type Coord = [u32; 5];

/// One communicator (for the drill-down's roles).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommInfo {
    /// `0x%016x`.
    pub hash: String,
    pub name: String,
    /// `dp`, `tp`, `pp`, `ep`, `cp`, `global`, ... or `unknown`.
    pub role: String,
    /// Global ranks in communicator-rank order (-1: not seen).
    pub ranks: Vec<i64>,
}

/// Per-step durations over the ranks with a summary of the step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStat {
    pub step: u64,
    pub min_us: u64,
    pub mean_us: f64,
    pub max_us: u64,
    /// Ranks with a summary of the step.
    pub ranks: u32,
    /// The rank with the highest root index in the step, else the highest index (`-1`: none
    /// above 0).
    pub top_rank: i64,
}

/// One rank's explanation (its straggler summary), for the drill-down.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankDetail {
    /// Position in [`ReportModel::ranks`].
    pub pos: u32,
    /// Multi-step index (mean over complete steps).
    pub index: f64,
    pub max_index: f64,
    pub complete_steps: u64,
    pub steps_over: u64,
    /// Root-cause index (mean), own excess (% of the step), what fixing it saves (%), and the
    /// chain that explains it (issue 17).
    #[serde(default)]
    pub root_index: f64,
    #[serde(default)]
    pub root_delay: f64,
    #[serde(default)]
    pub saves_pct: f64,
    #[serde(default)]
    pub root_steps_over: u64,
    #[serde(default)]
    pub chain: String,
    /// `[rank, wait_us, steps]`: who this rank waited for.
    pub causes: Vec<[i64; 3]>,
    /// `[rank, wait_us, steps]`: who this rank made wait.
    pub victims: Vec<[i64; 3]>,
    /// `compute-slow`, `comm-slow`, `cpu-starved`, `blocked-io`, `link-errors`, `retransmits`,
    /// `gpu-throttled`, `nvlink-errors`, `structural` or `none`.
    pub class: String,
    pub reason: String,
    /// Host context over its analysed steps (issue 19): its main thread's time shares, and its
    /// TCP retransmits with the connections that had most; empty without host streams.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_cpu: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_tcp: String,
    /// The errors and link-downs of the ports under its traffic; empty when none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_links: String,
    /// Its GPUs (issue 20): clocks held down, NVLink errors, XIDs; empty without GPU samples.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_gpu: String,
}

/// One operation of one rank in one step: `[func, comm (index into ReportModel::comms, -1
/// unknown), seq, start offset from the job's step start µs, duration µs, bytes]`; `func` is an
/// index into [`ReportModel::funcs`].
pub type OpRow = [i64; 6];

/// The ops of one rank in one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOps {
    pub step: u64,
    pub ops: Vec<OpRow>,
    /// Ops of the step left out (over the per-step cap).
    pub dropped: u64,
}

/// Op detail of one (top) rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankOps {
    pub rank: i64,
    pub steps: Vec<StepOps>,
}

/// The stacks of one process of a verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStacks {
    pub rank: i64,
    /// A source rank of the verdict (else a waiter).
    pub source: bool,
    pub proc_state: Option<ProcState>,
    pub stacks: ProcessStacks,
}

/// One hang / failure / mismatch verdict, bounded for the page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerdictView {
    pub kind: VerdictKind,
    pub source_ranks: Vec<i64>,
    pub comm: VerdictComm,
    pub func: String,
    pub seq: u64,
    pub entered: usize,
    pub absent: usize,
    /// The first absent ranks (at most [`super::gather::MAX_LISTED`]).
    pub absent_ranks: Vec<i64>,
    pub chain: Vec<ChainLink>,
    /// Links of the chain left out.
    pub chain_dropped: usize,
    pub since_us: u64,
    pub stacks: Vec<RankStacks>,
}

/// The hang analysis of the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangView {
    pub verdicts: Vec<VerdictView>,
    /// Stalls the job survived.
    pub resolved: usize,
}

/// Expert-parallel views (when the input carries them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpMatrices {
    /// Traffic matrices: a title and `bytes[src][dst]` over the EP group's ranks.
    pub matrices: Vec<EpMatrix>,
    /// MoE EP wait matrices (DeepEP / MC2 counters, DeepXTrace's detector): per EP group and
    /// phase, the window to look at.
    #[serde(default)]
    pub waits: Vec<EpWaitView>,
    /// One line per window with a finding or missing a rank (the first [`MAX_EP_LINES`]).
    #[serde(default)]
    pub lines: Vec<String>,
    /// Windows analysed, and those with a finding or missing a rank.
    #[serde(default)]
    pub windows: u64,
    #[serde(default)]
    pub findings: u64,
}

/// Lines of windows with findings a report lists.
pub const MAX_EP_LINES: usize = 200;

/// One EP group's wait matrix in one window (the strongest finding's, else the latest).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpWaitView {
    /// What the window said, in one line.
    pub title: String,
    pub phase: String,
    pub window_seq: u64,
    /// `ratio[waiter][peer]`: the cell over the mean cell (DeepXTrace's point ratio), tenths.
    pub ratio: Vec<Vec<u32>>,
    /// Flagged columns (slow senders), rows (slow receivers) and cells `[waiter, peer]`.
    pub senders: Vec<usize>,
    pub receivers: Vec<usize>,
    pub paths: Vec<[usize; 2]>,
}

/// One EP traffic matrix.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpMatrix {
    pub title: String,
    /// Global ranks of the rows / columns.
    pub ranks: Vec<i64>,
    pub bytes: Vec<Vec<u64>>,
}

/// A step range worth a Perfetto trace, with the command that writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceLink {
    /// Why this range (e.g. "slowest step 7").
    pub label: String,
    pub first: u64,
    pub last: u64,
    /// `--ranks` value (`None`: every rank).
    pub ranks: Option<String>,
    /// The exact shell command.
    pub command: String,
}

/// A top straggler in the summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopStraggler {
    pub rank: i64,
    pub host: String,
    pub index: f64,
    #[serde(default)]
    pub root_index: f64,
    #[serde(default)]
    pub saves_pct: f64,
    #[serde(default)]
    pub chain: String,
    pub class: String,
    pub reason: String,
}

/// The job summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median_step_us: f64,
    pub p95_step_us: f64,
    /// Stragglers by the root-cause rule, highest root index first (at most 5); empty when none.
    pub top: Vec<TopStraggler>,
    /// The highest rank (root index, then index) even when below the threshold.
    pub highest: Option<TopStraggler>,
    pub hang_verdicts: usize,
}

/// Everything the page shows for one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportModel {
    pub version: u32,
    pub job: String,
    /// The input directory as given (used in the commands shown).
    pub source: String,
    /// `comminsight-agent <version>`.
    pub generator: String,
    pub world: u32,
    pub grid: GridView,
    pub grid_confidence: f64,
    /// `name vN` of the step template, when one matched.
    pub template: Option<String>,
    /// Step numbers are calibrated (the job's saved calibration was applied).
    pub calibrated: bool,
    /// The seed index threshold.
    pub threshold: f64,
    /// The root-cause rule: root index above `root_threshold` with an own excess above
    /// `root_min_delay` (% of the step).
    #[serde(default)]
    pub root_threshold: f64,
    #[serde(default)]
    pub root_min_delay: f64,
    pub summary: Summary,
    pub step_stats: Vec<StepStat>,
    /// Global ranks, ascending; every per-rank array below is indexed like this one.
    pub ranks: Vec<i64>,
    /// Host names; `rank_host[i]` indexes this.
    pub hosts: Vec<String>,
    pub rank_host: Vec<u32>,
    /// Grid coordinates per rank.
    pub coords: Vec<Coord>,
    /// The coordinates were derived from rank numbers (no communicator told them).
    pub coords_guessed: bool,
    /// Multi-step index per rank ([`Tenths`]).
    pub index: Vec<Tenths>,
    /// Per step (like `step_stats`), per rank ([`Tenths`], -1: no summary).
    pub step_index: Vec<Vec<Tenths>>,
    /// The same two for the root-cause index (what the heatmap shows first).
    #[serde(default)]
    pub root_index: Vec<Tenths>,
    #[serde(default)]
    pub step_root_index: Vec<Vec<Tenths>>,
    /// Straggler details of the ranks with something to explain (index, causes or victims).
    pub details: Vec<RankDetail>,
    pub comms: Vec<CommInfo>,
    /// Function names indexed by [`OpRow`]'s first field.
    pub funcs: Vec<String>,
    /// Op detail of the top ranks only.
    pub ops: Vec<RankOps>,
    /// What `ops` covers, one sentence for the page.
    pub ops_note: String,
    pub hang: Option<HangView>,
    pub ep: Option<EpMatrices>,
    pub traces: Vec<TraceLink>,
    /// Anything the gathering could not do (shown on the page).
    pub notes: Vec<String>,
}

//! Kineto / Chrome JSON traces (`torch.profiler`, plain or gzip), read as a stream: the
//! `traceEvents` array is visited one event at a time and only NCCL kernels (a few dozen bytes
//! each) and `ProfilerStep#N` ranges are kept, so a multi-GB trace is never held in memory.
//!
//! What becomes a record (one stream per file, marked `SOURCE_KINETO`):
//!
//! * every GPU kernel whose name starts with `ncclKernel_` / `ncclDevKernel_` (cat `kernel`):
//!   a `coll` record, or `p2p` for Send / Recv / SendRecv (peer -1: Kineto does not say it).
//!   Function from `args["Collective name"]`, else the kernel name; data type from
//!   `args["dtype"]`, else the kernel name; count from `"In msg nelems"` (0 when absent).
//!   Times: absolute start = `ts` × 1000 + `baseTimeNanoseconds` (0 when absent: older traces
//!   are epoch µs); end = start + `dur`; timing `kernel_gpu`, one channel.
//! * communicators: a kernel with `"Process Group Name"` belongs to that process group:
//!   `comm_hash` = FNV-1a 64 of `"kineto:pg:" + name`, `nranks` = length of
//!   `"Process Group Ranks"` (else `"Group size"`), rank = the file's rank's index in those
//!   ranks (else -1), `comm_name` = `"{description}:{name}"` (PyTorch's own `commName` form, so
//!   roles come from the description). A kernel without it (older traces) belongs to its CUDA
//!   stream: `comm_hash` = FNV-1a 64 of `"kineto:stream:" + stream id` — the device is left
//!   out so that the ranks of one job, each on its own device, that issue a group's kernels on
//!   the same stream id share the communicator — `nranks` = `distributedInfo.world_size`, rank
//!   = the file's rank, `comm_name` = `"stream<id>"` (no role). This is a guess: two process
//!   groups on one stream are one communicator here.
//! * `coll_sn`: 0-based per (communicator, function) in start order; `coll_local_sn` per file.
//!
//! `ProfilerStep#N` ranges are returned as [`StepTruth`] (ground truth for tests and reports)
//! and never written as records.
//!
//! The stream's identity: host = `distributedInfo.hostname` if any, else `rank<R>`; pid = the
//! OS pid of the CPU-side `ProfilerStep` annotations when plausible (Kineto's GPU events carry
//! the device index as `pid`, which is not a process id: it is used only when it is ≥ 1024),
//! else the rank.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use comminsight_wire::names::{Algo, DataType, Func, Proto};
use serde::de::DeserializeSeed;

use crate::{ImportError, ImportSummary, Skips};

mod loose;
mod names;
mod parse;
mod write;

#[cfg(test)]
pub(crate) mod tests;

/// Most process-group members read from one `"Process Group Ranks"`.
const MAX_PG_RANKS: usize = 1 << 20;
/// Most communicators one file may define.
const MAX_COMMS: usize = 1 << 16;
/// Most `ProfilerStep` ranges kept from one file.
const MAX_STEPS: usize = 1 << 22;
/// Progress is reported at most this often (input bytes).
const PROGRESS_EVERY: u64 = 8 << 20;
/// Buffer under the JSON reader.
const BUF_BYTES: usize = 256 << 10;

/// One `ProfilerStep#N` range: ground truth of a step, never a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTruth {
    /// The trace file it was read from.
    pub file: PathBuf,
    /// `distributedInfo.rank`, -1 when absent.
    pub rank: i32,
    /// N of `ProfilerStep#N`.
    pub step: u64,
    /// `"cpu"` (`user_annotation`) or `"gpu"` (`gpu_user_annotation`).
    pub track: String,
    /// Absolute start, ns since the epoch.
    pub start_ns: u64,
    /// Absolute end, ns since the epoch.
    pub end_ns: u64,
}

/// The communicator a kernel belongs to, as the trace names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommKey {
    /// A PyTorch process group (`"Process Group Name"` and the fields beside it).
    Pg {
        name: String,
        desc: String,
        ranks: Option<Vec<i64>>,
        size: Option<u64>,
    },
    /// A CUDA stream (traces without process-group metadata).
    Stream { stream: i64, device: i32 },
}

/// One NCCL kernel, compact. Times are relative to `baseTimeNanoseconds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// `ts` in ns (before `baseTimeNanoseconds` is added).
    pub start: i128,
    /// `dur` in ns.
    pub dur: u64,
    /// `"In msg nelems"`, 0 when absent.
    pub count: u64,
    /// Index into [`KinetoTrace::comms`].
    pub comm: u32,
    /// CUDA device, -1 when absent.
    pub device: i32,
    pub func: Func,
    pub dtype: DataType,
    pub algo: Algo,
    pub proto: Proto,
}

/// One `ProfilerStep#N` event, times relative to `baseTimeNanoseconds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRange {
    pub step: u64,
    /// From `gpu_user_annotation`.
    pub gpu: bool,
    /// `ts` in ns.
    pub start: i128,
    /// `dur` in ns.
    pub dur: u64,
}

/// What was kept of one trace.
#[derive(Clone, Debug, Default)]
pub struct KinetoTrace {
    /// The file read.
    pub path: PathBuf,
    /// `distributedInfo.rank`, -1 when absent.
    pub rank: i32,
    /// `distributedInfo.world_size`, -1 when absent.
    pub world: i32,
    /// `distributedInfo.hostname`, when present.
    pub hostname: Option<String>,
    /// `baseTimeNanoseconds`, when present (it may follow `traceEvents`).
    pub base_ns: Option<u64>,
    /// NCCL kernels in file order.
    pub kernels: Vec<Kernel>,
    /// Communicators, indexed by [`Kernel::comm`].
    pub comms: Vec<CommKey>,
    /// `ProfilerStep#N` ranges in file order.
    pub steps: Vec<StepRange>,
    /// `pid` of the first NCCL kernel (Kineto: the device index).
    pub gpu_pid: Option<i64>,
    /// `pid` of the first CPU-side `ProfilerStep` (the OS pid).
    pub cpu_pid: Option<i64>,
    /// Events visited.
    pub events: u64,
    /// Whether a `traceEvents` key was seen.
    pub has_events: bool,
    /// What was skipped, by reason.
    pub skips: Skips,
    /// Input bytes read when the JSON broke off, for a truncated or corrupt file.
    pub truncated_at: Option<u64>,
    /// `schemaVersion` (Kineto has written 1 so far; -1: not a number).
    pub schema_version: Option<i64>,
}

impl KinetoTrace {
    fn new(path: &Path) -> KinetoTrace {
        KinetoTrace {
            path: path.to_path_buf(),
            rank: -1,
            world: -1,
            ..KinetoTrace::default()
        }
    }

    /// `ns` (relative) made absolute, when it lies in 0 .. 2⁶² ns.
    pub fn absolute(&self, ns: i128) -> Option<u64> {
        let abs = ns.checked_add(i128::from(self.base_ns.unwrap_or(0)))?;
        u64::try_from(abs)
            .ok()
            .filter(|v| *v < comminsight_wire::bounds::MAX_TIME_NS)
    }

    /// The step ranges as [`StepTruth`], in file order (ranges outside 0 .. 2⁶² ns left out).
    pub fn step_truths(&self) -> Vec<StepTruth> {
        self.steps
            .iter()
            .filter_map(|s| {
                let start = self.absolute(s.start)?;
                let end = self.absolute(s.start + i128::from(s.dur))?;
                Some(StepTruth {
                    file: self.path.clone(),
                    rank: self.rank,
                    step: s.step,
                    track: if s.gpu { "gpu" } else { "cpu" }.to_string(),
                    start_ns: start,
                    end_ns: end,
                })
            })
            .collect()
    }
}

/// FNV-1a, 64 bits: the stable hash of imported communicator keys.
pub fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A reader that counts the bytes it hands out and reports them every [`PROGRESS_EVERY`].
struct Counting<'p, R> {
    inner: R,
    n: u64,
    reported: u64,
    progress: &'p mut dyn FnMut(u64),
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n += k as u64;
        if self.n - self.reported >= PROGRESS_EVERY {
            self.reported = self.n;
            (self.progress)(self.n);
        }
        Ok(k)
    }
}

/// Read a trace (plain or gzip JSON) from `r`; `path` names it in errors and results.
pub fn parse_reader<R: Read>(r: R, path: &Path) -> Result<KinetoTrace, ImportError> {
    let mut nop = |_: u64| {};
    let mut c = Counting {
        inner: r,
        n: 0,
        reported: 0,
        progress: &mut nop,
    };
    parse_counted(&mut c, path)
}

fn parse_counted<R: Read>(
    c: &mut Counting<'_, R>,
    path: &Path,
) -> Result<KinetoTrace, ImportError> {
    let mut trace = KinetoTrace::new(path);
    let res = {
        let mut br = BufReader::with_capacity(BUF_BYTES, &mut *c);
        let gz = br
            .fill_buf()
            .map_err(|e| ImportError::io(path, e))?
            .starts_with(&[0x1f, 0x8b]);
        let src: Box<dyn Read + '_> = if gz {
            Box::new(BufReader::with_capacity(
                BUF_BYTES,
                flate2::read::MultiGzDecoder::new(br),
            ))
        } else {
            Box::new(br)
        };
        let mut de = serde_json::Deserializer::from_reader(src);
        let mut col = parse::Collector {
            trace: &mut trace,
            comm_index: HashMap::new(),
        };
        parse::TopSeed(&mut col)
            .deserialize(&mut de)
            .and_then(|()| de.end())
    };
    if let Some(v) = trace.schema_version.filter(|v| *v != 1) {
        return Err(ImportError::Version {
            path: path.to_path_buf(),
            what: "Kineto schemaVersion",
            version: v.to_string(),
            supported: "1",
        });
    }
    match res {
        Ok(()) if !trace.has_events => Err(ImportError::format(
            path,
            "no \"traceEvents\" array: not a Kineto / Chrome trace",
        )),
        Ok(()) => Ok(trace),
        Err(e) if trace.kernels.is_empty() => Err(ImportError::format(
            path,
            format!(
                "not a readable Kineto trace: {e} (after byte {} of the file, before any NCCL kernel)",
                c.n
            ),
        )),
        Err(_) => {
            trace
                .skips
                .add(&format!("truncated or corrupt JSON after byte {}", c.n), 1);
            trace.truncated_at = Some(c.n);
            Ok(trace)
        }
    }
}

/// Import one Kineto trace into `<out>/<job>/<host>/<pid>/`; returns what was written and the
/// trace's `ProfilerStep` ranges (which are not written). `progress` gets the input bytes read
/// so far, at most every 8 MiB and once at the end.
pub fn import_file(
    path: &Path,
    job: &str,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<(ImportSummary, Vec<StepTruth>), ImportError> {
    let f = std::fs::File::open(path).map_err(|e| ImportError::io(path, e))?;
    let mut c = Counting {
        inner: f,
        n: 0,
        reported: 0,
        progress: &mut *progress,
    };
    let trace = parse_counted(&mut c, path)?;
    let total = c.n;
    progress(total);
    let summary = write::write_trace(&trace, job, out)?;
    Ok((summary, trace.step_truths()))
}

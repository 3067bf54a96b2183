//! From segments to a trace: steps first (the step engine over the whole job, the same code and
//! numbering as `steps`), then each selected rank's operations from the segments the time index
//! says overlap its window, one rank at a time.
//!
//! Layout: one process track per host, one thread track per rank ("rank N"). On a rank's track
//! slices nest step -> phase (the template's phase labels, when it has phase rules) -> op; an op
//! that starts before its phase, crosses a phase boundary or overlaps the rank's previous op
//! (asynchronous operations on several streams) cannot nest there and goes to the rank's child
//! track "rank N · async K" instead (the first of them where it does not overlap another op), so
//! every track is properly nested. All slices of one matched instance (a collective's
//! `(comm, func, coll_sn)` on every member, a P2P send and its receive) carry the same flow id,
//! [`flow_id`]; instances seen on one rank only in the window get none.
//!
//! Network: a rank whose segments hold `net` records (the net plugin's transfers) gets a
//! counter track "rank N · NIC" with its throughput (GB/s per [`NET_BUCKET_US`]). No NVLink
//! source exists in the record format yet, so there is no NVLink counter.
//!
//! Memory: the step summaries of one rank at a time, the selected operations of one rank, and
//! one flow-key counter per instance in the window (a first pass over the same segments).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use comminsight_wire::record::Body;
use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::index::{self, observe_clock, IndexStats, StreamEntry};
use super::writer::{ArgValue, TraceWriter};
use super::TraceError;
use crate::clock::align;
use crate::steps::calibrate::Calibration;
use crate::steps::fsm::StepSummary;
use crate::steps::journal::{self, StepJournal};
use crate::steps::offline::{decisions, steps_pass, topology};
use crate::steps::phase::{spans, PhaseRule};
use crate::steps::template::TemplateSet;
use crate::steps::StepOp;

/// Which part of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Window {
    /// These step numbers (both included; calibrated when the job has a saved calibration, as
    /// `steps` shows them).
    Steps(RangeInclusive<u64>),
    /// Steps and operations that overlap `[t0, t1]`, µs on the aligned job timeline (realtime
    /// µs since the epoch).
    Time(u64, u64),
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub window: Window,
    /// Only these ranks (all when `None`).
    pub ranks: Option<Vec<RangeInclusive<i64>>>,
    /// The job (required when the input has several).
    pub job: Option<String>,
    /// Step templates from this directory instead of the built-in ones.
    pub templates: Option<PathBuf>,
}

/// What was written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSummary {
    pub job: String,
    pub hosts: usize,
    pub ranks: usize,
    pub packets: u64,
    pub bytes: u64,
    pub step_slices: u64,
    pub phase_slices: u64,
    pub op_slices: u64,
    /// Op slices on the "async" child tracks (they overlapped the rank's other ops).
    pub async_op_slices: u64,
    /// Counter values written (network throughput, from `net` records).
    pub counter_values: u64,
    /// Flow ids written (matched instances seen on at least two ranks).
    pub flows: u64,
    /// The window actually covered (µs, aligned).
    pub from_us: u64,
    pub to_us: u64,
    /// Segment files read for the operations, and those of the selected ranks.
    pub segments_read: usize,
    pub segments_total: usize,
    pub index: IndexStats,
}

impl TraceSummary {
    /// Trace bytes per op slice.
    pub fn bytes_per_op(&self) -> f64 {
        if self.op_slices == 0 {
            0.0
        } else {
            self.bytes as f64 / self.op_slices as f64
        }
    }
}

/// NCCL's bus-bandwidth factor (nccl-tests PERFORMANCE.md) of `func` on `n` ranks: busbw =
/// algbw × factor.
pub fn busbw_factor(func: Func, n: u32) -> f64 {
    let n = f64::from(n.max(1));
    match func {
        Func::ALL_REDUCE => 2.0 * (n - 1.0) / n,
        Func::ALL_GATHER | Func::REDUCE_SCATTER | Func::ALL_TO_ALL => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// FNV-1a over 64-bit words.
fn fnv(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The flow id of an operation's matched instance: collectives by `(comm, func, coll_sn)`, P2P
/// by `(comm, sender, receiver, ordinal)` (communicator ranks; `coll_sn` is the ordinal per
/// (comm, peer, func), so the n-th send to a peer meets its n-th receive from it).
pub fn flow_id(p2p: bool, comm: u64, func: Func, coll_sn: u64, rank: i32, peer: i32) -> u64 {
    if !p2p {
        return fnv(&[0, comm, u64::from(func.0), coll_sn]);
    }
    let (src, dst) = match func {
        Func::RECV => (peer, rank),
        Func::SEND => (rank, peer),
        _ => (rank.min(peer), rank.max(peer)),
    };
    fnv(&[1, comm, src as u64, dst as u64, coll_sn])
}

/// One operation of a rank, aligned (µs).
#[derive(Clone, Debug)]
struct Op {
    start_us: u64,
    end_us: u64,
    lsn: u64,
    comm: u64,
    func: Func,
    coll_sn: u64,
    bytes: u64,
    count: u64,
    algo: &'static str,
    proto: &'static str,
    p2p: bool,
    rank: i32,
    peer: i32,
}

impl Op {
    fn key(&self) -> (u64, u64) {
        (self.start_us, self.lsn)
    }
    fn flow(&self) -> u64 {
        flow_id(
            self.p2p,
            self.comm,
            self.func,
            self.coll_sn,
            self.rank,
            self.peer,
        )
    }
}

/// A selected step of a rank.
#[derive(Clone, Debug)]
struct Sel {
    step: u64,
    s: StepSummary,
    first: (u64, u64),
    last: (u64, u64),
    start_us: u64,
    end_us: u64,
    merged: bool,
}

/// A rank to draw.
struct RankPlan<'a> {
    stream: &'a StreamEntry,
    rank: i64,
    steps: Vec<Sel>,
    /// Operations by start (µs) in [w0, w1] are read.
    w0: u64,
    w1: u64,
}

/// The job's per-job facts the drawing needs.
struct JobCtx {
    /// Per communicator: role, size, name (empty when unnamed).
    roles: HashMap<u64, (Option<Role>, u32, String)>,
    phases: Vec<PhaseRule>,
    window: Window,
}

/// Removes a scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> TraceError + '_ {
    move |e| TraceError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Write the trace of `opts.window` of the job under `dir` to `out` (streamed).
pub fn write_trace<W: Write>(
    dir: &Path,
    opts: &TraceOptions,
    out: W,
) -> Result<TraceSummary, TraceError> {
    let templates = match &opts.templates {
        Some(d) => TemplateSet::load_dir(d)?,
        None => TemplateSet::builtin(),
    };
    // Steps: the step engine over the whole job (as `steps`), into a scratch journal.
    let scratch = Scratch(crate::replay::scratch_dir("trace"));
    let topo = topology(dir, &scratch.0)?;
    let dec = decisions(&topo, &templates);
    let mut journal = StepJournal::new(&scratch.0.join("steps"));
    let jobs = steps_pass(
        dir,
        &scratch.0,
        dec.clone(),
        &templates,
        &crate::steps::engine::StepSettings::default(),
        &mut journal,
    )?;
    let known = jobs
        .iter()
        .map(|j| j.job.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let job = match &opts.job {
        Some(j) => jobs
            .iter()
            .find(|x| &x.job == j)
            .ok_or_else(|| TraceError::NoJob {
                path: dir.to_path_buf(),
                job: j.clone(),
                known: known.clone(),
            })?,
        None if jobs.len() == 1 => &jobs[0],
        None => {
            return Err(TraceError::SeveralJobs {
                path: dir.to_path_buf(),
                known,
            })
        }
    };
    let Some(tref) = &job.template else {
        return Err(TraceError::NoTemplate {
            job: job.job.clone(),
            features: job.features.join(", "),
        });
    };
    let phases = templates
        .templates
        .iter()
        .find(|t| t.name == tref.name && t.version == tref.version)
        .map(|t| t.phases.clone())
        .unwrap_or_default();
    let mut roles = HashMap::new();
    if let Some(obs) = topo.jobs().get(&job.job) {
        for c in crate::roles::infer(&job.job, obs).comms {
            roles.insert(c.hash, (c.role, c.nranks, c.name));
        }
    }
    if let Some(d) = dec.get(&job.job) {
        for (h, r) in roles.iter_mut() {
            r.0 = r.0.or(d.role(*h));
        }
    }
    let cal = load_calibration(dir)?.and_then(|mut m| m.remove(&job.job));
    let ctx = JobCtx {
        roles,
        phases,
        window: opts.window.clone(),
    };

    // The ranks to draw and their steps.
    let (idx, istats) = index::load_or_build(dir)?;
    let mut plans: Vec<RankPlan> = Vec::new();
    let mut have: (Option<u64>, Option<u64>) = (None, None);
    for st in idx.streams.iter().filter(|s| s.job == job.job) {
        if opts
            .ranks
            .as_ref()
            .is_some_and(|rs| !rs.iter().any(|r| r.contains(&st.rank)))
        {
            continue;
        }
        let path = journal::stream_path(&scratch.0.join("steps"), &st.id());
        let summaries = match journal::read_stream(&path) {
            Ok(v) => v,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let mut steps = Vec::new();
        for s in summaries {
            let step = cal.as_ref().map_or(s.step, |c| c.step(s.rank, s.step));
            have.0 = Some(have.0.map_or(step, |x| x.min(step)));
            have.1 = Some(have.1.map_or(step, |x| x.max(step)));
            let start_us = s.first.start_us;
            let end_us = start_us + s.duration_us;
            let keep = match &ctx.window {
                Window::Steps(r) => r.contains(&step),
                Window::Time(t0, t1) => start_us <= *t1 && end_us >= *t0,
            };
            if keep {
                steps.push(Sel {
                    step,
                    first: (s.first.start_us, s.first.coll_local_sn),
                    last: (s.last.start_us, s.last.coll_local_sn),
                    start_us,
                    end_us,
                    merged: cal.as_ref().is_some_and(|c| c.is_merged(s.rank, s.step)),
                    s,
                });
            }
        }
        steps.sort_by_key(|x| x.first);
        let (w0, w1) = match &ctx.window {
            Window::Steps(_) => match (steps.first(), steps.last()) {
                (Some(a), Some(b)) => (a.first.0, b.last.0),
                _ => continue,
            },
            Window::Time(t0, t1) => (
                steps.first().map_or(*t0, |a| a.first.0.min(*t0)),
                steps.last().map_or(*t1, |b| b.last.0.max(*t1)),
            ),
        };
        plans.push(RankPlan {
            stream: st,
            rank: st.rank,
            steps,
            w0,
            w1,
        });
    }
    if plans.iter().all(|p| p.steps.is_empty()) {
        let what = match &ctx.window {
            Window::Steps(r) => format!("--steps {}..{}", r.start(), r.end()),
            Window::Time(a, b) => format!("--time {a}..{b}"),
        };
        return Err(TraceError::EmptyWindow {
            path: dir.to_path_buf(),
            job: job.job.clone(),
            what,
            have: match have {
                (Some(a), Some(b)) => format!("{a}..{b}"),
                _ => "none".into(),
            },
        });
    }
    plans.sort_by_key(|p| (p.rank, p.stream.pid.clone()));

    // Pass 1: which instances are seen on two ranks or more (they get a flow).
    let mut seen: HashMap<u64, (i64, bool)> = HashMap::new();
    let mut summary = TraceSummary {
        job: job.job.clone(),
        index: istats,
        ..Default::default()
    };
    for p in &plans {
        summary.segments_total += p.stream.segments.len();
        for op in rank_ops(dir, p, &ctx, &mut summary.segments_read)?.0 {
            let e = seen.entry(op.1.flow()).or_insert((p.rank, false));
            e.1 |= e.0 != p.rank;
        }
    }
    seen.retain(|_, v| v.1);
    summary.flows = seen.len() as u64;

    // Tracks.
    let mut w = TraceWriter::new(out);
    let hosts: Vec<String> = {
        let mut h: Vec<String> = plans.iter().map(|p| p.stream.host.clone()).collect();
        h.sort();
        h.dedup();
        h
    };
    let out_io = |e: std::io::Error| TraceError::Io {
        path: PathBuf::from("<trace output>"),
        message: e.to_string(),
    };
    for (i, h) in hosts.iter().enumerate() {
        w.process_track(host_uuid(i), host_pid(i), h)
            .map_err(out_io)?;
    }
    for p in &plans {
        let hi = hosts.iter().position(|h| *h == p.stream.host).unwrap_or(0);
        w.thread_track(
            rank_uuid(p.rank),
            host_uuid(hi),
            host_pid(hi),
            rank_tid(p.rank),
            &format!("rank {}", p.rank),
        )
        .map_err(out_io)?;
    }
    summary.hosts = hosts.len();
    summary.ranks = plans.len();
    summary.from_us = u64::MAX;

    // Pass 2: slices, one rank at a time.
    let mut reads = 0;
    for p in &plans {
        let (ops, net) = rank_ops(dir, p, &ctx, &mut reads)?;
        let mut d = Drawer {
            w: &mut w,
            rank: p.rank,
            lanes: Vec::new(),
            flows: &seen,
            ctx: &ctx,
            sum: &mut summary,
        };
        d.rank_slices(p, ops).map_err(out_io)?;
        d.net_counter(&net).map_err(out_io)?;
    }
    if summary.from_us == u64::MAX {
        summary.from_us = 0;
    }
    summary.packets = w.packets();
    summary.bytes = w.bytes();
    w.finish().map_err(out_io)?;
    Ok(summary)
}

// Track uuids: ranks get the small ones (every slice event names its track: 1 to 3 bytes).
const HOST_UUID: u64 = 1 << 48;
const LANE_UUID: u64 = 2 << 48;
const NET_UUID: u64 = 3 << 48;

fn host_uuid(i: usize) -> u64 {
    HOST_UUID + i as u64
}
/// Host "process" ids: far above the rank thread ids (`rank + 1`).
fn host_pid(i: usize) -> i32 {
    1_000_000_000 + i as i32
}
fn rank_uuid(rank: i64) -> u64 {
    rank.rem_euclid(1 << 40) as u64 + 1
}
fn rank_tid(rank: i64) -> i32 {
    (rank.rem_euclid(1 << 30) + 1) as i32
}
fn lane_uuid(rank: i64, k: usize) -> u64 {
    LANE_UUID + (rank.rem_euclid(1 << 32) as u64) * 4096 + k as u64
}

fn load_calibration(dir: &Path) -> Result<Option<BTreeMap<String, Calibration>>, TraceError> {
    let path = dir.join(".comminsight").join("steps-calibration.json");
    if !path.is_file() {
        return Ok(None);
    }
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| TraceError::Io {
                path,
                message: format!(
                    "not a calibration ({e}); run `steps --calibrate clear` or `--calibrate apply` again"
                ),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// A rank's operations, each with the index of its selected step.
type RankOps = Vec<(Option<usize>, Op)>;

/// The rank's operations in its window, by `(start, lsn)`: each with the index of its selected
/// step (`None`: in no selected step; kept only for a time window, when it overlaps it); and
/// its network transfers there (`net` records: end µs, bytes).
fn rank_ops(
    dir: &Path,
    p: &RankPlan,
    ctx: &JobCtx,
    reads: &mut usize,
) -> Result<(RankOps, Vec<(u64, u64)>), TraceError> {
    let mut out = Vec::new();
    let mut net = Vec::new();
    let net_end = p
        .steps
        .iter()
        .map(|s| s.end_us)
        .max()
        .unwrap_or(0)
        .max(p.w1);
    for seg in &p.stream.segments {
        let (Some(lo), Some(hi)) = (seg.first_us, seg.last_us) else {
            continue;
        };
        if hi < p.w0 || lo > p.w1 {
            continue;
        }
        *reads += 1;
        let mut clock = seg.clock.clone();
        for rec in index::segment_records(&dir.join(&seg.path))? {
            observe_clock(&mut clock, &rec);
            let a = align(&clock, None);
            if let Body::Net(n) = &rec.body {
                let end_us = a.apply(n.end_ns) / 1000;
                if n.end_ns != 0 && (p.w0..=net_end).contains(&end_us) {
                    net.push((end_us, n.length));
                }
                continue;
            }
            let (Body::Coll(o) | Body::P2p(o)) = &rec.body else {
                continue;
            };
            let start_us = a.apply(o.start_ns) / 1000;
            let end_us = (a.apply(o.end_ns) / 1000).max(start_us);
            let key = (start_us, o.coll_local_sn);
            let step = p
                .steps
                .partition_point(|s| s.first <= key)
                .checked_sub(1)
                .filter(|&i| key <= p.steps[i].last);
            let keep = match (&ctx.window, step) {
                (_, Some(_)) => true,
                (Window::Steps(_), None) => false,
                (Window::Time(t0, t1), None) => start_us <= *t1 && end_us >= *t0,
            };
            if !keep {
                continue;
            }
            out.push((
                step,
                Op {
                    start_us,
                    end_us,
                    lsn: o.coll_local_sn,
                    comm: o.comm_hash,
                    func: o.func,
                    coll_sn: o.coll_sn,
                    bytes: o.bytes,
                    count: o.count,
                    algo: o.algo.name(),
                    proto: o.proto.name(),
                    p2p: matches!(rec.body, Body::P2p(_)),
                    rank: o.rank,
                    peer: o.peer,
                },
            ));
        }
    }
    out.sort_by_key(|(_, o)| o.key());
    Ok((out, net))
}

/// Width of the network counter's buckets, µs.
pub const NET_BUCKET_US: u64 = 1_000;

/// Network throughput from transfers `(end µs, bytes)`: per [`NET_BUCKET_US`] bucket with
/// traffic, `(bucket start µs, GB/s)`, and a 0 after each run of busy buckets (the counter
/// drops back between them). A transfer counts in the bucket where it completed.
pub fn net_rate(samples: &[(u64, u64)]) -> Vec<(u64, f64)> {
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    for (end, bytes) in samples {
        *buckets.entry(end / NET_BUCKET_US).or_default() += bytes;
    }
    let mut out = Vec::new();
    let mut prev: Option<u64> = None;
    for (b, bytes) in buckets {
        if prev.is_some_and(|p| p + 1 != b) {
            out.push(((prev.expect("checked") + 1) * NET_BUCKET_US, 0.0));
        }
        // bytes per bucket / (bucket µs × 1000 ns) = bytes/ns = GB/s.
        out.push((
            b * NET_BUCKET_US,
            bytes as f64 / (NET_BUCKET_US as f64 * 1000.0),
        ));
        prev = Some(b);
    }
    if let Some(p) = prev {
        out.push(((p + 1) * NET_BUCKET_US, 0.0));
    }
    out
}

/// Draws one rank's slices.
struct Drawer<'a, W: Write> {
    w: &'a mut TraceWriter<W>,
    rank: i64,
    /// Per async lane: the end of its last op (µs).
    lanes: Vec<u64>,
    flows: &'a HashMap<u64, (i64, bool)>,
    ctx: &'a JobCtx,
    sum: &'a mut TraceSummary,
}

/// A slice on the rank's main track inside a step: a phase with its ops, or an op directly
/// under the step.
enum Item {
    Phase(usize, Vec<Op>),
    Op(Op),
}

impl<W: Write> Drawer<'_, W> {
    /// The rank's "NIC" counter track (GB/s, from its `net` records), when it has any.
    fn net_counter(&mut self, samples: &[(u64, u64)]) -> std::io::Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        let uuid = NET_UUID + rank_uuid(self.rank);
        self.w.counter_track(
            uuid,
            rank_uuid(self.rank),
            &format!("rank {} · NIC", self.rank),
            "GB/s",
        )?;
        for (t, v) in net_rate(samples) {
            self.w.counter(uuid, t * 1000, v)?;
            self.sum.counter_values += 1;
        }
        Ok(())
    }

    fn rank_slices(&mut self, p: &RankPlan, ops: RankOps) -> std::io::Result<()> {
        let mut cur: Option<(usize, Vec<Op>)> = None;
        for (step, op) in ops {
            if cur.as_ref().is_some_and(|(i, _)| Some(*i) != step) {
                let (i, v) = cur.take().expect("checked");
                self.step(&p.steps[i], v)?;
            }
            match step {
                Some(i) => cur.get_or_insert_with(|| (i, Vec::new())).1.push(op),
                None => self.lane_op(&op)?,
            }
        }
        if let Some((i, v)) = cur {
            self.step(&p.steps[i], v)?;
        }
        Ok(())
    }

    fn op_slice(&mut self, track: u64, op: &Op) -> std::io::Result<()> {
        let (role, n, name) = self
            .ctx
            .roles
            .get(&op.comm)
            .map_or((None, 0, ""), |(r, n, name)| (*r, *n, name.as_str()));
        let dur_us = op.end_us - op.start_us;
        let mut args: Vec<(&'static str, ArgValue)> = vec![
            (
                "role",
                ArgValue::Str(role.map_or("unknown", Role::as_str).to_string()),
            ),
            ("comm", ArgValue::Str(format!("0x{:016x}", op.comm))),
            ("comm_name", ArgValue::Str(name.to_string())),
            ("func", ArgValue::Str(op.func.name().to_string())),
            ("seq", ArgValue::Uint(op.coll_sn)),
            ("bytes", ArgValue::Uint(op.bytes)),
            ("count", ArgValue::Uint(op.count)),
            ("algo", ArgValue::Str(op.algo.to_string())),
            ("proto", ArgValue::Str(op.proto.to_string())),
        ];
        if op.p2p {
            args.push(("peer", ArgValue::Int(i64::from(op.peer))));
        }
        if dur_us > 0 {
            let gbps = op.bytes as f64 / (dur_us as f64 * 1000.0) * busbw_factor(op.func, n);
            args.push((
                "busbw_gbps",
                ArgValue::Double((gbps * 1000.0).round() / 1000.0),
            ));
        }
        args.push(("start_us", ArgValue::Uint(op.start_us)));
        args.push(("end_us", ArgValue::Uint(op.end_us)));
        let flow = op.flow();
        let flows: &[u64] = if self.flows.contains_key(&flow) {
            std::slice::from_ref(&flow)
        } else {
            &[]
        };
        self.w.begin(
            track,
            op.start_us * 1000,
            op.func.name(),
            true,
            &args,
            flows,
        )?;
        self.w.end(track, op.end_us * 1000)?;
        self.sum.op_slices += 1;
        self.sum.from_us = self.sum.from_us.min(op.start_us);
        self.sum.to_us = self.sum.to_us.max(op.end_us);
        Ok(())
    }

    /// An op on the first async lane where it does not overlap the lane's last op.
    fn lane_op(&mut self, op: &Op) -> std::io::Result<()> {
        let k = match self.lanes.iter().position(|e| *e <= op.start_us) {
            Some(k) => k,
            None => {
                let k = self.lanes.len();
                self.w.child_track(
                    lane_uuid(self.rank, k),
                    rank_uuid(self.rank),
                    &format!("rank {} · async {}", self.rank, k + 1),
                )?;
                self.lanes.push(0);
                k
            }
        };
        self.lanes[k] = op.end_us;
        self.sum.async_op_slices += 1;
        self.op_slice(lane_uuid(self.rank, k), op)
    }

    fn step(&mut self, sel: &Sel, ops: Vec<Op>) -> std::io::Result<()> {
        let start = sel
            .start_us
            .min(ops.first().map_or(u64::MAX, |o| o.start_us));
        let end = ops
            .iter()
            .map(|o| o.end_us)
            .max()
            .unwrap_or(0)
            .max(sel.end_us);
        // Phase stretches from the template's rules over the step's ops (roles as chosen).
        let with_end: Vec<(StepOp, u64)> = ops
            .iter()
            .map(|o| {
                (
                    StepOp {
                        comm_hash: o.comm,
                        role: self.ctx.roles.get(&o.comm).and_then(|r| r.0),
                        func: o.func,
                        bytes: o.bytes,
                        coll_sn: o.coll_sn,
                        coll_local_sn: o.lsn,
                        start_us: o.start_us,
                    },
                    o.end_us,
                )
            })
            .collect();
        let phase_spans: Vec<_> = spans(&self.ctx.phases, &with_end, end)
            .into_iter()
            .filter(|s| s.to_us > s.from_us)
            .collect();
        let mut items: Vec<Item> = (0..phase_spans.len())
            .map(|i| Item::Phase(i, Vec::new()))
            .collect();
        let mut lane = Vec::new();
        let mut main_end = start;
        for op in ops {
            if op.start_us < main_end {
                lane.push(op);
                continue;
            }
            let inside = phase_spans
                .iter()
                .position(|s| s.from_us <= op.start_us && op.end_us <= s.to_us);
            let crosses = phase_spans
                .iter()
                .any(|s| op.start_us < s.to_us && op.end_us > s.from_us);
            match inside {
                Some(i) => {
                    main_end = op.end_us;
                    if let Item::Phase(_, v) = &mut items[i] {
                        v.push(op);
                    }
                }
                None if !crosses => {
                    main_end = op.end_us;
                    items.push(Item::Op(op));
                }
                None => lane.push(op),
            }
        }
        let at = |it: &Item| match it {
            Item::Phase(i, _) => (phase_spans[*i].from_us, 1),
            Item::Op(o) => (o.start_us, 0),
        };
        items.sort_by_key(at);
        let track = rank_uuid(self.rank);
        let n_ops = sel.s.ops;
        self.w.begin(
            track,
            start * 1000,
            &format!("step {}", sel.step),
            false,
            &[
                ("step", ArgValue::Uint(sel.step)),
                ("raw_step", ArgValue::Uint(sel.s.step)),
                ("duration_us", ArgValue::Uint(end - start)),
                ("ops", ArgValue::Uint(n_ops)),
                (
                    "coverage_complete",
                    ArgValue::Uint(u64::from(sel.s.coverage_complete && !sel.merged)),
                ),
            ],
            &[],
        )?;
        self.sum.step_slices += 1;
        for it in &items {
            match it {
                Item::Op(o) => self.op_slice(track, o)?,
                Item::Phase(i, v) => {
                    let s = &phase_spans[*i];
                    self.w.begin(
                        track,
                        s.from_us * 1000,
                        s.phase.as_str(),
                        true,
                        &[("ops", ArgValue::Uint(v.len() as u64))],
                        &[],
                    )?;
                    self.sum.phase_slices += 1;
                    for o in v {
                        self.op_slice(track, o)?;
                    }
                    self.w.end(track, s.to_us * 1000)?;
                }
            }
        }
        self.w.end(track, end * 1000)?;
        self.sum.from_us = self.sum.from_us.min(start);
        self.sum.to_us = self.sum.to_us.max(end);
        for op in &lane {
            self.lane_op(op)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busbw_factors_follow_nccl_tests() {
        assert_eq!(busbw_factor(Func::ALL_REDUCE, 4), 1.5);
        assert_eq!(busbw_factor(Func::ALL_GATHER, 4), 0.75);
        assert_eq!(busbw_factor(Func::REDUCE_SCATTER, 2), 0.5);
        assert_eq!(busbw_factor(Func::SEND, 2), 1.0);
        assert_eq!(busbw_factor(Func::BROADCAST, 8), 1.0);
    }

    #[test]
    fn network_rate_per_bucket() {
        assert!(net_rate(&[]).is_empty());
        // 2 MB completing in bucket 5 and 1 MB in bucket 6, then 4 MB in bucket 9.
        let r = net_rate(&[
            (5_100, 1_000_000),
            (5_900, 1_000_000),
            (6_000, 1_000_000),
            (9_999, 4_000_000),
        ]);
        assert_eq!(
            r,
            vec![
                (5_000, 2.0),
                (6_000, 1.0),
                (7_000, 0.0),
                (9_000, 4.0),
                (10_000, 0.0)
            ]
        );
    }

    #[test]
    fn p2p_send_and_receive_share_a_flow() {
        let send = flow_id(true, 7, Func::SEND, 3, 0, 1);
        let recv = flow_id(true, 7, Func::RECV, 3, 1, 0);
        assert_eq!(send, recv);
        // The other direction and the next ordinal are other instances.
        assert_ne!(send, flow_id(true, 7, Func::SEND, 3, 1, 0));
        assert_ne!(send, flow_id(true, 7, Func::SEND, 4, 0, 1));
        // Collectives: same (comm, func, seq) on every rank, whatever the rank.
        assert_eq!(
            flow_id(false, 7, Func::ALL_REDUCE, 5, 0, -1),
            flow_id(false, 7, Func::ALL_REDUCE, 5, 3, -1)
        );
        assert_ne!(
            flow_id(false, 7, Func::ALL_REDUCE, 5, 0, -1),
            flow_id(false, 7, Func::ALL_GATHER, 5, 0, -1)
        );
    }
}

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
//! Reading: one [`Input`] (archives staged once). Pass 1 gathers the roles; pass 2 rebuilds the
//! job's steps into a scratch journal and builds the time index of streams not cached; then each
//! selected rank's overlapping segments are read twice with the input's own cursors (flows,
//! then slices).
//!
//! Memory: the step summaries of one rank at a time, the selected operations of one rank, and
//! one flow-key counter per instance in the window.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use comminsight_wire::record::Body;
use comminsight_wire::roles::Role;

use super::draw::{
    host_pid, host_uuid, rank_tid, rank_uuid, Drawer, JobCtx, Op, RankOps, Sel, TraceSummary,
    Window,
};
use super::host::{draw_host, DrawnRank};
use super::index::{self, IndexBuilder, IndexStats, StreamEntry, TimeIndex};
use super::writer::TraceWriter;
use super::TraceError;
use crate::clock::ProcessClock;
use crate::engine::Output;
use crate::offline::{calibration, steps, Input, Settings};
use crate::roles::TopologyCollector;
use crate::sinks::step_journal::{read_stream, stream_path, StepJournal};
use crate::steps::calibrate::Calibration;
use crate::steps::engine::{Decision, JobInfo};
use crate::stream::StreamId;
use crate::util::fs::ScratchDir;

/// What to draw.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub window: Window,
    /// Only these ranks (all when `None`).
    pub ranks: Option<Vec<RangeInclusive<i64>>>,
    /// The job (required when the input has several).
    pub job: Option<String>,
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

/// The job's steps and index, ready to plan from.
struct Prepared {
    job: JobInfo,
    ctx: JobCtx,
    cal: Option<Calibration>,
    index: TimeIndex,
    stats: IndexStats,
    /// The scratch journal of the job's steps.
    steps: ScratchDir,
    /// The job's MoE EP windows.
    ep: super::ep::EpMarks,
}

fn io_err(path: PathBuf) -> impl Fn(std::io::Error) -> TraceError {
    move |e| TraceError::Io {
        path: path.clone(),
        message: e.to_string(),
    }
}

/// Write the trace of `opts.window` of the job under `input` to `out` (streamed), with the
/// analyses' `settings` (templates, `[steps]`).
pub fn write_trace<W: Write>(
    input: &Input,
    opts: &TraceOptions,
    settings: &Settings,
    out: W,
) -> Result<TraceSummary, TraceError> {
    let p = prepare(input, opts, settings)?;
    let plans = plan_ranks(input, &p, opts)?;
    let mut summary = TraceSummary {
        job: p.job.job.clone(),
        index: p.stats,
        ..Default::default()
    };
    // Which instances are seen on two ranks or more (they get a flow).
    let mut seen: HashMap<u64, (i64, bool)> = HashMap::new();
    for plan in &plans {
        summary.segments_total += plan.stream.segments.len();
        for op in rank_ops(input, plan, &p.ctx, &mut summary.segments_read).0 {
            let e = seen.entry(op.1.flow()).or_insert((plan.rank, false));
            e.1 |= e.0 != plan.rank;
        }
    }
    seen.retain(|_, v| v.1);
    summary.flows = seen.len() as u64;
    draw(input, (&plans, &p.ep), &p.ctx, &seen, out, summary)
}

/// The job (`--job`, or the input's only one), its steps rebuilt into a scratch journal, the
/// time index, and the drawing context.
fn prepare(
    input: &Input,
    opts: &TraceOptions,
    settings: &Settings,
) -> Result<Prepared, TraceError> {
    let topo = steps::topology(input);
    let mut dec = steps::decisions(&topo, &settings.templates);
    let job = choose_job(input, &dec, opts.job.as_deref())?;
    dec.retain(|k, _| *k == job);
    let roles = comm_roles(&topo, &job, &dec);
    drop(topo);
    let ids: Vec<StreamId> = input
        .streams()
        .filter(|id| id.job == job)
        .cloned()
        .collect();
    let (cached, mut todo) = index::load_cached(input);
    todo.retain(|id| id.job == job);
    let mut builder = IndexBuilder::new(todo);
    let scratch = ScratchDir::new("trace");
    let mut journal = StepJournal::new(scratch.path());
    let mut engine = steps::step_engine(settings, dec, false);
    engine.enable(crate::engine::Builtins {
        moe: settings.moe.enabled,
        ..Default::default()
    });
    let mut err = None;
    let mut ep_rows = Vec::new();
    input.run_streams(
        &mut ids.iter(),
        &mut engine,
        &mut [&mut builder],
        &mut |o| match o {
            Output::Step(done) => {
                if let Err(e) = journal.write(&done.id, &done.summary) {
                    err.get_or_insert(e);
                }
            }
            Output::EpRow { id, row } => ep_rows.push((id, *row)),
            _ => {}
        },
    );
    let fail = io_err(scratch.path().to_path_buf());
    if let Some(e) = err {
        return Err(fail(e));
    }
    journal.close_all().map_err(&fail)?;
    let info = engine
        .step_jobs()
        .into_iter()
        .find(|j| j.job == job)
        .expect("the job was decided");
    let Some(tref) = &info.template else {
        return Err(TraceError::NoTemplate {
            job: info.job.clone(),
            features: info.features.join(", "),
        });
    };
    let phases = settings
        .templates
        .templates
        .iter()
        .find(|t| t.name == tref.name && t.version == tref.version)
        .map(|t| t.phases.clone())
        .unwrap_or_default();
    let cal = calibration::load(input.dir())
        .map_err(crate::offline::OfflineError::from)?
        .and_then(|mut m| m.remove(&job));
    let (index, stats) = index::assemble(input, cached, builder.finish(input));
    Ok(Prepared {
        ctx: JobCtx {
            roles,
            phases,
            window: opts.window.clone(),
        },
        job: info,
        cal,
        index,
        stats,
        steps: scratch,
        ep: super::ep::EpMarks::new(ep_rows, &settings.moe),
    })
}

/// `--job`, or the input's only job (an error naming the jobs found otherwise).
fn choose_job(
    input: &Input,
    dec: &BTreeMap<String, Decision>,
    job: Option<&str>,
) -> Result<String, TraceError> {
    let known = dec.keys().cloned().collect::<Vec<_>>().join(", ");
    match job {
        Some(j) if dec.contains_key(j) => Ok(j.to_string()),
        Some(j) => Err(TraceError::NoJob {
            path: input.dir().to_path_buf(),
            job: j.to_string(),
            known,
        }),
        None if dec.len() == 1 => Ok(dec.keys().next().expect("one").clone()),
        None => Err(TraceError::SeveralJobs {
            path: input.dir().to_path_buf(),
            known,
        }),
    }
}

/// Per communicator of `job`: its role (inferred, else as the template choice saw it), size
/// and name.
fn comm_roles(
    topo: &TopologyCollector,
    job: &str,
    dec: &BTreeMap<String, Decision>,
) -> HashMap<u64, (Option<Role>, u32, String)> {
    let mut roles = HashMap::new();
    if let Some(obs) = topo.jobs().get(job) {
        for c in crate::roles::infer(job, obs).comms {
            roles.insert(c.hash, (c.role, c.nranks, c.name));
        }
    }
    if let Some(d) = dec.get(job) {
        for (h, r) in roles.iter_mut() {
            r.0 = r.0.or(d.role(*h));
        }
    }
    roles
}

/// The ranks to draw, each with its steps in the window and the time range of ops to read.
fn plan_ranks<'a>(
    input: &Input,
    p: &'a Prepared,
    opts: &TraceOptions,
) -> Result<Vec<RankPlan<'a>>, TraceError> {
    let mut plans: Vec<RankPlan> = Vec::new();
    let mut have: (Option<u64>, Option<u64>) = (None, None);
    for st in p.index.streams.iter().filter(|s| s.job == p.job.job) {
        if opts
            .ranks
            .as_ref()
            .is_some_and(|rs| !rs.iter().any(|r| r.contains(&st.rank)))
        {
            continue;
        }
        let steps = selected_steps(p, st, &mut have)?;
        let (w0, w1) = match &p.ctx.window {
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
        let what = match &p.ctx.window {
            Window::Steps(r) => format!("--steps {}..{}", r.start(), r.end()),
            Window::Time(a, b) => format!("--time {a}..{b}"),
        };
        return Err(TraceError::EmptyWindow {
            path: input.dir().to_path_buf(),
            job: p.job.job.clone(),
            what,
            have: match have {
                (Some(a), Some(b)) => format!("{a}..{b}"),
                _ => "none".into(),
            },
        });
    }
    plans.sort_by_key(|p| (p.rank, p.stream.pid.clone()));
    Ok(plans)
}

/// The stream's steps in the window (numbered as `steps` shows them); `have` gathers the
/// smallest and largest step number seen.
fn selected_steps(
    p: &Prepared,
    st: &StreamEntry,
    have: &mut (Option<u64>, Option<u64>),
) -> Result<Vec<Sel>, TraceError> {
    let path = stream_path(p.steps.path(), &st.id());
    let summaries = match read_stream(&path) {
        Ok(v) => v,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(path)(e)),
    };
    let cal = p.cal.as_ref();
    let mut steps = Vec::new();
    for s in summaries {
        let step = cal.map_or(s.step, |c| c.step(s.rank, s.step));
        have.0 = Some(have.0.map_or(step, |x| x.min(step)));
        have.1 = Some(have.1.map_or(step, |x| x.max(step)));
        let start_us = s.first.start_us;
        let end_us = start_us + s.duration_us;
        let keep = match &p.ctx.window {
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
                merged: cal.is_some_and(|c| c.is_merged(s.rank, s.step)),
                s,
            });
        }
    }
    steps.sort_by_key(|x| x.first);
    Ok(steps)
}

/// Tracks, then each rank's slices (its overlapping segments read again).
fn draw<W: Write>(
    input: &Input,
    (plans, ep): (&[RankPlan], &super::ep::EpMarks),
    ctx: &JobCtx,
    seen: &HashMap<u64, (i64, bool)>,
    out: W,
    mut summary: TraceSummary,
) -> Result<TraceSummary, TraceError> {
    let mut w = TraceWriter::new(out);
    let mut hosts: Vec<String> = plans.iter().map(|p| p.stream.host.clone()).collect();
    hosts.sort();
    hosts.dedup();
    let out_io = io_err(PathBuf::from("<trace output>"));
    for (i, h) in hosts.iter().enumerate() {
        w.process_track(host_uuid(i), host_pid(i), h)
            .map_err(&out_io)?;
    }
    for p in plans {
        let hi = hosts.iter().position(|h| *h == p.stream.host).unwrap_or(0);
        w.thread_track(
            rank_uuid(p.rank),
            host_uuid(hi),
            host_pid(hi),
            rank_tid(p.rank),
            &format!("rank {}", p.rank),
        )
        .map_err(&out_io)?;
    }
    summary.hosts = hosts.len();
    summary.ranks = plans.len();
    summary.from_us = u64::MAX;
    let mut reads = 0;
    for p in plans {
        let (ops, net) = rank_ops(input, p, ctx, &mut reads);
        let mut d = Drawer {
            w: &mut w,
            rank: p.rank,
            lanes: Vec::new(),
            flows: seen,
            ctx,
            sum: &mut summary,
        };
        d.rank_slices(&p.steps, ops).map_err(&out_io)?;
        d.net_counter(&net).map_err(&out_io)?;
    }
    if let Some(first) = plans.first() {
        let ranks: Vec<DrawnRank> = plans
            .iter()
            .filter_map(|p| {
                Some(DrawnRank {
                    host: hosts.iter().position(|h| *h == p.stream.host)?,
                    pid: p.stream.pid.parse().ok()?,
                    rank: p.rank,
                })
            })
            .collect();
        let w0 = plans.iter().map(|p| p.w0).min().unwrap_or(0);
        let w1 = plans.iter().map(|p| p.w1).max().unwrap_or(u64::MAX);
        summary.host = draw_host(&mut w, input, &first.stream.job, &hosts, &ranks, (w0, w1))
            .map_err(&out_io)?;
        let drawn = plans.iter().map(|p| (p.stream.id(), p.rank)).collect();
        summary.ep_instants = ep.draw(&mut w, &drawn, (w0, w1)).map_err(&out_io)?;
    }
    if summary.from_us == u64::MAX {
        summary.from_us = 0;
    }
    summary.packets = w.packets();
    summary.bytes = w.bytes();
    w.finish().map_err(&out_io)?;
    Ok(summary)
}

/// The runs of consecutive segments (by position in the stream's list) whose operations
/// overlap `[w0, w1]`: `(first index, last index, clock where the first begins, segments)`.
fn overlapping_runs<'a>(p: &'a RankPlan) -> Vec<(u64, u64, &'a ProcessClock, usize)> {
    let mut runs: Vec<(u64, u64, &ProcessClock, usize)> = Vec::new();
    let mut open = false;
    for seg in &p.stream.segments {
        let hit = match (seg.first_us, seg.last_us, seg.index()) {
            (Some(lo), Some(hi), Some(i)) if hi >= p.w0 && lo <= p.w1 => Some(i),
            _ => None,
        };
        match (hit, runs.last_mut()) {
            (Some(i), Some(r)) if open => {
                r.1 = i;
                r.3 += 1;
            }
            (Some(i), _) => {
                runs.push((i, i, &seg.clock, 1));
                open = true;
            }
            (None, _) => open = false,
        }
    }
    runs
}

/// The rank's operations in its window, by `(start, lsn)`: each with the index of its selected
/// step (`None`: in no selected step; kept only for a time window, when it overlaps it); and
/// its network transfers there (`net` records: end µs, bytes).
fn rank_ops(
    input: &Input,
    p: &RankPlan,
    ctx: &JobCtx,
    reads: &mut usize,
) -> (RankOps, Vec<(u64, u64)>) {
    let mut out = Vec::new();
    let mut net = Vec::new();
    let net_end = p
        .steps
        .iter()
        .map(|s| s.end_us)
        .max()
        .unwrap_or(0)
        .max(p.w1);
    let id = p.stream.id();
    for (first, last, clock, n) in overlapping_runs(p) {
        *reads += n;
        input.read_segments(&id, first, last, clock.clone(), &mut |_, d| {
            if let Body::Net(n) = &d.rec.body {
                let end_us = d.align.apply(n.end_ns) / 1000;
                if n.end_ns != 0 && (p.w0..=net_end).contains(&end_us) {
                    net.push((end_us, n.length));
                }
                return;
            }
            let (Body::Coll(o) | Body::P2p(o)) = &d.rec.body else {
                return;
            };
            let start_us = d.align.apply(o.start_ns) / 1000;
            let end_us = (d.align.apply(o.end_ns) / 1000).max(start_us);
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
            if keep {
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
                        p2p: matches!(d.rec.body, Body::P2p(_)),
                        rank: o.rank,
                        peer: o.peer,
                    },
                ));
            }
        });
    }
    out.sort_by_key(|(_, o)| o.key());
    (out, net)
}

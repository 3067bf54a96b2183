//! The analyses behind a report, over one [`Input`] in three passes: (1) roles and the hang
//! tracker, (2) the steps with their arrivals (durations, the straggler index), (3) the ops of
//! the top ranks' highest-index steps (only their streams are read). One [`Inputs`] per job.

use std::collections::{BTreeMap, BTreeSet};

use comminsight_wire::names::Func;

use super::build::Inputs;
use super::model::{OpRow, RankOps, StepOps};
use super::ReportError;
use crate::engine::{Analysis, Builtins, Cx, Decoded, Engine, Output, StepDone};
use crate::hang::model::HangReport;
use crate::moe::windows::EpWindow;
use crate::offline::host_evidence::{self, HostSpans, JobHost};
use crate::offline::straggler::{calibrated, decided_jobs, report_of};
use crate::offline::{calibration, hang, steps, Input, Settings};
use crate::roles::TopologyCollector;
use crate::steps::calibrate::Calibration;
use crate::steps::engine::{JobInfo, StepEngine};
use crate::straggler::RankStep;
use crate::stream::StreamId;

/// What to gather.
#[derive(Clone, Debug)]
pub struct GatherOptions {
    /// Only this job (default: every job).
    pub job: Option<String>,
    /// Only these steps (both included).
    pub steps: Option<(u64, u64)>,
    /// Ranks whose ops are embedded (highest multi-step index first).
    pub top_ops_ranks: usize,
    /// Steps per such rank whose ops are embedded (its highest-index steps).
    pub ops_steps: usize,
    /// Ops per (rank, step) embedded at most.
    pub max_ops_per_step: usize,
}

impl Default for GatherOptions {
    fn default() -> Self {
        GatherOptions {
            job: None,
            steps: None,
            top_ops_ranks: 64,
            ops_steps: 8,
            max_ops_per_step: 256,
        }
    }
}

/// One op of a wanted stream: `(start_us, coll_local_sn, func, comm, seq, end_us, bytes)`.
type RawOp = (u64, u64, u8, u64, u64, u64, u64);

/// A step of a rank: its number (the job's view), first and last op `(start_us, lsn)`.
type StepKeys = (u64, (u64, u64), (u64, u64));

/// `(job, rank)` -> (the job's index in the output, the steps whose ops are wanted, the rank's
/// streams).
type Wanted = BTreeMap<(String, i64), (usize, Vec<StepKeys>, BTreeSet<StreamId>)>;

/// What pass 2 gathered of one job.
#[derive(Default)]
struct JobSteps {
    rank_steps: Vec<RankStep>,
    /// `(rank, step, duration_us)` of every step in the window.
    durations: Vec<(i64, u64, u64)>,
    /// Per step: the earliest first-op start of any rank.
    starts: BTreeMap<u64, u64>,
    /// Per rank: its steps in the window, and its streams.
    by_rank: BTreeMap<i64, (Vec<StepKeys>, BTreeSet<StreamId>)>,
}

/// Every job's inputs under `input`.
pub fn inputs(
    input: &Input,
    settings: &Settings,
    opts: &GatherOptions,
) -> Result<Vec<Inputs>, ReportError> {
    let (topo, hang, notes, mut ep) = roles_and_hang(input, settings);
    let roles = crate::roles::job_roles(&topo);
    let decided = decided_in(input, &topo, settings, opts.job.as_deref())?;
    let cal = calibration::load(input.dir()).map_err(crate::offline::OfflineError::from)?;
    let (per_job, infos, host) = job_steps(input, settings, decided, cal.as_ref(), opts.steps);
    let mut out = Vec::new();
    let mut wanted: Wanted = BTreeMap::new();
    let mut streams: BTreeSet<StreamId> = BTreeSet::new();
    for (job, mut js) in per_job {
        let mut rep = report_of(
            &job,
            std::mem::take(&mut js.rank_steps),
            &settings.straggler,
            None,
        );
        host_evidence::refine(&mut rep, &host);
        let mut inp = Inputs {
            roles: roles.iter().find(|r| r.job == job).cloned(),
            template: infos
                .iter()
                .find(|i| i.job == job)
                .and_then(|i| i.template.as_ref())
                .map(|t| format!("{} v{}", t.name, t.version)),
            calibrated: cal.as_ref().is_some_and(|c| c.contains_key(&job)),
            hang: hang.as_ref().map(|h| job_hang(h, &job)),
            notes: notes.clone(),
            funcs: Func::NAMES.iter().map(|s| s.to_string()).collect(),
            durations: std::mem::take(&mut js.durations),
            ep_windows: ep.remove(&job).unwrap_or_default(),
            ..Inputs::new(input.dir().display().to_string(), rep)
        };
        if let Some(obs) = topo.jobs().get(&job) {
            for p in obs.procs.values().filter(|p| p.global_rank >= 0) {
                inp.hosts.insert(i64::from(p.global_rank), p.host.clone());
            }
        }
        let top = top_steps(&inp, opts);
        for (rank, chosen) in &top {
            let Some((keys, ids)) = js.by_rank.get(rank) else {
                continue;
            };
            let keep: Vec<StepKeys> = keys
                .iter()
                .filter(|k| chosen.contains(&k.0))
                .copied()
                .collect();
            if !keep.is_empty() {
                streams.extend(ids.iter().cloned());
                wanted.insert((job.clone(), *rank), (out.len(), keep, ids.clone()));
            }
        }
        inp.ops_note = format!(
            "Op detail is embedded for the {} rank(s) with the highest index (of {}), in up to {} of each one's highest-index steps, at most {} ops per step; for other ranks use the trace command.",
            top.len().min(inp.straggler.ranks.len()),
            inp.straggler.ranks.len(),
            opts.ops_steps,
            opts.max_ops_per_step
        );
        out.push((inp, js.starts));
    }
    if !wanted.is_empty() {
        let ops = stream_ops(input, &streams);
        attach_ops(&mut out, &wanted, &ops, opts);
    }
    Ok(out.into_iter().map(|(i, _)| i).collect())
}

/// Each job's EP windows.
type JobWindows = BTreeMap<String, Vec<EpWindow>>;

/// Pass 1: the roles (communicator membership and traffic), the hang analysis (the raw
/// segments' snapshots plus any evidence bundles under the input) and the EP windows (as
/// `comminsight-agent moe` makes them). A hang analysis that fails becomes a note.
fn roles_and_hang(
    input: &Input,
    settings: &Settings,
) -> (
    TopologyCollector,
    Option<HangReport>,
    Vec<String>,
    JobWindows,
) {
    let mut engine = hang::hang_engine();
    engine.enable(Builtins {
        moe: settings.moe.enabled,
        ..Builtins::default()
    });
    let mut rows = Vec::new();
    input.run(&mut engine, &mut [], &mut |o| {
        if let Output::EpRow { row, .. } = o {
            rows.push(*row);
        }
    });
    let mut ep = JobWindows::new();
    for w in crate::offline::moe::windows_of(rows, &settings.moe).0 {
        ep.entry(w.job.clone()).or_default().push(w);
    }
    let raw = hang::raw_snapshots(input, &engine);
    let mut notes = Vec::new();
    let report = match hang::bundles(input.dir()) {
        Ok(events) => Some(hang::report_of(&events, raw, &settings.hang)),
        Err(e) => {
            notes.push(format!("no hang analysis: {e}"));
            None
        }
    };
    (engine.take_topology(), report, notes, ep)
}

/// The jobs to report on, with their template decisions (`--job` checked).
fn decided_in(
    input: &Input,
    topo: &TopologyCollector,
    settings: &Settings,
    job: Option<&str>,
) -> Result<BTreeMap<String, crate::steps::engine::Decision>, ReportError> {
    let mut decided = steps::decisions(topo, &settings.templates);
    if job.is_some() {
        // The same check and message as `straggler --job`.
        let known = decided_jobs(input, settings, job)?;
        decided.retain(|k, _| known.contains_key(k));
    }
    Ok(decided)
}

fn job_hang(h: &HangReport, job: &str) -> HangReport {
    let mut h = h.clone();
    h.verdicts.retain(|v| v.job == job);
    h.resolved.retain(|v| v.job == job);
    h
}

/// Pass 2: every decided job's steps through the step engine with the arrivals, one job's
/// worth gathered per [`JobSteps`]; plus the jobs' step headers and the ranks' host evidence.
fn job_steps(
    input: &Input,
    settings: &Settings,
    decided: BTreeMap<String, crate::steps::engine::Decision>,
    cal: Option<&calibration::Calibrations>,
    window: Option<(u64, u64)>,
) -> (BTreeMap<String, JobSteps>, Vec<JobInfo>, JobHost) {
    let mut per_job: BTreeMap<String, JobSteps> = decided
        .keys()
        .map(|j| (j.clone(), JobSteps::default()))
        .collect();
    let mut engine = steps::step_engine(settings, decided, true);
    engine.enable(Builtins {
        host: true,
        ..Builtins::default()
    });
    let empty = calibration::Calibrations::new();
    let cal = cal.unwrap_or(&empty);
    let ids = input.streams_of(per_job.keys());
    let mut spans = HostSpans::default();
    input.run_streams(&mut ids.iter(), &mut engine, &mut [], &mut |o| {
        let Output::Step(done) = o else { return };
        let Some(js) = per_job.get_mut(&done.id.job) else {
            return;
        };
        note_step(js, &done, cal.get(&done.id.job), window);
        let id = done.id.clone();
        if let Some(rs) = calibrated(*done, cal, 0, window) {
            spans.note(&id, &rs);
            js.rank_steps.push(rs);
        }
    });
    (per_job, engine.step_jobs(), spans.evidence(&engine))
}

/// A step's duration, the step's earliest start and the rank's step keys (merged steps and
/// steps outside the window are left out).
fn note_step(
    js: &mut JobSteps,
    done: &StepDone,
    cal: Option<&Calibration>,
    window: Option<(u64, u64)>,
) {
    let s = &done.summary;
    if cal.is_some_and(|c| c.is_merged(s.rank, s.step)) {
        return;
    }
    let step = cal.map_or(s.step, |c| c.step(s.rank, s.step));
    if window.is_some_and(|(a, b)| step < a || step > b) {
        return;
    }
    js.durations.push((s.rank, step, s.duration_us));
    let e = js.starts.entry(step).or_insert(u64::MAX);
    *e = (*e).min(s.first.start_us);
    let r = js.by_rank.entry(s.rank).or_default();
    r.0.push((
        step,
        (s.first.start_us, s.first.coll_local_sn),
        (s.last.start_us, s.last.coll_local_sn),
    ));
    r.1.insert(done.id.clone());
}

/// The top ranks (the report's order: root index, then index) and each one's highest steps
/// by root index, then index.
fn top_steps(inp: &Inputs, opts: &GatherOptions) -> BTreeMap<i64, BTreeSet<u64>> {
    let rep = &inp.straggler;
    rep.ranks
        .iter()
        .take(opts.top_ops_ranks)
        .map(|r| {
            let mut steps: Vec<((f64, f64), u64)> = rep
                .steps
                .iter()
                .filter_map(|s| {
                    s.ranks
                        .iter()
                        .find(|x| x.rank == r.rank)
                        .map(|x| ((x.root_index, x.index), s.step))
                })
                .collect();
            steps.sort_by(|a, b| {
                (b.0 .0)
                    .total_cmp(&a.0 .0)
                    .then((b.0 .1).total_cmp(&a.0 .1))
                    .then(a.1.cmp(&b.1))
            });
            let chosen = steps.iter().take(opts.ops_steps).map(|s| s.1).collect();
            (r.rank, chosen)
        })
        .collect()
}

/// Collects the ops of the streams it reads (pass 3).
#[derive(Default)]
struct OpsCollector {
    ops: BTreeMap<StreamId, Vec<RawOp>>,
}

impl Analysis for OpsCollector {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        let v = self.ops.entry(cx.id.clone()).or_default();
        for d in recs {
            if let Some((op, end)) = StepEngine::op_of(&d.rec, d.align) {
                v.push((
                    op.start_us,
                    op.coll_local_sn,
                    op.func.0,
                    op.comm_hash,
                    op.coll_sn,
                    end,
                    op.bytes,
                ));
            }
        }
    }
}

/// Pass 3: the ops of these streams, each stream's sorted by `(start, lsn)`.
fn stream_ops(input: &Input, streams: &BTreeSet<StreamId>) -> BTreeMap<StreamId, Vec<RawOp>> {
    let mut engine = Engine::new(Builtins::default());
    let mut c = OpsCollector::default();
    input.run_streams(&mut streams.iter(), &mut engine, &mut [&mut c], &mut |_| {});
    for v in c.ops.values_mut() {
        v.sort_unstable();
    }
    c.ops
}

/// The op rows of each wanted `(job, rank)`'s chosen steps, into its job's inputs.
fn attach_ops(
    out: &mut [(Inputs, BTreeMap<u64, u64>)],
    wanted: &Wanted,
    ops: &BTreeMap<StreamId, Vec<RawOp>>,
    opts: &GatherOptions,
) {
    let mut per_job: BTreeMap<usize, BTreeMap<i64, Vec<StepOps>>> = BTreeMap::new();
    for ((_, rank), (ji, keep, ids)) in wanted {
        let (inp, starts) = &out[*ji];
        let raw: Vec<&RawOp> = ids
            .iter()
            .filter_map(|id| ops.get(id))
            .flat_map(|v| v.iter())
            .collect();
        let comm_ix: BTreeMap<u64, i64> = inp
            .roles
            .as_ref()
            .map(|r| {
                r.comms
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.hash, i as i64))
                    .collect()
            })
            .unwrap_or_default();
        for (step, lo, hi) in keep {
            let base = starts.get(step).copied().unwrap_or(lo.0);
            let inside: Vec<&&RawOp> = raw
                .iter()
                .filter(|o| (o.0, o.1) >= *lo && (o.0, o.1) <= *hi)
                .collect();
            let rows: Vec<OpRow> = inside
                .iter()
                .take(opts.max_ops_per_step)
                .map(|o| {
                    [
                        i64::from(o.2),
                        comm_ix.get(&o.3).copied().unwrap_or(-1),
                        o.4 as i64,
                        o.0.saturating_sub(base) as i64,
                        o.5.saturating_sub(o.0) as i64,
                        o.6 as i64,
                    ]
                })
                .collect();
            per_job
                .entry(*ji)
                .or_default()
                .entry(*rank)
                .or_default()
                .push(StepOps {
                    step: *step,
                    dropped: inside.len().saturating_sub(rows.len()) as u64,
                    ops: rows,
                });
        }
    }
    for (ji, ranks) in per_job {
        let inp = &mut out[ji].0;
        let order: Vec<i64> = inp.straggler.ranks.iter().map(|r| r.rank).collect();
        let mut v: Vec<RankOps> = ranks
            .into_iter()
            .map(|(rank, mut steps)| {
                steps.sort_by_key(|s| s.step);
                RankOps { rank, steps }
            })
            .collect();
        v.sort_by_key(|r| order.iter().position(|x| *x == r.rank));
        inp.ops = v;
    }
}

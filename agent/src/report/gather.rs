//! The I/O part: run the offline analyses over a directory and collect one [`Inputs`] per job
//! (straggler reports, roles and hosts, step durations, hang verdicts, the top ranks' ops).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use comminsight_wire::names::Func;
use comminsight_wire::record::{Body, Record};

use super::build::Inputs;
use super::model::{OpRow, RankOps, StepOps};
use super::ReportError;
use crate::clock::{align, ProcessClock};
use crate::hang::HangSettings;
use crate::replay::{read_streams, scratch_dir};
use crate::steps::calibrate::Calibration;
use crate::steps::engine::{StepEngine, StepSettings};
use crate::steps::fsm::StepSummary;
use crate::steps::journal::{self, StepJournal};
use crate::steps::template::TemplateSet;
use crate::straggler::offline::OfflineOptions;
use crate::straggler::StragglerSettings;
use crate::stream::StreamId;

/// What to gather.
#[derive(Clone, Debug)]
pub struct GatherOptions {
    /// Only this job (default: every job).
    pub job: Option<String>,
    /// Only these steps (both included).
    pub steps: Option<(u64, u64)>,
    /// Step templates (default: the built-in ones).
    pub templates: Option<PathBuf>,
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
            templates: None,
            top_ops_ranks: 64,
            ops_steps: 8,
            max_ops_per_step: 256,
        }
    }
}

/// Removes a scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One op of a wanted stream: `(start_us, coll_local_sn, func, comm, seq, end_us, bytes)`.
type RawOp = (u64, u64, u8, u64, u64, u64, u64);

/// `(job, rank)` -> (the job's index in the output, the `(step, summary)`s whose ops are wanted).
type Wanted = BTreeMap<(String, i64), (usize, Vec<(u64, StepSummary)>)>;

/// A stream in the ops pass: its clock, its rank once known, its ops (`None`: not wanted).
type StreamOps = (ProcessClock, Option<i64>, Option<Vec<RawOp>>);

/// Every job's inputs under `dir`.
pub fn inputs(dir: &Path, opts: &GatherOptions) -> Result<Vec<Inputs>, ReportError> {
    let templates = match &opts.templates {
        Some(d) => TemplateSet::load_dir(d)?,
        None => TemplateSet::builtin(),
    };
    let off = OfflineOptions {
        job: opts.job.clone(),
        steps: opts.steps,
        ranks: None,
        templates: opts.templates.clone(),
        clock_err_us: None,
        settings: StragglerSettings::default(),
    };
    let reports = crate::straggler::offline::reports(dir, &off)?;
    let scratch = Scratch(scratch_dir("report"));
    let topo = crate::steps::offline::topology(dir, &scratch.0)?;
    let roles = crate::roles::job_roles(&topo);
    let decisions = crate::steps::offline::decisions(&topo, &templates);
    let steps_root = scratch.0.join("steps");
    let mut journal = StepJournal::new(&steps_root);
    let infos = crate::steps::offline::steps_pass(
        dir,
        &scratch.0,
        decisions,
        &templates,
        &StepSettings::default(),
        &mut journal,
    )?;
    drop(journal);
    let calibration = load_calibration(dir);
    let mut hang_notes = Vec::new();
    let hang = match crate::hang::offline::report(dir, &HangSettings::default()) {
        Ok(h) => Some(h),
        Err(e) => {
            hang_notes.push(format!("no hang analysis: {e}"));
            None
        }
    };

    let mut out = Vec::new();
    // Per job: the summaries of the streams whose ops are wanted.
    let mut wanted: Wanted = BTreeMap::new();
    let mut step_start: Vec<BTreeMap<u64, u64>> = Vec::new();
    for rep in reports {
        let job = rep.job.clone();
        let cal = calibration.as_ref().and_then(|c| c.get(&job));
        let info = infos.iter().find(|i| i.job == job);
        let mut inp = Inputs {
            roles: roles.iter().find(|r| r.job == job).cloned(),
            template: info
                .and_then(|i| i.template.as_ref())
                .map(|t| format!("{} v{}", t.name, t.version)),
            calibrated: cal.is_some(),
            hang: hang.as_ref().map(|h| {
                let mut h = h.clone();
                h.verdicts.retain(|v| v.job == job);
                h.resolved.retain(|v| v.job == job);
                h
            }),
            notes: hang_notes.clone(),
            funcs: Func::NAMES.iter().map(|s| s.to_string()).collect(),
            ..Inputs::new(dir.display().to_string(), rep)
        };
        if let Some(obs) = topo.jobs().get(&job) {
            for p in obs.procs.values() {
                if p.global_rank >= 0 {
                    inp.hosts.insert(i64::from(p.global_rank), p.host.clone());
                }
            }
        }
        // The top ranks and their highest-index steps.
        let rep = &inp.straggler;
        let top: BTreeMap<i64, BTreeSet<u64>> = rep
            .ranks
            .iter()
            .take(opts.top_ops_ranks)
            .map(|r| {
                let mut steps: Vec<(f64, u64)> = rep
                    .steps
                    .iter()
                    .filter_map(|s| {
                        s.ranks
                            .iter()
                            .find(|x| x.rank == r.rank)
                            .map(|x| (x.index, s.step))
                    })
                    .collect();
                steps.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                let chosen = steps.iter().take(opts.ops_steps).map(|s| s.1).collect();
                (r.rank, chosen)
            })
            .collect();
        let ji = out.len();
        let mut starts: BTreeMap<u64, u64> = BTreeMap::new();
        for f in stream_files(&steps_root, &job) {
            let summaries = journal::read_stream(&f).map_err(|e| ReportError::Input {
                path: f.clone(),
                message: e.to_string(),
            })?;
            let mut keep = Vec::new();
            let mut rank = -1;
            for s in summaries {
                rank = s.rank;
                let step = cal.map_or(s.step, |c| c.step(s.rank, s.step));
                if cal.is_some_and(|c| c.is_merged(s.rank, s.step)) {
                    continue;
                }
                if opts.steps.is_some_and(|(a, b)| step < a || step > b) {
                    continue;
                }
                inp.durations.push((s.rank, step, s.duration_us));
                let e = starts.entry(step).or_insert(u64::MAX);
                *e = (*e).min(s.first.start_us);
                if top.get(&s.rank).is_some_and(|st| st.contains(&step)) {
                    keep.push((step, s));
                }
            }
            if !keep.is_empty() {
                wanted
                    .entry((job.clone(), rank))
                    .or_insert_with(|| (ji, Vec::new()))
                    .1
                    .extend(keep);
            }
        }
        let shown = top.len().min(inp.straggler.ranks.len());
        inp.ops_note = format!(
            "Op detail is embedded for the {shown} rank(s) with the highest index (of {}), in up to {} of each one's highest-index steps, at most {} ops per step; for other ranks use the trace command.",
            inp.straggler.ranks.len(),
            opts.ops_steps,
            opts.max_ops_per_step
        );
        step_start.push(starts);
        out.push(inp);
    }
    if !wanted.is_empty() {
        let ops = stream_ops(dir, &scratch.0, &wanted)?;
        let mut per_job: BTreeMap<usize, BTreeMap<i64, Vec<StepOps>>> = BTreeMap::new();
        for ((_, rank), (ji, keep)) in &wanted {
            let raw = ops
                .get(&(out[*ji].straggler.job.clone(), *rank))
                .map_or(&[][..], Vec::as_slice);
            let comm_ix: BTreeMap<u64, i64> = out[*ji]
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
            for (step, s) in keep {
                let lo = (s.first.start_us, s.first.coll_local_sn);
                let hi = (s.last.start_us, s.last.coll_local_sn);
                let base = step_start[*ji].get(step).copied().unwrap_or(lo.0);
                let inside: Vec<&RawOp> = raw
                    .iter()
                    .filter(|o| (o.0, o.1) >= lo && (o.0, o.1) <= hi)
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
            let order: Vec<i64> = out[ji].straggler.ranks.iter().map(|r| r.rank).collect();
            let mut v: Vec<RankOps> = ranks
                .into_iter()
                .map(|(rank, mut steps)| {
                    steps.sort_by_key(|s| s.step);
                    RankOps { rank, steps }
                })
                .collect();
            v.sort_by_key(|r| order.iter().position(|x| *x == r.rank));
            out[ji].ops = v;
        }
    }
    Ok(out)
}

/// The ops of the wanted `(job, rank)`s, in stream order (a stream's rank comes from its
/// `proc_start`; streams of other ranks are skipped as soon as it is known).
fn stream_ops<T>(
    dir: &Path,
    scratch: &Path,
    wanted: &BTreeMap<(String, i64), T>,
) -> Result<BTreeMap<(String, i64), Vec<RawOp>>, crate::replay::ReplayError> {
    let jobs: BTreeSet<&str> = wanted.keys().map(|k| k.0.as_str()).collect();
    let mut out: BTreeMap<(String, i64), Vec<RawOp>> = BTreeMap::new();
    // Per stream: its clock, its rank once known, its ops (None: not wanted).
    let mut streams: BTreeMap<StreamId, StreamOps> = BTreeMap::new();
    read_streams(dir, &scratch.join("ops"), &mut |id, batch| {
        if !jobs.contains(id.job.as_str()) {
            return;
        }
        let (clock, rank, ops) = streams
            .entry(id.clone())
            .or_insert_with(|| (ProcessClock::default(), None, Some(Vec::new())));
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            clock.observe(&rec);
            if let Body::ProcStart(p) = &rec.body {
                let r = i64::from(p.rank);
                *rank = Some(r);
                if !wanted.contains_key(&(id.job.clone(), r)) {
                    *ops = None;
                }
            }
            let Some(ops) = ops.as_mut() else { continue };
            if let Some((op, end)) = StepEngine::op_of(&rec, align(clock, None)) {
                ops.push((
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
    })?;
    for (id, (_, rank, ops)) in streams {
        if let (Some(r), Some(mut ops)) = (rank, ops) {
            if wanted.contains_key(&(id.job.clone(), r)) {
                ops.sort_unstable();
                out.entry((id.job, r)).or_default().extend(ops);
            }
        }
    }
    Ok(out)
}

/// Every stream file of `job` in a step journal.
fn stream_files(root: &Path, job: &str) -> Vec<PathBuf> {
    let dir = journal::job_path(root, job)
        .parent()
        .expect("job.json has a parent")
        .to_path_buf();
    let mut out = Vec::new();
    let Ok(hosts) = std::fs::read_dir(&dir) else {
        return out;
    };
    for h in hosts.flatten().filter(|e| e.path().is_dir()) {
        let Ok(files) = std::fs::read_dir(h.path()) else {
            continue;
        };
        out.extend(
            files
                .flatten()
                .map(|f| f.path())
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl")),
        );
    }
    out.sort();
    out
}

/// The job's applied step calibration (`DIR/.comminsight/steps-calibration.json`), if any.
fn load_calibration(dir: &Path) -> Option<BTreeMap<String, Calibration>> {
    let p = dir.join(".comminsight").join("steps-calibration.json");
    let b = std::fs::read(&p).ok()?;
    match serde_json::from_slice(&b) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "not a step calibration; ignored");
            None
        }
    }
}

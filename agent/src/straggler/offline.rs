//! The straggler analysis offline (`comminsight-agent straggler DIR`): the steps are rebuilt
//! with the same code as `steps` (template decisions from the whole input's roles, the job's
//! applied calibration in `DIR/.comminsight/steps-calibration.json`), while each process's
//! operations go through a [`StepOpCollector`] into one [`RankStep`] per step summary; one
//! process at a time, nothing beyond the rank-steps is kept. Then [`analyze`] per job.
//!
//! Clock bound per stream: raw segments carry no host-offset measurement, so the host part is
//! `clock_err_us` (default 0: pass `--clock-error-us` for hosts whose clocks are synced less well
//! than the step's waits); the process part (the plugin's clock pairs) is added to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, Record};

use super::collect::StepOpCollector;
use super::index::analyze;
use super::model::{RankStep, StragglerReport};
use super::StragglerSettings;
use crate::clock::{align, ProcessClock, UNMEASURED_ERR_NS};
use crate::replay::{read_streams, ReplayError};
use crate::steps::calibrate::Calibration;
use crate::steps::engine::{StepEngine, StepSettings};
use crate::steps::offline::{decisions, topology};
use crate::steps::template::TemplateSet;
use crate::stream::StreamId;

/// What to analyse and how.
#[derive(Clone, Debug, Default)]
pub struct OfflineOptions {
    /// Only this job (default: every job).
    pub job: Option<String>,
    /// Only these steps, both included (step numbers of the job's view: calibrated when applied).
    pub steps: Option<(u64, u64)>,
    /// List only these ranks (the index is computed over every rank regardless).
    pub ranks: Option<Vec<i64>>,
    /// Template directory (default: the built-in templates).
    pub templates: Option<PathBuf>,
    /// Host clock error bound, µs (default 0; see the module docs).
    pub clock_err_us: Option<u64>,
    pub settings: StragglerSettings,
}

/// Why the offline analysis failed (one line naming the input and the fix).
#[derive(Debug, thiserror::Error)]
pub enum StragglerError {
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("{path}: cannot load the templates ({message}); fix them or leave --templates out")]
    Templates { path: PathBuf, message: String },
    #[error("{path}: no job {job:?} (jobs found: {known}); pass one of them to --job")]
    UnknownJob {
        path: PathBuf,
        job: String,
        known: String,
    },
    #[error("{path}: not a calibration ({message}); run `steps --calibrate clear` or `--calibrate apply` again")]
    Calibration { path: PathBuf, message: String },
    #[error("--steps {a}..{b}: the first step is after the last; use a..b with a <= b")]
    BadRange { a: u64, b: u64 },
}

/// The applied calibration of each job under `dir`, if any.
fn load_calibration(dir: &Path) -> Result<BTreeMap<String, Calibration>, StragglerError> {
    let path = dir.join(".comminsight").join("steps-calibration.json");
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| StragglerError::Calibration {
            path,
            message: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(StragglerError::Calibration {
            path,
            message: e.to_string(),
        }),
    }
}

/// Removes a scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One report per job under `dir` (segments, test-bed output, archive), jobs by name.
pub fn reports(dir: &Path, opts: &OfflineOptions) -> Result<Vec<StragglerReport>, StragglerError> {
    Ok(rank_steps(dir, opts)?
        .into_iter()
        .map(|(job, steps)| report_of(&job, steps, opts))
        .collect())
}

/// The analysis of one job's rank-steps with the options' settings and rank filter (the
/// ranks filter only lists: the index is computed over every rank).
pub fn report_of(job: &str, steps: Vec<RankStep>, opts: &OfflineOptions) -> StragglerReport {
    let mut r = analyze(job, steps, &opts.settings);
    if let Some(keep) = &opts.ranks {
        for s in &mut r.steps {
            s.ranks.retain(|x| keep.contains(&x.rank));
        }
        r.ranks.retain(|x| keep.contains(&x.rank));
    }
    r
}

/// Every job's rank-steps under `dir` (the options' job and steps; ranks and settings unused),
/// jobs by name.
pub fn rank_steps(
    dir: &Path,
    opts: &OfflineOptions,
) -> Result<BTreeMap<String, Vec<RankStep>>, StragglerError> {
    if let Some((a, b)) = opts.steps {
        if a > b {
            return Err(StragglerError::BadRange { a, b });
        }
    }
    let templates = match &opts.templates {
        Some(t) => TemplateSet::load_dir(t).map_err(|e| StragglerError::Templates {
            path: t.clone(),
            message: e.to_string(),
        })?,
        None => TemplateSet::builtin(),
    };
    let scratch = Scratch(crate::replay::scratch_dir("straggler"));
    let topo = topology(dir, &scratch.0)?;
    let mut decided = decisions(&topo, &templates);
    drop(topo);
    if let Some(j) = &opts.job {
        if !decided.contains_key(j) {
            return Err(StragglerError::UnknownJob {
                path: dir.to_path_buf(),
                job: j.clone(),
                known: decided.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        decided.retain(|k, _| k == j);
    }
    let cal = load_calibration(dir)?;
    let mut per_job: BTreeMap<String, Vec<RankStep>> =
        decided.keys().map(|j| (j.clone(), Vec::new())).collect();
    let mut engine = StepEngine::new(templates.clone(), StepSettings::default());
    for (job, d) in decided {
        engine.decide(&job, d);
    }
    let mut collector = StepOpCollector::new();
    let mut current: Option<StreamId> = None;
    let mut clock = ProcessClock::default();
    let host_err = opts.clock_err_us.unwrap_or(0);
    let steps = opts.steps;
    // Each summary of the engine's outbox -> its rank-step.
    let drain = |engine: &mut StepEngine,
                 collector: &mut StepOpCollector,
                 clock: &ProcessClock,
                 per_job: &mut BTreeMap<String, Vec<RankStep>>| {
        let p = clock.correction().err_ns;
        let err_us = host_err.saturating_add(if p < UNMEASURED_ERR_NS { p / 1000 } else { 0 });
        for (sid, s) in engine.take_output() {
            let c = cal.get(&sid.job);
            let step = c.map_or(s.step, |c| c.step(s.rank, s.step));
            let mut rs = collector.take(&sid, &s, step, s.rank, err_us);
            if c.is_some_and(|c| c.is_merged(s.rank, s.step)) {
                rs.coverage_complete = false;
            }
            if steps.is_some_and(|(a, b)| step < a || step > b) {
                continue;
            }
            if let Some(v) = per_job.get_mut(&sid.job) {
                v.push(rs);
            }
        }
    };
    read_streams(dir, &scratch.0, &mut |id, batch| {
        if !per_job.contains_key(&id.job) {
            return;
        }
        if current.as_ref() != Some(id) {
            if let Some(prev) = current.take() {
                engine.end_stream(&prev);
                drain(&mut engine, &mut collector, &clock, &mut per_job);
                collector.end_stream(&prev);
            }
            current = Some(id.clone());
            clock = ProcessClock::default();
        }
        let (mut rank, mut ops) = (None, Vec::with_capacity(batch.len()));
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            match &rec.body {
                Body::ProcStart(p) => {
                    rank = Some(i64::from(p.rank));
                    clock.observe(&rec);
                }
                Body::Stats(_) | Body::Coll(_) | Body::P2p(_) => clock.observe(&rec),
                _ => {}
            }
            let a = align(&clock, None);
            collector.observe(id, &rec, a);
            ops.extend(StepEngine::op_of(&rec, a));
        }
        engine.feed(id, rank, ops);
        drain(&mut engine, &mut collector, &clock, &mut per_job);
    })?;
    if let Some(prev) = current.take() {
        engine.end_stream(&prev);
        drain(&mut engine, &mut collector, &clock, &mut per_job);
        collector.end_stream(&prev);
    }
    let dropped = collector.dropped();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "straggler: operations dropped by full stream buffers"
        );
    }
    Ok(per_job)
}

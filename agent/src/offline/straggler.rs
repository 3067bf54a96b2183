//! The straggler analysis offline (`comminsight-agent straggler DIR`): the steps are rebuilt with
//! the same code as `steps` (template decisions from the whole input's roles, the job's applied
//! calibration), and each step's arrivals come out of the engine's arrivals built-in as one
//! [`RankStep`]; one process at a time, nothing beyond the rank-steps is kept. Then
//! [`analyze`] per job.
//!
//! Clock bound per stream: raw segments carry no host-offset measurement, so the host part is
//! `clock_err_us` (default 0: pass `--clock-error-us` for hosts whose clocks are synced less well
//! than the step's waits); the process part (the plugin's clock pairs) is added to it, as online.

use std::collections::BTreeMap;

use comminsight_wire::roles::Role;

use super::calibration::{self, Calibrations};
use super::host_evidence::{HostSpans, JobHost};
use super::{steps, Input, OfflineError, Settings};
use crate::engine::{Builtins, Output, StepDone};
use crate::straggler::{analyze, RankStep, StragglerReport, StragglerSettings};

/// Each job's rank-steps, jobs by name.
type JobSteps = BTreeMap<String, Vec<RankStep>>;

/// What to analyse.
#[derive(Clone, Debug, Default)]
pub struct StragglerOptions {
    /// Only this job (default: every job).
    pub job: Option<String>,
    /// Only these steps, both included (step numbers of the job's view: calibrated when applied).
    pub steps: Option<(u64, u64)>,
    /// List only these ranks (the index is computed over every rank regardless).
    pub ranks: Option<Vec<i64>>,
    /// Host clock error bound, µs (default 0; see the module docs).
    pub clock_err_us: Option<u64>,
}

/// One report per job of `input`, jobs by name.
pub fn reports(
    input: &Input,
    settings: &Settings,
    opts: &StragglerOptions,
) -> Result<Vec<StragglerReport>, OfflineError> {
    let (per_job, roles, host) = steps_and_roles(input, settings, opts)?;
    let st = StragglerSettings {
        comm_roles: std::sync::Arc::new(roles),
        ..settings.straggler.clone()
    };
    Ok(per_job
        .into_iter()
        .map(|(job, steps)| {
            let mut r = report_of(&job, steps, &st, opts.ranks.as_deref());
            super::host_evidence::refine(&mut r, &host);
            r
        })
        .collect())
}

/// The analysis of one job's rank-steps (the `ranks` filter only lists: the index is computed
/// over every rank).
pub fn report_of(
    job: &str,
    steps: Vec<RankStep>,
    settings: &StragglerSettings,
    ranks: Option<&[i64]>,
) -> StragglerReport {
    let mut r = analyze(job, steps, settings);
    if let Some(keep) = ranks {
        for s in &mut r.steps {
            s.ranks.retain(|x| keep.contains(&x.rank));
        }
        r.ranks.retain(|x| keep.contains(&x.rank));
    }
    r
}

/// The jobs to analyse: every job's template decision, or only `job`'s (an unknown job is an
/// error naming the jobs found).
pub fn decided_jobs(
    input: &Input,
    settings: &Settings,
    job: Option<&str>,
) -> Result<BTreeMap<String, crate::steps::engine::Decision>, OfflineError> {
    let mut decided = steps::decisions(&steps::topology(input), &settings.templates);
    if let Some(j) = job {
        if !decided.contains_key(j) {
            return Err(OfflineError::UnknownJob {
                path: input.dir().to_path_buf(),
                job: j.to_string(),
                known: decided.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        decided.retain(|k, _| k == j);
    }
    Ok(decided)
}

/// Every job's rank-steps under `input` (the options' job and steps; ranks unused), jobs by
/// name.
pub fn rank_steps(
    input: &Input,
    settings: &Settings,
    opts: &StragglerOptions,
) -> Result<BTreeMap<String, Vec<RankStep>>, OfflineError> {
    Ok(steps_and_roles(input, settings, opts)?.0)
}

/// [`rank_steps`], and the role of every communicator the jobs' templates were decided with.
fn steps_and_roles(
    input: &Input,
    settings: &Settings,
    opts: &StragglerOptions,
) -> Result<(JobSteps, BTreeMap<u64, Role>, JobHost), OfflineError> {
    if let Some((a, b)) = opts.steps {
        if a > b {
            return Err(OfflineError::BadRange { a, b });
        }
    }
    let decided = decided_jobs(input, settings, opts.job.as_deref())?;
    let roles: BTreeMap<u64, Role> = decided.values().flat_map(|d| d.comm_roles()).collect();
    let cal = calibration::load(input.dir())?.unwrap_or_default();
    let mut per_job: BTreeMap<String, Vec<RankStep>> =
        decided.keys().map(|j| (j.clone(), Vec::new())).collect();
    let mut engine = steps::step_engine(settings, decided, true);
    engine.enable(Builtins {
        host: true,
        ..Builtins::default()
    });
    let host_err = opts.clock_err_us.unwrap_or(0);
    let ids = input.streams_of(per_job.keys());
    let mut spans = HostSpans::default();
    input.run_streams(&mut ids.iter(), &mut engine, &mut [], &mut |o| {
        let Output::Step(done) = o else { return };
        let id = done.id.clone();
        if let (Some(rs), Some(v)) = (
            calibrated(*done, &cal, host_err, opts.steps),
            per_job.get_mut(&id.job),
        ) {
            spans.note(&id, &rs);
            v.push(rs);
        }
    });
    let dropped = engine.arrivals_dropped();
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "straggler: operations dropped by full stream buffers"
        );
    }
    let host = spans.evidence(&engine);
    Ok((per_job, roles, host))
}

/// A completed step as the analysis takes it: its calibrated number (a merged step is not
/// complete), the host's clock bound added; `None` outside `window` or without arrivals.
pub fn calibrated(
    done: StepDone,
    cal: &Calibrations,
    host_err_us: u64,
    window: Option<(u64, u64)>,
) -> Option<RankStep> {
    let mut rs = done.arrivals?;
    let s = &done.summary;
    let c = cal.get(&done.id.job);
    rs.step = c.map_or(s.step, |c| c.step(s.rank, s.step));
    if c.is_some_and(|c| c.is_merged(s.rank, s.step)) {
        rs.coverage_complete = false;
    }
    if window.is_some_and(|(a, b)| rs.step < a || rs.step > b) {
        return None;
    }
    rs.err_us = rs.err_us.saturating_add(host_err_us);
    Some(rs)
}

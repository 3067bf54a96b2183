//! `comminsight-agent steps DIR [--json] [--ranks ..] [--steps a..b] [--templates DIR] [--job J]
//! [--calibrate preview|apply|clear] [--config FILE]`: training steps rebuilt from the
//! communication records, per rank.

use std::collections::BTreeMap;
use std::io::Write;

use crate::offline::calibration::{self, Calibrations};
use crate::offline::steps as offline_steps;
use crate::sinks::step_journal::{job_streams, read_stream, StepJournal};
use crate::steps::calibrate::{calibrate, Calibration};
use crate::steps::engine::JobInfo;
use crate::steps::fsm::{ClosedBy, Evidence, StepSummary};
use crate::steps::phase::PhaseTimes;
use crate::util::fs::ScratchDir;

use super::offline::{ranks_arg, settings, steps_arg};
use super::{exit, StepsArgs};

pub fn run(a: &StepsArgs) -> anyhow::Result<u8> {
    let settings = settings(&a.config, a.templates.as_deref())?;
    let ranks = ranks_arg(a.ranks.as_deref())?;
    let steps = steps_arg(a.steps.as_deref())?;
    let scratch = ScratchDir::new("steps-out");
    let input = super::offline::open_input(&a.dir, "steps")?;
    let mut kept = offline_steps::StepInputs::new(offline_steps::CACHED_OPS);
    let topology = offline_steps::first_pass(&input, &mut kept);
    let decisions = offline_steps::decisions(&topology, &settings.templates);
    let mut journal = StepJournal::new(scratch.path());
    let mut jobs =
        offline_steps::rebuild_into(&input, &settings, decisions, &mut kept, &mut journal)?;
    drop(journal);
    let skipped = serde_json::to_string(&input.skipped())?;
    super::keep_job(&mut jobs, a.job.as_deref(), &a.dir, |j| &j.job)?;
    let view = calibration_view(a, &jobs, scratch.path())?;
    // Streamed out, one step per line, one stream file at a time (4096 ranks x 1000 steps is
    // millions of steps).
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if a.json && jobs.len() > 1 {
        writeln!(w, "{{\"skipped\": {skipped}, \"jobs\": [")?;
    }
    for (ji, j) in jobs.iter().enumerate() {
        let cal = view.as_ref().and_then(|v| v.get(&j.job));
        if a.json {
            if ji > 0 {
                writeln!(w, ",")?;
            }
            let alone = (jobs.len() == 1).then_some(skipped.as_str());
            render_json_header(&mut w, j, cal.is_some(), alone)?;
        } else if !render_header(&mut w, j, cal.is_some())? {
            continue;
        }
        let (mut n, mut complete) = (0u64, 0u64);
        for (rank, f) in job_streams(scratch.path(), &j.job)? {
            if ranks
                .as_ref()
                .is_some_and(|rs| !rs.iter().any(|r| r.contains(&rank)))
            {
                continue;
            }
            for s in read_stream(&f)? {
                let v = StepView::of(&s, cal);
                if steps.is_some_and(|(lo, hi)| v.step < lo || v.step > hi) {
                    continue;
                }
                if a.json {
                    if n > 0 {
                        writeln!(w, ",")?;
                    }
                    serde_json::to_writer(&mut w, &v)?;
                } else {
                    render_row(&mut w, &v)?;
                }
                n += 1;
                complete += u64::from(v.coverage_complete);
            }
        }
        if a.json {
            write!(w, "\n]}}")?;
        } else {
            writeln!(w, "{n} steps shown, {complete} with complete coverage")?;
        }
    }
    if a.json {
        if jobs.len() > 1 {
            write!(w, "\n]}}")?;
        }
        writeln!(w)?;
    }
    w.flush()?;
    super::offline::report_skipped(&input.skipped());
    Ok(exit::OK)
}

/// Raw or calibrated numbers: by `--calibrate`, else by the job directory's saved state.
fn calibration_view(
    a: &StepsArgs,
    jobs: &[JobInfo],
    steps_root: &std::path::Path,
) -> anyhow::Result<Option<Calibrations>> {
    let mut computed: BTreeMap<String, Calibration> = BTreeMap::new();
    if matches!(a.calibrate.as_deref(), Some("preview" | "apply")) {
        for j in jobs {
            let mut all = Vec::new();
            for (_, f) in job_streams(steps_root, &j.job)? {
                all.extend(read_stream(&f)?);
            }
            computed.insert(j.job.clone(), calibrate(&all));
        }
    }
    Ok(match a.calibrate.as_deref() {
        Some("preview") => Some(computed),
        Some("apply") => {
            let path = calibration::save(&a.dir, &computed)?;
            eprintln!("calibration saved in {}", path.display());
            Some(computed)
        }
        Some(_) => {
            if let Some(path) = calibration::clear(&a.dir)? {
                eprintln!("calibration cleared ({})", path.display());
            }
            None
        }
        None => calibration::load(&a.dir)?,
    })
}

/// One step as printed (`step` in the chosen view).
#[derive(serde::Serialize)]
struct StepView<'a> {
    rank: i64,
    step: u64,
    raw_step: u64,
    first: &'a Evidence,
    anchor: Option<&'a Evidence>,
    anchor_alt: Option<u32>,
    last: &'a Evidence,
    duration_us: u64,
    ops: u64,
    coverage_complete: bool,
    closed_by: ClosedBy,
    #[serde(skip_serializing_if = "Option::is_none")]
    phases: Option<&'a PhaseTimes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    microbatches: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    merged: bool,
}

impl<'a> StepView<'a> {
    fn of(s: &'a StepSummary, cal: Option<&Calibration>) -> StepView<'a> {
        let merged = cal.is_some_and(|c| c.is_merged(s.rank, s.step));
        StepView {
            rank: s.rank,
            step: cal.map_or(s.step, |c| c.step(s.rank, s.step)),
            raw_step: s.step,
            first: &s.first,
            anchor: s.anchor.as_ref(),
            anchor_alt: s.anchor_alt,
            last: &s.last,
            duration_us: s.duration_us,
            ops: s.ops,
            coverage_complete: s.coverage_complete && !merged,
            closed_by: s.closed_by,
            phases: s.phases.as_ref(),
            microbatches: s.microbatches,
            merged,
        }
    }
}

/// A job's JSON up to its steps; `skipped` (the input's counts, JSON) when it is the only job.
fn render_json_header(
    w: &mut impl Write,
    j: &JobInfo,
    calibrated: bool,
    skipped: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(s) = skipped {
        write!(w, "{{\"skipped\": {s}, ")?;
    } else {
        write!(w, "{{")?;
    }
    writeln!(
        w,
        "\"job\": {}, \"template\": {}, \"features\": {}, \"calibrated\": {}, \"open_ops\": {}, \"tripped\": {}, \"late\": {}, \"steps\": [",
        serde_json::to_string(&j.job)?,
        serde_json::to_string(&j.template)?,
        serde_json::to_string(&j.features)?,
        calibrated,
        serde_json::to_string(&j.open_ops)?,
        serde_json::to_string(&j.tripped)?,
        j.late,
    )?;
    Ok(())
}

/// The human header of a job; `false` when it has no template (nothing more to show).
fn render_header(w: &mut impl Write, j: &JobInfo, calibrated: bool) -> std::io::Result<bool> {
    let Some(t) = &j.template else {
        writeln!(
            w,
            "job {}: no template matches its features [{}]; raw records are kept, steps can be rebuilt after adding one (templates/README.md)",
            j.job,
            j.features.join(", ")
        )?;
        return Ok(false);
    };
    writeln!(
        w,
        "job {}: template {} v{} ({} v{}); {} step numbers",
        j.job,
        t.name,
        t.version,
        t.file,
        t.file_version,
        if calibrated { "calibrated" } else { "raw" }
    )?;
    writeln!(
        w,
        "{:>6} {:>6} {:>12} {:>12} {:>12} {:>6}  complete",
        "rank", "step", "first_lsn", "last_lsn", "duration_us", "ops"
    )?;
    Ok(true)
}

fn render_row(w: &mut impl Write, x: &StepView) -> std::io::Result<()> {
    writeln!(
        w,
        "{:>6} {:>6} {:>12} {:>12} {:>12} {:>6}  {}",
        x.rank,
        x.step,
        x.first.coll_local_sn,
        x.last.coll_local_sn,
        x.duration_us,
        x.ops,
        if x.coverage_complete { "yes" } else { "no" }
    )
}

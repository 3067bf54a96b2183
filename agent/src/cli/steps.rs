//! `comminsight-agent steps DIR [--json] [--ranks ..] [--steps a..b] [--templates DIR] [--job J]`:
//! training steps rebuilt from the communication records, per rank.

use std::ops::RangeInclusive;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::io::Write;

use crate::steps::calibrate::{calibrate, Calibration};
use crate::steps::engine::{JobInfo, StepSettings};
use crate::steps::fsm::{ClosedBy, Evidence, StepSummary};
use crate::steps::journal;
use crate::steps::offline::rebuild;
use crate::steps::phase::PhaseTimes;
use crate::steps::template::TemplateSet;

use super::{exit, StepsArgs};

/// `"0,3,8-11"` -> the ranks.
pub fn parse_ranks(s: &str) -> Result<Vec<RangeInclusive<i64>>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let p = p.trim();
            let (a, b) = p.split_once('-').unwrap_or((p, p));
            match (a.trim().parse::<i64>(), b.trim().parse::<i64>()) {
                (Ok(a), Ok(b)) if a <= b => Ok(a..=b),
                _ => Err(format!(
                    "--ranks {s:?}: {p:?} is not a rank or a range like 8-11"
                )),
            }
        })
        .collect()
}

/// `"a..b"` (both included) or `"a"` -> the steps.
pub fn parse_steps(s: &str) -> Result<RangeInclusive<u64>, String> {
    let (a, b) = s.split_once("..").unwrap_or((s, s));
    match (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => Ok(a..=b),
        _ => Err(format!(
            "--steps {s:?}: use a..b (both included) or one step number"
        )),
    }
}

/// Removes a scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every stream file of `job` under `root`, with its rank (from its first step), by rank.
fn stream_files(root: &Path, job: &str) -> anyhow::Result<Vec<(i64, PathBuf)>> {
    let dir = journal::job_path(root, job)
        .parent()
        .expect("job.json has a parent")
        .to_path_buf();
    let mut out = Vec::new();
    let Ok(hosts) = std::fs::read_dir(&dir) else {
        return Ok(out);
    };
    for h in hosts.flatten().filter(|e| e.path().is_dir()) {
        for f in std::fs::read_dir(h.path())?.flatten() {
            let p = f.path();
            if p.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            let first = std::io::BufRead::lines(std::io::BufReader::new(std::fs::File::open(&p)?))
                .next()
                .transpose()?;
            let rank = first
                .and_then(|l| serde_json::from_str::<StepSummary>(&l).ok())
                .map_or(-1, |s| s.rank);
            out.push((rank, p));
        }
    }
    out.sort();
    Ok(out)
}

pub fn run(a: &StepsArgs) -> anyhow::Result<u8> {
    let templates = match &a.templates {
        Some(dir) => TemplateSet::load_dir(dir)?,
        None => TemplateSet::builtin(),
    };
    let ranks = a
        .ranks
        .as_deref()
        .map(parse_ranks)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let steps = a
        .steps
        .as_deref()
        .map(parse_steps)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let scratch = Scratch(crate::replay::scratch_dir("steps-out"));
    let mut jobs = rebuild(&a.dir, &templates, &StepSettings::default(), &scratch.0)?;
    super::keep_job(&mut jobs, a.job.as_deref(), &a.dir, |j| &j.job)?;
    // Raw or calibrated: by the option, else by the job's saved state.
    let state = state_path(&a.dir);
    let mut computed: BTreeMap<String, Calibration> = BTreeMap::new();
    if matches!(a.calibrate.as_deref(), Some("preview" | "apply")) {
        for j in &jobs {
            let mut all = Vec::new();
            for (_, f) in stream_files(&scratch.0, &j.job)? {
                all.extend(journal::read_stream(&f)?);
            }
            computed.insert(j.job.clone(), calibrate(&all));
        }
    }
    let view: Option<BTreeMap<String, Calibration>> = match a.calibrate.as_deref() {
        Some("preview") => Some(computed),
        Some("apply") => {
            save(&state, &computed)?;
            eprintln!("calibration saved in {}", state.display());
            Some(computed)
        }
        Some(_) => {
            match std::fs::remove_file(&state) {
                Ok(()) => eprintln!("calibration cleared ({})", state.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => anyhow::bail!("{}: cannot remove: {e}", state.display()),
            }
            None
        }
        None => load(&state)?,
    };
    // Streamed out, one step per line, one stream file at a time (4096 ranks x 1000 steps is
    // millions of steps).
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if a.json && jobs.len() > 1 {
        writeln!(w, "{{\"jobs\": [")?;
    }
    for (ji, j) in jobs.iter().enumerate() {
        let cal = view.as_ref().and_then(|v| v.get(&j.job));
        if a.json {
            if ji > 0 {
                writeln!(w, ",")?;
            }
            writeln!(
                w,
                "{{\"job\": {}, \"template\": {}, \"features\": {}, \"calibrated\": {}, \"open_ops\": {}, \"tripped\": {}, \"late\": {}, \"steps\": [",
                serde_json::to_string(&j.job)?,
                serde_json::to_string(&j.template)?,
                serde_json::to_string(&j.features)?,
                cal.is_some(),
                serde_json::to_string(&j.open_ops)?,
                serde_json::to_string(&j.tripped)?,
                j.late,
            )?;
        } else if !render_header(&mut w, j, cal.is_some())? {
            continue;
        }
        let (mut n, mut complete) = (0u64, 0u64);
        for (rank, f) in stream_files(&scratch.0, &j.job)? {
            if ranks
                .as_ref()
                .is_some_and(|rs| !rs.iter().any(|r| r.contains(&rank)))
            {
                continue;
            }
            for s in journal::read_stream(&f)? {
                let v = StepView::of(&s, cal);
                if steps.as_ref().is_some_and(|r| !r.contains(&v.step)) {
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
    Ok(exit::OK)
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

/// Where a job directory keeps its applied calibration.
fn state_path(dir: &Path) -> PathBuf {
    dir.join(".comminsight").join("steps-calibration.json")
}

fn save(path: &Path, c: &BTreeMap<String, Calibration>) -> anyhow::Result<()> {
    let dir = path.parent().expect("has a parent");
    std::fs::create_dir_all(dir).map_err(|e| {
        anyhow::anyhow!(
            "{}: cannot save the calibration ({e}); use --calibrate preview on a read-only directory",
            dir.display()
        )
    })?;
    crate::pipeline::state::write_atomic(path, serde_json::to_string_pretty(c)?.as_bytes())
        .map_err(|e| anyhow::anyhow!("{}: cannot save the calibration: {e}", path.display()))
}

fn load(path: &Path) -> anyhow::Result<Option<BTreeMap<String, Calibration>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(serde_json::from_slice(&b).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a calibration ({e}); run `steps --calibrate clear` or `--calibrate apply` again",
                path.display()
            )
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", path.display())),
    }
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

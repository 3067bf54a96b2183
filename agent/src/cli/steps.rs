//! `comminsight-agent steps DIR [--json] [--ranks ..] [--steps a..b] [--templates DIR] [--job J]`:
//! training steps rebuilt from the communication records, per rank.

use std::ops::RangeInclusive;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::steps::calibrate::{calibrate, Calibration};
use crate::steps::offline::{rebuild, JobSteps};
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
    let mut jobs = rebuild(&a.dir, &templates)?;
    if let Some(j) = &a.job {
        let known: Vec<String> = jobs.iter().map(|r| r.job.clone()).collect();
        jobs.retain(|r| &r.job == j);
        if jobs.is_empty() {
            anyhow::bail!(
                "{}: no job {j:?} (jobs found: {}); pass one of them to --job",
                a.dir.display(),
                known.join(", ")
            );
        }
    }
    // Raw or calibrated: by the option, else by the job's saved state.
    let state = state_path(&a.dir);
    let computed: BTreeMap<String, Calibration> = jobs
        .iter()
        .map(|j| (j.job.clone(), calibrate(&j.steps)))
        .collect();
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
    let mut docs = Vec::new();
    for j in &jobs {
        let cal = view.as_ref().and_then(|v| v.get(&j.job));
        let mut out_steps = Vec::new();
        let mut rows = Vec::new();
        for s in &j.steps {
            let step = cal.map_or(s.step, |c| c.step(s.rank, s.step));
            let keep = ranks
                .as_ref()
                .is_none_or(|rs| rs.iter().any(|r| r.contains(&s.rank)))
                && steps.as_ref().is_none_or(|r| r.contains(&step));
            if !keep {
                continue;
            }
            let mut v = serde_json::to_value(s)?;
            v["step"] = step.into();
            v["raw_step"] = s.step.into();
            if cal.is_some_and(|c| c.is_merged(s.rank, s.step)) {
                v["coverage_complete"] = false.into();
                v["merged"] = true.into();
            }
            out_steps.push(v);
            rows.push((s, step));
        }
        if !a.json {
            print!("{}", render_human(j, &rows, cal.is_some()));
        }
        docs.push(serde_json::json!({
            "job": j.job,
            "template": j.template,
            "features": j.features,
            "calibrated": cal.is_some(),
            "steps": out_steps,
            "open_ops": j.open_ops,
            "tripped": j.tripped,
        }));
    }
    if a.json {
        let text = match docs.as_slice() {
            [one] => serde_json::to_string_pretty(one)?,
            many => serde_json::to_string_pretty(&serde_json::json!({ "jobs": many }))?,
        };
        println!("{text}");
    }
    Ok(exit::OK)
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

fn render_human(
    j: &JobSteps,
    rows: &[(&crate::steps::fsm::StepSummary, u64)],
    calibrated: bool,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let Some(t) = &j.template else {
        let _ = writeln!(
            s,
            "job {}: no template matches its features [{}]; raw records are kept, steps can be rebuilt after adding one (templates/README.md)",
            j.job,
            j.features.join(", ")
        );
        return s;
    };
    let complete = j.steps.iter().filter(|x| x.coverage_complete).count();
    let _ = writeln!(
        s,
        "job {}: template {} v{} ({} v{}); {} steps, {} with complete coverage; {} step numbers",
        j.job,
        t.name,
        t.version,
        t.file,
        t.file_version,
        j.steps.len(),
        complete,
        if calibrated { "calibrated" } else { "raw" }
    );
    let _ = writeln!(
        s,
        "{:>6} {:>6} {:>12} {:>12} {:>12} {:>6}  complete",
        "rank", "step", "first_lsn", "last_lsn", "duration_us", "ops"
    );
    for (x, step) in rows {
        let _ = writeln!(
            s,
            "{:>6} {:>6} {:>12} {:>12} {:>12} {:>6}  {}",
            x.rank,
            step,
            x.first.coll_local_sn,
            x.last.coll_local_sn,
            x.duration_us,
            x.ops,
            if x.coverage_complete { "yes" } else { "no" }
        );
    }
    s
}

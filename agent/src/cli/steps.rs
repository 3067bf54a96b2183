//! `comminsight-agent steps DIR [--json] [--ranks ..] [--steps a..b] [--templates DIR] [--job J]`:
//! training steps rebuilt from the communication records, per rank.

use std::ops::RangeInclusive;

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
    for j in &mut jobs {
        j.steps.retain(|s| {
            ranks
                .as_ref()
                .is_none_or(|rs| rs.iter().any(|r| r.contains(&s.rank)))
                && steps.as_ref().is_none_or(|r| r.contains(&s.step))
        });
    }
    if a.json {
        let text = match jobs.as_slice() {
            [one] => serde_json::to_string_pretty(one)?,
            many => serde_json::to_string_pretty(&serde_json::json!({ "jobs": many }))?,
        };
        println!("{text}");
    } else {
        for j in &jobs {
            print!("{}", render_human(j));
        }
    }
    Ok(exit::OK)
}

fn render_human(j: &JobSteps) -> String {
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
        "job {}: template {} v{} ({} v{}); {} steps, {} with complete coverage",
        j.job,
        t.name,
        t.version,
        t.file,
        t.file_version,
        j.steps.len(),
        complete
    );
    let _ = writeln!(
        s,
        "{:>6} {:>6} {:>12} {:>12} {:>12} {:>6}  complete",
        "rank", "step", "first_lsn", "last_lsn", "duration_us", "ops"
    );
    for x in &j.steps {
        let _ = writeln!(
            s,
            "{:>6} {:>6} {:>12} {:>12} {:>12} {:>6}  {}",
            x.rank,
            x.step,
            x.first.coll_local_sn,
            x.last.coll_local_sn,
            x.duration_us,
            x.ops,
            if x.coverage_complete { "yes" } else { "no" }
        );
    }
    s
}

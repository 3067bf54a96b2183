//! `comminsight-agent report DIR -o report.html [--job J] [--steps a..b] [--templates DIR]
//! [--config FILE]`:
//! one self-contained HTML page per job (summary, step durations, straggler heatmap on the
//! parallel grid, hang verdicts, Perfetto trace commands).

use std::path::{Path, PathBuf};

use crate::report::{gather, render, GatherOptions};

use super::exit;
use super::offline::{settings, steps_arg, ConfigArg};

/// `report` options.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Segments: a segment root, a test-bed output directory, a job directory or an agent archive.
    pub dir: PathBuf,
    /// The HTML file to write (with several jobs and no --job: one file per job,
    /// `<stem>-<job>.html` next to it).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
    /// Only this job (default: every job found).
    #[arg(long)]
    pub job: Option<String>,
    /// Only these steps (a..b, both included, or one step).
    #[arg(long)]
    pub steps: Option<String>,
    /// Step templates from this directory (every *.toml) instead of the built-in ones.
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
    /// Ranks whose ops are embedded for the drill-down (highest index first).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub top_ops: usize,
    #[command(flatten)]
    pub config: ConfigArg,
}

/// Where job `job`'s page goes when several jobs share `out`.
fn per_job(out: &Path, job: &str) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or_else(|| "report".into(), |s| s.to_string_lossy().into_owned());
    let safe: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.with_file_name(format!("{stem}-{safe}.html"))
}

/// Run `report`.
pub fn run(a: &ReportArgs) -> anyhow::Result<u8> {
    let settings = settings(&a.config, a.templates.as_deref())?;
    let opts = GatherOptions {
        job: a.job.clone(),
        steps: steps_arg(a.steps.as_deref())?,
        top_ops_ranks: a.top_ops,
        ..GatherOptions::default()
    };
    let input = super::offline::open_input(&a.dir, "report")?;
    let models = gather(&input, &settings, &opts)?;
    let several = models.len() > 1;
    for m in &models {
        let path = if several {
            per_job(&a.out, &m.job)
        } else {
            a.out.clone()
        };
        let html = render(m);
        std::fs::write(&path, html.as_bytes()).map_err(|e| {
            anyhow::anyhow!(
                "{}: cannot write the report ({e}); pass a writable path to -o",
                path.display()
            )
        })?;
        let top = m
            .summary
            .top
            .first()
            .map(|t| {
                format!(
                    "top straggler rank {} (root index {:.1}, saves {:.1} %, seed index {:.1}, {})",
                    t.rank, t.root_index, t.saves_pct, t.index, t.class
                )
            })
            .unwrap_or_else(|| "no straggler".into());
        println!(
            "{}: job {}, {} ranks, {} steps, {}, {} hang verdict(s); {} bytes",
            path.display(),
            m.job,
            m.ranks.len(),
            m.step_stats.len(),
            top,
            m.summary.hang_verdicts,
            html.len()
        );
    }
    super::offline::report_skipped(&input.skipped());
    Ok(exit::OK)
}

//! `comminsight-agent straggler DIR [--steps a..b] [--ranks ..] [--job J] [--threshold X]
//! [--root-threshold X] [--clock-error-us N] [--templates DIR] [--config FILE] [--json]`: whose
//! own slowness starts the waiting (the root-cause index, issue 17) beside who makes the others
//! wait (the seed's straggler index of DESIGN.md §5), per job. Exit 1 when some rank's root index
//! is above the root threshold.

use std::io::Write;
use std::path::PathBuf;

use crate::offline::straggler::{reports, StragglerOptions};
use crate::straggler::{PeerWait, RankSummary, StragglerClass, StragglerReport};

use super::exit;
use super::offline::{ranks_arg, settings, steps_arg, ConfigArg};

/// Ranks shown per job at least (more when more are above the threshold, up to [`MAX_SHOWN`]).
const MIN_SHOWN: usize = 10;
const MAX_SHOWN: usize = 50;
/// Peers shown per rank in the human table.
const PEERS_SHOWN: usize = 3;

#[derive(Debug, clap::Args)]
pub struct StragglerArgs {
    /// Segments: a segment root, a test-bed output directory, a job directory or an agent archive.
    pub dir: PathBuf,
    /// Only these steps (a..b, both included, or one step).
    #[arg(long)]
    pub steps: Option<String>,
    /// List only these ranks (e.g. 0,3,8-11); the index is computed over every rank.
    #[arg(long)]
    pub ranks: Option<String>,
    /// Only this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Index (percent of the mean step) above which a rank is a straggler (default:
    /// `[straggler] threshold` of the configuration, 15).
    #[arg(long)]
    pub threshold: Option<f64>,
    /// Host clock error bound in µs: raw segments carry no host-offset measurement; pass it for
    /// hosts whose clocks are synced less well than the step's waits (waits below the two
    /// ranks' bounds are not attributed).
    #[arg(long = "clock-error-us")]
    pub clock_error_us: Option<u64>,
    /// Root-cause index (percent of the step) above which a rank is a straggler (default:
    /// `[straggler] root_threshold` of the configuration).
    #[arg(long = "root-threshold")]
    pub root_threshold: Option<f64>,
    /// Template directory (default: the built-in templates).
    #[arg(long)]
    pub templates: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArg,
    /// The report as JSON (one job: the report; several: {"jobs": [...]}).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &StragglerArgs) -> anyhow::Result<u8> {
    let mut settings = settings(&a.config, a.templates.as_deref())?;
    if let Some(t) = a.threshold {
        if !t.is_finite() || t < 0.0 {
            anyhow::bail!("--threshold {t}: use a number >= 0 (percent of the mean step)");
        }
        settings.straggler.threshold = t;
    }
    if let Some(t) = a.root_threshold {
        if !t.is_finite() || t < 0.0 {
            anyhow::bail!("--root-threshold {t}: use a number >= 0 (percent of the mean step)");
        }
        settings.straggler.root_threshold = t;
    }
    let ranks =
        ranks_arg(a.ranks.as_deref())?.map(|rs| rs.into_iter().flatten().collect::<Vec<i64>>());
    let opts = StragglerOptions {
        job: a.job.clone(),
        steps: steps_arg(a.steps.as_deref())?,
        ranks,
        clock_err_us: a.clock_error_us,
    };
    let input = super::offline::open_input(&a.dir, "straggler")?;
    let reps: Vec<StragglerReport> = reports(&input, &settings, &opts)?;
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if a.json {
        let v = if reps.len() == 1 {
            serde_json::to_value(&reps[0])?
        } else {
            serde_json::json!({ "jobs": reps })
        };
        serde_json::to_writer(&mut w, &super::offline::with_skipped(v, &input.skipped()))?;
        writeln!(w)?;
    } else {
        for r in &reps {
            render(&mut w, r)?;
        }
    }
    w.flush()?;
    super::offline::report_skipped(&input.skipped());
    let finding = reps
        .iter()
        .any(|r| r.ranks.iter().any(|x| r.is_straggler(x)));
    Ok(if finding { exit::FINDING } else { exit::OK })
}

fn peers(v: &[PeerWait]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter()
        .take(PEERS_SHOWN)
        .map(|p| format!("{}:{}us", p.rank, p.wait_us))
        .collect::<Vec<_>>()
        .join(",")
}

fn render(w: &mut impl Write, r: &StragglerReport) -> std::io::Result<()> {
    let over = r.ranks.iter().filter(|x| r.is_straggler(x)).count();
    writeln!(
        w,
        "job {}: {} ranks, {} steps, root threshold {:.1} with own excess > {:.1} % (seed index threshold {:.1}); {}",
        r.job,
        r.ranks.len(),
        r.steps.len(),
        r.root_threshold,
        r.root_min_delay,
        r.threshold,
        match over {
            0 => "no rank above it".to_string(),
            1 => "1 rank above it".to_string(),
            n => format!("{n} ranks above it"),
        }
    )?;
    if r.steps.is_empty() {
        writeln!(
            w,
            "  no steps: the job's template did not match or no step was complete (see `comminsight-agent steps {}`)",
            r.job
        )?;
        return Ok(());
    }
    writeln!(
        w,
        "{:>6} {:<12} {:>7} {:>7} {:>6} {:>7} {:>7} {:<13} {:<28} top victims (rank:us)",
        "rank", "host", "root", "saves%", "over", "index", "max", "class", "top causes (rank:us)"
    )?;
    let shown = over.clamp(MIN_SHOWN, MAX_SHOWN);
    for x in r.ranks.iter().take(shown) {
        let class = serde_json::to_value(x.class)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        writeln!(
            w,
            "{:>6} {:<12} {:>7.2} {:>7.2} {:>6} {:>7.2} {:>7.2} {:<13} {:<28} {}",
            x.rank,
            x.host,
            x.root_index,
            x.saves_pct,
            format!("{}/{}", x.root_steps_over, x.complete_steps),
            x.index,
            x.max_index,
            class,
            peers(&x.top_causes),
            peers(&x.top_victims)
        )?;
        if r.is_straggler(x) {
            if !x.chain.is_empty() {
                writeln!(w, "{:>6} {}", "", x.chain)?;
            }
            writeln!(w, "{:>6} {}", "", x.class_reason)?;
        }
    }
    let structural: Vec<&RankSummary> = r
        .ranks
        .iter()
        .filter(|x| x.class == StragglerClass::Structural)
        .collect();
    if let Some(first) = structural.first() {
        let mut ranks: Vec<i64> = structural.iter().map(|x| x.rank).collect();
        ranks.sort_unstable();
        writeln!(
            w,
            "  structural (no straggler rank): ranks {}: {}",
            ranks
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            first.class_reason
        )?;
    }
    if r.ranks.len() > shown {
        writeln!(
            w,
            "  ... {} more ranks (--json for all)",
            r.ranks.len() - shown
        )?;
    }
    for s in &r.steps {
        match s.ranks.first() {
            Some(t) => writeln!(
                w,
                "step {} avg_step_us {:.0} top rank {} root {:.2} index {:.2} structural {:.0}%",
                s.step, s.avg_step_us, t.rank, t.root_index, t.index, s.structural
            )?,
            None => writeln!(w, "step {} avg_step_us {:.0}", s.step, s.avg_step_us)?,
        }
    }
    Ok(())
}

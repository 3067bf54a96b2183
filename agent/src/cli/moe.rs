//! `comminsight-agent moe DIR [--job J] [--json] [--deepxtrace-log FILE [--details]]`: the MoE
//! expert-parallel windows of an input (the ranks' `ep_stats` records) analysed with
//! DeepXTrace's detector under `[moe]`: slow senders, slow receivers, slow paths, and windows a
//! rank never reported. Exit 1 on a finding or an incomplete window, like `straggler`.

use std::io::Write;
use std::path::PathBuf;

use crate::moe::windows::EpWindow;
use crate::offline::moe::windows;

use super::exit;
use super::offline::{settings, ConfigArg};

#[derive(Debug, clap::Args)]
pub struct MoeArgs {
    /// Segments (a segment root, a test-bed output directory, a job directory or an agent
    /// archive), or a results file of analysed windows (`results/moe/<job>.jsonl`, the
    /// archive's `moe/<job>.jsonl`).
    pub dir: PathBuf,
    /// Only this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Also write DeepXTrace's log lines (its `diagnose_rank0.log` format, which its heatmap
    /// script reads) to this file.
    #[arg(long, value_name = "FILE")]
    pub deepxtrace_log: Option<PathBuf>,
    /// With --deepxtrace-log: each window's matrix rows too (DeepXTrace's
    /// `DEEPEP_DIAGNOSE_LOG_DETAILS=1`).
    #[arg(long, requires = "deepxtrace_log")]
    pub details: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// JSON: `{"windows": [{"job", "event": {...}}, ...]}` (events as `results/moe` holds them).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &MoeArgs) -> anyhow::Result<u8> {
    let s = settings(&a.config, None)?;
    if !s.moe.enabled {
        eprintln!(
            "comminsight-agent: [moe] enabled = false in the configuration: nothing analysed"
        );
        return Ok(exit::OK);
    }
    if a.dir.is_file() {
        return run_file(a);
    }
    let input = super::offline::open_input(&a.dir, "moe")?;
    let r = windows(&input, &s.moe, a.job.as_deref());
    if let Some(path) = &a.deepxtrace_log {
        write_log(path, &r.windows, a.details)?;
    }
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if a.json {
        let ws: Vec<serde_json::Value> = r
            .windows
            .iter()
            .map(|x| serde_json::json!({ "job": x.job, "event": x.event }))
            .collect();
        let v = serde_json::json!({
            "windows": ws,
            "rows_refused": r.refused,
            "rows_dropped": r.dropped,
        });
        serde_json::to_writer(&mut w, &super::offline::with_skipped(v, &input.skipped()))?;
        writeln!(w)?;
    } else {
        render(&mut w, &r.windows)?;
    }
    w.flush()?;
    super::offline::report_skipped(&input.skipped());
    let finding = r.windows.iter().any(EpWindow::is_finding);
    Ok(if finding { exit::FINDING } else { exit::OK })
}

/// One window of a results file.
#[derive(serde::Deserialize)]
struct Saved {
    job: String,
    event: comminsight_ascend::report::EpEvent,
}

/// `moe FILE`: the windows a results file holds (lines that are not a window are counted and
/// skipped), shown like the segments' windows.
fn run_file(a: &MoeArgs) -> anyhow::Result<u8> {
    use std::io::BufRead;
    let path = &a.dir;
    if a.deepxtrace_log.is_some() {
        anyhow::bail!(
            "{}: a results file has no matrices for --deepxtrace-log; give the segments (the job's directory or the archive) instead",
            path.display()
        );
    }
    let f = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read ({e})", path.display()))?;
    let (mut saved, mut skipped) = (Vec::new(), 0u64);
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| anyhow::anyhow!("{}: cannot read ({e})", path.display()))?;
        match serde_json::from_str::<Saved>(&line) {
            Ok(w) if a.job.as_ref().is_none_or(|j| *j == w.job) => saved.push(w),
            Ok(_) => {}
            Err(_) if line.trim().is_empty() => {}
            Err(_) => skipped += 1,
        }
    }
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let finding = |s: &Saved| !s.event.findings.is_empty() || s.event.incomplete_window.is_some();
    if a.json {
        let ws: Vec<serde_json::Value> = saved
            .iter()
            .map(|x| serde_json::json!({ "job": x.job, "event": x.event }))
            .collect();
        serde_json::to_writer(
            &mut w,
            &serde_json::json!({"windows": ws, "lines_skipped": skipped}),
        )?;
        writeln!(w)?;
    } else {
        for x in saved.iter().filter(|x| finding(x)) {
            writeln!(w, "job {}: {}", x.job, x.event.summary())?;
        }
        let n = saved.iter().filter(|x| finding(x)).count();
        writeln!(
            w,
            "{} windows, {n} with a finding or missing a rank",
            saved.len()
        )?;
    }
    w.flush()?;
    if skipped > 0 {
        eprintln!(
            "comminsight-agent: {}: {skipped} lines are not EP windows (skipped); is it a results/moe/<job>.jsonl file?",
            path.display()
        );
    }
    Ok(if saved.iter().any(finding) {
        exit::FINDING
    } else {
        exit::OK
    })
}

/// One line per window with a finding, then a count.
fn render(w: &mut dyn Write, ws: &[EpWindow]) -> std::io::Result<()> {
    if ws.is_empty() {
        writeln!(w, "no EP window (no ep_stats records in the input)")?;
        return Ok(());
    }
    let mut shown = 0;
    for x in ws.iter().filter(|x| x.is_finding()) {
        writeln!(w, "job {}: {}", x.job, x.event.summary())?;
        shown += 1;
    }
    writeln!(
        w,
        "{} windows, {} with a finding or missing a rank",
        ws.len(),
        shown
    )
}

/// DeepXTrace's lines of every whole window, in its log format.
fn write_log(path: &std::path::Path, ws: &[EpWindow], details: bool) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path)
            .map_err(|e| anyhow::anyhow!("{}: cannot create the log: {e}", path.display()))?,
    );
    for l in ws.iter().flat_map(|x| x.deepxtrace_lines(details)) {
        writeln!(f, "{l}")?;
    }
    f.flush()
        .map_err(|e| anyhow::anyhow!("{}: cannot write the log: {e}", path.display()))
}

//! `comminsight-agent import [FORMAT] INPUT... -o OUT [--job J] [--json]`: other tools' evidence
//! (Flight Recorder dumps, Kineto traces, NCCL Inspector logs) as CommInsight records under `OUT`,
//! for `hang`, `steps`, `straggler`, `trace` and `report` (crate::interop).

use std::io::Write;
use std::path::PathBuf;

use comminsight_import::Format;

use super::exit;
use crate::interop::{import, ImportRequest, MANIFEST};

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The format (`flight-recorder`, `kineto` or `nccl-inspector`), then the inputs: dump files
    /// or a directory of them, trace files (`.json`, `.json.gz`), Inspector `.log` files or their
    /// directory. Without a format it is detected from the first input's content.
    #[arg(required = true, num_args = 1.., value_name = "[FORMAT] INPUT")]
    pub args: Vec<PathBuf>,
    /// The directory to write (new or empty): segment streams, `import.json`, hang evidence.
    #[arg(short, long, value_name = "DIR")]
    pub out: PathBuf,
    /// The job name of the streams (default: the input directory's name or the file's stem).
    #[arg(long)]
    pub job: Option<String>,
    /// Print `import.json` (what was read, written, skipped; the input's ground truth) instead
    /// of the summary line.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &ImportArgs) -> anyhow::Result<u8> {
    let (format, inputs) = split_format(&a.args);
    if inputs.is_empty() {
        anyhow::bail!("import: no input after the format; give the files or directory to import");
    }
    let req = ImportRequest {
        format,
        inputs,
        out: a.out.clone(),
        job: a.job.clone(),
        progress: !a.json,
    };
    let r = import(&req)?;
    let mut w = std::io::stdout().lock();
    if a.json {
        let text = std::fs::read_to_string(a.out.join(MANIFEST))?;
        writeln!(w, "{}", text.trim_end())?;
    } else {
        let s = &r.summary;
        writeln!(
            w,
            "imported {} {} input file(s) into {} as job {}: {} stream(s), {} record(s), {} op(s)",
            s.files,
            r.format.name(),
            a.out.display(),
            r.job,
            s.streams,
            s.records,
            s.ops
        )?;
        if let Some(b) = &r.hang_bundle {
            writeln!(w, "hang evidence: {}", b.display())?;
        }
        if !r.truth.is_empty() {
            writeln!(
                w,
                "ground truth kept apart (never fed to the step engine): {} ProfilerStep range(s) in {}",
                r.truth.len(),
                a.out.join(MANIFEST).display()
            )?;
        }
        writeln!(
            w,
            "next: comminsight-agent hang|steps|straggler|trace|report {}",
            a.out.display()
        )?;
    }
    w.flush()?;
    if let Some(d) = r.summary.skipped.describe() {
        eprintln!("comminsight-agent: import skipped {d}");
    }
    Ok(exit::OK)
}

/// A leading format name, and the inputs after it.
fn split_format(args: &[PathBuf]) -> (Option<Format>, Vec<PathBuf>) {
    match args
        .first()
        .and_then(|a| a.to_str()?.parse::<Format>().ok())
    {
        Some(f) if !args[0].exists() => (Some(f), args[1..].to_vec()),
        _ => (None, args.to_vec()),
    }
}

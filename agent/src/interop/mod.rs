//! `comminsight-agent import [FORMAT] INPUT... -o OUT` (issue 22): evidence other tools wrote
//! (PyTorch Flight Recorder dumps, Kineto traces, NCCL Inspector logs) converted by
//! `comminsight-import` into segment streams under `OUT`, so that `hang`, `steps`, `straggler`,
//! `trace` and `report` read it like a recording of the plugin. Beside the streams:
//! * `OUT/import.json`: what was read, written and skipped, and the ground truth the input
//!   carried that the analyses must not see (Kineto's `ProfilerStep#N` ranges);
//! * Flight Recorder: `OUT/hang/<job>/flight-recorder/dumps.snapshot.json`, the dumps as hang
//!   evidence ([`fr_snapshot`]), which `hang OUT` analyses with stacks and progress.

pub mod fr_snapshot;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use comminsight_import::kineto::StepTruth;
use comminsight_import::{detect, flight_recorder, inspector, kineto};
use comminsight_import::{Format, ImportError, ImportSummary};
use serde_json::json;

/// File name of the manifest an import writes in `OUT`.
pub const MANIFEST: &str = "import.json";

/// One import.
#[derive(Clone, Debug)]
pub struct ImportRequest {
    /// `None`: detected from the first input.
    pub format: Option<Format>,
    pub inputs: Vec<PathBuf>,
    pub out: PathBuf,
    /// `None`: named after the inputs (a directory's name, a file's stem).
    pub job: Option<String>,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

/// What an import did.
#[derive(Clone, Debug)]
pub struct ImportReport {
    pub format: Format,
    pub job: String,
    pub summary: ImportSummary,
    /// Kineto: the profiler's step ranges (ground truth, never records).
    pub truth: Vec<StepTruth>,
    /// Flight Recorder: the hang evidence written.
    pub hang_bundle: Option<PathBuf>,
}

/// The job name of `inputs` when none is given.
pub fn default_job(inputs: &[PathBuf]) -> String {
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let raw = match inputs {
        [one] if one.is_dir() => name(one),
        [one] => name(one).split('.').next().unwrap_or_default().to_string(),
        many => many
            .first()
            .and_then(|p| p.canonicalize().ok())
            .and_then(|p| p.parent().map(name))
            .unwrap_or_default(),
    };
    let job = comminsight_import::out::component(&raw);
    if job == "_" {
        "imported".into()
    } else {
        job
    }
}

/// `OUT` must be new or empty: an import never mixes with other streams.
fn prepare_out(out: &Path) -> Result<(), ImportError> {
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(|e| ImportError::io(out, e))?;
        if entries.next().is_some() {
            return Err(ImportError::Output {
                path: out.to_path_buf(),
                what: "the output directory is not empty; give a new directory (an import never mixes with other records)".into(),
            });
        }
    }
    std::fs::create_dir_all(out).map_err(|e| ImportError::io(out, e))
}

/// Run one import.
pub fn import(req: &ImportRequest) -> Result<ImportReport, ImportError> {
    let first = req.inputs.first().ok_or_else(|| {
        ImportError::format(
            ".",
            "no input given: name the dumps, traces or logs to import",
        )
    })?;
    for p in &req.inputs {
        if !p.exists() {
            return Err(ImportError::io(
                p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        }
    }
    let format = match req.format {
        Some(f) => f,
        None => detect(first)?,
    };
    let job = req.job.clone().unwrap_or_else(|| default_job(&req.inputs));
    prepare_out(&req.out)?;
    let total: u64 = req.inputs.iter().map(|p| input_bytes(p)).sum();
    let bar = progress_bar(req.progress, format, total);
    let mut report = ImportReport {
        format,
        job: job.clone(),
        summary: ImportSummary::default(),
        truth: Vec::new(),
        hang_bundle: None,
    };
    match format {
        Format::FlightRecorder => import_fr(req, &job, &mut report)?,
        Format::Kineto => {
            let mut done = 0;
            for p in &req.inputs {
                let base = done;
                let (s, t) =
                    kineto::import_file(p, &job, &req.out, &mut |n| bar.set_position(base + n))?;
                done += input_bytes(p);
                report.summary.merge(&s);
                report.truth.extend(t);
            }
        }
        Format::NcclInspector => {
            let files = inspector_files(&req.inputs)?;
            let s = inspector::import_files(&files, &job, &req.out, &mut |n| bar.set_position(n))?;
            report.summary.merge(&s);
        }
    }
    bar.finish_and_clear();
    write_manifest(req, &report)?;
    Ok(report)
}

fn import_fr(req: &ImportRequest, job: &str, report: &mut ImportReport) -> Result<(), ImportError> {
    let mut dumps = Vec::new();
    for input in &req.inputs {
        for p in flight_recorder::find_dumps(input)? {
            let (d, skips) = flight_recorder::read_dump(&p)?;
            report.summary.skipped.merge(&skips);
            report.summary.files += 1;
            dumps.push(d);
        }
    }
    dumps.sort_by_key(|d| d.rank);
    if let Some(w) = dumps.windows(2).find(|w| w[0].rank == w[1].rank) {
        return Err(ImportError::format(
            &w[1].path,
            format!(
                "a second dump of rank {} (also {}); import one dump per rank",
                w[1].rank,
                w[0].path.display()
            ),
        ));
    }
    let s = flight_recorder::write_streams(&dumps, job, &req.out)?;
    report.summary.merge(&ImportSummary { files: 0, ..s });
    let snap = fr_snapshot::snapshot(job, &dumps);
    let dir = req
        .out
        .join("hang")
        .join(comminsight_import::out::component(job))
        .join("flight-recorder");
    std::fs::create_dir_all(&dir).map_err(|e| ImportError::io(&dir, e))?;
    let path = dir.join(format!("dumps{}", crate::hang::model::SNAPSHOT_SUFFIX));
    let bytes = serde_json::to_vec_pretty(&snap).map_err(|e| ImportError::Output {
        path: path.clone(),
        what: e.to_string(),
    })?;
    std::fs::write(&path, bytes).map_err(|e| ImportError::io(&path, e))?;
    report.hang_bundle = Some(path);
    Ok(())
}

/// Inspector inputs: files, or the files of a directory (Inspector writes one per process).
fn inspector_files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, ImportError> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            out.extend(comminsight_import::detect::files_in(p)?);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Bytes of a file, or of the files of a directory.
fn input_bytes(p: &Path) -> u64 {
    if p.is_dir() {
        std::fs::read_dir(p)
            .map(|r| {
                r.filter_map(|e| e.ok()?.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
    }
}

fn progress_bar(show: bool, format: Format, total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !show || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "import {} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} ({{elapsed}})",
            format.name()
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

fn write_manifest(req: &ImportRequest, r: &ImportReport) -> Result<(), ImportError> {
    let path = req.out.join(MANIFEST);
    let v = json!({
        "format": r.format.name(),
        "job": r.job,
        "inputs": req.inputs,
        "summary": r.summary,
        "hang_bundle": r.hang_bundle,
        "ground_truth": {
            "profiler_steps": r.truth.iter().map(|t| json!({
                "file": t.file, "rank": t.rank, "step": t.step, "track": t.track,
                "start_ns": t.start_ns, "end_ns": t.end_ns,
            })).collect::<Vec<_>>(),
        },
    });
    let bytes = serde_json::to_vec_pretty(&v).map_err(|e| ImportError::Output {
        path: path.clone(),
        what: e.to_string(),
    })?;
    std::fs::write(&path, bytes).map_err(|e| ImportError::io(&path, e))
}

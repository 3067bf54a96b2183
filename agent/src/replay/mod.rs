//! `comminsight-agent replay DIR --out OUT`: the live pipeline's stages run offline over
//! segments, with the same code ([`crate::pipeline::process::Processor`], the same cursors),
//! so the results are byte-identical to what the daemon wrote for the same input.
//!
//! `DIR` may be a segment root, a test-bed output directory, a job directory or an agent
//! archive (`raw/**/seg-*.cis.zst` are decompressed into `OUT/.input/` first).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use comminsight_wire::RawRecord;
use serde::Serialize;

use crate::config::SourcesConfig;
use crate::pipeline::ingest::render_metrics;
use crate::pipeline::process::Processor;
use crate::pipeline::state::write_atomic;
use crate::sources::{find_log_roots, CursorStats, Discovery, StreamCursor};
use crate::steps::engine::StepSettings;
use crate::steps::journal::StepJournal;
use crate::steps::template::TemplateSet;
use crate::stream::StreamId;

/// Records read per poll offline: 128 KiB, so the read buffer and the batch stay in the CPU
/// caches while they are decoded (8 MiB batches measured ~25 % slower: page faults, zeroing).
const READ_BATCH: usize = 1024;

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{path}: no such directory (give a segment root, a test-bed output directory or an archive)")]
    Missing { path: PathBuf },
    #[error("{path}: no segment files (seg-*.cis or archived seg-*.cis.zst) under it")]
    NoSegments { path: PathBuf },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
}

/// Replay settings.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Show a progress bar on standard error (only when it is a terminal).
    pub progress: bool,
    /// Series cap of the metrics (the daemon's `[otlp] max_series`).
    pub max_series: usize,
    /// Rebuild the steps too (`OUT/steps/`), with these templates and settings (the daemon's
    /// `[steps]`).
    pub steps: Option<(TemplateSet, StepSettings)>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            progress: true,
            max_series: crate::config::OtlpConfig::default().max_series,
            steps: Some((TemplateSet::builtin(), StepSettings::default())),
        }
    }
}

/// Per-stream accounting of a replay.
#[derive(Clone, Debug, Serialize)]
pub struct StreamSummary {
    pub stream: StreamId,
    pub stats: CursorStats,
}

/// What a replay read and wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ReplaySummary {
    pub streams: usize,
    pub records: u64,
    pub corrupt: u64,
    pub seconds: f64,
    pub records_per_s: f64,
    pub outputs: Vec<PathBuf>,
    pub per_stream: Vec<StreamSummary>,
    /// The metrics results (also in `OUT/metrics.json`).
    #[serde(skip)]
    pub metrics: crate::metrics::MetricsSnapshot,
    /// Communicator roles per job (also in `OUT/roles.json`).
    #[serde(skip)]
    pub roles: Vec<crate::roles::JobRoles>,
    /// Each stream's mapping onto the job timeline, after all of its records.
    #[serde(skip)]
    pub alignments: BTreeMap<StreamId, crate::stream::Alignment>,
}

/// Run the pipeline over every segment under `input`, write the results under `out`.
pub fn replay(
    input: &Path,
    out: &Path,
    opts: &ReplayOptions,
) -> Result<ReplaySummary, ReplayError> {
    replay_visit(input, out, opts, &mut |_, _| {})
}

/// [`replay`], also handing every batch of every stream (in the stream's order) to `visit`.
pub fn replay_visit(
    input: &Path,
    out: &Path,
    opts: &ReplayOptions,
    visit: &mut dyn FnMut(&StreamId, &[RawRecord]),
) -> Result<ReplaySummary, ReplayError> {
    let io = |path: &Path, e: std::io::Error| ReplayError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let staged = out.join(".input");
    let t0 = Instant::now();
    let mut cursors = open_streams(input, &staged)?;
    let bar = progress_bar(opts.progress, cursors.len() as u64);
    let mut processor = Processor::new(opts.max_series);
    let mut buf: Vec<RawRecord> = Vec::with_capacity(READ_BATCH);
    let (mut records, mut corrupt) = (0u64, 0u64);
    let mut per_stream = Vec::new();
    for (id, cursor) in cursors.iter_mut() {
        drain_cursor(id, cursor, &mut buf, &mut |batch| {
            let o = processor.apply(id, batch);
            visit(id, batch);
            records += o.records;
            corrupt += o.corrupt;
        });
        per_stream.push(StreamSummary {
            stream: id.clone(),
            stats: cursor.stats(),
        });
        bar.inc(1);
        bar.set_message(format!("{records} records"));
    }
    bar.finish_and_clear();
    let seconds = t0.elapsed().as_secs_f64();
    let metrics = out.join("metrics.json");
    let snapshot = processor.snapshot();
    write_atomic(&metrics, render_metrics(&snapshot).as_bytes()).map_err(|e| io(&metrics, e))?;
    let roles = processor.roles();
    let roles_path = out.join("roles.json");
    write_atomic(&roles_path, crate::roles::render(&roles).as_bytes())
        .map_err(|e| io(&roles_path, e))?;
    let streams_path = out.join("streams.json");
    let mut text = serde_json::to_string_pretty(&per_stream).expect("serialisable");
    text.push('\n');
    write_atomic(&streams_path, text.as_bytes()).map_err(|e| io(&streams_path, e))?;
    if staged.exists() {
        let _ = std::fs::remove_dir_all(&staged);
    }
    let mut outputs = vec![metrics, roles_path, streams_path];
    if let Some((templates, settings)) = &opts.steps {
        // Second pass: the steps, with the templates chosen from the whole input's roles.
        let dir = out.join("steps");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io(&dir, e))?;
        }
        let decisions = crate::steps::offline::decisions(processor.topology(), templates);
        let mut journal = StepJournal::new(&dir);
        let scratch = out.join(".steps-input");
        let res = crate::steps::offline::steps_pass(
            input,
            &scratch,
            decisions,
            templates,
            settings,
            &mut journal,
        );
        let _ = std::fs::remove_dir_all(&scratch);
        res?;
        outputs.push(dir);
    }
    Ok(ReplaySummary {
        streams: per_stream.len(),
        records,
        corrupt,
        seconds,
        records_per_s: if seconds > 0.0 {
            records as f64 / seconds
        } else {
            0.0
        },
        alignments: cursors
            .keys()
            .map(|id| (id.clone(), processor.alignment(id, None)))
            .collect(),
        outputs,
        per_stream,
        metrics: snapshot,
        roles,
    })
}

/// A fresh scratch directory name under the system temp dir for an offline command (`what`).
pub fn scratch_dir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "comminsight-{what}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ))
}

/// The communicator roles of every job under `input` (same stages as [`replay`], results in a
/// scratch directory that is removed afterwards).
pub fn roles(input: &Path) -> Result<Vec<crate::roles::JobRoles>, ReplayError> {
    let scratch = scratch_dir("roles");
    let opts = ReplayOptions {
        progress: false,
        steps: None,
        ..ReplayOptions::default()
    };
    let res = replay(input, &scratch, &opts);
    let _ = std::fs::remove_dir_all(&scratch);
    res.map(|s| s.roles)
}

/// One exactly-once cursor per process stream under `input` (archives decompressed into
/// `staged` first; a job, host or process directory below a root keeps only its streams).
fn open_streams(
    input: &Path,
    staged: &Path,
) -> Result<BTreeMap<StreamId, StreamCursor>, ReplayError> {
    if !input.is_dir() {
        return Err(ReplayError::Missing {
            path: input.to_path_buf(),
        });
    }
    let io = |path: &Path, e: std::io::Error| ReplayError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut roots = Vec::new();
    for (i, root) in find_log_roots(input).into_iter().enumerate() {
        let dest = staged.join(i.to_string());
        if stage_archive(&root, &dest).map_err(|e| io(&root, e))? > 0 {
            roots.push(dest);
        } else {
            roots.push(root);
        }
    }
    if roots.is_empty() {
        return Err(ReplayError::NoSegments {
            path: input.to_path_buf(),
        });
    }
    let mut cursors: BTreeMap<StreamId, StreamCursor> = BTreeMap::new();
    for root in &roots {
        let only = (input != root.as_path() && input.starts_with(root)).then_some(input);
        let mut d = Discovery::new(&SourcesConfig {
            shm_enabled: false,
            segment_dirs: vec![root.clone()],
            ..SourcesConfig::default()
        });
        for s in d.scan() {
            if let Some(only) = only {
                if !s.seg_dir.as_deref().is_some_and(|d| d.starts_with(only)) {
                    continue;
                }
            }
            cursors
                .entry(s.id.clone())
                .or_insert_with(|| StreamCursor::new(s.id, s.seg_dir, None, None));
        }
    }
    Ok(cursors)
}

/// Hand every remaining batch of `cursor` to `f` (a read error ends the stream with a warning).
fn drain_cursor(
    id: &StreamId,
    cursor: &mut StreamCursor,
    buf: &mut Vec<RawRecord>,
    f: &mut dyn FnMut(&[RawRecord]),
) {
    loop {
        buf.clear();
        if let Err(e) = cursor.poll(buf, READ_BATCH) {
            tracing::warn!(stream = %id, "{e}");
            return;
        }
        if buf.is_empty() {
            return;
        }
        f(buf);
    }
}

/// Every stream's records in order, stream after stream (sorted by id), handed to `visit`,
/// without the processing stages (a second pass over what [`replay_visit`] already saw).
/// `scratch` holds decompressed archives while it runs and is removed afterwards.
pub fn read_streams(
    input: &Path,
    scratch: &Path,
    visit: &mut dyn FnMut(&StreamId, &[RawRecord]),
) -> Result<(), ReplayError> {
    let staged = scratch.join(".input");
    let mut cursors = open_streams(input, &staged)?;
    let mut buf: Vec<RawRecord> = Vec::with_capacity(READ_BATCH);
    for (id, cursor) in cursors.iter_mut() {
        drain_cursor(id, cursor, &mut buf, &mut |batch| visit(id, batch));
    }
    if staged.exists() {
        let _ = std::fs::remove_dir_all(&staged);
    }
    Ok(())
}

fn progress_bar(show: bool, streams: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !show || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(streams);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "replay {bar:30} {pos}/{len} streams {msg} ({elapsed})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Decompress an agent archive's `raw/<job>/<host>/<pid>/seg-N.cis.zst` into
/// `staged/<job>/<host>/<pid>/seg-N.cis`; returns the number of segments staged.
fn stage_archive(input: &Path, staged: &Path) -> std::io::Result<usize> {
    let mut raw_roots = Vec::new();
    find_dirs_named(input, "raw", 4, &mut raw_roots);
    if raw_roots.is_empty() {
        raw_roots.push(input.to_path_buf());
    }
    let mut n = 0;
    for raw in raw_roots {
        let mut files = Vec::new();
        walk_files(&raw, 4, &mut files);
        files.sort();
        for f in files {
            let Some(name) = f.file_name().and_then(|s| s.to_str()) else {
                continue;
            };
            let Some(seg) = name.strip_suffix(".zst") else {
                continue;
            };
            if !seg.ends_with(".cis") {
                continue;
            }
            let rel = f.parent().and_then(|p| p.strip_prefix(&raw).ok());
            let Some(rel) = rel else { continue };
            let dir = staged.join(rel);
            std::fs::create_dir_all(&dir)?;
            let mut dec = zstd::stream::read::Decoder::new(std::fs::File::open(&f)?)?;
            let mut bytes = Vec::new();
            dec.read_to_end(&mut bytes)?;
            std::fs::write(dir.join(seg), bytes)?;
            n += 1;
        }
    }
    Ok(n)
}

fn find_dirs_named(dir: &Path, name: &str, depth: u32, out: &mut Vec<PathBuf>) {
    if dir.file_name().is_some_and(|n| n == name) {
        out.push(dir.to_path_buf());
        return;
    }
    if depth == 0 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut subs: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    subs.sort();
    for s in subs {
        find_dirs_named(&s, name, depth - 1, out);
    }
}

fn walk_files(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() && depth > 0 => walk_files(&p, depth - 1, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

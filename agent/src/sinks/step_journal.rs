//! Step summaries on disk: one JSON line per step, one file per stream,
//! `<root>/<job>/<host>/<pid>.jsonl`, plus `<root>/<job>/job.json` (template, features, what was
//! left open). The daemon writes them under `<state_dir>/results/steps/`, `replay` under
//! `OUT/steps/`, byte-identical for the same input.
//!
//! Restart safety: the engine's state in the checkpoint may be older than the files (the files
//! are flushed before the checkpoint is written); after a restart the engine emits the same
//! steps again, and a step whose number is not above the file's last one is skipped. A torn last
//! line (a crash while writing) is cut off when the file is opened again.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::steps::engine::JobInfo;
use crate::steps::fsm::StepSummary;
use crate::stream::StreamId;

/// Files kept open at once (a host has a few dozen ranks; more are closed and reopened).
const MAX_OPEN: usize = 256;

/// Writer of the step files under one root.
pub struct StepJournal {
    root: PathBuf,
    open: BTreeMap<StreamId, Open>,
}

struct Open {
    w: BufWriter<File>,
    /// The next step number to write (lower ones are duplicates after a restart).
    next_step: u64,
}

/// One path component from an id part (no separators, never empty, never `.`/`..`).
fn component(s: &str) -> String {
    let c: String = s
        .chars()
        .map(|c| if c == '/' || c == '\\' { '_' } else { c })
        .collect();
    match c.as_str() {
        "" | "." | ".." => format!("_{c}"),
        _ => c,
    }
}

/// `<root>/<job>/<host>/<pid>.jsonl`.
pub fn stream_path(root: &Path, id: &StreamId) -> PathBuf {
    root.join(component(&id.job))
        .join(component(&id.host))
        .join(format!("{}.jsonl", component(&id.pid)))
}

/// `<root>/<job>/job.json`.
pub fn job_path(root: &Path, job: &str) -> PathBuf {
    root.join(component(job)).join("job.json")
}

impl StepJournal {
    /// A journal under `root` (created on the first write).
    pub fn new(root: &Path) -> StepJournal {
        StepJournal {
            root: root.to_path_buf(),
            open: BTreeMap::new(),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Append `s` to its stream's file (skipped when the file already has that step).
    pub fn write(&mut self, id: &StreamId, s: &StepSummary) -> std::io::Result<()> {
        if !self.open.contains_key(id) {
            if self.open.len() >= MAX_OPEN {
                self.close_all()?;
            }
            let f = open_for_append(&stream_path(&self.root, id))?;
            self.open.insert(id.clone(), f);
        }
        let f = self.open.get_mut(id).expect("opened above");
        if s.step < f.next_step {
            return Ok(());
        }
        serde_json::to_writer(&mut f.w, s).map_err(std::io::Error::other)?;
        f.w.write_all(b"\n")?;
        f.next_step = s.step + 1;
        Ok(())
    }

    /// Flush every open file to the kernel and to disk (before a checkpoint is written).
    pub fn sync(&mut self) -> std::io::Result<()> {
        for f in self.open.values_mut() {
            f.w.flush()?;
            f.w.get_ref().sync_data()?;
        }
        Ok(())
    }

    /// Flush and close one stream's file (its stream ended).
    pub fn close(&mut self, id: &StreamId) -> std::io::Result<()> {
        if let Some(mut f) = self.open.remove(id) {
            f.w.flush()?;
        }
        Ok(())
    }

    /// Flush and close every file.
    pub fn close_all(&mut self) -> std::io::Result<()> {
        for (_, mut f) in std::mem::take(&mut self.open) {
            f.w.flush()?;
        }
        Ok(())
    }

    /// Write every job's `job.json` (atomically).
    pub fn write_jobs(&self, jobs: &[JobInfo]) -> std::io::Result<()> {
        for j in jobs {
            let path = job_path(&self.root, &j.job);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut text = serde_json::to_string_pretty(j).map_err(std::io::Error::other)?;
            text.push('\n');
            crate::util::fs::write_atomic(&path, text.as_bytes())?;
        }
        Ok(())
    }
}

impl Drop for StepJournal {
    fn drop(&mut self) {
        let _ = self.close_all();
    }
}

/// Open a stream file for appending: cut a torn last line, learn the last step written.
fn open_for_append(path: &Path) -> std::io::Result<Open> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let len = f.metadata()?.len();
    // The tail: enough for the last complete line (a summary is a few hundred bytes).
    let from = len.saturating_sub(16 * 1024);
    f.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail)?;
    let keep = tail.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let cut = if keep == 0 && from > 0 {
        // No newline in the last 16 KiB: not our file, or corrupt; start it over.
        0
    } else {
        from + keep as u64
    };
    if cut < len {
        f.set_len(cut)?;
    }
    let next_step = tail[..keep.min(tail.len())]
        .split(|b| *b == b'\n')
        .rfind(|l| !l.is_empty())
        .and_then(|l| serde_json::from_slice::<StepSummary>(l).ok())
        .map_or(0, |s| s.step + 1);
    f.seek(SeekFrom::End(0))?;
    Ok(Open {
        w: BufWriter::new(f),
        next_step,
    })
}

/// Read one stream file back (a torn last line is ignored).
pub fn read_stream(path: &Path) -> std::io::Result<Vec<StepSummary>> {
    let text = std::fs::read(path)?;
    let mut out = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<StepSummary>(line) {
            Ok(s) => out.push(s),
            Err(e) if i + 1 == text.split(|b| *b == b'\n').count() => {
                tracing::debug!("{}: torn last line ignored: {e}", path.display());
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: line {}: not a step summary: {e}",
                        path.display(),
                        i + 1
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Every stream file of `job` under `root`, with the rank of its first step (-1 when empty), by
/// rank.
pub fn job_streams(root: &Path, job: &str) -> std::io::Result<Vec<(i64, PathBuf)>> {
    let dir = job_path(root, job)
        .parent()
        .expect("job.json has a parent")
        .to_path_buf();
    let mut out = Vec::new();
    for p in crate::util::fs::files_under(&dir, 1, &|n| n.ends_with(".jsonl")) {
        if p.parent() == Some(dir.as_path()) {
            continue;
        }
        let first = std::io::BufRead::lines(std::io::BufReader::new(File::open(&p)?))
            .next()
            .transpose()?;
        let rank = first
            .and_then(|l| serde_json::from_str::<StepSummary>(&l).ok())
            .map_or(-1, |s| s.rank);
        out.push((rank, p));
    }
    out.sort();
    Ok(out)
}

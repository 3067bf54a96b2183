//! The live MoE EP windows ([`crate::moe::windows::MoeWindows`]) as a sink of the daemon, where
//! every host's rows meet (the job master, or a standalone agent): EP rows in (`ep_row` step
//! lines, pushed like the straggler arrivals), per analysed window the gauges (column / row
//! ratios, the matrix for small groups, findings counted), an OTLP log record and an agent log
//! line per window with a finding or missing a rank, and the results files
//! `<state_dir>/results/moe/<job>.jsonl` (one event a window, as `comminsight-agent moe --json`
//! writes them) and `<job>.deepxtrace.log` (DeepXTrace's log lines, its heatmap script's input),
//! also under the archive's `moe/`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use comminsight_ascend::decode::Phase;
use comminsight_ascend::report::Finding;

use super::otlp::OtlpSink;
use super::LogEvent;
use crate::moe::windows::{EpWindow, MoeWindows};
use crate::moe::{EpRow, MoeConfig};
use crate::telemetry::moe::{GroupKey, GroupValues, MoeValues, MAX_GROUPS, MAX_MATRIX_N};

/// A results file is moved to `<name>.1` (replacing the previous one) past this size.
pub const ROTATE_BYTES: u64 = 64 << 20;

/// A function told of every window with a finding, with its one line.
pub type FindingHook = Box<dyn Fn(&str, &str) + Send + Sync>;

struct Inner {
    windows: MoeWindows,
    values: MoeValues,
}

/// The live EP windows and where their results go; share it behind an `Arc`.
pub struct MoeOutput {
    inner: Mutex<Inner>,
    host: String,
    otlp: Option<Arc<OtlpSink>>,
    dirs: Vec<PathBuf>,
    on_finding: OnceLock<FindingHook>,
    gauges: OnceLock<Arc<crate::telemetry::Source>>,
}

/// One step line's EP row (other lines have none).
#[derive(serde::Deserialize)]
struct Line {
    ep_row: Option<EpRow>,
}

impl MoeOutput {
    /// The live windows under `cfg`; results files go to each of `dirs`.
    pub fn new(
        cfg: &MoeConfig,
        dirs: Vec<PathBuf>,
        host: &str,
        otlp: Option<Arc<OtlpSink>>,
    ) -> Arc<MoeOutput> {
        Arc::new(MoeOutput {
            inner: Mutex::new(Inner {
                windows: MoeWindows::new(cfg),
                values: MoeValues::default(),
            }),
            host: host.to_string(),
            otlp,
            dirs,
            on_finding: OnceLock::new(),
            gauges: OnceLock::new(),
        })
    }

    /// Publish the gauges into `source` (OTLP and `/metrics` read it).
    pub fn set_gauges(&self, source: Arc<crate::telemetry::Source>) {
        let _ = self.gauges.set(source);
    }

    /// Tell `hook` (job, line) of every window with a finding from now on (once).
    pub fn set_on_finding(&self, hook: FindingHook) {
        let _ = self.on_finding.set(hook);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Step lines of `job` (as pushed to the master): their EP rows join the windows. A row
    /// is taken as `job`'s whatever it says (the push names the job).
    pub fn on_lines(&self, job: &str, bytes: &[u8]) {
        self.on_lines_at(job, bytes, crate::util::time::unix_ns());
    }

    /// [`Self::on_lines`] at `now_ns` (tests).
    pub fn on_lines_at(&self, job: &str, bytes: &[u8], now_ns: u64) {
        let mut done = Vec::new();
        {
            let mut g = self.lock();
            for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let Ok(Line {
                    ep_row: Some(mut r),
                }) = serde_json::from_slice::<Line>(line)
                else {
                    continue;
                };
                r.job = job.to_string();
                done.extend(g.windows.row(r, now_ns));
            }
        }
        self.publish(done);
    }

    /// Windows past their assembly timeout become incomplete (call it every second or so).
    pub fn tick(&self) {
        self.tick_at(crate::util::time::unix_ns());
    }

    /// [`Self::tick`] at `now_ns` (tests).
    pub fn tick_at(&self, now_ns: u64) {
        let done = self.lock().windows.expire(now_ns);
        self.publish(done);
    }

    /// The values the gauges export now.
    pub fn values(&self) -> MoeValues {
        self.lock().values.clone()
    }

    fn publish(&self, done: Vec<EpWindow>) {
        if done.is_empty() {
            return;
        }
        let values = {
            let mut g = self.lock();
            for w in &done {
                note(&mut g.values, w);
            }
            g.values.clone()
        };
        for w in &done {
            self.write_results(w);
            if w.is_finding() {
                let ev = LogEvent::ep_window(&self.host, &w.job, &w.event);
                tracing::warn!(job = %w.job, "{}", ev.body);
                if let Some(h) = self.on_finding.get() {
                    h(&w.job, &ev.body);
                }
                if let Some(s) = &self.otlp {
                    s.emit(ev);
                }
            }
        }
        if let Some(s) = self.gauges.get() {
            s.set_moe(values);
        }
    }

    fn write_results(&self, w: &EpWindow) {
        let Ok(mut event) =
            serde_json::to_vec(&serde_json::json!({"job": w.job, "event": w.event}))
        else {
            return;
        };
        event.push(b'\n');
        let mut log = Vec::new();
        for l in w.deepxtrace_lines(false) {
            log.extend_from_slice(l.as_bytes());
            log.push(b'\n');
        }
        for dir in &self.dirs {
            for (name, bytes) in [
                (format!("{}.jsonl", w.job), &event),
                (format!("{}.deepxtrace.log", w.job), &log),
            ] {
                if bytes.is_empty() {
                    continue;
                }
                let path = dir.join(name);
                if let Err(e) = append(dir, &path, bytes) {
                    tracing::warn!("{}: cannot write the EP window: {e}", path.display());
                }
            }
        }
    }
}

/// Append `bytes` to `path` (created 0644 in `dir`), moving a file past [`ROTATE_BYTES`] to
/// `<path>.1` first.
fn append(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= ROTATE_BYTES) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(path, old)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(bytes)
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Dispatch => "dispatch",
        Phase::Combine => "combine",
    }
}

/// The window's values into the gauges: its group's latest ratios, its findings counted.
fn note(v: &mut MoeValues, w: &EpWindow) {
    let e = &w.event;
    let key: GroupKey = (
        w.job.clone(),
        format!("{:#018x}", e.ep_group_id),
        phase_name(e.phase),
    );
    if let Some((cols, rows)) = w.ratios() {
        let cells = match &w.matrix {
            Some(m) if m.n() <= MAX_MATRIX_N => {
                let n = m.n() as f64;
                let mu = m.cells().iter().sum::<f64>() / (n * n);
                m.cells().iter().map(|c| c / (mu + 1e-8)).collect()
            }
            _ => Vec::new(),
        };
        if v.groups.len() < MAX_GROUPS || v.groups.contains_key(&key) {
            v.groups
                .insert(key.clone(), GroupValues { cols, rows, cells });
        }
    }
    let mut kinds: Vec<&'static str> = e
        .findings
        .iter()
        .map(|f| match f {
            Finding::SenderSlow { .. } => "sender_slow",
            Finding::ReceiverSlow { .. } => "receiver_slow",
            Finding::PathSlow { .. } => "path_slow",
        })
        .collect();
    if e.incomplete_window.is_some() {
        kinds.push("incomplete_window");
    }
    for k in kinds {
        if v.findings.len() < MAX_GROUPS * 4 || v.findings.contains_key(&(key.clone(), k)) {
            *v.findings.entry((key.clone(), k)).or_default() += 1;
        }
    }
}

/// Tick `out` every second on its own thread until `out` is dropped.
pub fn start_ticker(out: &Arc<MoeOutput>) {
    let weak = Arc::downgrade(out);
    let _ = std::thread::Builder::new()
        .name("comminsight-moe".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let Some(out) = weak.upgrade() else { return };
            out.tick();
        });
}

#[cfg(test)]
mod tests;

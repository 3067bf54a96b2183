//! The live straggler index ([`crate::straggler::live`]) as a sink of the daemon: step arrivals in
//! (from the master's store, or from this agent's own steps when it has no master), per
//! analysed step the OTLP gauge and the "m of n steps" alerts out (agent log and OTLP log
//! record), and each job's report written to `<state_dir>/results/straggler/<job>.json` (and the
//! archive's `straggler/`) at most every [`REPORT_EVERY`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::otlp::OtlpSink;
use super::LogEvent;
use crate::straggler::live::{LiveSettings, LiveStraggler, StepOutcome};

/// A job's report is rewritten at most this often (the analysis of its kept steps runs then).
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// The live analysis and where its results go; share it behind an `Arc`.
pub struct StragglerOutput {
    live: LiveStraggler,
    host: String,
    otlp: Option<Arc<OtlpSink>>,
    dirs: Vec<PathBuf>,
    /// Also told of every alert (the daemon's `/status`).
    on_alert: std::sync::OnceLock<AlertHook>,
    /// Where the straggler gauges go (the daemon's telemetry source: OTLP and `/metrics`).
    gauges: std::sync::OnceLock<Arc<crate::telemetry::Source>>,
}

/// A function told of every straggler alert, with its one line.
pub type AlertHook = Box<dyn Fn(&crate::straggler::live::Alert, &str) + Send + Sync>;

impl StragglerOutput {
    /// The live analysis with `settings`; reports go to `<dir>/<job>.json` in each of `dirs`.
    pub fn new(
        settings: LiveSettings,
        dirs: Vec<PathBuf>,
        host: &str,
        otlp: Option<Arc<OtlpSink>>,
    ) -> Arc<Self> {
        Arc::new(StragglerOutput {
            live: LiveStraggler::new(settings),
            host: host.to_string(),
            otlp,
            dirs,
            on_alert: std::sync::OnceLock::new(),
            gauges: std::sync::OnceLock::new(),
        })
    }

    /// Publish the straggler gauges into `source` (also without OTLP: `/metrics` reads it).
    pub fn set_gauges(&self, source: Arc<crate::telemetry::Source>) {
        let _ = self.gauges.set(source);
    }

    /// Tell `hook` of every alert from now on (once; a second hook is ignored).
    pub fn set_on_alert(&self, hook: AlertHook) {
        let _ = self.on_alert.set(hook);
    }

    /// Step lines of `job` (as pushed to the master).
    pub fn on_lines(&self, job: &str, bytes: &[u8]) {
        let out = self.live.on_lines(job, bytes, Instant::now());
        self.publish(&out);
    }

    /// Settle timeouts, then the reports of jobs analysed since the last call.
    pub fn tick(&self) {
        let out = self.live.tick(Instant::now());
        self.publish(&out);
        for (report, late) in self.live.take_reports() {
            if late > 0 {
                tracing::debug!(job = %report.job, late, "straggler: step reports after their step was analysed (dropped)");
            }
            let Ok(json) = serde_json::to_vec_pretty(&report) else {
                continue;
            };
            for dir in &self.dirs {
                let path = dir.join(format!("{}.json", report.job));
                let res = std::fs::create_dir_all(dir)
                    .and_then(|_| crate::util::fs::write_atomic(&path, &json));
                if let Err(e) = res {
                    tracing::warn!("{}: cannot write the straggler report: {e}", path.display());
                }
            }
        }
    }

    fn publish(&self, out: &[StepOutcome]) {
        if out.is_empty() {
            return;
        }
        for o in out {
            for a in &o.alerts {
                let ev = LogEvent::straggler(&self.host, a);
                tracing::warn!(job = %a.job, "{}", ev.body);
                if let Some(h) = self.on_alert.get() {
                    h(a, &ev.body);
                }
                if let Some(s) = &self.otlp {
                    s.emit(ev);
                }
            }
        }
        if let Some(g) = self.gauges.get() {
            g.set_straggler(self.live.gauges());
        } else if let Some(s) = &self.otlp {
            s.set_straggler(self.live.gauges());
        }
    }
}

/// Tick `out` every second on its own thread until the process ends (or `out` is dropped).
pub fn start_ticker(out: &Arc<StragglerOutput>) {
    let weak = Arc::downgrade(out);
    let _ = std::thread::Builder::new()
        .name("comminsight-straggler".into())
        .spawn(move || {
            let mut last = Instant::now();
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(out) = weak.upgrade() else { return };
                if last.elapsed() >= REPORT_EVERY {
                    last = Instant::now();
                    out.tick();
                } else {
                    out.publish(&out.live.tick(Instant::now()));
                }
            }
        });
}

//! The daemon's state for people and supervisors: [`Live`] is updated by the ingest loop and
//! the sinks and read by the HTTP endpoint's `/status` and `/readyz`, by
//! `<state_dir>/status.json` (rewritten atomically every [`FILE_EVERY`]) and by the systemd
//! `STATUS=` line ([`status_line`], sent at ready and every [`SYSTEMD_EVERY`] when it changed).
//! [`DaemonStatus`] is the one shape all of them show, and what `comminsight-agent status`
//! renders.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::host::recorder::RecorderStatus;
use crate::metrics::SelfMetrics;
use crate::util::time::unix_ms;

/// `<state_dir>/status.json` is rewritten this often.
pub const FILE_EVERY: Duration = Duration::from_secs(2);
/// The systemd status line is re-sent at most this often (and only when it changed).
pub const SYSTEMD_EVERY: Duration = Duration::from_secs(10);
/// The ingest loop counts as alive while its last round is this recent.
pub const ALIVE_MS: u64 = 30_000;
/// Format version of [`DaemonStatus`].
pub const STATUS_VERSION: u32 = 1;

/// One followed stream (one rank process).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamStatus {
    pub job: String,
    pub host: String,
    pub pid: String,
    /// Global rank, once the stream said it.
    pub rank: Option<i64>,
    /// Records read from it.
    pub records: u64,
    /// How old its newest record was when it was read (ms).
    pub lag_ms: u64,
    /// Records lost before the agent could read them (seq gaps) and corrupt records skipped.
    pub drops: u64,
    /// Its process ended and everything it wrote was read.
    pub finished: bool,
}

/// The sinks' health.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SinkStatus {
    pub otlp_enabled: bool,
    pub archive_enabled: bool,
    /// Failed sink operations (exports, uploads, archive writes).
    pub errors: u64,
    /// Log records dropped because the OTLP backlog was full.
    pub logs_dropped: u64,
    /// Sealed segments waiting for the archive.
    pub archive_backlog: u64,
}

/// A finding, as its one line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// When the daemon announced it (ms since the Unix epoch).
    pub at_unix_ms: u64,
    pub job: String,
    pub line: String,
}

/// The daemon's state at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub version: u32,
    pub agent_version: String,
    pub pid: u32,
    pub host: String,
    pub state_dir: PathBuf,
    /// The endpoint's bound address, when it serves.
    pub http: Option<String>,
    pub started_unix_ms: u64,
    pub uptime_s: u64,
    /// When this status was taken.
    pub taken_unix_ms: u64,
    pub ready: bool,
    pub stopping: bool,
    /// Records read since start, and the rate over the last few seconds.
    pub records: u64,
    pub records_per_s: f64,
    /// How old the newest record was when it was read (ms).
    pub lag_ms: u64,
    /// Sum of the streams' drops.
    pub drops: u64,
    pub rss_bytes: u64,
    pub streams: Vec<StreamStatus>,
    pub sinks: SinkStatus,
    pub last_hang: Option<Finding>,
    pub last_straggler: Option<Finding>,
    /// The last MoE EP window with a finding or missing a rank (master / standalone agents).
    #[serde(default)]
    pub last_moe: Option<Finding>,
    /// The host recorder (probes, thread source, ports), when `[probes]` or `[ports]` run it.
    #[serde(default)]
    pub host_context: Option<RecorderStatus>,
}

/// The daemon's live state, shared behind an `Arc`.
pub struct Live {
    started: Instant,
    started_unix_ms: u64,
    host: String,
    state_dir: PathBuf,
    otlp_enabled: bool,
    archive_enabled: bool,
    ready: AtomicBool,
    stopping: AtomicBool,
    /// Ms since the epoch at the ingest loop's last round.
    heartbeat: Arc<AtomicU64>,
    self_metrics: Arc<SelfMetrics>,
    http: Mutex<Option<String>>,
    streams: Mutex<Vec<StreamStatus>>,
    last_hang: Mutex<Option<Finding>>,
    last_straggler: Mutex<Option<Finding>>,
    last_moe: Mutex<Option<Finding>>,
    host_context: Mutex<Option<RecorderStatus>>,
    /// `(when, records)` at the previous rate sample, and the rate then.
    rate: Mutex<(Instant, u64, f64)>,
}

impl Live {
    pub fn new(
        host: &str,
        state_dir: &Path,
        sinks: (bool, bool),
        heartbeat: Arc<AtomicU64>,
        self_metrics: Arc<SelfMetrics>,
    ) -> Arc<Live> {
        Arc::new(Live {
            started: Instant::now(),
            started_unix_ms: unix_ms(),
            host: host.to_string(),
            state_dir: state_dir.to_path_buf(),
            otlp_enabled: sinks.0,
            archive_enabled: sinks.1,
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            heartbeat,
            self_metrics,
            http: Mutex::new(None),
            streams: Mutex::new(Vec::new()),
            last_hang: Mutex::new(None),
            last_straggler: Mutex::new(None),
            last_moe: Mutex::new(None),
            host_context: Mutex::new(None),
            rate: Mutex::new((Instant::now(), 0, 0.0)),
        })
    }

    /// Sources and sinks are up.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Shutdown began.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// The endpoint serves on `addr`.
    pub fn set_http(&self, addr: String) {
        *lock(&self.http) = Some(addr);
    }

    /// The ingest loop's view of its streams.
    pub fn set_streams(&self, streams: Vec<StreamStatus>) {
        *lock(&self.streams) = streams;
    }

    /// The host recorder's state now.
    pub fn set_host_context(&self, status: RecorderStatus) {
        *lock(&self.host_context) = Some(status);
    }

    /// A hang or failure verdict was announced.
    pub fn hang_verdict(&self, job: &str, line: String) {
        *lock(&self.last_hang) = Some(Finding {
            at_unix_ms: unix_ms(),
            job: job.to_string(),
            line,
        });
    }

    /// A straggler was announced.
    pub fn straggler(&self, job: &str, line: String) {
        *lock(&self.last_straggler) = Some(Finding {
            at_unix_ms: unix_ms(),
            job: job.to_string(),
            line,
        });
    }

    /// An MoE EP window had a finding or missed a rank.
    pub fn moe(&self, job: &str, line: String) {
        *lock(&self.last_moe) = Some(Finding {
            at_unix_ms: unix_ms(),
            job: job.to_string(),
            line,
        });
    }

    /// The ingest loop made a round recently.
    pub fn alive(&self) -> bool {
        unix_ms().saturating_sub(self.heartbeat.load(Ordering::Relaxed)) < ALIVE_MS
    }

    /// Ready and not stopping.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.stopping.load(Ordering::Acquire)
    }

    /// Refresh the records rate (called by the status ticker, every [`FILE_EVERY`]).
    fn sample_rate(&self) {
        let records = self.self_metrics.values().records;
        let mut r = lock(&self.rate);
        let dt = r.0.elapsed().as_secs_f64();
        if dt >= 0.5 {
            r.2 = records.saturating_sub(r.1) as f64 / dt;
            *r = (Instant::now(), records, r.2);
        }
    }

    /// The state now.
    pub fn snapshot(&self) -> DaemonStatus {
        let m = self.self_metrics.values();
        let streams = lock(&self.streams).clone();
        DaemonStatus {
            version: STATUS_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            host: self.host.clone(),
            state_dir: self.state_dir.clone(),
            http: lock(&self.http).clone(),
            started_unix_ms: self.started_unix_ms,
            uptime_s: self.started.elapsed().as_secs(),
            taken_unix_ms: unix_ms(),
            ready: self.ready.load(Ordering::Acquire),
            stopping: self.stopping.load(Ordering::Acquire),
            records: m.records,
            records_per_s: lock(&self.rate).2,
            lag_ms: m.lag_ms,
            drops: streams.iter().map(|s| s.drops).sum(),
            rss_bytes: m.rss_bytes,
            streams,
            sinks: SinkStatus {
                otlp_enabled: self.otlp_enabled,
                archive_enabled: self.archive_enabled,
                errors: m.sink_errors,
                logs_dropped: m.logs_dropped,
                archive_backlog: m.archive_backlog,
            },
            last_hang: lock(&self.last_hang).clone(),
            last_straggler: lock(&self.last_straggler).clone(),
            last_moe: lock(&self.last_moe).clone(),
            host_context: lock(&self.host_context).clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `<state_dir>/status.json`.
pub fn status_path(state_dir: &Path) -> PathBuf {
    state_dir.join("status.json")
}

/// The one-line status for `systemctl status`: streams, rate, lag, drops, the last verdict.
pub fn status_line(s: &DaemonStatus) -> String {
    let live = s.streams.iter().filter(|x| !x.finished).count();
    let verdict = [&s.last_hang, &s.last_straggler, &s.last_moe]
        .into_iter()
        .flatten()
        .max_by_key(|f| f.at_unix_ms)
        .map_or_else(|| "none".to_string(), |f| f.line.clone());
    format!(
        "following {} streams ({live} live); {} records/s; lag {}; {} dropped; last verdict: {verdict}",
        s.streams.len(),
        round2(s.records_per_s),
        lag(s.lag_ms),
        s.drops,
    )
}

/// `ms` for people: `850 ms`, `12 s`, `3 min`.
pub fn lag(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..120_000 => format!("{} s", ms / 1000),
        _ => format!("{} min", ms / 60_000),
    }
}

/// Two significant digits (so the status line changes with the rate, not with every record).
pub fn round2(v: f64) -> String {
    if v < 1.0 {
        return if v > 0.0 { "<1".into() } else { "0".into() };
    }
    let digits = v.log10().floor() as i32;
    let scale = 10f64.powi((digits - 1).max(0));
    format!("{}", ((v / scale).round() * scale) as u64)
}

/// Every [`FILE_EVERY`]: refresh the rate, rewrite `status.json`; every [`SYSTEMD_EVERY`] send
/// the status line to systemd when it changed. Returns at `stop`.
pub async fn ticker(live: Arc<Live>, mut stop: watch::Receiver<bool>) {
    let path = status_path(&live.state_dir);
    let mut last_line = String::new();
    let mut last_sent: Option<Instant> = None;
    loop {
        live.sample_rate();
        let snap = live.snapshot();
        let line = status_line(&snap);
        if line != last_line && last_sent.is_none_or(|t| t.elapsed() >= SYSTEMD_EVERY) {
            let _ = crate::sdnotify::status(&line);
            last_sent = Some(Instant::now());
            last_line = line;
        }
        let p = path.clone();
        let res = tokio::task::spawn_blocking(move || {
            let json = serde_json::to_vec_pretty(&snap).map_err(std::io::Error::other)?;
            crate::util::fs::write_atomic(&p, &json)
        })
        .await;
        if let Ok(Err(e)) = res {
            tracing::debug!("{}: cannot write the status: {e}", path.display());
        }
        tokio::select! {
            _ = tokio::time::sleep(FILE_EVERY) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_names_streams_rate_lag_drops_and_the_newest_verdict() {
        let mut s = DaemonStatus {
            records_per_s: 12_345.0,
            lag_ms: 1_500,
            drops: 3,
            streams: vec![
                StreamStatus::default(),
                StreamStatus {
                    finished: true,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            status_line(&s),
            "following 2 streams (1 live); 12000 records/s; lag 1 s; 3 dropped; last verdict: none"
        );
        s.last_hang = Some(Finding {
            at_unix_ms: 5,
            job: "j".into(),
            line: "hang: rank 3".into(),
        });
        s.last_straggler = Some(Finding {
            at_unix_ms: 9,
            job: "j".into(),
            line: "straggler: rank 1".into(),
        });
        assert!(status_line(&s).ends_with("last verdict: straggler: rank 1"));
    }

    #[test]
    fn rates_and_lags_are_rounded_for_people() {
        assert_eq!(
            [0.0, 0.4, 7.2, 99.6, 1234.0, 98_765.0].map(round2),
            ["0", "<1", "7", "100", "1200", "99000"]
        );
        assert_eq!([12, 4_999, 300_000].map(lag), ["12 ms", "4 s", "5 min"]);
    }

    #[test]
    fn readiness_follows_start_and_stop() {
        let hb = Arc::new(AtomicU64::new(unix_ms()));
        let live = Live::new(
            "h",
            Path::new("/x"),
            (true, false),
            hb.clone(),
            Arc::default(),
        );
        assert!(live.alive() && !live.ready());
        live.set_ready();
        assert!(live.ready());
        live.set_stopping();
        assert!(!live.ready());
        hb.store(0, Ordering::Relaxed);
        assert!(!live.alive());
        let s = live.snapshot();
        assert!(s.ready && s.stopping && s.sinks.otlp_enabled && !s.sinks.archive_enabled);
    }
}

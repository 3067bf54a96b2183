//! OTLP export (HTTP protobuf or gRPC) of the [`Source`]'s metrics and of log records
//! ([`LogEvent`]), encoded by [`crate::telemetry::otlp`] from the aggregator's pre-aggregated
//! sums: counters as cumulative sums, the op duration as a native OTLP histogram in seconds,
//! the full resource (`service.*`, `host.*`, `OTEL_RESOURCE_ATTRIBUTES`). No OpenTelemetry SDK:
//! the SDK cannot take pre-aggregated histograms, and the aggregator (checkpointed, it survives
//! restarts) is the single source of truth. With cumulative temporality an export after an
//! outage carries the totals, so nothing observed during the outage is lost.
//!
//! # Threads
//! Nothing blocks the caller's runtime: the sink owns one thread running a current-thread tokio
//! runtime with two tasks, the periodic metric export and the log backlog's drain
//! ([`logs`]). Both retry with the shared jittered backoff ([`crate::util::backoff`]); a failing
//! export is one `warn` per failure streak (and `SelfMetrics::sink_errors`), never an error that
//! stops the agent.

pub mod config;
pub mod encode_logs;
mod logs;
pub mod transport;

pub use self::config::{OtlpCompression, OtlpConfig, OtlpProtocol};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::mpsc;

use super::{LogEvent, SinkError};
use crate::metrics::{MetricsAggregator, SelfMetrics};
use crate::telemetry::{otlp as encode, resource as res, Source};
use crate::util::backoff::Backoff;
use transport::Transport;

/// Export health counters (for the agent's status and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Successful metric exports.
    pub metric_exports: u64,
    /// Failed metric exports.
    pub metric_failures: u64,
    /// Failure streaks of metric exports (each logged once).
    pub metric_failure_streaks: u64,
    /// Log records delivered.
    pub logs_sent: u64,
    /// Log records dropped because the backlog was full.
    pub logs_dropped: u64,
    /// Log records waiting for the backend.
    pub logs_pending: u64,
}

#[derive(Default)]
struct Health {
    ok: AtomicU64,
    failed: AtomicU64,
    streaks: AtomicU64,
    failing: AtomicBool,
}

/// What the sink's thread is asked to do.
enum Control {
    /// Export metrics now and say whether it worked.
    Flush(std::sync::mpsc::Sender<bool>),
    /// Export metrics one last time, give the log backlog one last attempt, end.
    Shutdown,
}

/// The OTLP sink: a thread exporting metrics periodically and draining the log backlog.
pub struct OtlpSink {
    source: Arc<Source>,
    logs: Arc<logs::Shared>,
    health: Arc<Health>,
    agent: Arc<SelfMetrics>,
    control: mpsc::UnboundedSender<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The metric side of the sink's thread.
struct MetricExport {
    source: Arc<Source>,
    transport: Arc<Transport>,
    resource: Resource,
    health: Arc<Health>,
    agent: Arc<SelfMetrics>,
    endpoint: String,
    start_ns: u64,
}

impl MetricExport {
    /// Collect and export once; records the outcome.
    async fn export(&self) -> bool {
        let families = self.source.families();
        let req = encode::metrics_request(
            &self.resource,
            &families,
            self.start_ns,
            crate::util::time::unix_ns(),
        );
        let h = &self.health;
        match self.transport.metrics(req).await {
            Ok(()) => {
                h.ok.fetch_add(1, Ordering::Relaxed);
                if h.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "OTLP metric export works again");
                }
                true
            }
            Err(e) => {
                h.failed.fetch_add(1, Ordering::Relaxed);
                self.agent.sink_errors.fetch_add(1, Ordering::Relaxed);
                if !h.failing.swap(true, Ordering::Relaxed) {
                    h.streaks.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(endpoint = %self.endpoint, "OTLP metric export failed: {e}; retrying with backoff, totals are kept");
                }
                false
            }
        }
    }

    /// Export every `interval` (later, with backoff, while failing) until told to stop.
    async fn run(
        self,
        interval: Duration,
        mut backoff: Backoff,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        let mut next = tokio::time::Instant::now() + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {
                    let wait = if self.export().await {
                        backoff.succeed();
                        interval
                    } else {
                        backoff.fail().0.max(interval)
                    };
                    next = tokio::time::Instant::now() + wait;
                }
                c = control.recv() => match c {
                    Some(Control::Flush(reply)) => {
                        let _ = reply.send(self.export().await);
                    }
                    Some(Control::Shutdown) | None => {
                        self.export().await;
                        return;
                    }
                },
            }
        }
    }
}

/// `endpoint` + `path` unless `full` is set; must be an http(s) URL.
fn resolve(key: &'static str, full: &str, base: &str, path: &str) -> Result<String, SinkError> {
    let (key, url) = if full.is_empty() {
        ("endpoint", format!("{}{path}", base.trim_end_matches('/')))
    } else {
        (key, full.to_owned())
    };
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') => Ok(url),
        _ => Err(SinkError::BadEndpoint {
            key,
            value: url,
            reason: "expected http://host:port or https://host:port".into(),
        }),
    }
}

/// The metrics and logs URLs: grpc uses `endpoint` for both; http/protobuf appends the signal
/// paths to `endpoint` unless `metrics_endpoint` / `logs_endpoint` are set.
fn endpoints(cfg: &OtlpConfig) -> Result<(String, String), SinkError> {
    if cfg.protocol == OtlpProtocol::Grpc {
        let url = resolve("endpoint", &cfg.endpoint, "", "")?;
        return Ok((url.clone(), url));
    }
    Ok((
        resolve(
            "metrics_endpoint",
            &cfg.metrics_endpoint,
            &cfg.endpoint,
            "/v1/metrics",
        )?,
        resolve(
            "logs_endpoint",
            &cfg.logs_endpoint,
            &cfg.endpoint,
            "/v1/logs",
        )?,
    ))
}

impl OtlpSink {
    /// Start exporting: metrics every `export_interval_ms` from `aggregator` and `self_metrics`,
    /// log records as they are [`emit`](Self::emit)ted. `host` becomes `host.name` and
    /// `service.instance.id`. Does not block; may be called inside or outside a tokio runtime.
    pub fn start(
        cfg: &OtlpConfig,
        host: &str,
        aggregator: Arc<Mutex<MetricsAggregator>>,
        self_metrics: Arc<SelfMetrics>,
    ) -> Result<OtlpSink, SinkError> {
        Self::start_with(cfg, Source::new(aggregator, self_metrics, host))
    }

    /// [`OtlpSink::start`] reading an existing [`Source`] (shared with `/metrics`).
    pub fn start_with(cfg: &OtlpConfig, source: Arc<Source>) -> Result<OtlpSink, SinkError> {
        let (metrics_url, logs_url) = endpoints(cfg)?;
        let resource = encode::resource(&res::detect(source.host())?);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| SinkError::Thread {
                what: "runtime",
                source,
            })?;
        let built = {
            let _enter = rt.enter();
            Transport::new(cfg, metrics_url.clone(), logs_url.clone())
        };
        let transport = match built {
            Ok(t) => Arc::new(t),
            Err(e) => {
                // Dropping a runtime the normal way panics inside the caller's async context.
                rt.shutdown_background();
                return Err(e);
            }
        };
        let agent = source.agent().clone();
        let health = Arc::new(Health::default());
        let shared = Arc::new(logs::Shared::new(cfg.max_backlog));
        let drain = logs::Drain {
            shared: shared.clone(),
            transport: transport.clone(),
            resource: resource.clone(),
            backoff: Backoff::new(cfg.retry_initial_ms, cfg.retry_max_ms),
            agent: agent.clone(),
            endpoint: logs_url,
        };
        let export = MetricExport {
            source: source.clone(),
            transport,
            resource,
            health: health.clone(),
            agent: agent.clone(),
            endpoint: metrics_url,
            start_ns: crate::util::time::unix_ns(),
        };
        let interval = Duration::from_millis(cfg.export_interval_ms.max(100));
        let backoff = Backoff::new(cfg.retry_initial_ms, cfg.retry_max_ms);
        let (tx, rx) = mpsc::unbounded_channel();
        let stop_logs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("comminsight-otlp".into())
            .spawn(move || {
                rt.block_on(async move {
                    let logs = tokio::spawn(drain.run());
                    export.run(interval, backoff, rx).await;
                    stop_logs.stop();
                    let _ = logs.await;
                });
            })
            .map_err(|source| SinkError::Thread {
                what: "export thread",
                source,
            })?;
        Ok(OtlpSink {
            source,
            logs: shared,
            health,
            agent,
            control: tx,
            thread: Some(thread),
        })
    }

    /// The source the sink reads (share it with `/metrics`).
    pub fn source(&self) -> &Arc<Source> {
        &self.source
    }

    /// Replace the straggler gauges with these `(job, rank, host, index)` values.
    pub fn set_straggler(&self, values: Vec<(String, i64, String, (f64, f64))>) {
        self.source.set_straggler(values);
    }

    /// Queue a log record for export (never blocks on the network; the oldest pending record
    /// is dropped and counted when `max_backlog` are waiting).
    pub fn emit(&self, event: LogEvent) {
        self.logs.push(event, &self.agent);
    }

    /// Export counters so far.
    pub fn stats(&self) -> SinkStats {
        let (logs_sent, logs_dropped, logs_pending) = self.logs.counts();
        SinkStats {
            metric_exports: self.health.ok.load(Ordering::Relaxed),
            metric_failures: self.health.failed.load(Ordering::Relaxed),
            metric_failure_streaks: self.health.streaks.load(Ordering::Relaxed),
            logs_sent,
            logs_dropped,
            logs_pending,
        }
    }

    /// Collect and export metrics now (blocks up to the export timeout; call it from a
    /// blocking context). `false` when the export failed or the sink has stopped.
    pub fn flush_metrics(&self) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.control.send(Control::Flush(tx)).is_err() {
            return false;
        }
        rx.recv().unwrap_or(false)
    }

    /// Export metrics one last time, give pending log records one last attempt and stop the
    /// thread (blocks up to about twice the export timeout; from async code call it in
    /// `spawn_blocking`).
    pub fn shutdown(mut self) {
        let _ = self.control.send(Control::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for OtlpSink {
    /// Asks the thread to stop (after one last export) without waiting; prefer
    /// [`OtlpSink::shutdown`], which also waits for the final exports.
    fn drop(&mut self) {
        let _ = self.control.send(Control::Shutdown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_append_the_signal_paths_unless_overridden() {
        let r = resolve("metrics_endpoint", "", "http://h:4318/", "/v1/metrics").unwrap();
        assert_eq!(r, "http://h:4318/v1/metrics");
        let r = resolve(
            "metrics_endpoint",
            "https://vm/otlp",
            "http://h:4318",
            "/v1/metrics",
        );
        assert_eq!(r.unwrap(), "https://vm/otlp");
        let e = resolve("logs_endpoint", "h:4318/v1/logs", "", "/v1/logs").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("[otlp] logs_endpoint = \"h:4318/v1/logs\""),
            "{e}"
        );
        let e = resolve("metrics_endpoint", "", "", "/v1/metrics").unwrap_err();
        assert!(e.to_string().contains("[otlp] endpoint"), "{e}");
    }

    #[test]
    fn a_bad_endpoint_fails_start() {
        let cfg = OtlpConfig {
            endpoint: "localhost:4317".into(),
            protocol: OtlpProtocol::Grpc,
            ..OtlpConfig::default()
        };
        let agg = Arc::new(Mutex::new(MetricsAggregator::new(10)));
        let err = OtlpSink::start(&cfg, "h", agg, Arc::default())
            .err()
            .unwrap();
        assert!(matches!(err, SinkError::BadEndpoint { .. }), "{err}");
    }
}

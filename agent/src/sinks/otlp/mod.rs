//! OTLP export (opentelemetry-otlp 0.33, HTTP protobuf or gRPC): metrics read from the
//! [`MetricsAggregator`] and log records ([`LogEvent`]).
//!
//! # How pre-aggregated values reach the exporter
//! The aggregator is the single source of truth (checkpointed, it survives restarts), so the
//! SDK must not aggregate anything itself and nothing is called per record. Counters and gauges
//! are **observable instruments** whose callbacks read one snapshot of the aggregator per
//! collection ([`metrics`]); with cumulative temporality an export after a backend outage
//! carries the totals, so nothing observed during the outage is lost.
//!
//! The histogram is the hard part. opentelemetry_sdk 0.33 has no public way to hand it
//! pre-aggregated buckets: `data::{ResourceMetrics, Histogram, HistogramDataPoint}` have only
//! `pub(crate)` fields and no constructors, `MetricReader::collect` fills them only from the
//! SDK's own aggregators (a custom reader needs `experimental_metrics_custom_reader` and still
//! cannot build the data), there is no `MetricProducer` in the Rust SDK, and
//! `Histogram::record` takes one value per call (replaying a delta would cost one SDK call per
//! operation, and the sum would be approximate). Least bad option taken: the histogram is
//! exported in the Prometheus classic layout, as exact cumulative counters
//! `comminsight.op.duration_bucket{le="10"...,"+Inf"}` (cumulative over `le`),
//! `comminsight.op.duration_sum` (µs) and `comminsight.op.duration_count`: the same series a
//! Prometheus-compatible backend (VictoriaMetrics, Mimir, Prometheus' OTLP receiver) stores for
//! a native OTLP histogram, so `histogram_quantile` works; OTLP-native backends see counters.
//! A native histogram would need building `ExportMetricsServiceRequest` with
//! `opentelemetry-proto` and our own transport (not done: two transports to maintain).
//!
//! # Threads and runtimes
//! Nothing blocks the caller's tokio runtime: metrics are exported by the SDK's
//! `PeriodicReader` thread (blocking reqwest client for HTTP), log records by our own drain
//! thread (`logs.rs`). gRPC (tonic) needs a tokio runtime: the sink owns a one-worker runtime
//! for it. A failing export is one `warn` per failure streak (and `SelfMetrics::sink_errors`),
//! never an error that stops the agent.

mod block;
pub mod config;
mod logs;
pub mod metrics;
pub mod retry;

pub use self::config::{OtlpConfig, OtlpProtocol};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::MeterProvider;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{
    LogExporter, MetricExporter, Protocol, RetryPolicy, WithExportConfig, WithHttpConfig,
    WithTonicConfig,
};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::logs::LogExporter as _;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{
    Instrument, PeriodicReader, SdkMeterProvider, Stream, Temporality,
};
use opentelemetry_sdk::Resource;

use super::{LogEvent, SinkError};
use crate::metrics::{MetricsAggregator, SelfMetrics};

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

/// The metric exporter with its outcome recorded: one warning per failure streak.
struct Watched {
    inner: MetricExporter,
    health: Arc<Health>,
    agent: Arc<SelfMetrics>,
    endpoint: String,
}

impl PushMetricExporter for Watched {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        let h = &self.health;
        match &r {
            Ok(()) => {
                h.ok.fetch_add(1, Ordering::Relaxed);
                if h.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "OTLP metric export works again");
                }
            }
            Err(e) => {
                h.failed.fetch_add(1, Ordering::Relaxed);
                self.agent.sink_errors.fetch_add(1, Ordering::Relaxed);
                if !h.failing.swap(true, Ordering::Relaxed) {
                    h.streaks.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(endpoint = %self.endpoint, "OTLP metric export failed ({e}); retrying every export interval, totals are kept");
                }
            }
        }
        r
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// The OTLP sink: a meter provider exporting periodically and a log-record backlog.
pub struct OtlpSink {
    meters: SdkMeterProvider,
    _instruments: metrics::Instruments,
    /// The snapshot the instruments' callbacks share; cleared before a flush so the last export
    /// carries every record observed until then.
    cache: Arc<metrics::SnapshotCache>,
    logs: Arc<logs::Shared>,
    log_thread: Option<std::thread::JoinHandle<()>>,
    health: Arc<Health>,
    agent: Arc<SelfMetrics>,
    straggler: metrics::StragglerGauges,
    /// Kept alive (last field: dropped after the exporters that use it).
    _runtime: OwnRuntime,
}

/// The sink's own runtime (gRPC), shut down in the background when dropped: dropping a
/// runtime the normal way panics inside another runtime's async context.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
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

impl OwnRuntime {
    /// A one-worker runtime for gRPC (tonic); none for HTTP.
    fn for_protocol(grpc: bool) -> Result<OwnRuntime, SinkError> {
        if !grpc {
            return Ok(OwnRuntime(None));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("comminsight-otlp")
            .enable_all()
            .build()
            .map_err(|source| SinkError::Thread {
                what: "gRPC runtime",
                source,
            })?;
        Ok(OwnRuntime(Some(rt)))
    }
}

/// An exporter that failed to build, as a [`SinkError`] naming the signal and the endpoint.
fn build_err(
    signal: &'static str,
    endpoint: &str,
) -> impl FnOnce(opentelemetry_otlp::ExporterBuildError) -> SinkError {
    let endpoint = endpoint.to_owned();
    move |e| SinkError::Exporter {
        signal,
        endpoint,
        reason: e.to_string(),
    }
}

/// The metric exporter (cumulative temporality). gRPC needs the sink's runtime entered.
fn metric_exporter(grpc: bool, url: &str, timeout: Duration) -> Result<MetricExporter, SinkError> {
    if grpc {
        MetricExporter::builder()
            .with_tonic()
            .with_endpoint(url)
            .with_timeout(timeout)
            .with_temporality(Temporality::Cumulative)
            .build()
    } else {
        MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(timeout)
            .with_temporality(Temporality::Cumulative)
            .build()
    }
    .map_err(build_err("metrics", url))
}

/// The log exporter (no SDK retries: the drain thread retries with its own backoff). gRPC needs
/// the sink's runtime entered.
fn log_exporter(grpc: bool, url: &str, timeout: Duration) -> Result<LogExporter, SinkError> {
    if grpc {
        LogExporter::builder()
            .with_tonic()
            .with_endpoint(url)
            .with_timeout(timeout)
            .with_retry_policy(RetryPolicy::disabled())
            .build()
    } else {
        LogExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(timeout)
            .with_retry_policy(RetryPolicy::disabled())
            .build()
    }
    .map_err(build_err("logs", url))
}

/// The meter provider: `exporter` read every `interval`, each instrument's cardinality bounded
/// for `max_series` series.
fn meter_provider(
    exporter: Watched,
    resource: Resource,
    interval: Duration,
    max_series: usize,
) -> SdkMeterProvider {
    let reader = PeriodicReader::builder(exporter)
        .with_interval(interval)
        .build();
    SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .with_view(move |i: &Instrument| {
            Stream::builder()
                .with_cardinality_limit(metrics::cardinality_limit(i.name(), max_series))
                .build()
                .ok()
        })
        .build()
}

/// The log records' backlog and the thread draining it into `exporter`.
fn start_log_drain(
    cfg: &OtlpConfig,
    mut exporter: LogExporter,
    resource: Resource,
    url: String,
    runtime: &OwnRuntime,
    agent: Arc<SelfMetrics>,
) -> Result<(Arc<logs::Shared>, std::thread::JoinHandle<()>), SinkError> {
    exporter.set_resource(&resource);
    let shared = Arc::new(logs::Shared::new(cfg.max_backlog));
    let drain = logs::Drain {
        shared: shared.clone(),
        exporter,
        provider: opentelemetry_sdk::logs::SdkLoggerProvider::builder()
            .with_resource(resource)
            .build(),
        backoff: retry::Backoff::new(cfg.retry_initial_ms, cfg.retry_max_ms),
        agent,
        endpoint: url,
        runtime: runtime.0.as_ref().map(|rt| rt.handle().clone()),
    };
    let thread = std::thread::Builder::new()
        .name("comminsight-otlp-logs".into())
        .spawn(move || drain.run())
        .map_err(|source| SinkError::Thread {
            what: "log thread",
            source,
        })?;
    Ok((shared, thread))
}

impl OtlpSink {
    /// Start exporting: metrics every `export_interval_ms` from `aggregator` and `self_metrics`,
    /// log records as they are [`emit`](Self::emit)ted. `host` becomes the `host.name` resource
    /// attribute. Does not block; may be called inside or outside a tokio runtime.
    pub fn start(
        cfg: &OtlpConfig,
        host: &str,
        aggregator: Arc<Mutex<MetricsAggregator>>,
        self_metrics: Arc<SelfMetrics>,
    ) -> Result<OtlpSink, SinkError> {
        let grpc = cfg.protocol == OtlpProtocol::Grpc;
        let (metrics_url, logs_url) = endpoints(cfg)?;
        let timeout = Duration::from_millis(cfg.timeout_ms.max(1));
        let runtime = OwnRuntime::for_protocol(grpc)?;
        let _enter = runtime.0.as_ref().map(|rt| rt.enter());
        let metric_exporter = metric_exporter(grpc, &metrics_url, timeout)?;
        let log_exporter = log_exporter(grpc, &logs_url, timeout)?;

        let resource = Resource::builder_empty()
            .with_service_name("comminsight-agent")
            .with_attribute(KeyValue::new("host.name", host.to_owned()))
            .build();
        let health = Arc::new(Health::default());
        let watched = Watched {
            inner: metric_exporter,
            health: health.clone(),
            agent: self_metrics.clone(),
            endpoint: metrics_url,
        };
        let interval = Duration::from_millis(cfg.export_interval_ms.max(100));
        let meters = meter_provider(watched, resource.clone(), interval, cfg.max_series);
        let cache = Arc::new(metrics::SnapshotCache::new(
            aggregator,
            (interval / 4).min(Duration::from_millis(500)),
        ));
        let meter = meters.meter("comminsight-agent");
        let straggler = metrics::StragglerGauges::default();
        let instruments = metrics::register(
            &meter,
            cache.clone(),
            self_metrics.clone(),
            straggler.clone(),
        );

        let (shared, log_thread) = start_log_drain(
            cfg,
            log_exporter,
            resource,
            logs_url,
            &runtime,
            self_metrics.clone(),
        )?;
        drop(_enter);
        Ok(OtlpSink {
            meters,
            _instruments: instruments,
            cache,
            logs: shared,
            log_thread: Some(log_thread),
            health,
            agent: self_metrics,
            straggler,
            _runtime: runtime,
        })
    }

    /// Replace the straggler gauges with these `(job, rank, host, index)` values.
    pub fn set_straggler(&self, values: Vec<(String, i64, String, (f64, f64))>) {
        let mut g = self.straggler.lock().unwrap_or_else(|e| e.into_inner());
        *g = values
            .into_iter()
            .map(|(job, rank, host, index)| ((job, rank), (host, index)))
            .collect();
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
    /// blocking context).
    pub fn flush_metrics(&self) -> bool {
        self.cache.invalidate();
        self.meters.force_flush().is_ok()
    }

    /// Export what is pending one last time and stop the threads (blocks up to about twice
    /// the export timeout; from async code call it in `spawn_blocking`).
    pub fn shutdown(mut self) {
        self.cache.invalidate();
        if let Err(e) = self.meters.shutdown() {
            tracing::debug!("OTLP meter provider shutdown: {e}");
        }
        self.logs.stop();
        if let Some(t) = self.log_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for OtlpSink {
    /// Stops the log thread (after one last attempt); prefer [`OtlpSink::shutdown`], which
    /// also waits for the final exports.
    fn drop(&mut self) {
        self.logs.stop();
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

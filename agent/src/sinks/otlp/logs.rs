//! Log records: a bounded backlog drained by one thread that exports with the OTLP log
//! exporter and retries with exponential backoff while the backend is down (the SDK's batch
//! processor drops a failed batch; findings must survive an outage).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use opentelemetry::logs::{AnyValue, LogRecord, Logger, LoggerProvider, Severity as OtelSeverity};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::logs::{LogBatch, LogExporter, SdkLogRecord, SdkLoggerProvider};

use super::block::block_on;
use super::retry::Backoff;
use crate::metrics::SelfMetrics;
use crate::sinks::{AttrValue, LogEvent, Severity};

/// Most records in one export request.
const BATCH: usize = 512;

#[derive(Default)]
struct Queue {
    /// Pending events with their ids (increasing).
    events: VecDeque<(u64, LogEvent)>,
    next_id: u64,
    dropped: u64,
    sent: u64,
    stop: bool,
}

/// State shared by the sink handle and the drain thread.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    max_backlog: usize,
}

impl Shared {
    pub(crate) fn new(max_backlog: usize) -> Shared {
        Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            max_backlog: max_backlog.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `event`; the oldest pending one is dropped (and counted) when the backlog is full.
    pub(crate) fn push(&self, event: LogEvent, agent: &SelfMetrics) {
        let mut q = self.lock();
        if q.events.len() >= self.max_backlog {
            q.events.pop_front();
            q.dropped += 1;
            agent.logs_dropped.fetch_add(1, Ordering::Relaxed);
        }
        let id = q.next_id;
        q.next_id += 1;
        q.events.push_back((id, event));
        self.wake.notify_all();
    }

    /// (sent, dropped, pending).
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let q = self.lock();
        (q.sent, q.dropped, q.events.len() as u64)
    }

    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }
}

/// What the drain thread needs.
pub(crate) struct Drain<E: LogExporter> {
    pub(crate) shared: Arc<Shared>,
    pub(crate) exporter: E,
    pub(crate) provider: SdkLoggerProvider,
    pub(crate) backoff: Backoff,
    pub(crate) agent: Arc<SelfMetrics>,
    pub(crate) endpoint: String,
    /// Runtime context the exporter needs (gRPC), entered by the drain thread.
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

fn severity(s: Severity) -> (OtelSeverity, &'static str) {
    match s {
        Severity::Trace => (OtelSeverity::Trace, "TRACE"),
        Severity::Debug => (OtelSeverity::Debug, "DEBUG"),
        Severity::Info => (OtelSeverity::Info, "INFO"),
        Severity::Warn => (OtelSeverity::Warn, "WARN"),
        Severity::Error => (OtelSeverity::Error, "ERROR"),
        Severity::Fatal => (OtelSeverity::Fatal, "FATAL"),
    }
}

fn attr(v: &AttrValue) -> AnyValue {
    match v {
        AttrValue::Str(s) => AnyValue::String(s.clone().into()),
        AttrValue::I64(i) => AnyValue::Int(*i),
        AttrValue::F64(f) => AnyValue::Double(*f),
        AttrValue::Bool(b) => AnyValue::Boolean(*b),
    }
}

impl<E: LogExporter> Drain<E> {
    fn record(&self, logger: &impl Logger<LogRecord = SdkLogRecord>, e: &LogEvent) -> SdkLogRecord {
        let mut r = logger.create_log_record();
        let now = SystemTime::now();
        let at = if e.time_ns == 0 {
            now
        } else {
            SystemTime::UNIX_EPOCH + Duration::from_nanos(e.time_ns)
        };
        r.set_timestamp(at);
        r.set_observed_timestamp(now);
        let (num, text) = severity(e.severity);
        r.set_severity_number(num);
        r.set_severity_text(text);
        r.set_body(AnyValue::String(e.body.clone().into()));
        for (k, v) in &e.attributes {
            r.add_attribute(k.clone(), attr(v));
        }
        r
    }

    /// Export pending events until told to stop; on stop, one last attempt at what is left.
    pub(crate) fn run(mut self) {
        let _rt = self.runtime.as_ref().map(|h| h.enter());
        let scope = InstrumentationScope::builder("comminsight-agent").build();
        let logger = self.provider.logger("comminsight-agent");
        loop {
            let (batch, last_id, stopping) = {
                let mut q = self.shared.lock();
                while q.events.is_empty() && !q.stop {
                    q = self.shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                if q.events.is_empty() {
                    break;
                }
                let batch: Vec<LogEvent> =
                    q.events.iter().take(BATCH).map(|e| e.1.clone()).collect();
                let last = q.events[batch.len() - 1].0;
                (batch, last, q.stop)
            };
            let records: Vec<SdkLogRecord> =
                batch.iter().map(|e| self.record(&logger, e)).collect();
            let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
                records.iter().map(|r| (r, &scope)).collect();
            match block_on(self.exporter.export(LogBatch::new(&refs))) {
                Ok(()) => {
                    let mut q = self.shared.lock();
                    let before = q.events.len();
                    while q.events.front().is_some_and(|e| e.0 <= last_id) {
                        q.events.pop_front();
                    }
                    q.sent += (before - q.events.len()) as u64;
                    drop(q);
                    let failures = self.backoff.succeed();
                    if failures > 0 {
                        tracing::info!(endpoint = %self.endpoint, failures, "OTLP log export works again; backlog delivered");
                    }
                }
                Err(err) => {
                    self.agent.sink_errors.fetch_add(1, Ordering::Relaxed);
                    if stopping {
                        let (_, _, pending) = self.shared.counts();
                        tracing::warn!(endpoint = %self.endpoint, pending, "OTLP log export failed at shutdown ({err}); pending log records not delivered");
                        break;
                    }
                    let (delay, first) = self.backoff.fail();
                    if first {
                        tracing::warn!(endpoint = %self.endpoint, "OTLP log export failed ({err}); keeping up to the backlog limit and retrying with backoff");
                    }
                    let q = self.shared.lock();
                    if !q.stop {
                        let _ = self.shared.wake.wait_timeout_while(q, delay, |q| !q.stop);
                    }
                }
            }
        }
        if let Err(e) = self.exporter.shutdown() {
            tracing::debug!("OTLP log exporter shutdown: {e}");
        }
    }
}

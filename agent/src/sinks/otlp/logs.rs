//! Log records: a bounded backlog drained by the sink's task, exported in batches and retried
//! with the shared jittered backoff while the backend is down (findings must survive an outage;
//! beyond `max_backlog` the oldest are dropped and counted).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::encode_logs::logs_request;
use super::transport::Transport;
use crate::metrics::SelfMetrics;
use crate::sinks::LogEvent;
use crate::util::backoff::Backoff;

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

/// State shared by the sink handle and the drain task.
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    /// Woken by [`Shared::stop`] only (cuts a retry delay short; new events do not).
    halt: Notify,
    max_backlog: usize,
}

impl Shared {
    pub(crate) fn new(max_backlog: usize) -> Shared {
        Shared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            halt: Notify::new(),
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
        drop(q);
        self.wake.notify_one();
    }

    /// (sent, dropped, pending).
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let q = self.lock();
        (q.sent, q.dropped, q.events.len() as u64)
    }

    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_one();
        self.halt.notify_one();
    }

    /// The next batch: `(events, last id, stopping)`, or `None` when stopped with nothing left.
    async fn next_batch(&self) -> Option<(Vec<LogEvent>, u64, bool)> {
        loop {
            let notified = self.wake.notified();
            {
                let q = self.lock();
                if !q.events.is_empty() {
                    let batch: Vec<LogEvent> =
                        q.events.iter().take(BATCH).map(|e| e.1.clone()).collect();
                    let last = q.events[batch.len() - 1].0;
                    return Some((batch, last, q.stop));
                }
                if q.stop {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Forget the events up to `last_id` (delivered).
    fn delivered(&self, last_id: u64) {
        let mut q = self.lock();
        let before = q.events.len();
        while q.events.front().is_some_and(|e| e.0 <= last_id) {
            q.events.pop_front();
        }
        q.sent += (before - q.events.len()) as u64;
    }

    fn stopping(&self) -> bool {
        self.lock().stop
    }
}

/// What the drain task needs.
pub(crate) struct Drain {
    pub(crate) shared: Arc<Shared>,
    pub(crate) transport: Arc<Transport>,
    pub(crate) resource: opentelemetry_proto::tonic::resource::v1::Resource,
    pub(crate) backoff: Backoff,
    pub(crate) agent: Arc<SelfMetrics>,
    pub(crate) endpoint: String,
}

impl Drain {
    /// Export pending events until told to stop; on stop, one last attempt at what is left.
    pub(crate) async fn run(mut self) {
        while let Some((batch, last_id, stopping)) = self.shared.next_batch().await {
            let req = logs_request(&self.resource, &batch, crate::util::time::unix_ns());
            match self.transport.logs(req).await {
                Ok(()) => {
                    self.shared.delivered(last_id);
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
                        return;
                    }
                    let (delay, first) = self.backoff.fail();
                    if first {
                        tracing::warn!(endpoint = %self.endpoint, "OTLP log export failed ({err}); keeping up to the backlog limit and retrying with backoff");
                    }
                    let stop = self.shared.halt.notified();
                    if !self.shared.stopping() {
                        let _ = tokio::time::timeout(delay, stop).await;
                    }
                }
            }
        }
    }
}

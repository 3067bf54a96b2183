//! [`Source`]: what one collection reads — the aggregator, the agent's own counters, the
//! straggler gauges, the host context's values and the host name — shared by the OTLP sink and the `/metrics` endpoint.

use std::sync::{Arc, Mutex};

use super::{collect, Family, HostValues, StragglerValues};
use crate::metrics::{MetricsAggregator, SelfMetrics};

/// The inputs of [`collect`], shared behind an `Arc`.
#[derive(Debug)]
pub struct Source {
    aggregator: Arc<Mutex<MetricsAggregator>>,
    agent: Arc<SelfMetrics>,
    straggler: Mutex<StragglerValues>,
    host_values: Mutex<HostValues>,
    moe: Mutex<super::moe::MoeValues>,
    host: String,
}

impl Source {
    /// A source reading `aggregator` and `agent`, putting `host` on every point.
    pub fn new(
        aggregator: Arc<Mutex<MetricsAggregator>>,
        agent: Arc<SelfMetrics>,
        host: &str,
    ) -> Arc<Source> {
        Arc::new(Source {
            aggregator,
            agent,
            straggler: Mutex::new(StragglerValues::new()),
            host_values: Mutex::new(HostValues::default()),
            moe: Mutex::new(super::moe::MoeValues::default()),
            host: host.to_owned(),
        })
    }

    /// The host name on every point.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The agent's own counters.
    pub fn agent(&self) -> &Arc<SelfMetrics> {
        &self.agent
    }

    /// Replace the straggler gauges with these `(job, rank, host, (index, root_index))` values
    /// (percent of the step, as the live analysis computes them).
    pub fn set_straggler(&self, values: Vec<(String, i64, String, (f64, f64))>) {
        let mut g = self.straggler.lock().unwrap_or_else(|e| e.into_inner());
        *g = values
            .into_iter()
            .map(|(job, rank, host, index)| ((job, rank), (host, index)))
            .collect();
    }

    /// Replace the host context's values (the ingest loop publishes them).
    pub fn set_host_values(&self, values: HostValues) {
        *self.host_values.lock().unwrap_or_else(|e| e.into_inner()) = values;
    }

    /// Replace the MoE EP values (the live EP windows publish them).
    pub fn set_moe(&self, values: super::moe::MoeValues) {
        *self.moe.lock().unwrap_or_else(|e| e.into_inner()) = values;
    }

    /// One collection: a snapshot of everything, as families (RSS sampled now).
    pub fn families(&self) -> Vec<Family> {
        self.agent.sample_rss();
        let snapshot = {
            let agg = self.aggregator.lock().unwrap_or_else(|e| e.into_inner());
            agg.snapshot()
        };
        let straggler = self
            .straggler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let host_values = self
            .host_values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let moe = self.moe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        collect(
            &snapshot,
            &self.agent.values(),
            &straggler,
            &host_values,
            &moe,
            &self.host,
        )
    }

    /// One collection as Prometheus / OpenMetrics text.
    pub fn prometheus_text(&self) -> String {
        super::prometheus::render(self.families())
    }
}

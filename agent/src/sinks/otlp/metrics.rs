//! The OTLP metric instruments: observable (asynchronous) instruments whose callbacks read the
//! aggregator's latest snapshot when the SDK's periodic reader collects, so nothing is called
//! per record.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::metrics::{AsyncInstrument, Meter};
use opentelemetry::KeyValue;

use crate::metrics::buckets::DURATION_BOUNDS_US;
use crate::metrics::{MetricsAggregator, MetricsSnapshot, SelfMetrics, Series, SeriesValues};

/// Name of the per-bucket counter of the execution-time histogram (see the module comment of
/// [`super`]); `_sum` and `_count` complete it.
pub const DURATION_BUCKET: &str = "comminsight.op.duration_bucket";

/// Snapshots of the aggregator shared by the callbacks of one collection (one snapshot per
/// collection, not one per instrument).
pub(crate) struct SnapshotCache {
    aggregator: Arc<Mutex<MetricsAggregator>>,
    cached: Mutex<Option<(Instant, Arc<MetricsSnapshot>)>>,
    max_age: Duration,
}

impl SnapshotCache {
    pub(crate) fn new(aggregator: Arc<Mutex<MetricsAggregator>>, max_age: Duration) -> Self {
        SnapshotCache {
            aggregator,
            cached: Mutex::new(None),
            max_age,
        }
    }

    /// Forget the cached snapshot: the next collection reads the aggregator afresh.
    pub(crate) fn invalidate(&self) {
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn get(&self) -> Arc<MetricsSnapshot> {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, snap)) = cached.as_ref() {
            if at.elapsed() < self.max_age {
                return snap.clone();
            }
        }
        let snap = {
            let agg = self.aggregator.lock().unwrap_or_else(|e| e.into_inner());
            Arc::new(agg.snapshot())
        };
        *cached = Some((Instant::now(), snap.clone()));
        snap
    }
}

/// The attributes of one series' data points.
fn series_attrs(job: &str, s: &Series) -> Vec<KeyValue> {
    vec![
        KeyValue::new("comminsight.job.id", job.to_owned()),
        KeyValue::new("comminsight.comm", s.labels.comm.clone()),
        KeyValue::new("comminsight.func", s.labels.func.clone()),
        KeyValue::new("comminsight.size", s.labels.size.clone()),
        KeyValue::new("comminsight.algo", s.labels.algo.clone()),
        KeyValue::new("comminsight.proto", s.labels.proto.clone()),
    ]
}

/// Keeps the instruments (and their callbacks) alive as long as the sink.
pub(crate) type Instruments = Vec<Box<dyn std::any::Any + Send + Sync>>;

/// Cardinality limit for an instrument named `name` when the aggregator keeps `max_series`.
pub(crate) fn cardinality_limit(name: &str, max_series: usize) -> usize {
    // `other` folds can add series beyond max_series; twice the limit leaves room for them.
    let series = max_series.saturating_mul(2).saturating_add(64);
    if name == DURATION_BUCKET {
        series.saturating_mul(DURATION_BOUNDS_US.len() + 1)
    } else {
        series
    }
}

/// (name, unit, description, value of a series) of a per-series counter.
type SeriesCounter = (
    &'static str,
    &'static str,
    &'static str,
    fn(&SeriesValues) -> u64,
);
/// (name, description, value of a series) of a per-series gauge.
type SeriesGauge = (&'static str, &'static str, fn(&Series) -> f64);

/// The latest straggler index of each rank, `(job, rank) -> (host, index)`, set by the live
/// analysis ([`crate::straggler::live`]) and read at each collection.
pub type StragglerGauges = Arc<Mutex<BTreeMap<(String, i64), (String, (f64, f64))>>>;

/// Register every instrument on `meter`.
pub(crate) fn register(
    meter: &Meter,
    cache: Arc<SnapshotCache>,
    agent: Arc<SelfMetrics>,
    straggler: StragglerGauges,
) -> Instruments {
    let mut keep: Instruments = Vec::new();
    register_straggler(meter, straggler, &mut keep);
    register_series_counters(meter, &cache, &mut keep);
    register_duration(meter, &cache, &mut keep);
    register_bandwidth(meter, &cache, &mut keep);
    register_per_job(meter, &cache, &mut keep);
    register_agent(meter, agent, &mut keep);
    keep
}

/// A straggler gauge: name, description, which index of the pair it reports.
type StragglerGauge = (&'static str, &'static str, fn((f64, f64)) -> f64);

/// `comminsight.straggler.index` (the seed's) and `comminsight.straggler.root_index` (the root
/// cause's, issue 17) of each rank.
fn register_straggler(meter: &Meter, straggler: StragglerGauges, keep: &mut Instruments) {
    let gauges: [StragglerGauge; 2] = [
        (
            "comminsight.straggler.index",
            "Straggler index of the rank's latest analysed step: the mean wait it caused its peers, in percent of the step time (DESIGN.md 5)",
            |v| v.0,
        ),
        (
            "comminsight.straggler.root_index",
            "Root-cause index of the rank's latest analysed step: the waiting its own slowness (excess over its role peers) started, in percent of the step time (issue 17)",
            |v| v.1,
        ),
    ];
    for (name, description, pick) in gauges {
        register_straggler_gauge(meter, straggler.clone(), name, description, pick, keep);
    }
}

fn register_straggler_gauge(
    meter: &Meter,
    straggler: StragglerGauges,
    name: &'static str,
    description: &'static str,
    pick: fn((f64, f64)) -> f64,
    keep: &mut Instruments,
) {
    keep.push(Box::new(
        meter
            .f64_observable_gauge(name)
            .with_unit("%")
            .with_description(description)
            .with_callback(move |obs: &dyn AsyncInstrument<f64>| {
                let g = straggler.lock().unwrap_or_else(|e| e.into_inner());
                for ((job, rank), (host, index)) in g.iter() {
                    obs.observe(
                        pick(*index),
                        &[
                            KeyValue::new("comminsight.job.id", job.clone()),
                            KeyValue::new("comminsight.rank", *rank),
                            KeyValue::new("comminsight.rank.host", host.clone()),
                        ],
                    );
                }
            })
            .build(),
    ));
}

/// The per-series counters: operations, bytes, incomplete operations, the histogram's
/// `_count`, traffic bytes.
fn register_series_counters(meter: &Meter, cache: &Arc<SnapshotCache>, keep: &mut Instruments) {
    let series_u64: [SeriesCounter; 5] = [
        (
            "comminsight.ops",
            "{operation}",
            "Completed NCCL operations",
            |v| v.ops,
        ),
        (
            "comminsight.op.bytes",
            "By",
            "Message bytes (count * type size)",
            |v| v.bytes,
        ),
        (
            "comminsight.op.incomplete",
            "{operation}",
            "Operations unfinished at exit",
            |v| v.incomplete,
        ),
        (
            "comminsight.op.duration_count",
            "{operation}",
            "Operations in the execution-time histogram",
            |v| v.ops,
        ),
        (
            "comminsight.op.traffic_bytes",
            "By",
            "NCCL Inspector traffic bytes (algbw numerator)",
            |v| v.traffic_bytes,
        ),
    ];
    for (name, unit, desc, f) in series_u64 {
        let cache = cache.clone();
        let c = meter
            .u64_observable_counter(name)
            .with_unit(unit)
            .with_description(desc)
            .with_callback(move |obs: &dyn AsyncInstrument<u64>| {
                let snap = cache.get();
                for (job, js) in &snap.jobs {
                    for s in &js.series {
                        obs.observe(f(&s.values), &series_attrs(job, s));
                    }
                }
            })
            .build();
        keep.push(Box::new(c));
    }
}

/// The execution-time histogram in the Prometheus classic layout: `_sum` and the cumulative
/// `_bucket{le}` counters (`_count` is a series counter).
fn register_duration(meter: &Meter, cache: &Arc<SnapshotCache>, keep: &mut Instruments) {
    let c = cache.clone();
    keep.push(Box::new(
        meter
            .f64_observable_counter("comminsight.op.duration_sum")
            .with_unit("us")
            .with_description("Sum of execution times")
            .with_callback(move |obs: &dyn AsyncInstrument<f64>| {
                let snap = c.get();
                for (job, js) in &snap.jobs {
                    for s in &js.series {
                        obs.observe(s.values.exec_ns_sum as f64 / 1000.0, &series_attrs(job, s));
                    }
                }
            })
            .build(),
    ));
    let c = cache.clone();
    keep.push(Box::new(
        meter
            .u64_observable_counter(DURATION_BUCKET)
            .with_unit("{operation}")
            .with_description(
                "Execution-time histogram: operations with time <= le (us), cumulative over le",
            )
            .with_callback(move |obs: &dyn AsyncInstrument<u64>| {
                let snap = c.get();
                for (job, js) in &snap.jobs {
                    for s in &js.series {
                        let attrs = series_attrs(job, s);
                        let mut cumulative = 0;
                        for (i, n) in s.values.hist.iter().enumerate() {
                            cumulative += n;
                            let le = DURATION_BOUNDS_US
                                .get(i)
                                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
                            let mut a = attrs.clone();
                            a.push(KeyValue::new("le", le));
                            obs.observe(cumulative, &a);
                        }
                    }
                }
            })
            .build(),
    ));
}

/// The per-series bandwidth gauges (series with a measured execution time only).
fn register_bandwidth(meter: &Meter, cache: &Arc<SnapshotCache>, keep: &mut Instruments) {
    let gauges: [SeriesGauge; 2] = [
        (
            "comminsight.op.algbw",
            "NCCL Inspector algorithm bandwidth over the series",
            |s| s.algbw_gbs,
        ),
        (
            "comminsight.op.busbw",
            "NCCL Inspector bus bandwidth over the series",
            |s| s.busbw_gbs,
        ),
    ];
    for (name, desc, f) in gauges {
        let cache = cache.clone();
        keep.push(Box::new(
            meter
                .f64_observable_gauge(name)
                .with_unit("GBy/s")
                .with_description(desc)
                .with_callback(move |obs: &dyn AsyncInstrument<f64>| {
                    let snap = cache.get();
                    for (job, js) in &snap.jobs {
                        for s in js.series.iter().filter(|s| s.values.exec_ns_sum > 0) {
                            obs.observe(f(s), &series_attrs(job, s));
                        }
                    }
                })
                .build(),
        ));
    }
}

/// The per-job counters: overdue operations, plugin drops, lost records, folded operations.
fn register_per_job(meter: &Meter, cache: &Arc<SnapshotCache>, keep: &mut Instruments) {
    type JobField = fn(&crate::metrics::JobSnapshot) -> u64;
    let per_job: [(&'static str, &'static str, JobField); 4] = [
        (
            "comminsight.overdue.ops",
            "Distinct overdue operations",
            |j| j.overdue_ops,
        ),
        (
            "comminsight.plugin.drops",
            "Records the plugin dropped (ring full, no op slot)",
            |j| j.plugin_drops,
        ),
        (
            "comminsight.records.lost",
            "Records missing from the streams (sequence gaps)",
            |j| j.records_lost,
        ),
        (
            "comminsight.series.folded",
            "Operations folded into comm=other (series limit)",
            |j| j.folded_ops,
        ),
    ];
    for (name, desc, f) in per_job {
        let cache = cache.clone();
        keep.push(Box::new(
            meter
                .u64_observable_counter(name)
                .with_description(desc)
                .with_callback(move |obs: &dyn AsyncInstrument<u64>| {
                    let snap = cache.get();
                    for (job, js) in &snap.jobs {
                        obs.observe(f(js), &[KeyValue::new("comminsight.job.id", job.clone())]);
                    }
                })
                .build(),
        ));
    }
}

/// `comminsight.agent.*`: the agent's own counters and gauges.
fn register_agent(meter: &Meter, agent: Arc<SelfMetrics>, keep: &mut Instruments) {
    type Field = fn(&crate::metrics::self_metrics::SelfMetricsValues) -> u64;
    let counters: [(&'static str, &'static str, Field); 4] = [
        ("comminsight.agent.records", "{record}", |v| v.records),
        ("comminsight.agent.bytes", "By", |v| v.bytes),
        ("comminsight.agent.sink.errors", "{error}", |v| {
            v.sink_errors
        }),
        ("comminsight.agent.logs.dropped", "{record}", |v| {
            v.logs_dropped
        }),
    ];
    for (name, unit, f) in counters {
        let agent = agent.clone();
        keep.push(Box::new(
            meter
                .u64_observable_counter(name)
                .with_unit(unit)
                .with_callback(move |obs: &dyn AsyncInstrument<u64>| {
                    obs.observe(f(&agent.values()), &[])
                })
                .build(),
        ));
    }
    let gauges: [(&'static str, &'static str, Field); 3] = [
        ("comminsight.agent.lag", "ms", |v| v.lag_ms),
        ("comminsight.agent.rss", "By", |v| v.rss_bytes),
        ("comminsight.agent.archive.backlog", "{segment}", |v| {
            v.archive_backlog
        }),
    ];
    for (name, unit, f) in gauges {
        let agent = agent.clone();
        keep.push(Box::new(
            meter
                .u64_observable_gauge(name)
                .with_unit(unit)
                .with_callback(move |obs: &dyn AsyncInstrument<u64>| {
                    if name == "comminsight.agent.rss" {
                        agent.sample_rss();
                    }
                    obs.observe(f(&agent.values()), &[])
                })
                .build(),
        ));
    }
}

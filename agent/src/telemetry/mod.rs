//! What the agent exports about itself and the jobs it follows, independent of the wire:
//! [`catalogue`] names every instrument; [`collect`] turns one aggregator snapshot, the agent's
//! own counters, the straggler gauges and the host context's values ([`HostValues`]) into
//! [`Family`]s of data points; [`otlp`] encodes
//! them (and log records) as OTLP protobuf requests, [`prometheus`] as the Prometheus text
//! exposition. OTLP and `/metrics` read the same snapshot through the same code, so they
//! cannot disagree. [`resource`] builds the OTLP resource (`service.*`, `host.*`,
//! `OTEL_RESOURCE_ATTRIBUTES`).

pub mod catalogue;
pub mod gpu;
pub mod moe;
pub mod otlp;
pub mod prometheus;
pub mod resource;
mod source;

pub use source::Source;

use std::collections::BTreeMap;

use crate::host::context::{PortView, ProcTotals};
use crate::metrics::buckets::DURATION_BOUNDS_US;
use crate::metrics::self_metrics::SelfMetricsValues;
use crate::metrics::{MetricsSnapshot, Series};
use catalogue::{Instrument, Kind};

/// An attribute value of a data point.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// The value of one data point.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A cumulative integer count.
    Count(u64),
    /// A cumulative or last value.
    Real(f64),
    /// A cumulative histogram over [`duration_bounds_s`]: `counts[i]` operations in bucket `i`
    /// (not cumulative; the last bucket is unbounded), their `sum` and `count`.
    Histogram {
        /// Per-bucket counts (`bounds + 1` of them).
        counts: Vec<u64>,
        /// Sum of the observed values.
        sum: f64,
        /// Number of observed values.
        count: u64,
    },
}

/// One data point: its attributes (in the instrument's order) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// `(key, value)`, keys from the catalogue.
    pub attrs: Vec<(&'static str, Attr)>,
    /// The value.
    pub value: Value,
}

/// All data points of one instrument.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The instrument.
    pub instrument: Instrument,
    /// Its points (possibly none).
    pub points: Vec<Point>,
}

/// The latest straggler indices of each rank, `(job, rank) -> (host, (index, root_index))`
/// in percent of the step, as the live analysis keeps them.
pub type StragglerValues = BTreeMap<(String, i64), (String, (f64, f64))>;

/// The host context's values on this host, for the `comminsight.host.*` instruments: each
/// rank process' totals by `(job, rank)`, and the ports' counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostValues {
    pub ranks: BTreeMap<(String, i64), ProcTotals>,
    pub ports: Vec<PortView>,
    /// The GPUs the local ranks run on (issue 20).
    pub gpus: Vec<gpu::GpuValues>,
}

/// Ranks exported per collection by the host instruments (bounded cardinality).
pub const MAX_HOST_RANKS: usize = 4096;
/// Ports exported per collection.
pub const MAX_HOST_PORTS: usize = 256;

/// Upper bounds (seconds) of the op-duration histogram buckets.
pub fn duration_bounds_s() -> Vec<f64> {
    DURATION_BOUNDS_US
        .iter()
        .map(|&us| us as f64 / 1e6)
        .collect()
}

/// Everything one collection exports, one [`Family`] per catalogue instrument, in catalogue
/// order. `host` goes on every point (`host.name`).
pub fn collect(
    snapshot: &MetricsSnapshot,
    agent: &SelfMetricsValues,
    straggler: &StragglerValues,
    host_values: &HostValues,
    moe: &moe::MoeValues,
    host: &str,
) -> Vec<Family> {
    catalogue::INSTRUMENTS
        .iter()
        .map(|i| Family {
            instrument: *i,
            points: gpu::gpu_points(i, &host_values.gpus, host)
                .or_else(|| moe::moe_points(i, moe, host))
                .or_else(|| host_points(i, host_values, host))
                .unwrap_or_else(|| points(i, snapshot, agent, straggler, host)),
        })
        .collect()
}

/// The points of a `comminsight.host.*` instrument (`None`: another instrument).
fn host_points(i: &Instrument, v: &HostValues, host: &str) -> Option<Vec<Point>> {
    use catalogue::*;
    let rank_attrs = |job: &str, rank: i64| {
        vec![
            (JOB, Attr::Str(job.to_owned())),
            (RANK, Attr::Int(rank)),
            (HOST, Attr::Str(host.to_owned())),
        ]
    };
    let ranks = v.ranks.iter().take(MAX_HOST_RANKS);
    let mut out = Vec::new();
    match i.name {
        n if n == HOST_THREAD_TIME.name => {
            for ((job, rank), t) in ranks {
                let m = &t.main;
                let states = [
                    ("on_cpu", m.on_cpu_ns),
                    ("runnable", m.runnable_ns),
                    ("blocked", m.blocked_ns.saturating_sub(m.blocked_io_ns)),
                    ("blocked_io", m.blocked_io_ns),
                ];
                for (state, ns) in states {
                    let mut attrs = rank_attrs(job, *rank);
                    attrs.push((THREAD_STATE, Attr::Str(state.to_owned())));
                    out.push(Point {
                        attrs,
                        value: Value::Real(ns as f64 / 1e9),
                    });
                }
            }
        }
        n if n == HOST_TCP_RETRANSMITS.name => {
            for ((job, rank), t) in ranks {
                out.push(Point {
                    attrs: rank_attrs(job, *rank),
                    value: Value::Count(t.retransmits),
                });
            }
        }
        n if n.starts_with("comminsight.host.port.") => {
            for p in v.ports.iter().take(MAX_HOST_PORTS) {
                let value = match n {
                    x if x == HOST_PORT_RECEIVED.name => Value::Count(p.rx_bytes),
                    x if x == HOST_PORT_TRANSMITTED.name => Value::Count(p.tx_bytes),
                    x if x == HOST_PORT_ERRORS.name => Value::Count(p.errors),
                    x if x == HOST_PORT_LINK_DOWNED.name => Value::Count(p.link_downed),
                    _ => Value::Real(if p.up { 1.0 } else { 0.0 }),
                };
                out.push(Point {
                    attrs: vec![
                        (HOST, Attr::Str(host.to_owned())),
                        (PORT_DEVICE, Attr::Str(p.device.clone())),
                        (PORT_NUMBER, Attr::Int(i64::from(p.port))),
                    ],
                    value,
                });
            }
        }
        _ => return None,
    }
    Some(out)
}

fn series_attrs(job: &str, host: &str, s: &Series) -> Vec<(&'static str, Attr)> {
    use catalogue::*;
    vec![
        (JOB, Attr::Str(job.to_owned())),
        (HOST, Attr::Str(host.to_owned())),
        (COMM, Attr::Str(s.labels.comm.clone())),
        (FUNC, Attr::Str(s.labels.func.clone())),
        (SIZE, Attr::Str(s.labels.size.clone())),
        (ALGO, Attr::Str(s.labels.algo.clone())),
        (PROTO, Attr::Str(s.labels.proto.clone())),
    ]
}

/// The value of a per-series instrument for one series (`None`: no point).
fn series_value(i: &Instrument, s: &Series) -> Option<Value> {
    use catalogue::*;
    let v = &s.values;
    Some(match i.name {
        n if n == OP_DURATION.name => Value::Histogram {
            counts: v.hist.to_vec(),
            sum: v.exec_ns_sum as f64 / 1e9,
            count: v.ops,
        },
        n if n == OP_PAYLOAD.name => Value::Count(v.bytes),
        n if n == OP_TRAFFIC.name => Value::Count(v.traffic_bytes),
        n if n == OP_BUS_TRAFFIC.name => Value::Count(v.bus_bytes),
        n if n == OP_INCOMPLETE.name => Value::Count(v.incomplete),
        // GB/s -> By/s; only series with a measured execution time have a bandwidth.
        n if n == OP_ALGBW.name && v.exec_ns_sum > 0 => Value::Real(s.algbw_gbs * 1e9),
        n if n == OP_BUSBW.name && v.exec_ns_sum > 0 => Value::Real(s.busbw_gbs * 1e9),
        _ => return None,
    })
}

fn job_value(i: &Instrument, j: &crate::metrics::JobSnapshot) -> Option<u64> {
    use catalogue::*;
    Some(match i.name {
        n if n == OP_OVERDUE.name => j.overdue_ops,
        n if n == PLUGIN_DROPPED.name => j.plugin_drops,
        n if n == STREAM_LOST.name => j.records_lost,
        n if n == OP_FOLDED.name => j.folded_ops,
        _ => return None,
    })
}

fn agent_value(i: &Instrument, a: &SelfMetricsValues) -> Option<Value> {
    use catalogue::*;
    Some(match i.name {
        n if n == AGENT_RECORDS.name => Value::Count(a.records),
        n if n == AGENT_RECEIVED.name => Value::Count(a.bytes),
        n if n == AGENT_SINK_ERRORS.name => Value::Count(a.sink_errors),
        n if n == AGENT_LOGS_DROPPED.name => Value::Count(a.logs_dropped),
        n if n == AGENT_LAG.name => Value::Real(a.lag_ms as f64 / 1e3),
        n if n == AGENT_MEMORY_RSS.name => Value::Real(a.rss_bytes as f64),
        n if n == AGENT_ARCHIVE_BACKLOG.name => Value::Real(a.archive_backlog as f64),
        _ => return None,
    })
}

fn points(
    i: &Instrument,
    snapshot: &MetricsSnapshot,
    agent: &SelfMetricsValues,
    straggler: &StragglerValues,
    host: &str,
) -> Vec<Point> {
    let mut out = Vec::new();
    let attrs = i.attributes;
    if attrs == catalogue::SERIES_ATTRS {
        for (job, js) in &snapshot.jobs {
            for s in &js.series {
                if let Some(value) = series_value(i, s) {
                    out.push(Point {
                        attrs: series_attrs(job, host, s),
                        value,
                    });
                }
            }
        }
    } else if attrs == catalogue::JOB_ATTRS {
        for (job, js) in &snapshot.jobs {
            if let Some(v) = job_value(i, js) {
                out.push(Point {
                    attrs: vec![
                        (catalogue::JOB, Attr::Str(job.clone())),
                        (catalogue::HOST, Attr::Str(host.to_owned())),
                    ],
                    value: Value::Count(v),
                });
            }
        }
    } else if attrs == catalogue::RANK_ATTRS {
        let root = i.name == catalogue::STRAGGLER_ROOT_INDEX.name;
        for ((job, rank), (rank_host, (index, root_index))) in straggler {
            let pct = if root { *root_index } else { *index };
            out.push(Point {
                attrs: vec![
                    (catalogue::JOB, Attr::Str(job.clone())),
                    (catalogue::RANK, Attr::Int(*rank)),
                    (catalogue::HOST, Attr::Str(rank_host.clone())),
                ],
                value: Value::Real(pct / 100.0),
            });
        }
    } else if let Some(value) = agent_value(i, agent) {
        out.push(Point {
            attrs: vec![(catalogue::HOST, Attr::Str(host.to_owned()))],
            value,
        });
    }
    debug_assert!(out.iter().all(|p| p.attrs.len() == attrs.len()));
    debug_assert!(out
        .iter()
        .all(|p| matches!(p.value, Value::Histogram { .. }) == (i.kind == Kind::Histogram)));
    out
}

#[cfg(test)]
mod tests;

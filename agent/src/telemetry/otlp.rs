//! [`Family`]s as OTLP protobuf export requests (opentelemetry-proto's prost types): counters
//! as monotonic cumulative sums, gauges as gauges, the op-duration histogram as a native
//! cumulative explicit-bucket histogram in seconds; the resource and scope that log records
//! share (`crate::sinks::otlp` encodes those). Pure: no I/O.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::catalogue::Kind;
use super::{duration_bounds_s, Attr, Family, Value};

/// Instrumentation scope of everything the agent exports.
pub const SCOPE: &str = "comminsight-agent";

/// One OTLP attribute.
pub fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// The instrumentation scope of everything the agent exports.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

/// The OTLP resource of `attributes` (see [`super::resource`]).
pub fn resource(attributes: &[(String, String)]) -> Resource {
    Resource {
        attributes: attributes
            .iter()
            .map(|(k, v)| kv(k, any_value::Value::StringValue(v.clone())))
            .collect(),
        ..Default::default()
    }
}

fn point_attrs(attrs: &[(&'static str, Attr)]) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| {
            kv(
                k,
                match v {
                    Attr::Str(s) => any_value::Value::StringValue(s.clone()),
                    Attr::Int(i) => any_value::Value::IntValue(*i),
                },
            )
        })
        .collect()
}

fn number(v: &Value) -> Option<number_data_point::Value> {
    match v {
        Value::Count(n) => Some(number_data_point::Value::AsInt(
            i64::try_from(*n).unwrap_or(i64::MAX),
        )),
        Value::Real(x) => Some(number_data_point::Value::AsDouble(*x)),
        Value::Histogram { .. } => None,
    }
}

/// One family as an OTLP metric; `start_ns` is when the cumulative values started (the
/// agent's start), `now_ns` the collection time.
fn metric(f: &Family, start_ns: u64, now_ns: u64) -> Metric {
    let i = &f.instrument;
    let numbers = || -> Vec<NumberDataPoint> {
        f.points
            .iter()
            .map(|p| NumberDataPoint {
                attributes: point_attrs(&p.attrs),
                start_time_unix_nano: if i.kind == Kind::Counter { start_ns } else { 0 },
                time_unix_nano: now_ns,
                value: number(&p.value),
                ..Default::default()
            })
            .collect()
    };
    let data = match i.kind {
        Kind::Counter => metric::Data::Sum(Sum {
            data_points: numbers(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        Kind::Gauge => metric::Data::Gauge(Gauge {
            data_points: numbers(),
        }),
        Kind::Histogram => metric::Data::Histogram(Histogram {
            data_points: f
                .points
                .iter()
                .filter_map(|p| match &p.value {
                    Value::Histogram { counts, sum, count } => Some(HistogramDataPoint {
                        attributes: point_attrs(&p.attrs),
                        start_time_unix_nano: start_ns,
                        time_unix_nano: now_ns,
                        count: *count,
                        sum: Some(*sum),
                        bucket_counts: counts.clone(),
                        explicit_bounds: duration_bounds_s(),
                        ..Default::default()
                    }),
                    _ => None,
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
    };
    Metric {
        name: i.name.into(),
        description: i.description.into(),
        unit: i.unit.into(),
        data: Some(data),
        ..Default::default()
    }
}

/// The metrics export request of one collection (families without points are left out).
pub fn metrics_request(
    resource: &Resource,
    families: &[Family],
    start_ns: u64,
    now_ns: u64,
) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics: families
                    .iter()
                    .filter(|f| !f.points.is_empty())
                    .map(|f| metric(f, start_ns, now_ns))
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

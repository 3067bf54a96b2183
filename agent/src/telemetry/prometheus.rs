//! [`Family`]s in the OpenMetrics text format (prometheus-client's encoder), for `/metrics`.
//! Names and units follow the OpenTelemetry-to-Prometheus translation
//! ([`Instrument::prometheus_name`]); attribute keys become labels with `.` -> `_`.

use std::fmt::Write as _;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::catalogue::{prometheus_key, prometheus_unit, Instrument, Kind};
use super::{duration_bounds_s, Attr, Family, Value};

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
struct Families(Vec<Family>);

fn labels(attrs: &[(&'static str, Attr)]) -> Vec<(String, String)> {
    attrs
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Attr::Str(s) => s.clone(),
                Attr::Int(i) => i.to_string(),
            };
            (prometheus_key(k), v)
        })
        .collect()
}

fn unit(i: &Instrument) -> Option<Unit> {
    prometheus_unit(i.unit, i.kind).map(|u| match u {
        "seconds" => Unit::Seconds,
        "bytes" => Unit::Bytes,
        other => Unit::Other(other.to_owned()),
    })
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let bounds = duration_bounds_s();
        for f in self.0.iter().filter(|f| !f.points.is_empty()) {
            let i = &f.instrument;
            let ty = match i.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let name = prometheus_key(i.name);
            let unit = unit(i);
            let mut family = encoder.encode_descriptor(&name, i.description, unit.as_ref(), ty)?;
            for p in &f.points {
                let l = labels(&p.attrs);
                let e = family.encode_family(&l)?;
                match &p.value {
                    Value::Count(n) if i.kind == Kind::Counter => {
                        ConstCounter::new(*n).encode(e)?
                    }
                    Value::Count(n) => ConstGauge::new(*n as f64).encode(e)?,
                    Value::Real(x) if i.kind == Kind::Counter => ConstCounter::new(*x).encode(e)?,
                    Value::Real(x) => ConstGauge::new(*x).encode(e)?,
                    Value::Histogram { counts, sum, count } => {
                        let buckets: Vec<(f64, u64)> = bounds
                            .iter()
                            .copied()
                            .chain(std::iter::once(f64::INFINITY))
                            .zip(counts.iter().copied())
                            .collect();
                        let mut e = e;
                        e.encode_histogram::<NoLabelSet>(*sum, *count, &buckets, None)?
                    }
                }
            }
        }
        Ok(())
    }
}

/// `families` as OpenMetrics text (ends with `# EOF`).
pub fn render(families: Vec<Family>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(families)));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        // Writing into a String cannot fail; keep the scrape parseable if the encoder does.
        out.clear();
        let _ = writeln!(out, "# EOF");
    }
    out
}

//! dcgm-exporter `/metrics` bodies over arbitrary bytes (lossy UTF-8). Every line through the
//! sample-line reader `promtext::sample`: never panics, and a sample it accepts, written back
//! in the text format (labels escaped, the value as an integer or a float with an exponent),
//! reads back the same. The body through `exposition::parse` with the fields the agent really
//! asks for (`convert::FIELDS`): never panics and accounts for what it skips (a first skipped line is kept, cut to 200 bytes
//! at a character boundary); its series go through the converter twice (gauges, then counters'
//! deltas, links and Xid events against the previous scrape), and every GPU, link and Xid
//! record the converter makes is one the wire accepts (encodes and decodes to itself).
#![no_main]

use std::collections::BTreeMap;

use comminsight_agent::host::gpu::dcgm::convert::{DcgmConverter, FIELDS};
use comminsight_agent::host::gpu::dcgm::exposition::parse;
use comminsight_agent::host::gpu::dcgm::promtext::{sample, Number, Sample};
use comminsight_wire::record::{Body, Record};
use libfuzzer_sys::fuzz_target;

fn check(body: Body) {
    let rec = Record::new(body);
    match Record::decode(&rec.encode()) {
        Ok(back) => assert_eq!(back, rec),
        Err(e) => panic!("the converter made a record the wire refuses ({e:?}): {rec:?}"),
    }
}

/// `s` in the text format.
fn render(s: &Sample) -> String {
    let mut out = s.name.to_string();
    if !s.labels.is_empty() {
        let labels: Vec<String> = s
            .labels
            .iter()
            .map(|(k, v)| {
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                format!("{k}=\"{v}\"")
            })
            .collect();
        out.push_str(&format!("{{{}}}", labels.join(",")));
    }
    match s.value {
        Number::Int(i) => out.push_str(&format!(" {i}")),
        Number::Float(f) if f.is_nan() => out.push_str(" NaN"),
        Number::Float(f) if f == f64::INFINITY => out.push_str(" +Inf"),
        Number::Float(f) if f == f64::NEG_INFINITY => out.push_str(" -Inf"),
        Number::Float(f) => out.push_str(&format!(" {f:e}")),
    }
    if let Some(t) = s.timestamp_ms {
        out.push_str(&format!(" {t}"));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let body = String::from_utf8_lossy(data);
    for line in body.lines() {
        let Ok(s) = sample(line) else { continue };
        assert!(!s.name.is_empty());
        let text = render(&s);
        let back = sample(&text).unwrap_or_else(|e| panic!("{line:?} -> {text:?}: {e}"));
        assert_eq!(back.name, s.name);
        assert_eq!(back.labels, s.labels, "{line:?} -> {text:?}");
        assert_eq!(back.timestamp_ms, s.timestamp_ms);
        match (back.value, s.value) {
            (Number::Float(a), Number::Float(b)) if a.is_nan() && b.is_nan() => {}
            (a, b) => assert_eq!(a, b, "{line:?} -> {text:?}"),
        }
    }
    let e = parse(&body, &FIELDS);
    assert!(e.first_skipped.len() <= 200);
    assert_eq!(e.skipped == 0, e.first_skipped.is_empty());
    for s in &e.series {
        assert!(FIELDS.contains(&s.name.as_str()));
    }
    let mut uuids = BTreeMap::new();
    uuids.insert("GPU-a".to_string(), 0x1b00u64);
    let mut conv = DcgmConverter::default();
    for (now, host) in [
        (1_000_000_000u64, 1_764_000_000_000_000_000u64),
        (2_000_000_000, 1_764_000_001_000_000_000),
    ] {
        let (r, stats) = conv.convert(&e.series, &uuids, now, host);
        assert_eq!(stats.gpus, r.gpus.len());
        for g in r.gpus {
            check(Body::Gpu(g));
        }
        for l in r.links {
            check(Body::GpuLink(l));
        }
        for x in r.xids {
            check(Body::Xid(x));
        }
    }
});

//! The Parquet archive read back with DuckDB (the real engine, from the test venv): per-comm op
//! counts equal the records the plugin wrote, hive partitions, unique seqs, idempotent repeats,
//! raw `.zst` files decompress to the segment bytes plus recovered records.

mod archive_util;

use std::path::Path;

use archive_util::{python, write_process, TempDir, Written};
use comminsight_agent::archive::{Archive, SegmentInput};
use comminsight_agent::config::ArchiveConfig;
use comminsight_agent::stream::{Alignment, StreamId};
use comminsight_wire::record::{Body, OpRecord, RawRecord, Record};
use comminsight_wire::segment::{find_segments, parse_segment_name, read_segment};
use serde_json::Value;

const ALIGN: Alignment = Alignment {
    offset_ns: -1_500,
    err_ns: 250,
};
/// GPU timer -> job timeline of every stream in these tests.
const GPU_ALIGN: Alignment = Alignment {
    offset_ns: 1_795_000_000_000_000_000,
    err_ns: 1_300,
};

/// Archive every sealed segment under `logs`; returns (files archived, per-file outputs' rows).
fn archive_all(a: &Archive, logs: &Path) -> u64 {
    let mut rows = 0;
    for seg in find_segments(logs).unwrap() {
        let id = StreamId::from_dir(logs, seg.parent().unwrap()).unwrap();
        let name = seg.file_name().unwrap().to_str().unwrap();
        let (index, open) = parse_segment_name(name).unwrap();
        assert!(!open);
        let out = a
            .archive_segment(SegmentInput {
                id: &id,
                index,
                path: &seg,
                recovered: &[],
                align: ALIGN,
                gpu_align: Some(GPU_ALIGN),
            })
            .unwrap();
        assert_eq!(out.torn_bytes, 0);
        assert_eq!(out.bad_records, 0);
        rows += out.rows;
    }
    rows
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn duckdb_counts_equal_the_records_written() {
    let d = TempDir::new("duckdb");
    let logs = d.path().join("logs");
    let procs: Vec<(&str, u32, Written)> = [
        ("node-a", 100u32, 0u64),
        ("node-a", 101, 1),
        ("node-b", 100, 2),
    ]
    .into_iter()
    .map(|(h, pid, salt)| (h, pid, write_process(&logs, "job7", h, pid, salt)))
    .collect();
    let root = d.path().join("archive");
    let cfg = ArchiveConfig {
        dir: root.clone(),
        ..ArchiveConfig::default()
    };
    let a = Archive::open(&cfg).unwrap();
    let rows = archive_all(&a, &logs);
    let records: u64 = procs.iter().map(|p| p.2.records).sum();
    assert_eq!(
        rows, records,
        "one row per record written, no headers or repeats"
    );

    let q: Value =
        serde_json::from_str(&python("archive_duckdb.py", &[root.to_str().unwrap()])).unwrap();
    // Per comm (a comm spans processes; counted by hash and name as users would).
    let mut expect: Vec<(String, String, u64)> = Vec::new();
    for (_, _, w) in &procs {
        for (h, name, n) in &w.ops {
            let key = (format!("0x{h:016x}"), name.clone());
            match expect.iter_mut().find(|e| (&e.0, &e.1) == (&key.0, &key.1)) {
                Some(e) => e.2 += n,
                None => expect.push((key.0, key.1, *n)),
            }
        }
    }
    expect.sort();
    let got: Vec<(String, String, u64)> = q["per_comm"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                r[1].as_str().unwrap().to_string(),
                r[2].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expect);
    assert_eq!(q["rows"].as_u64().unwrap(), records);
    assert_eq!(q["dup_seq"].as_u64().unwrap(), 0, "seq unique per process");
    assert_eq!(q["misaligned"].as_u64().unwrap(), 0);
    assert_eq!(q["clock_err"], serde_json::json!([[250]]));
    assert_eq!(
        q["overdue_json"],
        serde_json::json!([["31000"], ["31000"], ["31000"]])
    );
    // Op rows are complete through their columns and carry no JSON; every other row has it.
    let ops: u64 = q["per_comm"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[2].as_u64().unwrap())
        .sum();
    assert_eq!(q["op_json"].as_u64().unwrap(), 0);
    // GPU timer values on the job timeline, with their own error bound.
    assert_eq!(q["gpu_misaligned"].as_u64().unwrap(), 0);
    assert_eq!(q["gpu_err"], serde_json::json!([[1300]]));
    assert_eq!(q["non_op_without_json"].as_u64().unwrap(), 0);
    let f: Vec<f64> = q["op_fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(
        f,
        vec![3.0 * ops as f64, 16.0 * ops as f64, 2.0 * ops as f64]
    );
    let cols: Vec<&str> = q["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for c in [
        "job",
        "host",
        "hour",
        "pid",
        "seq",
        "comm_hash",
        "comm_name",
        "aligned_start_ns",
        "clock_err_ns",
        "body_json",
    ] {
        assert!(cols.contains(&c), "column {c} in {cols:?}");
    }
    // Partitions: job / host from the stream, hour (UTC) from each segment header.
    let mut parts: Vec<(String, String, String, u64)> = Vec::new();
    for seg in find_segments(&logs).unwrap() {
        let id = StreamId::from_dir(&logs, seg.parent().unwrap()).unwrap();
        let read = read_segment(&seg).unwrap();
        let hour = comminsight_agent::archive::hour_of_ns(read.header().unwrap().created_real_ns);
        let n = read
            .records
            .iter()
            .filter(|r| r.flags & 1 == 0 && !matches!(r.body, Body::Segment(_)))
            .count() as u64;
        match parts
            .iter_mut()
            .find(|p| (&p.0, &p.1, &p.2) == (&id.job, &id.host, &hour))
        {
            Some(p) => p.3 += n,
            None => parts.push((id.job, id.host, hour, n)),
        }
    }
    parts.sort();
    let got: Vec<(String, String, String, u64)> = q["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |i: usize| r[i].as_str().unwrap().to_string();
            (s(0), s(1), s(2), r[3].as_u64().unwrap())
        })
        .collect();
    assert_eq!(got, parts);

    // Archiving everything again (a restart after a crash) changes no byte and adds no row.
    let before = snapshot(&root);
    archive_all(&a, &logs);
    assert_eq!(snapshot(&root), before);
    let q2: Value =
        serde_json::from_str(&python("archive_duckdb.py", &[root.to_str().unwrap()])).unwrap();
    assert_eq!(q2["rows"], q["rows"]);
}

#[test]
fn raw_archive_is_the_segment_plus_recovered_records() {
    let d = TempDir::new("raw");
    let logs = d.path().join("logs");
    write_process(&logs, "j", "h", 5, 0);
    let seg = find_segments(&logs).unwrap().pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let whole = bytes.clone();
    bytes.extend_from_slice(&[7u8; 77]); // torn tail of a killed writer
    let open = seg.with_file_name("seg-000001.cis.open");
    std::fs::write(&open, &bytes).unwrap();
    let mut r = Record::new(Body::Coll(OpRecord {
        comm_hash: 9,
        start_ns: 1,
        ..Default::default()
    }));
    r.seq = 10_000;
    let recovered: Vec<RawRecord> = vec![r.encode()];
    let a = Archive::open(&ArchiveConfig {
        dir: d.path().join("archive"),
        ..Default::default()
    })
    .unwrap();
    let id = StreamId::new("j", "h", "5");
    let out = a
        .archive_segment(SegmentInput {
            id: &id,
            index: 1,
            path: &open,
            recovered: &recovered,
            align: ALIGN,
            gpu_align: Some(GPU_ALIGN),
        })
        .unwrap();
    assert_eq!(out.torn_bytes, 77);
    let raw = zstd::decode_all(std::fs::File::open(&out.raw_path).unwrap()).unwrap();
    let mut expect = whole;
    expect.extend_from_slice(&recovered[0].0);
    assert_eq!(raw, expect);
    assert_eq!(out.input_bytes, expect.len() as u64);
    assert!(out.raw_bytes < out.input_bytes, "compressed");
    assert!(a.contains(&id, 1));
}

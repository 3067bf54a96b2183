//! `comminsight-agent dump` / `encode` against segments written by the real segment writer.

use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record};
use comminsight_wire::segment::{find_segments, SegmentConfig, SegmentWriter};
use comminsight_wire::Func;

mod support;
use support::{agent, TempDir as Tmp};

/// A process directory with one sealed segment: proc_start, a named comm, `n` all-reduces.
fn write_job(root: &Path, rank: i32, n: u64) -> PathBuf {
    let dir = root
        .join("job1")
        .join(format!("host{}", rank / 4))
        .join(format!("{}", 1000 + rank));
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: dir.clone(),
            ..Default::default()
        },
        1000 + rank as u32,
    );
    let mut seq = 0;
    let mut raw = |body: Body| {
        seq += 1;
        Record {
            seq,
            flags: 0,
            body,
        }
        .encode()
    };
    let mut recs = vec![
        raw(Body::ProcStart(ProcStart {
            pid: 1000 + rank as u32,
            rank,
            host: format!("host{}", rank / 4).as_str().into(),
            job: "job1".into(),
            ..Default::default()
        })),
        raw(Body::CommInit(CommInit {
            comm_hash: 0xabc,
            nranks: 2,
            rank,
            comm_name: "dp".into(),
            ..Default::default()
        })),
    ];
    for i in 0..n {
        recs.push(raw(Body::Coll(OpRecord {
            comm_hash: 0xabc,
            coll_sn: i,
            coll_local_sn: i,
            rank,
            func: Func::ALL_REDUCE,
            start_ns: 1_000_000 * (i + 1),
            end_ns: 1_000_000 * (i + 1) + 5_000,
            ..Default::default()
        })));
    }
    w.write(&recs);
    w.seal();
    dir
}

#[test]
fn dump_json_lines_carry_design_field_names_and_derived_fields() {
    let t = Tmp::new("json");
    write_job(&t.0, 0, 3);
    let out = agent(&["dump", t.0.to_str().unwrap(), "--json", "--kind", "coll"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["kind"], "coll");
    assert_eq!(lines[1]["comm_hash"], "0x0000000000000abc");
    assert_eq!(lines[1]["comm_name"], "dp");
    assert_eq!(lines[1]["func"], "AllReduce");
    assert_eq!(lines[1]["coll_sn"], 1);
    assert_eq!(lines[1]["start_us"], 2000);
    assert_eq!(lines[1]["end_us"], 2005);
}

#[test]
fn dump_then_encode_is_byte_identical() {
    let t = Tmp::new("roundtrip");
    let dir = write_job(&t.0, 1, 50);
    let seg = &find_segments(&dir).unwrap()[0];
    let out = agent(&["dump", seg.to_str().unwrap(), "--json"]);
    assert!(out.status.success());
    let jsonl = t.0.join("x.jsonl");
    std::fs::write(&jsonl, &out.stdout).unwrap();
    let bin = t.0.join("x.bin");
    let enc = agent(&[
        "encode",
        jsonl.to_str().unwrap(),
        "--out",
        bin.to_str().unwrap(),
    ]);
    assert!(
        enc.status.success(),
        "{}",
        String::from_utf8_lossy(&enc.stderr)
    );
    assert_eq!(std::fs::read(seg).unwrap(), std::fs::read(bin).unwrap());
}

#[test]
fn summary_counts_processes_and_comms() {
    let t = Tmp::new("summary");
    for r in 0..2 {
        write_job(&t.0, r, 4);
    }
    let out = agent(&["dump", t.0.to_str().unwrap(), "--summary", "--json"]);
    assert!(out.status.success());
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["processes"].as_array().unwrap().len(), 2);
    assert_eq!(s["processes"][1]["colls"], 4);
    assert_eq!(s["processes"][1]["mean_op_us"], 5.0);
    assert_eq!(s["comms"][0]["name"], "dp");
    assert_eq!(s["comms"][0]["ranks_seen"], serde_json::json!([0, 1]));
    assert_eq!(s["comms"][0]["ops"], 8);
    let human = agent(&["dump", t.0.to_str().unwrap(), "--summary"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("host0"));
}

#[test]
fn bad_input_is_one_clear_line_and_exit_2() {
    let out = agent(&["dump", "/nonexistent/inspector_logs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/nonexistent/inspector_logs") && err.contains("no such file"),
        "{err}"
    );

    let t = Tmp::new("empty");
    let out = agent(&["dump", t.0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no segment files"));

    let out = agent(&["dump", t.0.to_str().unwrap(), "--kind", "colls"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown kind"));

    let bad = t.0.join("bad.jsonl");
    std::fs::write(&bad, "{\"kind\":\"coll\"}\n").unwrap();
    let out = agent(&[
        "encode",
        bad.to_str().unwrap(),
        "--out",
        t.0.join("o").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

#[test]
fn a_corrupt_record_is_reported_and_the_rest_is_kept() {
    let t = Tmp::new("corrupt");
    let dir = write_job(&t.0, 0, 5);
    let seg = find_segments(&dir).unwrap()[0].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[128 * 4] ^= 0xff; // magic of the 5th record
    bytes.extend_from_slice(&[1, 2, 3]); // and a torn tail
    std::fs::write(&seg, bytes).unwrap();
    let out = agent(&["dump", seg.to_str().unwrap(), "--json", "--kind", "coll"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("record 4 is corrupt"), "{err}");
    assert!(err.contains("3 trailing bytes"), "{err}");
}

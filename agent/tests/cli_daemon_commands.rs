//! `replay`, `config` and `doctor` from the command line: exit codes, `--json`, one-line errors.

use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::Func;

mod support;
use support::{agent, TempDir as Tmp};

fn write_stream(root: &std::path::Path, pid: u32, ops: u64) {
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: root.join("job7").join("h0").join(pid.to_string()),
            ..SegmentConfig::default()
        },
        pid,
    );
    let mut seq = 0;
    let mut put = |w: &mut SegmentWriter, body: Body| {
        let mut r = Record::new(body).encode();
        r.set_seq(seq);
        seq += 1;
        w.write(&[r]);
    };
    put(
        &mut w,
        Body::ProcStart(ProcStart {
            pid,
            mono_ns: 1,
            real_ns: 2,
            ..Default::default()
        }),
    );
    put(
        &mut w,
        Body::CommInit(CommInit {
            comm_hash: 5,
            nranks: 2,
            comm_name: "dp".into(),
            ..Default::default()
        }),
    );
    for i in 0..ops {
        put(
            &mut w,
            Body::Coll(OpRecord {
                comm_hash: 5,
                coll_sn: i,
                count: 256,
                bytes: 1024,
                start_ns: 1_000_000 + i * 10_000,
                end_ns: 1_002_000 + i * 10_000,
                func: Func::ALL_REDUCE,
                ..Default::default()
            }),
        );
    }
    w.seal();
}

#[test]
fn replay_json_counts_every_record_and_is_deterministic() {
    let t = Tmp::new("replay");
    let logs = t.0.join("logs");
    write_stream(&logs, 11, 30);
    write_stream(&logs, 12, 20);
    let out = agent(&[
        "replay",
        logs.to_str().unwrap(),
        "--out",
        t.0.join("a").to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["streams"], 2);
    assert_eq!(v["records"], 2 * 2 + 50);
    // From a job directory (any directory above segments): the same results, byte for byte.
    let again = agent(&[
        "replay",
        logs.join("job7").to_str().unwrap(),
        "--out",
        t.0.join("b").to_str().unwrap(),
    ]);
    assert!(again.status.success());
    assert_eq!(
        std::fs::read(t.0.join("a/metrics.json")).unwrap(),
        std::fs::read(t.0.join("b/metrics.json")).unwrap()
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.0.join("a/metrics.json")).unwrap()).unwrap();
    let ops: u64 = m["jobs"]["job7"]["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["values"]["ops"].as_u64().unwrap())
        .sum();
    assert_eq!(ops, 50);
}

#[test]
fn replay_of_a_directory_without_segments_is_an_input_error() {
    let t = Tmp::new("empty");
    let out = agent(&[
        "replay",
        t.0.to_str().unwrap(),
        "--out",
        t.0.join("o").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no segment files"), "{err}");
}

#[test]
fn config_check_names_the_bad_key_and_exits_2() {
    let t = Tmp::new("conf");
    let f = t.0.join("agent.toml");
    std::fs::write(&f, "[otlp]\nendpiont = \"http://x:4318\"\n").unwrap();
    let out = agent(&["config", "check", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("otlp.endpiont") && err.contains("otlp.endpoint"),
        "{err}"
    );
    std::fs::write(&f, "[otlp]\nendpoint = \"http://x:4318\"\n").unwrap();
    let ok = agent(&["config", "check", f.to_str().unwrap(), "--json"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(v["otlp"]["endpoint"], "http://x:4318");
    // The example is what `config example` prints.
    let ex = agent(&["config", "example"]);
    assert_eq!(
        String::from_utf8(ex.stdout).unwrap(),
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.toml"))
            .unwrap()
    );
}

#[test]
fn doctor_json_lists_checks_with_fixes() {
    let t = Tmp::new("doctor");
    let f = t.0.join("agent.toml");
    std::fs::write(
        &f,
        format!("[agent]\nstate_dir = \"{}\"\n", t.0.join("state").display()),
    )
    .unwrap();
    let out = agent(&["doctor", "--config", f.to_str().unwrap(), "--json"]);
    let code = out.status.code().unwrap();
    assert!(code == 0 || code == 1, "exit {code}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    assert!(checks.len() >= 8, "{v}");
    for c in checks {
        if c["status"] != "ok" {
            assert!(
                c["fix"].as_str().is_some_and(|s| !s.is_empty()),
                "a failing check without a fix: {c}"
            );
        }
    }
    assert_eq!(code == 1, checks.iter().any(|c| c["status"] == "fail"));
}

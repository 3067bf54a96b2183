//! Issue 22, deliverable 5 and the Inspector importer on real producer output: our plugin's NCCL
//! Inspector-compatible lines (`COMMINSIGHT_INSPECTOR_COMPAT=1`) from a test-bed MoE job do not
//! have Inspector's two bugs measured under the test bed (the last ops of a communicator dropped
//! at teardown, AlltoAll named "Invalid"), and `import nccl-inspector` turns them back into
//! the same operations.

use std::collections::BTreeMap;

use comminsight_tests::*;
use comminsight_wire::record::Body;

const MOE: &str = "tests/scenarios/moe.toml";

/// Every Inspector line under `dir`, parsed.
fn inspector_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        for l in std::fs::read_to_string(&p).unwrap().lines() {
            out.push(
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", p.display())),
            );
        }
    }
    out
}

#[test]
fn compat_output_keeps_the_last_op_of_every_comm_and_names_alltoall_and_imports_back() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("inspector-compat");
    let insp = out.path().join("inspector-json");
    let scenario = format!("{}/../../{MOE}", env!("CARGO_MANIFEST_DIR"));
    testbed(
        out.path(),
        &["--scenario", &scenario, "--ranks", "8", "--steps", "3"],
        &[
            ("COMMINSIGHT_INSPECTOR_COMPAT", "1"),
            ("NCCL_INSPECTOR_DUMP_DIR", insp.to_str().unwrap()),
            ("NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES", "0"),
            ("NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING", "0"),
        ],
    )
    .assert_ok();

    // Per (comm, func): the last collective the plugin recorded, and how many.
    let recs = records(&out.path().join("inspector_logs"));
    let mut last: BTreeMap<(u64, String), (u64, u64)> = BTreeMap::new();
    for r in &recs {
        if let Body::Coll(o) = &r.body {
            let e = last
                .entry((o.comm_hash, o.func.name().to_string()))
                .or_default();
            e.0 = e.0.max(o.coll_sn);
            e.1 += 1;
        }
    }
    let a2a = last
        .iter()
        .filter(|((_, f), _)| f == "AlltoAll")
        .map(|(_, (_, n))| n)
        .sum::<u64>();
    assert!(a2a > 0, "the MoE scenario issues AlltoAll");

    let lines = inspector_lines(&insp);
    let mut seen: BTreeMap<(u64, String), Vec<u64>> = BTreeMap::new();
    for l in &lines {
        if let Some(c) = l.get("coll_perf") {
            let id = l["header"]["id"].as_str().unwrap().trim_start_matches("0x");
            let comm = u64::from_str_radix(id, 16).unwrap();
            seen.entry((comm, c["coll"].as_str().unwrap().to_string()))
                .or_default()
                .push(c["coll_sn"].as_u64().unwrap());
        }
    }
    assert!(
        !seen.keys().any(|(_, f)| f == "Invalid"),
        "no collective is named Invalid"
    );
    for ((comm, func), (max_sn, n)) in &last {
        let sns = seen.get(&(*comm, func.clone())).unwrap_or_else(|| {
            panic!("comm {comm:016x} {func}: no Inspector line at all ({n} recorded)")
        });
        assert!(
            sns.contains(max_sn),
            "comm {comm:016x} {func}: its last op (sn {max_sn}) is in the Inspector output"
        );
        assert_eq!(
            sns.len() as u64,
            *n,
            "comm {comm:016x} {func}: one line per op"
        );
    }

    // The importer reads them back: the same ops, nothing skipped.
    let back = out.path().join("imported");
    let o = agent(&[
        "import",
        "nccl-inspector",
        insp.to_str().unwrap(),
        "-o",
        back.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(m["format"], "nccl-inspector");
    assert_eq!(m["summary"]["ops"].as_u64().unwrap(), lines.len() as u64);
    assert_eq!(m["summary"]["skipped"], serde_json::json!({}));
    let imported = records(&back);
    let colls_back = imported
        .iter()
        .filter(|r| matches!(r.body, Body::Coll(_)))
        .count() as u64;
    assert_eq!(colls_back, last.values().map(|(_, n)| n).sum::<u64>());
}

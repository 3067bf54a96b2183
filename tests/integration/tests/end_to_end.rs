//! Issue 2 acceptance, end to end: the real plugin loaded by the CPU NCCL stand-in in real rank
//! processes, read back with the real reader and the agent CLI.

use std::collections::{BTreeMap, BTreeSet};

use comminsight_tests::*;
use comminsight_wire::record::{Body, Timing};

const MEGATRON: &str = "tests/scenarios/megatron.toml";

fn scenario() -> String {
    // Tests run with the package dir as cwd; scenarios live at the workspace root.
    format!("{}/../../{MEGATRON}", env!("CARGO_MANIFEST_DIR"))
}

fn comm_inits(recs: &[comminsight_wire::Record]) -> Vec<&comminsight_wire::record::CommInit> {
    recs.iter()
        .filter_map(|r| {
            if let Body::CommInit(c) = &r.body {
                Some(c)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn plugin_is_found_by_name_by_absolute_path_and_not_with_none() {
    let _g = one_job_at_a_time();
    let abs = lib_dir().join("libnccl-profiler-comminsight.so");
    let abs = abs.to_str().unwrap().to_string();
    for plugin in ["comminsight", abs.as_str()] {
        let out = OutDir::new("find-plugin");
        testbed(
            out.path(),
            &["--scenario", &scenario(), "--ranks", "4", "--steps", "2"],
            &[("NCCL_PROFILER_PLUGIN", plugin)],
        )
        .assert_ok();
        let recs = records(&out.path().join("inspector_logs"));
        let pids: BTreeSet<u32> = recs
            .iter()
            .filter_map(|r| {
                if let Body::ProcStart(p) = &r.body {
                    Some(p.pid)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            pids.len(),
            4,
            "NCCL_PROFILER_PLUGIN={plugin}: one proc_start per rank"
        );
        assert!(
            !colls(&recs).is_empty(),
            "NCCL_PROFILER_PLUGIN={plugin}: coll records"
        );
    }
    let out = OutDir::new("no-plugin");
    testbed(
        out.path(),
        &["--scenario", &scenario(), "--ranks", "4", "--steps", "2"],
        &[("NCCL_PROFILER_PLUGIN", "none")],
    )
    .assert_ok();
    let segs = comminsight_wire::segment::find_segments(&out.path().join("inspector_logs"))
        .unwrap_or_default();
    assert!(
        segs.is_empty(),
        "NCCL_PROFILER_PLUGIN=none must load nothing, found {segs:?}"
    );
}

#[test]
fn every_abi_version_is_driven() {
    let _g = one_job_at_a_time();
    for (nccl, abi) in [("2.27", 4u8), ("2.28", 5), ("2.30", 6)] {
        let out = OutDir::new(&format!("abi-{abi}"));
        testbed(
            out.path(),
            &["--scenario", &scenario(), "--ranks", "4", "--steps", "3"],
            &[("COMMINSIGHT_TESTBED_NCCL_VERSION", nccl)],
        )
        .assert_ok();
        let recs = records(&out.path().join("inspector_logs"));
        let inits = comm_inits(&recs);
        assert!(!inits.is_empty());
        for c in &inits {
            assert_eq!(
                c.abi_version, abi,
                "NCCL {nccl} must drive profiler ABI v{abi}"
            );
        }
        let cs = colls(&recs);
        assert!(!cs.is_empty(), "NCCL {nccl}: coll records");
        for o in &cs {
            assert_eq!(
                o.timing,
                Timing::KernelGpu,
                "NCCL {nccl}: KernelCh GPU timers recorded: {o:?}"
            );
            assert!(
                o.end_ns >= o.start_ns && o.start_ns >= o.enqueue_ns,
                "times ordered: {o:?}"
            );
            assert_eq!(o.channels_done, o.nchannels, "every channel stopped: {o:?}");
            assert!(o.gpu_end_ns > o.gpu_start_ns);
        }
    }
}

#[test]
fn every_coll_record_matches_on_every_member_rank_over_50_steps() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("match-8x50");
    testbed(
        out.path(),
        &[
            "--scenario",
            &scenario(),
            "--ranks",
            "8",
            "--hosts",
            "2",
            "--steps",
            "50",
        ],
        &[],
    )
    .assert_ok();
    let truth = truth(out.path());
    let recs = records(&out.path().join("inspector_logs"));
    // comm hash -> member ranks (global ranks), from the truth file.
    let mut members: BTreeMap<u64, BTreeSet<i64>> = BTreeMap::new();
    for c in truth["comms"].as_array().expect("truth.comms") {
        let h =
            u64::from_str_radix(c["hash"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        members.insert(
            h,
            c["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_i64().unwrap())
                .collect(),
        );
    }
    // (comm, rank-in-comm) -> global rank, from comm_init and proc_start of the same process.
    let mut by_key: BTreeMap<(u64, u8, u64), BTreeSet<i64>> = BTreeMap::new();
    let mut n = 0;
    for f in comminsight_wire::segment::find_segments(&out.path().join("inspector_logs")).unwrap() {
        let seg = comminsight_wire::segment::read_segment(&f).unwrap();
        let global = seg.records.iter().find_map(|r| {
            if let Body::ProcStart(p) = &r.body {
                Some(p.rank as i64)
            } else {
                None
            }
        });
        let global = match global {
            Some(g) => g,
            None => continue, // later segments carry proc_start as a repeat; it is there too
        };
        for r in &seg.records {
            if let Body::Coll(o) = &r.body {
                if r.flags & comminsight_wire::record::FLAG_REPEAT == 0 {
                    by_key
                        .entry((o.comm_hash, o.func.0, o.coll_sn))
                        .or_default()
                        .insert(global);
                    n += 1;
                }
            }
        }
    }
    assert!(n > 8 * 50, "expected many coll records, got {n}");
    assert_eq!(n, colls(&recs).len());
    for ((comm, func, sn), ranks) in &by_key {
        let want = members
            .get(comm)
            .unwrap_or_else(|| panic!("comm 0x{comm:016x} not in truth.json"));
        assert_eq!(
            ranks, want,
            "coll (0x{comm:016x}, func {func}, sn {sn}) recorded on {ranks:?}, members {want:?}"
        );
    }
    // Step boundaries in truth.json index the records actually written.
    for (rank, steps) in truth["steps"].as_object().expect("truth.steps") {
        let steps = steps.as_array().unwrap();
        assert_eq!(steps.len(), 50, "rank {rank}: 50 steps in truth");
    }
}

#[test]
fn dump_json_then_encode_reproduces_a_segment_byte_for_byte() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("roundtrip");
    testbed(
        out.path(),
        &["--scenario", &scenario(), "--ranks", "4", "--steps", "3"],
        &[],
    )
    .assert_ok();
    let segs =
        comminsight_wire::segment::find_segments(&out.path().join("inspector_logs")).unwrap();
    assert!(!segs.is_empty());
    for seg in segs.iter().take(2) {
        let dump = agent(&["dump", seg.to_str().unwrap(), "--json"]);
        assert!(
            dump.status.success(),
            "{}",
            String::from_utf8_lossy(&dump.stderr)
        );
        let jsonl = out.path().join("seg.jsonl");
        std::fs::write(&jsonl, &dump.stdout).unwrap();
        let bin = out.path().join("seg.bin");
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
        assert_eq!(
            std::fs::read(seg).unwrap(),
            std::fs::read(&bin).unwrap(),
            "{}",
            seg.display()
        );
        let line = String::from_utf8_lossy(&dump.stdout)
            .lines()
            .find(|l| l.contains("\"kind\":\"coll\""))
            .unwrap()
            .to_string();
        for key in [
            "comm_hash",
            "comm_name",
            "rank",
            "func",
            "coll_sn",
            "coll_local_sn",
            "count",
            "bytes",
            "start_us",
            "end_us",
        ] {
            assert!(
                line.contains(&format!("\"{key}\":")),
                "dump --json lacks {key}: {line}"
            );
        }
    }
}

#[test]
fn a_hang_yields_overdue_records_within_twice_the_threshold() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("hang");
    let threshold_ms = 2000u64;
    testbed(
        out.path(),
        &[
            "--scenario",
            &scenario(),
            "--ranks",
            "8",
            "--hosts",
            "2",
            "--steps",
            "6",
            "--fault",
            "hang:rank=3,step=2",
            "--timeout",
            "15",
        ],
        &[("COMMINSIGHT_OVERDUE_MS", "2000")],
    );
    let truth = truth(out.path());
    assert_eq!(truth["culprit_ranks"], serde_json::json!([3]));
    let recs = records(&out.path().join("inspector_logs"));
    let mut first_reports = 0;
    let mut ranks = BTreeSet::new();
    for r in &recs {
        if let Body::Overdue(o) = &r.body {
            assert_eq!(o.threshold_ms as u64, threshold_ms);
            if o.repeat == 0 {
                first_reports += 1;
                let age_ms = (o.now_ns - o.enqueue_ns) / 1_000_000;
                assert!(
                    age_ms >= threshold_ms && age_ms <= 2 * threshold_ms,
                    "first overdue report after {age_ms} ms: {o:?}"
                );
                ranks.insert(o.rank);
            }
        }
    }
    assert!(first_reports > 0, "no overdue records after a hang");
    assert!(
        ranks.len() >= 2,
        "peers of the hung rank report overdue ops: {ranks:?}"
    );
}

//! Issue 7: `comminsight-agent trace` writes a Perfetto protobuf trace that Perfetto's own schema
//! (PyPI `perfetto`, `perfetto_trace_pb2`) parses, with the expected tracks, properly nested
//! step -> phase -> op slices, the ops of the chosen steps, and flows linking each matched
//! instance across ranks. Counts are computed independently from the segments and `steps --json`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use comminsight_tests::*;
use comminsight_wire::record::{Body, FLAG_REPEAT};
use comminsight_wire::segment::{find_segments, read_segment};
use comminsight_wire::Func;
use serde_json::Value;

const RANKS: i64 = 16;
const HOSTS: usize = 4;

fn scenario(name: &str) -> String {
    format!(
        "{}/../../tests/scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The facts the Python checker prints about a trace file.
fn facts(trace: &Path) -> Value {
    let python = test_tool("venv/bin/python");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/trace_facts.py");
    let o = Command::new(&python)
        .arg(script)
        .arg(trace)
        .output()
        .expect("start the Python checker");
    assert!(
        o.status.success(),
        "trace_facts.py failed (perfetto_trace_pb2 could not parse the trace?):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("the checker prints JSON")
}

/// `comminsight-agent trace ARGS`: its stdout (must succeed).
fn trace(args: &[&str]) -> String {
    let mut a = vec!["trace"];
    a.extend_from_slice(args);
    let o = agent(&a);
    assert!(
        o.status.success(),
        "trace {args:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `"wrote F: N packets, M op slices, B bytes (b bytes/op)"` -> (N, M, B, b).
fn summary_line(stdout: &str) -> (u64, u64, u64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("wrote "))
        .unwrap_or_else(|| panic!("no summary line in {stdout:?}"));
    let nums: Vec<f64> = line
        .rsplit_once(": ")
        .expect("wrote FILE: ...")
        .1
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|s| !s.is_empty() && *s != ".")
        .map(|s| s.parse().expect("a number"))
        .collect();
    assert_eq!(nums.len(), 4, "{line}");
    (nums[0] as u64, nums[1] as u64, nums[2] as u64, nums[3])
}

/// One operation record of a rank: (lsn, p2p, comm, func, coll_sn, comm rank, peer).
type RecOp = (u64, bool, u64, Func, u64, i32, i32);

/// Every rank's operation records, read per process directory (rank from its `proc_start`).
fn ops_by_rank(out: &Path) -> BTreeMap<i64, Vec<RecOp>> {
    let mut by_dir: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    for f in find_segments(out).expect("segments") {
        by_dir
            .entry(f.parent().expect("process dir").to_path_buf())
            .or_default()
            .push(f);
    }
    let mut res = BTreeMap::new();
    for files in by_dir.values() {
        let (mut rank, mut ops) = (None, Vec::new());
        for f in files {
            for r in read_segment(f).expect("read").records {
                if r.flags & FLAG_REPEAT != 0 {
                    continue;
                }
                match &r.body {
                    Body::ProcStart(p) => rank = Some(i64::from(p.rank)),
                    Body::Coll(o) | Body::P2p(o) => ops.push((
                        o.coll_local_sn,
                        matches!(r.body, Body::P2p(_)),
                        o.comm_hash,
                        o.func,
                        o.coll_sn,
                        o.rank,
                        o.peer,
                    )),
                    _ => {}
                }
            }
        }
        res.insert(rank.expect("a proc_start per process"), ops);
    }
    res
}

/// A matched instance: (p2p, comm, func, sender, receiver, seq).
type Instance = (bool, u64, u64, i64, i64, u64);

/// A step of `steps --json`: (first lsn, last lsn, ops, start_us, end_us).
type StepRow = (u64, u64, u64, u64, u64);

/// The matched instance of an op: collectives by (comm, func, seq); P2P by (comm, sender,
/// receiver, ordinal).
fn instance(o: &RecOp) -> Instance {
    let (_, p2p, comm, func, sn, rank, peer) = *o;
    if !p2p {
        return (false, comm, u64::from(func.0), 0, 0, sn);
    }
    let (src, dst) = if func == Func::RECV {
        (peer, rank)
    } else {
        (rank, peer)
    };
    (true, comm, 0, i64::from(src), i64::from(dst), sn)
}

/// `steps --json --steps A..B`: per (rank, step): (first lsn, last lsn, ops, start_us, end_us).
fn steps_json(out: &Path, range: &str) -> BTreeMap<(i64, u64), StepRow> {
    let o = agent(&["steps", out.to_str().unwrap(), "--json", "--steps", range]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("steps --json");
    v["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            let start = s["first"]["start_us"].as_u64().unwrap();
            (
                (s["rank"].as_i64().unwrap(), s["step"].as_u64().unwrap()),
                (
                    s["first"]["coll_local_sn"].as_u64().unwrap(),
                    s["last"]["coll_local_sn"].as_u64().unwrap(),
                    s["ops"].as_u64().unwrap(),
                    start,
                    start + s["duration_us"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// Structural facts every trace must show: tracks, nesting, args, well-formed flows.
fn assert_well_formed(f: &Value, ranks: usize) {
    assert_eq!(f["problem_count"], 0, "{}", f["problems"]);
    assert_eq!(f["threads"].as_array().unwrap().len(), ranks, "{f}");
    assert_eq!(f["threads_under_processes"], true);
    assert_eq!(f["ops_missing_args"], 0);
    assert_eq!(f["flows_bad"], 0, "a flow links fewer than 2 ranks");
}

#[test]
fn perfetto_trace_of_16_ranks_and_10_steps() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("trace-perfetto");
    let out = dir.path().join("run");
    testbed(
        &out,
        &[
            "--scenario",
            &scenario("megatron.toml"),
            "--ranks",
            "16",
            "--hosts",
            "4",
            "--steps",
            "14",
        ],
        &[],
    )
    .assert_ok();
    let o = out.to_str().unwrap();

    // --- Steps 2..11, every rank.
    let file = dir.path().join("steps.pftrace");
    let stdout = trace(&[o, "--steps", "2..11", "-o", file.to_str().unwrap()]);
    let (packets, op_slices, bytes, per_op) = summary_line(&stdout);
    assert_eq!(bytes, std::fs::metadata(&file).unwrap().len());
    let f = facts(&file);
    assert_well_formed(&f, RANKS as usize);
    assert_eq!(f["packets"], packets);
    assert_eq!(f["processes"].as_array().unwrap().len(), HOSTS);
    let per_rank = f["steps_per_rank"].as_object().unwrap();
    assert_eq!(per_rank.len(), RANKS as usize);
    for (r, steps) in per_rank {
        let want: Vec<u64> = (2..=11).collect();
        let got: Vec<u64> = serde_json::from_value(steps.clone()).unwrap();
        assert_eq!(got, want, "rank {r}");
    }
    // The megatron template labels phases: every step has some.
    assert!(f["phases"].as_u64().unwrap() >= 160, "{}", f["phases"]);

    // Op slices = the ops of those steps (steps --json), = the records in their lsn ranges.
    let steps = steps_json(&out, "2..11");
    assert_eq!(steps.len(), 160);
    let want_ops: u64 = steps.values().map(|s| s.2).sum();
    assert_eq!(f["ops"], want_ops);
    assert_eq!(op_slices, want_ops);
    let recs = ops_by_rank(&out);
    let mut seen: HashMap<Instance, BTreeSet<i64>> = HashMap::new();
    let mut n = 0;
    for ((rank, _), (lo, hi, _, _, _)) in &steps {
        for op in recs[rank].iter().filter(|o| (*lo..=*hi).contains(&o.0)) {
            n += 1;
            seen.entry(instance(op)).or_default().insert(*rank);
        }
    }
    assert_eq!(n, want_ops, "records in the steps' lsn ranges");
    // Flows: one per instance seen on two ranks or more.
    let matched = seen.values().filter(|r| r.len() >= 2).count();
    assert!(matched > 0);
    assert_eq!(f["flows"].as_u64().unwrap() as usize, matched);
    let linked: usize = seen
        .values()
        .filter(|r| r.len() >= 2)
        .map(|r| r.len())
        .sum();
    assert_eq!(f["flow_slices"].as_u64().unwrap() as usize, linked);
    eprintln!(
        "steps 2..11 x 16 ranks: {packets} packets, {op_slices} op slices, {bytes} bytes, {per_op:.1} bytes/op, {matched} flows"
    );
    assert!(per_op < 400.0, "{per_op} bytes per op");

    // The time index was built and saved; the next run takes it from the cache.
    assert!(out.join(".comminsight/time-index.json").exists());
    let again = trace(&[o, "--steps", "2..11", "-o", file.to_str().unwrap()]);
    assert!(again.contains("16 streams cached, 0 indexed"), "{again}");

    // --- A time window around step 5 on every rank, ranks 0-7 only.
    let s5: Vec<&StepRow> = steps
        .iter()
        .filter(|((_, s), _)| *s == 5)
        .map(|(_, v)| v)
        .collect();
    let t0 = s5.iter().map(|s| s.3).min().unwrap();
    let t1 = s5.iter().map(|s| s.4).max().unwrap();
    let file = dir.path().join("time.pftrace");
    let window = format!("{t0}..{t1}");
    let stdout = trace(&[
        o,
        "--time",
        &window,
        "--ranks",
        "0-7",
        "-o",
        file.to_str().unwrap(),
    ]);
    let (_, time_ops, _, _) = summary_line(&stdout);
    let f = facts(&file);
    assert_well_formed(&f, 8);
    let per_rank = f["steps_per_rank"].as_object().unwrap();
    let all = steps_json(&out, "0..13");
    for r in 0..8i64 {
        let got: Vec<u64> = serde_json::from_value(per_rank[&r.to_string()].clone()).unwrap();
        assert!(got.contains(&5), "rank {r}: {got:?}");
        // Exactly the rank's steps that overlap the window.
        let want: Vec<u64> = all
            .iter()
            .filter(|((rank, _), s)| *rank == r && s.3 <= t1 && s.4 >= t0)
            .map(|((_, step), _)| *step)
            .collect();
        assert_eq!(got, want, "rank {r}");
    }
    assert!(f["min_ts_us"].as_u64().unwrap() <= t1 && f["max_ts_us"].as_u64().unwrap() >= t0);
    assert!(time_ops > 0 && time_ops < op_slices, "{time_ops}");

    // --- A window with no step is an input error naming the job's steps.
    let o2 = agent(&[
        "trace",
        o,
        "--steps",
        "50..60",
        "-o",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o2.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o2.stderr);
    assert!(
        err.contains("selects no step") && err.contains("0..13"),
        "{err}"
    );
}

//! The `fsdp`, `ddp` and `decode` workload kinds end to end: real rank processes against the
//! libnccl stand-in and the plugin (results verified by the ranks), and `--synthetic`. What the
//! plugin recorded per completed step is exactly the plan's sequence of operations.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_wire::record::{Body, Record};
use comminsight_wire::Func;
use support::*;

/// `(role, func)` of one planned or recorded operation.
type Op = (String, Func);

fn func_of(name: &str) -> Func {
    match name {
        "all_reduce" => Func::ALL_REDUCE,
        "all_gather" => Func::ALL_GATHER,
        "reduce_scatter" => Func::REDUCE_SCATTER,
        "all_to_all" => Func::ALL_TO_ALL,
        other => panic!("unknown func {other}"),
    }
}

/// Per step, the planned operations of `rank` (`DIR/run/plan-<rank>.json`); a grouped p2p's
/// parts sorted, since their records may come in either order.
fn planned(out: &Path, rank: i32) -> Vec<Vec<Op>> {
    let p = out.join(format!("run/plan-{rank}.json"));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("plan file")).expect("plan JSON");
    let steps = plan["steps"].as_array().expect("plan steps");
    steps
        .iter()
        .map(|ops| {
            let mut out = Vec::new();
            for op in ops.as_array().unwrap() {
                let comm = op["comm"].as_str().unwrap_or_default().to_string();
                match op["op"].as_str().unwrap() {
                    "coll" => out.push((comm, func_of(op["func"].as_str().unwrap()))),
                    "p2p" => {
                        let mut parts: Vec<Op> = op["parts"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|x| {
                                let f = if x["send"] == true {
                                    Func::SEND
                                } else {
                                    Func::RECV
                                };
                                (comm.clone(), f)
                            })
                            .collect();
                        parts.sort_by_key(|(_, f)| f.0);
                        out.extend(parts);
                    }
                    _ => {}
                }
            }
            out
        })
        .collect()
}

/// Per completed step (truth's ranges), the recorded operations of `rank` in `coll_local_sn`
/// order, the role read from truth's comm of the record's hash; consecutive p2p records sorted
/// the way [`planned`] sorts a group.
fn recorded(
    truth: &serde_json::Value,
    recs: &BTreeMap<i32, Vec<Record>>,
    rank: i32,
) -> Vec<Vec<Op>> {
    let roles: BTreeMap<String, String> = truth["comms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["hash"].as_str().unwrap().to_string(),
                c["role"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut ops: Vec<(u64, Op, bool)> = recs[&rank]
        .iter()
        .filter_map(|r| match &r.body {
            Body::Coll(o) | Body::P2p(o) => {
                let role = roles[&format!("0x{:016x}", o.comm_hash)].clone();
                let p2p = matches!(r.body, Body::P2p(_));
                Some((o.coll_local_sn, (role, o.func), p2p))
            }
            _ => None,
        })
        .collect();
    ops.sort_by_key(|o| o.0);
    truth["steps"][rank.to_string()]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let (a, b) = (s[0].as_u64().unwrap(), s[1].as_u64().unwrap());
            let in_step: Vec<&(u64, Op, bool)> =
                ops.iter().filter(|o| (a..=b).contains(&o.0)).collect();
            let mut out: Vec<Op> = Vec::new();
            let mut i = 0;
            while i < in_step.len() {
                let mut j = i;
                while j < in_step.len() && in_step[j].2 {
                    j += 1;
                }
                if j > i {
                    let mut group: Vec<Op> = in_step[i..j].iter().map(|o| o.1.clone()).collect();
                    group.sort_by_key(|(_, f)| f.0);
                    out.extend(group);
                    i = j;
                } else {
                    out.push(in_step[i].1.clone());
                    i += 1;
                }
            }
            out
        })
        .collect()
}

/// Run `scenario` (a path) with real processes and check every rank: all steps completed,
/// results verified (a wrong result fails the run), records == plan per step.
fn run_kind(name: &str, scenario: &str, extra: &[&str], ranks: usize, steps: usize) {
    let _g = one_job_at_a_time();
    let out = Out::new(name);
    let mut args = vec!["--scenario", scenario, "--steps"];
    let steps_s = steps.to_string();
    args.push(&steps_s);
    args.extend_from_slice(extra);
    let (o, _) = testbed(out.path(), &args, &[]);
    assert_ok(&o);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!(
            "steps completed per rank: min {steps} max {steps}"
        )),
        "{stdout}"
    );
    let truth = out.truth();
    assert_eq!(truth["ranks"], ranks);
    let recs = records_by_rank(out.path());
    assert_eq!(recs.len(), ranks);
    for rank in 0..ranks as i32 {
        assert_steps_tile_records(&truth, &recs, rank);
        let plan = planned(out.path(), rank);
        let got = recorded(&truth, &recs, rank);
        assert_eq!(got.len(), steps, "rank {rank}: truth steps");
        for (s, ops) in got.iter().enumerate() {
            assert!(
                !ops.is_empty(),
                "{name} rank {rank} step {s}: no operations"
            );
            assert_eq!(
                ops, &plan[s],
                "{name} rank {rank} step {s}: recorded != planned"
            );
        }
    }
}

#[test]
fn fsdp_runs_verified_with_per_layer_gathers_in_the_records() {
    run_kind("fsdp", &scenario("fsdp"), &["--ranks", "8"], 8, 3);
}

#[test]
fn ddp_runs_verified_with_bucket_all_reduces_in_the_records() {
    run_kind("ddp", &scenario("ddp"), &["--ranks", "8"], 8, 3);
}

#[test]
fn decode_runs_verified_with_pipeline_transfers_in_the_records() {
    // tp=2 x pp=4 (8 ranks) of the shipped tp=4 x pp=4: decode has no dp to rescale.
    let out = Out::new("decode-scenario");
    std::fs::create_dir_all(out.path()).unwrap();
    let text = std::fs::read_to_string(scenario("decode"))
        .unwrap()
        .replace("tp = 4\n", "tp = 2\n");
    assert!(text.contains("tp = 2\n"));
    let scen = out.path().join("decode8.toml");
    std::fs::write(&scen, text).unwrap();
    run_kind("decode", scen.to_str().unwrap(), &[], 8, 3);
}

#[test]
fn synthetic_runs_of_every_kind_tile_the_truth_steps() {
    for (name, ranks) in [("fsdp", 256), ("ddp", 128), ("decode", 16)] {
        let out = Out::new(&format!("synthetic-{name}"));
        let o = std::process::Command::new(BIN)
            .args([
                "run",
                "--synthetic",
                "--scenario",
                &scenario(name),
                "--steps",
                "4",
            ])
            .args(["--ranks", &ranks.to_string(), "--hosts", "4"])
            .arg("--out")
            .arg(out.path())
            .env("COMMINSIGHT_LIB_DIR", "/nonexistent")
            .output()
            .unwrap();
        assert_ok(&o);
        let truth = out.truth();
        assert_eq!(truth["synthetic"], true);
        assert_eq!(truth["ranks"], ranks);
        let recs = records_by_rank(out.path());
        assert_eq!(recs.len(), ranks);
        for rank in [0, 5, ranks as i32 - 1] {
            assert_steps_tile_records(&truth, &recs, rank);
            let got = recorded(&truth, &recs, rank);
            assert_eq!(got.len(), 4, "{name} rank {rank}");
            let last = got[0].last().unwrap();
            let want = if name == "decode" {
                ("tp", Func::ALL_GATHER)
            } else {
                ("global", Func::ALL_REDUCE)
            };
            assert_eq!(
                (last.0.as_str(), last.1),
                want,
                "{name} rank {rank}: the step's last op"
            );
        }
    }
}

#[test]
fn a_kind_that_does_not_fit_the_ranks_is_a_usage_error() {
    let out = Out::new("kind-usage");
    let o = command(
        out.path(),
        &["--scenario", &scenario("decode"), "--ranks", "32"],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("kind = \"decode\"") && err.contains("dp = 1"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

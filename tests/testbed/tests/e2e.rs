//! End to end with real rank processes: the libnccl stand-in and the CommInsight plugin, staged by
//! `cargo xtask build` (or found through `COMMINSIGHT_LIB_DIR`). These tests fail, not skip, when
//! the libraries are missing.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use comminsight_wire::record::Body;
use comminsight_wire::Func;
use support::*;

#[test]
fn megatron_truth_matches_what_the_plugin_recorded() {
    let _g = one_job_at_a_time();
    let out = Out::new("megatron");
    let (o, _) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--ranks",
            "8",
            "--hosts",
            "2",
            "--steps",
            "4",
        ],
        &[],
    );
    assert_ok(&o);
    let truth = out.truth();
    assert_eq!(truth["ranks"], 8);
    assert_eq!(truth["hosts"], 2);
    assert_eq!(truth["culprit_ranks"], serde_json::json!([]));
    assert!(truth["nccl_version"].as_str().unwrap().starts_with("2."));
    let recs = records_by_rank(out.path());
    assert_eq!(recs.len(), 8, "one process directory per rank");
    // Every comm_init a rank recorded is a truth comm with that rank as a member.
    let comms = truth["comms"].as_array().unwrap();
    let roles: BTreeSet<&str> = comms.iter().map(|c| c["role"].as_str().unwrap()).collect();
    assert_eq!(roles, BTreeSet::from(["dp", "global", "pp", "tp"]));
    for (rank, rs) in &recs {
        let mut seen = 0;
        for r in rs {
            if let Body::CommInit(c) = &r.body {
                let hex = format!("0x{:016x}", c.comm_hash);
                let tc = comms
                    .iter()
                    .find(|t| t["hash"] == hex.as_str())
                    .unwrap_or_else(|| panic!("{hex} not in truth"));
                let members: Vec<i64> = tc["ranks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect();
                assert!(members.contains(&(*rank as i64)));
                assert_eq!(members.len() as u32, c.nranks);
                assert_eq!(tc["name"].as_str().unwrap(), c.comm_name.as_str_lossy());
                seen += 1;
            }
        }
        assert_eq!(seen, 4, "rank {rank}: tp, dp, pp and world comms");
        assert_eq!(
            truth["steps"][rank.to_string()].as_array().unwrap().len(),
            4
        );
        assert_steps_tile_records(&truth, &recs, *rank);
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("steps completed per rank: min 4 max 4"),
        "{stdout}"
    );
}

#[test]
fn moe_issues_all_to_all_on_ep_comms_and_split_unnamed_comms_work() {
    let _g = one_job_at_a_time();
    let out = Out::new("moe");
    let (o, _) = testbed(
        out.path(),
        &["--scenario", &scenario("moe"), "--steps", "2", "--json"],
        &[],
    );
    assert_ok(&o);
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json summary");
    assert_eq!(summary["ok"], true);
    assert_eq!(summary["steps_completed_min"], 2);
    let truth = out.truth();
    assert!(truth["comms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["role"] == "ep"));
    let recs = records_by_rank(out.path());
    let a2a = recs[&0]
        .iter()
        .filter(|r| matches!(&r.body, Body::Coll(o) if o.func == Func::ALL_TO_ALL))
        .count();
    assert!(
        a2a >= 2 * 4 * 2,
        "dispatch + combine per microbatch, forward and backward: {a2a}"
    );
    for r in 0..8 {
        assert_steps_tile_records(&truth, &recs, r);
    }

    // The same model with ncclCommSplit and no comm names.
    let text = std::fs::read_to_string(scenario("moe"))
        .unwrap()
        .replace("comm_init = \"config\"", "comm_init = \"split\"")
        .replace("named_comms = true", "named_comms = false");
    let out2 = Out::new("moe-split");
    std::fs::create_dir_all(out2.path()).unwrap();
    let scen = out2.path().join("moe-split.toml");
    std::fs::write(&scen, text).unwrap();
    let (o, _) = testbed(
        out2.path(),
        &["--scenario", scen.to_str().unwrap(), "--steps", "2"],
        &[],
    );
    assert_ok(&o);
    let recs = records_by_rank(out2.path());
    for r in &recs[&3] {
        if let Body::CommInit(c) = &r.body {
            assert!(c.comm_name.is_empty(), "unnamed comms: {c:?}");
        }
    }
}

#[test]
fn lost_events_are_reflected_in_the_truth_boundaries() {
    let _g = one_job_at_a_time();
    let out = Out::new("loss");
    let (o, _) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--steps",
            "4",
            "--fault",
            "loss:pct=25",
            "--seed",
            "3",
        ],
        &[],
    );
    assert_ok(&o);
    let truth = out.truth();
    let recs = records_by_rank(out.path());
    let full_step = 42; // ops per step per rank in megatron.toml without loss
    let mut total = 0;
    for r in 0..8 {
        assert_steps_tile_records(&truth, &recs, r);
        total += local_sns(&recs[&r]).len();
    }
    assert!(total < 8 * 4 * full_step, "{total} records: some were lost");
    assert!(
        total > 8 * 4 * full_step / 2,
        "{total} records: about a quarter lost"
    );
}

#[test]
fn a_hang_ends_at_the_timeout_with_partial_steps_and_overdue_records() {
    let _g = one_job_at_a_time();
    let out = Out::new("hang");
    let (o, wall) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--hosts",
            "2",
            "--steps",
            "6",
            "--fault",
            "hang:rank=3,step=2",
            "--timeout",
            "6",
        ],
        &[("COMMINSIGHT_OVERDUE_MS", "1000")],
    );
    assert_ok(&o);
    assert!(wall < Duration::from_secs(6 + 5), "{wall:?}");
    let truth = out.truth();
    assert_eq!(truth["culprit_ranks"], serde_json::json!([3]));
    assert_eq!(
        truth["faults"][0],
        serde_json::json!({"kind": "hang", "rank": 3, "step": 2})
    );
    let partial: Vec<(u64, u64)> = truth["partial_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["rank"].as_u64().unwrap(), p["step"].as_u64().unwrap()))
        .collect();
    assert!(partial.contains(&(3, 2)), "{partial:?}");
    assert_eq!(
        truth["rank_info"]["3"]["status"], "terminated",
        "SIGTERM reached Python"
    );
    let recs = records_by_rank(out.path());
    let overdue_ranks: BTreeSet<i32> = recs
        .iter()
        .filter(|(_, rs)| rs.iter().any(|r| matches!(r.body, Body::Overdue(_))))
        .map(|(r, _)| *r)
        .collect();
    assert!(
        overdue_ranks.len() >= 2,
        "peers report overdue ops: {overdue_ranks:?}"
    );
    for r in 0..8 {
        assert_eq!(truth["steps"][r.to_string()].as_array().unwrap().len(), 2);
        assert_steps_tile_records(&truth, &recs, r);
    }
}

#[test]
fn a_killed_rank_keeps_its_finished_steps() {
    let _g = one_job_at_a_time();
    let out = Out::new("kill");
    let (o, _) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--steps",
            "5",
            "--fault",
            "kill:rank=5,step=2",
            "--timeout",
            "5",
        ],
        &[],
    );
    assert_ok(&o);
    let truth = out.truth();
    assert_eq!(truth["rank_info"]["5"]["status"], "killed");
    assert_eq!(truth["steps"]["5"].as_array().unwrap().len(), 2);
    assert_eq!(truth["culprit_ranks"], serde_json::json!([5]));
}

#[test]
fn hung_ranks_show_their_fault_in_real_python_stacks() {
    let _g = one_job_at_a_time();
    for (spec, frame) in [
        ("pyhang:rank=2,step=1", "_stuck_in_data_loader"),
        ("hang:rank=2,step=1", "_hang_in_native_compute"),
    ] {
        let out = Out::new("stacks");
        let run = Running::start(
            out.path(),
            &[
                "--scenario",
                &scenario("megatron"),
                "--steps",
                "3",
                "--fault",
                spec,
                "--timeout",
                "20",
            ],
            &[],
        );
        let rank_file = out.path().join("run/rank-2.json");
        let pid: i32 = wait_for("rank 2 to reach its fault", Duration::from_secs(15), || {
            let text = std::fs::read_to_string(&rank_file).ok()?;
            if !text.contains("\"event\":\"fault\"") {
                return None;
            }
            let start = text.lines().find(|l| l.contains("\"event\":\"start\""))?;
            let v: serde_json::Value = serde_json::from_str(start).ok()?;
            v["pid"].as_i64().map(|p| p as i32)
        });
        let log = out.path().join("ranks/rank-2.log");
        let dump = wait_for("a Python stack dump", Duration::from_secs(10), || {
            // `kill -USR1 <pid>`: the driver's faulthandler dumps every thread's stack.
            let _ = std::process::Command::new("kill")
                .args(["-USR1", &pid.to_string()])
                .status();
            std::thread::sleep(Duration::from_millis(200));
            let text = std::fs::read_to_string(&log).ok()?;
            text.contains(frame).then_some(text)
        });
        assert!(
            dump.contains("run_step"),
            "{spec}: stack goes through the driver: {dump}"
        );
        drop(run);
    }
}

#[test]
fn a_mismatched_collective_hangs_the_job_and_names_the_culprit() {
    let _g = one_job_at_a_time();
    let out = Out::new("mismatch");
    let (o, _) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--steps",
            "3",
            "--fault",
            "mismatch:rank=1,step=1",
            "--timeout",
            "5",
        ],
        &[],
    );
    assert_ok(&o);
    let truth = out.truth();
    assert_eq!(truth["culprit_ranks"], serde_json::json!([1]));
    assert_eq!(truth["steps"]["0"].as_array().unwrap().len(), 1);
}

#[test]
fn a_slow_link_slows_the_job_and_its_namespaces_are_removed() {
    let _g = one_job_at_a_time();
    let args = [
        "--scenario",
        &scenario("megatron"),
        "--hosts",
        "2",
        "--steps",
        "4",
    ];
    let base = Out::new("link-base");
    let (o, base_wall) = testbed(base.path(), &args, &[]);
    assert_ok(&o);
    let out = Out::new("slowlink");
    let mut a = args.to_vec();
    a.extend(["--fault", "slowlink:a=1,b=5,rate=10mbit"]);
    let t0 = std::time::Instant::now();
    let run = Running::start(out.path(), &a, &[]);
    let runner_pid = run.0.id();
    assert!(run.wait().success());
    let slow_wall = t0.elapsed();
    let truth = out.truth();
    assert_eq!(truth["culprit_ranks"], serde_json::json!([1, 5]));
    assert_eq!(truth["steps"]["5"].as_array().unwrap().len(), 4);
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let ns = String::from_utf8_lossy(&ns.stdout);
    assert!(
        !ns.contains(&format!("cit-{runner_pid}-")),
        "namespaces left behind: {ns}"
    );
    assert!(
        slow_wall > base_wall + Duration::from_millis(1500),
        "10mbit link: {slow_wall:?} vs {base_wall:?}"
    );
}

#[test]
fn input_errors_exit_2_with_one_clear_line() {
    let out = Out::new("inputs");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(BIN);
        c.arg("run").arg("--out").arg(out.path()).args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = run(
        &["--scenario", &scenario("megatron")],
        &[("COMMINSIGHT_LIB_DIR", "/nonexistent")],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("libnccl.so.2 not found in /nonexistent: run `cargo xtask build`"),
        "{err}"
    );
    let o = run(
        &[
            "--scenario",
            &scenario("megatron"),
            "--fault",
            "hang:rank=1",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad fault spec `hang:rank=1`"));
    let o = run(
        &[
            "--scenario",
            &scenario("megatron"),
            "--ranks",
            "6",
            "--synthetic",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("multiple of tp*cp*pp = 4"));
    let o = run(
        &[
            "--scenario",
            &scenario("megatron"),
            "--hosts",
            "3",
            "--synthetic",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let o = run(
        &[
            "--scenario",
            &scenario("megatron"),
            "--fault",
            "kill:rank=99,step=0",
            "--synthetic",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("only 8 ranks"));
}

#[test]
fn synthetic_runs_need_no_libraries() {
    let out = Out::new("synthetic");
    let o = std::process::Command::new(BIN)
        .args([
            "run",
            "--synthetic",
            "--scenario",
            &scenario("moe"),
            "--ranks",
            "64",
            "--hosts",
            "8",
            "--steps",
            "3",
        ])
        .arg("--out")
        .arg(out.path())
        .env("COMMINSIGHT_LIB_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert_ok(&o);
    let truth = out.truth();
    assert_eq!(truth["synthetic"], true);
    assert_eq!(truth["ranks"], 64);
    let recs = records_by_rank(out.path());
    assert_eq!(recs.len(), 64);
    for r in [0, 17, 63] {
        assert_steps_tile_records(&truth, &recs, r);
    }
}

#[test]
fn a_rank_failing_without_a_fault_fails_the_run_quickly() {
    let _g = one_job_at_a_time();
    let out = Out::new("unexpected");
    let (o, wall) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--steps",
            "2",
            "--python",
            "false",
            "--timeout",
            "60",
        ],
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(wall < Duration::from_secs(20), "{wall:?}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("FAILED ranks"), "{stdout}");
    assert_eq!(out.truth()["rank_info"]["0"]["status"], "exit 1");
}

/// Step wall times of `rank` (truth's `step_times_ns`), in ms.
fn step_ms(out: &Out, rank: usize) -> Vec<f64> {
    out.truth()["step_times_ns"][rank.to_string()]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t[1].as_u64().unwrap() - t[0].as_u64().unwrap()) as f64 / 1e6)
        .collect()
}

#[test]
fn a_slow_rank_stretches_the_steps_it_is_slow_in() {
    let _g = one_job_at_a_time();
    let out = Out::new("slow");
    let (o, _) = testbed(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--steps",
            "4",
            "--fault",
            "slow:rank=5,ms=250,steps=2..2",
        ],
        &[],
    );
    assert_ok(&o);
    assert_eq!(out.truth()["culprit_ranks"], serde_json::json!([5]));
    // Ranks' hosts run ahead of their streams, so part of the 250 ms overlaps with waiting that
    // happened anyway; the step still grows clearly, on the slow rank and on its peers.
    for (r, extra) in [(5, 120.0), (0, 120.0)] {
        let ms = step_ms(&out, r);
        assert!(
            ms[2] > ms[1] + extra && ms[2] > ms[3] + extra,
            "rank {r}: step times {ms:?}"
        );
    }
}

#[test]
fn a_stopped_runner_ends_its_ranks_and_removes_its_namespaces() {
    let _g = one_job_at_a_time();
    let out = Out::new("stopped");
    let run = Running::start(
        out.path(),
        &[
            "--scenario",
            &scenario("megatron"),
            "--hosts",
            "2",
            "--netns",
            "--steps",
            "4",
            "--fault",
            "hang:rank=1,step=1",
            "--timeout",
            "60",
        ],
        &[],
    );
    let pid = run.0.id();
    let rank_file = out.path().join("run/rank-1.json");
    wait_for("rank 1 to hang", Duration::from_secs(20), || {
        std::fs::read_to_string(&rank_file)
            .ok()?
            .contains("\"event\":\"fault\"")
            .then_some(())
    });
    // Rank 0 ends step 0 after rank 1 entered step 1 (its last compute): on a loaded machine it
    // may not have yet, and the truth of a stopped run holds the steps that ended before the stop.
    let rank0 = out.path().join("run/rank-0.json");
    wait_for("rank 0 to end step 0", Duration::from_secs(20), || {
        std::fs::read_to_string(&rank0)
            .ok()?
            .contains("\"event\":\"step_end\",\"step\":0")
            .then_some(())
    });
    let t0 = std::time::Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = run.wait();
    assert_eq!(
        status.code(),
        Some(1),
        "an interrupted run is not a success"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ns.stdout).contains(&format!("cit-{pid}-")));
    let truth = out.truth();
    assert_eq!(truth["steps"]["0"].as_array().unwrap().len(), 1);
}

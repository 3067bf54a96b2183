//! Issue 16 Deliver 7: a hang is not a straggler. The test bed's megatron job (8 ranks, 2
//! hosts, simulated) hangs at rank 3, step 4; the other ranks' step-4 operations are written flagged
//! incomplete at exit. Those operations must not close step 4 as complete (it used to be
//! `coverage_complete` with duration 0 on the ranks whose whole step was enqueued), and the
//! straggler analysis, offline and in the daemon, leaves the cut step out and names no rank.

use std::time::Duration;

use comminsight_tests::*;
use serde_json::Value;

const HANG_STEP: u64 = 4;

fn json(args: &[&str]) -> Value {
    let o = agent(args);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: {e} (exit {}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Ranks a straggler report names: each rank's index (its mean over its complete analysed
/// steps, every step of the report), recomputed from the steps, and the report's own, over the
/// report's threshold.
fn named(report: &Value) -> Vec<(i64, f64)> {
    let threshold = report["threshold"].as_f64().expect("threshold");
    let mut sums: std::collections::BTreeMap<i64, (f64, u32)> = Default::default();
    for s in report["steps"].as_array().expect("steps") {
        for r in s["ranks"].as_array().expect("step ranks") {
            if r["coverage_complete"] == true {
                let e = sums.entry(r["rank"].as_i64().unwrap()).or_default();
                e.0 += r["index"].as_f64().unwrap();
                e.1 += 1;
            }
        }
    }
    let mut over: Vec<(i64, f64)> = sums
        .into_iter()
        .map(|(r, (sum, n))| (r, sum / f64::from(n)))
        .filter(|(_, mean)| *mean > threshold)
        .collect();
    for r in report["ranks"].as_array().expect("ranks") {
        let index = r["index"].as_f64().expect("rank index");
        if index > threshold || r["class"] != "none" {
            over.push((r["rank"].as_i64().unwrap(), index));
        }
    }
    over
}

#[test]
fn a_hang_cuts_its_step_and_names_no_straggler() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("hang-straggler");
    let job = out.path().join("job");
    testbed(
        &job,
        &[
            "--scenario",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/megatron.toml"),
            "--ranks",
            "8",
            "--hosts",
            "2",
            "--steps",
            "8",
            "--fault",
            &format!("hang:rank=3,step={HANG_STEP}"),
            // Simulated, so that the ranks' timing is the scenario's: 8 real rank processes on
            // 2 shared cores (CI) are slowed at random by the scheduler, and a rank slowed so is
            // rightly named a straggler. The records are those of a real hang: the hung
            // rank's peers end with their step-4 operations flagged incomplete.
            "--synthetic",
        ],
        &[],
    )
    .assert_ok();
    let dir = job.to_str().unwrap();

    // Steps: every rank's step 4 (and anything after) is not complete; no complete step is
    // empty in time.
    let steps = json(&["steps", dir, "--json"]);
    let steps = steps["steps"].as_array().expect("steps");
    let cut: Vec<&Value> = steps
        .iter()
        .filter(|s| s["step"].as_u64() >= Some(HANG_STEP))
        .collect();
    assert!(cut.len() >= 3, "the ranks' cut steps are emitted: {cut:?}");
    for s in &cut {
        assert_eq!(s["coverage_complete"], false, "a step cut by the hang: {s}");
    }
    for s in steps.iter().filter(|s| s["coverage_complete"] == true) {
        assert!(
            s["duration_us"].as_u64() > Some(0),
            "complete and empty: {s}"
        );
    }
    assert!(
        steps
            .iter()
            .any(|s| s["coverage_complete"] == true && s["step"].as_u64() < Some(HANG_STEP)),
        "the steps before the hang are complete"
    );

    // Offline straggler: the cut step is left out and no rank is named.
    let report = json(&["straggler", dir, "--json"]);
    let analysed: Vec<u64> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    for r in report["ranks"].as_array().unwrap() {
        assert!(
            r["complete_steps"].as_u64() < Some(HANG_STEP + 1),
            "a cut step counted as complete: {r}"
        );
    }
    assert!(
        !analysed.contains(&HANG_STEP),
        "step {HANG_STEP} analysed: {analysed:?}"
    );
    // The warm-up (`[straggler] warmup_steps`, default 1) is left out too.
    assert!(
        !analysed.contains(&0),
        "the warm-up step analysed: {analysed:?}"
    );
    assert!(
        !analysed.is_empty(),
        "the steps before the hang are analysed"
    );
    assert_eq!(
        named(&report),
        vec![],
        "straggler names a rank in a hang run"
    );

    // The daemon over the same segments: no straggler announced, the live result agrees.
    let state = out.path().join("state");
    let config = out.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_enabled = false\nsegment_dirs = [{logs:?}]\nscan_interval_ms = 50\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = false\n\
             [steps]\nstream_end_s = 1\n[straggler]\nsettle_s = 2\n",
            logs = job.join("inspector_logs"),
        ),
    )
    .unwrap();
    let log = out.path().join("agent.log");
    let _daemon = start_agent(&config, &log);
    let result = state.join("results/straggler/megatron.json");
    let live = || -> Option<Value> { serde_json::from_slice(&std::fs::read(&result).ok()?).ok() };
    let ok = wait_until(Duration::from_secs(60), || {
        live().is_some_and(|r| {
            r["steps"]
                .as_array()
                .is_some_and(|s| s.len() >= analysed.len())
        })
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ok, "no live straggler result; log:\n{text}");
    // Past the settle time of the last (cut) step.
    std::thread::sleep(Duration::from_secs(4));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text
            .lines()
            .any(|l| l.contains("straggler: rank") && l.contains(&format!("(step {HANG_STEP}:"))),
        "the daemon announced a straggler at the hang step:\n{text}"
    );
    assert_eq!(named(&live().unwrap()), vec![], "live straggler result");
}

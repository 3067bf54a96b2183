//! With no agent attached, a job's wall time with the plugin is within noise of the same job
//! with profiling disabled (`NCCL_PROFILER_PLUGIN=none`). Rounds alternate so drift hits both.

use comminsight_tests::*;

#[test]
fn plugin_without_agent_costs_no_measurable_wall_time() {
    let _g = one_job_at_a_time();
    let scenario = format!(
        "{}/../../tests/scenarios/megatron.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let args = [
        "--scenario",
        scenario.as_str(),
        "--ranks",
        "8",
        "--hosts",
        "2",
        "--steps",
        "20",
    ];
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let out = OutDir::new(&format!("overhead-off-{round}"));
        off.push(
            testbed(out.path(), &args, &[("NCCL_PROFILER_PLUGIN", "none")])
                .assert_ok()
                .wall,
        );
        let out = OutDir::new(&format!("overhead-on-{round}"));
        on.push(testbed(out.path(), &args, &[]).assert_ok().wall);
    }
    on.sort();
    off.sort();
    let (on_med, off_med) = (on[1].as_secs_f64(), off[1].as_secs_f64());
    eprintln!("wall time median: plugin {on_med:.2} s, disabled {off_med:.2} s (runs on {on:?}, off {off:?})");
    // "Within noise": the plugin run may not be slower than the spread of the disabled runs allows.
    let noise = (off[2].as_secs_f64() - off[0].as_secs_f64()).max(0.05 * off_med);
    assert!(
        on_med <= off_med + 2.0 * noise + 0.25,
        "plugin {on_med:.2} s vs disabled {off_med:.2} s (noise {noise:.2} s)"
    );
}

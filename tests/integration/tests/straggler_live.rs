//! Issue 7, live: the daemon (no master: it computes the index itself) follows a DDP job with a slow
//! rank and exports the index as the OTLP gauge `comminsight.straggler.index` per rank, announces
//! the rank once it is over the threshold in m of n steps (an OTLP log record, received and
//! decoded by a Python receiver with the official opentelemetry-proto classes), and writes
//! `results/straggler/<job>.json`; the offline `straggler` over the same segments names the same
//! rank first.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use comminsight_tests::*;
use serde_json::Value;

const SLOW: i64 = 5;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every decoded request the receiver wrote (one JSON object per line).
fn received(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn attr<'a>(attrs: &'a Value, key: &str) -> Option<&'a Value> {
    attrs
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

/// `(rank, value)` of every `comminsight.straggler.index` data point received.
fn gauge_points(reqs: &[Value]) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    for r in reqs.iter().filter(|r| r["signal"] == "metrics") {
        for rm in r["request"]["resourceMetrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
                for m in sm["metrics"].as_array().into_iter().flatten() {
                    if m["name"] != "comminsight.straggler.index" {
                        continue;
                    }
                    for p in m["gauge"]["dataPoints"].as_array().into_iter().flatten() {
                        let rank = attr(&p["attributes"], "comminsight.rank")
                            .and_then(|v| v["intValue"].as_str()?.parse().ok());
                        if let (Some(rank), Some(v)) = (rank, p["asDouble"].as_f64()) {
                            out.push((rank, v));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The straggler log records received: their attributes.
fn straggler_logs(reqs: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for r in reqs.iter().filter(|r| r["signal"] == "logs") {
        for rl in r["request"]["resourceLogs"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                for lr in sl["logRecords"].as_array().into_iter().flatten() {
                    let attrs = &lr["attributes"];
                    if lr["eventName"] == "comminsight.straggler.alert" {
                        out.push(attrs.clone());
                    }
                }
            }
        }
    }
    out
}

#[test]
fn the_daemon_exports_the_index_and_announces_the_slow_rank() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("straggler-live");
    let job = out.path().join("job");
    testbed(
        &job,
        &[
            "--scenario",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/ddp.toml"),
            "--ranks",
            "16",
            "--hosts",
            "2",
            "--steps",
            "24",
            "--synthetic",
            "--fault",
            &format!("slow:rank={SLOW},ms=40"),
        ],
        &[],
    )
    .assert_ok();

    let port = free_port();
    let got = out.path().join("otlp.jsonl");
    let _receiver = comminsight_tests::backends::otlp_receiver(&got, port);

    let state = out.path().join("state");
    let config = out.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_enabled = false\nsegment_dirs = [{logs:?}]\nscan_interval_ms = 50\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = false\n\
             [otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{port}\"\nexport_interval_ms = 500\n\
             [steps]\nstream_end_s = 1\n[straggler]\nsettle_s = 2\n",
            logs = job.join("inspector_logs"),
        ),
    )
    .unwrap();
    let log = out.path().join("agent.log");
    let _daemon = start_agent(&config, &log);

    let result = state.join("results/straggler/ddp.json");
    let report = || -> Option<Value> { serde_json::from_slice(&std::fs::read(&result).ok()?).ok() };
    // Every step but the last is analysed as soon as the next one is reported, the last one
    // after settle_s; the report keeps the last report_steps (20).
    let ok = wait_until(Duration::from_secs(90), || {
        report().is_some_and(|r| r["steps"].as_array().is_some_and(|s| s.len() >= 20))
            && straggler_logs(&received(&got)).iter().any(|a| {
                attr(a, "comminsight.rank").and_then(|v| v["intValue"].as_str())
                    == Some(&SLOW.to_string())
            })
            && !gauge_points(&received(&got)).is_empty()
    });
    let agent_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        ok,
        "no complete live result: report {:?}\nagent log:\n{agent_log}",
        report().map(|r| r["ranks"][0].clone())
    );
    let live = report().unwrap();
    assert_eq!(live["ranks"][0]["rank"], SLOW, "{}", live["ranks"][0]);
    assert_eq!(live["ranks"][0]["class"], "compute-slow");

    // The gauge: the slow rank's points are the highest of every collection.
    let points = gauge_points(&received(&got));
    let slow_max = points
        .iter()
        .filter(|(r, _)| *r == SLOW)
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let others_max = points
        .iter()
        .filter(|(r, _)| *r != SLOW)
        .map(|p| p.1)
        .fold(0.0, f64::max);
    assert!(
        // The gauge is a ratio (unit 1); the report's threshold is in percent.
        slow_max * 100.0 > live["threshold"].as_f64().unwrap() && slow_max > others_max,
        "slow rank {slow_max}, others {others_max}"
    );
    // One announcement of the slow rank (it stays over the threshold), none of another rank.
    let logs = straggler_logs(&received(&got));
    let ranks: Vec<String> = logs
        .iter()
        .filter_map(|a| {
            Some(
                attr(a, "comminsight.rank")?["intValue"]
                    .as_str()?
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(ranks, vec![SLOW.to_string()], "{logs:?}");
    assert!(
        agent_log.contains(&format!("straggler: rank {SLOW}")),
        "{agent_log}"
    );

    // Offline over the same segments: the same first rank.
    let o = agent(&["straggler", job.to_str().unwrap(), "--json"]);
    let offline: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler --json: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(offline["ranks"][0]["rank"], SLOW);
}

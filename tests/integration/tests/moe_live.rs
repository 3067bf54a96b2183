//! Issue 21, live: the job master assembles MoE EP windows across hosts. Two real daemons on
//! this host: the master follows host `ha` (EP ranks 0-7), a member follows host `hb` (ranks
//! 8-15) and pushes its rows over the authenticated gRPC link. Window 1 has a slow sender (rank
//! 2), window 2 a slow path from rank 3 (on `ha`) to rank 12 (on `hb`), window 3 never gets rank
//! 12's row. The master's `results/moe/<job>.jsonl` names each, the OTLP receiver (the official
//! opentelemetry-proto classes) gets a log record per finding and the ratio gauges, and the
//! offline `moe` over both hosts' segments, and over the master's results file, give the same
//! events.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use comminsight_tests::*;
use comminsight_wire::moe::{ep_phase, ep_source, EpStats};
use comminsight_wire::record::{Body, ProcStart, Record, SegmentHeader};
use comminsight_wire::RECORD_SIZE;
use serde_json::Value;

const JOB: &str = "moelive";
const N: usize = 16;
const T0: u64 = 1_764_900_000_000_000_000;
const WINDOW_NS: u64 = 20_000_000_000;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// EP rank `rank`'s row of window `w` (µs-like units; everybody waits ~1000 on everybody).
fn row(rank: usize, w: u64) -> Vec<u64> {
    (0..N)
        .map(|j| {
            let mut v = 1_000 + ((3 * rank + 5 * j) % 11) as u64 * 10;
            if w == 1 && j == 2 && rank != 2 {
                v += 20_000; // everybody waits on rank 2
            }
            if w == 2 && rank == 12 && j == 3 {
                // Only rank 12 waits on rank 3: a point above 5x the mean cell, its row and
                // column below 3x (a severer one would flag both instead: spec §1.9).
                v += 20_000;
            }
            v
        })
        .collect()
}

/// Rank `rank`'s segment in `<root>/<JOB>/<host>/<pid>`: its `proc_start` and one dispatch row
/// per window in `windows`.
fn write_rank(root: &Path, host: &str, rank: usize, windows: &[u64]) {
    let pid = 1000 + rank as u32;
    let dir = root.join(JOB).join(host).join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut bodies = vec![
        Body::Segment(SegmentHeader {
            format: 1,
            record_size: RECORD_SIZE as u32,
            segment_index: 0,
            pid,
            source: 0,
            created_real_ns: T0,
            created_mono_ns: 1_000,
        }),
        Body::ProcStart(ProcStart {
            pid,
            rank: rank as i32,
            local_rank: (rank % 8) as i32,
            world_size: N as i32,
            mono_ns: 1_000,
            real_ns: T0,
            abi_version: 5,
            host: host.into(),
            job: JOB.into(),
        }),
    ];
    for &w in windows {
        let head = EpStats {
            ep_group_id: 0xe9,
            instance: [0x5a; 16],
            window_seq: w,
            t_start_ns: T0 + w * WINDOW_NS,
            t_end_ns: T0 + (w + 1) * WINDOW_NS,
            steps: 100,
            rank: rank as u16,
            phase: ep_phase::DISPATCH,
            source: ep_source::MC2,
            ..EpStats::default()
        };
        bodies.extend(
            EpStats::split(&head, &row(rank, w))
                .into_iter()
                .map(Body::EpStats),
        );
    }
    let bytes = Record::encode_numbered(bodies);
    std::fs::write(dir.join("seg-000000.cis"), bytes).unwrap();
}

/// A daemon config in `out/<name>` following `out/<name>/logs`, with `extra` sections.
fn conf(out: &Path, name: &str, extra: &str) -> (PathBuf, PathBuf) {
    let dir = out.join(name);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[agent]\nstate_dir = \"{d}/state\"\nhost_name = \"{name}\"\npoll_interval_ms = 20\n\
             checkpoint_interval_ms = 200\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{d}/logs\"]\n\
             scan_interval_ms = 50\n[archive]\nenabled = false\n[clock]\nsync_interval_s = 1\n\
             [moe]\nassemble_timeout_s = 3\n{extra}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    (dir, path)
}

/// The `comminsight.moe.window` log records received, and every `comminsight.moe.ep.cell_ratio`
/// point.
fn received(path: &Path) -> (Vec<Value>, Vec<Value>) {
    let (mut logs, mut points) = (Vec::new(), Vec::new());
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for r in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let req = &r["request"];
        for rl in req["resourceLogs"].as_array().into_iter().flatten() {
            for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                for lr in sl["logRecords"].as_array().into_iter().flatten() {
                    if lr["eventName"] == "comminsight.moe.window" {
                        logs.push(lr.clone());
                    }
                }
            }
        }
        for rm in req["resourceMetrics"].as_array().into_iter().flatten() {
            for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
                for m in sm["metrics"].as_array().into_iter().flatten() {
                    if m["name"] == "comminsight.moe.ep.cell_ratio" {
                        points.extend(
                            m["gauge"]["dataPoints"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .cloned(),
                        );
                    }
                }
            }
        }
    }
    (logs, points)
}

fn attr<'a>(attrs: &'a Value, key: &str) -> Option<&'a Value> {
    attrs
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

/// The findings of each window of a `{"job", "event"}` list, as `(window, kind, ranks)`.
fn findings(events: &[Value]) -> Vec<(u64, String, Vec<u64>)> {
    let mut out = Vec::new();
    for e in events {
        let e = &e["event"];
        let w = e["window_seq"].as_u64().unwrap();
        for f in e["findings"].as_array().into_iter().flatten() {
            let ranks = ["rank", "peer", "waiter"]
                .iter()
                .filter_map(|k| f[*k].as_u64())
                .collect();
            out.push((w, f["kind"].as_str().unwrap().to_string(), ranks));
        }
        if let Some(m) = e["incomplete_window"]["missing_rows"].as_array() {
            let ranks = m.iter().filter_map(Value::as_u64).collect();
            out.push((w, "incomplete_window".into(), ranks));
        }
    }
    out.sort();
    out
}

#[test]
fn the_master_assembles_ep_windows_across_hosts() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("moe-live");
    std::fs::create_dir_all(out.path()).unwrap();
    let token = out.path().join("token");
    std::fs::write(&token, "moe-live-secret\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (otlp_port, link_port) = (free_port(), free_port());
    let got = out.path().join("otlp.jsonl");
    let _receiver = comminsight_tests::backends::otlp_receiver(&got, otlp_port);
    let (mdir, mconf) = conf(
        out.path(),
        "ha",
        &format!(
            "[master]\nlisten = \"127.0.0.1:{link_port}\"\ntoken_file = {token:?}\n\
             [otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{otlp_port}\"\nexport_interval_ms = 500\n"
        ),
    );
    let (bdir, bconf) = conf(
        out.path(),
        "hb",
        &format!("[master]\nlisten = \"\"\naddress = \"127.0.0.1:{link_port}\"\ntoken_file = {token:?}\n"),
    );
    for rank in 0..N {
        let (dir, host) = if rank < 8 {
            (&mdir, "ha")
        } else {
            (&bdir, "hb")
        };
        let windows: &[u64] = if rank == 12 {
            &[0, 1, 2]
        } else {
            &[0, 1, 2, 3]
        };
        write_rank(&dir.join("logs"), host, rank, windows);
    }
    let (mlog, blog) = (out.path().join("ha.log"), out.path().join("hb.log"));
    let _master = start_agent(&mconf, &mlog);
    let _member = start_agent(&bconf, &blog);

    let results = mdir.join(format!("state/results/moe/{JOB}.jsonl"));
    let events = || -> Vec<Value> {
        std::fs::read_to_string(&results)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let ok = wait_until(Duration::from_secs(60), || {
        events().len() >= 4 && received(&got).0.len() >= 3 && !received(&got).1.is_empty()
    });
    assert!(
        ok,
        "no complete live result: {:?}\nmaster log:\n{}\nmember log:\n{}",
        events(),
        std::fs::read_to_string(&mlog).unwrap_or_default(),
        std::fs::read_to_string(&blog).unwrap_or_default()
    );
    let live = findings(&events());
    assert_eq!(
        live,
        vec![
            (1, "sender_slow".to_string(), vec![2]),
            (2, "path_slow".to_string(), vec![3, 12]),
            (3, "incomplete_window".to_string(), vec![12]),
        ],
        "{:#?}",
        events()
    );

    // One log record per window with a finding; the path names both hosts' ranks.
    let (logs, points) = received(&got);
    let paths: Vec<&Value> = logs
        .iter()
        .filter_map(|l| attr(&l["attributes"], "comminsight.moe.path_slow"))
        .filter(|v| v["stringValue"] == "3->12")
        .collect();
    assert_eq!(paths.len(), 1, "{logs:#?}");
    // The matrix gauge of the latest whole window (2): the cell rank 12 waited on rank 3.
    let cell = |waiter: &str, peer: &str| {
        points.iter().rev().find_map(|p| {
            let a = &p["attributes"];
            (attr(a, "comminsight.moe.waiter")?["intValue"] == waiter
                && attr(a, "comminsight.moe.peer")?["intValue"] == peer)
                .then(|| p["asDouble"].as_f64())
                .flatten()
        })
    };
    let (slow, other) = (cell("12", "3").unwrap(), cell("11", "3").unwrap());
    assert!(slow > 5.0 && other < 1.5, "{slow} {other}");
    // The DeepXTrace log of the master.
    let log = std::fs::read_to_string(mdir.join(format!("state/results/moe/{JOB}.deepxtrace.log")))
        .unwrap();
    assert!(log.contains("EPSize: 16"), "{log}");

    // Offline over both hosts' segments: the same findings.
    let all = out.path().join("all");
    for d in [&mdir, &bdir] {
        for e in std::fs::read_dir(d.join("logs").join(JOB)).unwrap() {
            let e = e.unwrap();
            let to = all.join(JOB).join(e.file_name());
            std::fs::create_dir_all(&to).unwrap();
            for p in std::fs::read_dir(e.path()).unwrap() {
                let p = p.unwrap();
                let dst = to.join(p.file_name());
                std::fs::create_dir_all(&dst).unwrap();
                for f in std::fs::read_dir(p.path()).unwrap() {
                    let f = f.unwrap();
                    std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
                }
            }
        }
    }
    let o = agent(&["moe", all.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1), "a finding exits 1");
    let offline: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(findings(offline["windows"].as_array().unwrap()), live);
    // `hang` names the rank that stopped reporting as MoE EP evidence, by its global rank.
    let o = agent(&["hang", all.to_str().unwrap(), "--json"]);
    let hang: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ep = &hang["ep_incomplete"];
    assert_eq!(ep.as_array().map(Vec::len), Some(1), "{hang:#}");
    assert_eq!(
        (
            &ep[0]["window_seq"],
            &ep[0]["missing_ep_ranks"],
            &ep[0]["missing_ranks"]
        ),
        (
            &serde_json::json!(3),
            &serde_json::json!([12]),
            &serde_json::json!([12])
        )
    );
    let o = agent(&["hang", all.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("never got a row from EP rank(s) 12 (global rank(s) 12)"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // The master's results file read back by `moe FILE`: the same, exit 1.
    let o = agent(&["moe", results.to_str().unwrap(), "--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let saved: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(findings(saved["windows"].as_array().unwrap()), live);
    assert_eq!(saved["lines_skipped"], 0);
}

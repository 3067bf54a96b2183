//! MoE expert parallelism end to end (issue 21): `tests/scenarios/moe_ep.toml`, 16 EP ranks on the
//! libnccl stand-in with the plugin, each running CommInsight's Python reporter
//! (`comminsight_moe`) fed with the per-peer arrival times the stand-in measured where the bytes
//! arrived (`ncclTestbedLastRecvTimes`), as DeepEP's low-latency kernels (SM cycles) or Ascend
//! MC2 (µs, the hierarchical 2 x 8 layout) accumulate them; then `comminsight-agent moe RUN_DIR
//! --json`: a rank slow before dispatch is a slow sender, a rank entering its receive early a slow
//! receiver, a shaped veth between two test hosts a slow path, the healthy hierarchical layout
//! gives nothing (its structural zeros would give false points without zero exclusion), and a
//! rank whose reporter stops leaves `incomplete_window`s naming it.

use std::path::{Path, PathBuf};

use comminsight_tests::{agent, one_job_at_a_time, testbed, OutDir};

const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/moe_ep.toml");

/// One window's event as `moe --json` prints it.
struct Window {
    phase: String,
    seq: u64,
    findings: Vec<serde_json::Value>,
    missing: Option<Vec<u64>>,
}

/// `scenario` with `from` replaced by `to` (a variant of the shipped file), written into `dir`.
fn variant(dir: &Path, name: &str, edits: &[(&str, &str)]) -> PathBuf {
    let mut text = std::fs::read_to_string(SCENARIO).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "moe_ep.toml lacks {from:?}");
        text = text.replacen(from, to, 1);
    }
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Run the scenario with `args`, then `comminsight-agent moe OUT --json [extra]`: (exit, windows).
fn run(out: &Path, scenario: &Path, args: &[&str], extra: &[&str]) -> (i32, Vec<Window>) {
    let mut a = vec!["--scenario", scenario.to_str().unwrap()];
    a.extend_from_slice(args);
    testbed(out, &a, &[]).assert_ok();
    let mut cmd = vec!["moe", out.to_str().unwrap(), "--json"];
    cmd.extend_from_slice(extra);
    let o = agent(&cmd);
    let text = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "moe --json: {e}\n{text}\n{}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(
        (v["rows_refused"].as_u64(), v["rows_dropped"].as_u64()),
        (Some(0), Some(0)),
        "{v:#}"
    );
    let windows = v["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let e = &w["event"];
            assert_eq!(e["N"], 16, "{e:#}");
            Window {
                phase: e["phase"].as_str().unwrap().to_string(),
                seq: e["window_seq"].as_u64().unwrap(),
                findings: e["findings"].as_array().unwrap().clone(),
                missing: e["incomplete_window"]["missing_rows"]
                    .as_array()
                    .map(|m| m.iter().map(|r| r.as_u64().unwrap()).collect()),
            }
        })
        .collect::<Vec<_>>();
    for w in &windows {
        eprintln!(
            "{} {} {:?} missing {:?}",
            w.phase, w.seq, w.findings, w.missing
        );
    }
    (o.status.code().unwrap_or(-1), windows)
}

/// (kind, rank or waiter, peer) of every finding.
fn findings(ws: &[Window]) -> Vec<(String, u64, Option<u64>)> {
    ws.iter()
        .flat_map(|w| &w.findings)
        .map(|f| {
            let kind = f["kind"].as_str().unwrap().to_string();
            match f["rank"].as_u64() {
                Some(r) => (kind, r, None),
                None => (kind, f["waiter"].as_u64().unwrap(), f["peer"].as_u64()),
            }
        })
        .collect()
}

/// 18 steps, 2 of warm-up, a window every 8: 2 windows per phase, each whole.
fn whole(ws: &[Window]) {
    assert_eq!(ws.len(), 4, "2 windows x 2 phases");
    assert!(ws.iter().all(|w| w.missing.is_none()));
}

/// The report's EP section (headless Chromium) holds the window that named rank 5 as a slow
/// sender, drawn as a 16 x 16 wait matrix; the trace (read with Perfetto's protos) has the
/// finding as an instant on rank 5's "MoE EP" track, and no other rank has one.
fn report_and_trace_show_the_sender(out: &Path) {
    let page = out.join("report.html");
    let b = comminsight_tests::report_dom(out, &page);
    let ep = comminsight_tests::chromium::element_text(&b.stdout, "ep").expect("#ep");
    assert!(ep.contains("rank 5 is a slow sender"), "{ep}");
    assert!(ep.contains("4 EP windows analysed"), "{ep}");
    assert!(
        b.stdout.contains("data-phase=\"dispatch\""),
        "no wait matrix canvas"
    );
    let pf = out.join("moe.pftrace");
    comminsight_tests::write_trace(out, "0..17", &pf);
    let facts = comminsight_tests::backends::trace_facts(&pf);
    assert_eq!(facts["problem_count"], 0, "{:#}", facts["problems"]);
    let marks: Vec<(String, String)> = facts["instants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["track"].as_str().is_some_and(|t| t.ends_with("MoE EP")))
        .map(|i| {
            (
                i["track"].as_str().unwrap().into(),
                i["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(!marks.is_empty(), "{:#}", facts["instants"]);
    assert!(
        marks.iter().all(
            |(t, n)| t == "rank 5 · MoE EP" && n.starts_with("slow EP sender (dispatch window")
        ),
        "{marks:?}"
    );
}

#[test]
fn a_late_sender_and_an_early_receiver_are_named_and_a_muted_rank_leaves_windows_incomplete() {
    let _one = one_job_at_a_time();
    let dir = OutDir::new("moe-ep");
    let scenario = PathBuf::from(SCENARIO);

    // Rank 5 sleeps 50 ms before its first dispatch of each step: every rank waits on it.
    let (code, ws) = run(
        &dir.path().join("slow"),
        &scenario,
        &["--fault", "slow:rank=5,ms=50"],
        &[],
    );
    whole(&ws);
    let f = findings(&ws);
    let dispatch_hits = ws
        .iter()
        .filter(|w| w.phase == "dispatch")
        .filter(|w| {
            w.findings
                .iter()
                .any(|f| f["kind"] == "sender_slow" && f["rank"] == 5)
        })
        .count();
    assert_eq!(dispatch_hits, 2, "{f:?}");
    assert!(
        f.iter().all(|x| *x == ("sender_slow".into(), 5, None)),
        "{f:?}"
    );
    assert_eq!(code, 1);
    report_and_trace_show_the_sender(&dir.path().join("slow"));

    // Every rank but 9 computes 50 ms longer: 9 enters its receive early and waits on all.
    let (code, ws) = run(
        &dir.path().join("early"),
        &scenario,
        &["--fault", "early:rank=9,ms=50"],
        &[],
    );
    whole(&ws);
    let f = findings(&ws);
    let hits = ws
        .iter()
        .filter(|w| w.phase == "dispatch")
        .filter(|w| {
            w.findings
                .iter()
                .any(|f| f["kind"] == "receiver_slow" && f["rank"] == 9)
        })
        .count();
    assert_eq!(hits, 2, "{f:?}");
    assert!(
        f.iter().all(|x| *x == ("receiver_slow".into(), 9, None)),
        "{f:?}"
    );
    assert_eq!(code, 1);

    // Rank 7's reporter stops at step 10: window 1 (steps 10..17, after 2 warm-up steps) of both
    // phases misses its row (and is not analysed); window 0 is whole and healthy.
    let (code, ws) = run(
        &dir.path().join("mute"),
        &scenario,
        &["--fault", "mute:rank=7,step=10"],
        &[],
    );
    assert_eq!(ws.len(), 4);
    for w in &ws {
        let want = (w.seq >= 1).then(|| vec![7]);
        assert_eq!(w.missing, want, "{} window {}", w.phase, w.seq);
        assert!(w.seq >= 1 || w.findings.is_empty(), "{:?}", w.findings);
    }
    assert_eq!(code, 1);
}

#[test]
fn the_healthy_mc2_hierarchical_layout_gives_no_finding_with_its_zeros_excluded() {
    let _one = one_job_at_a_time();
    let dir = OutDir::new("moe-ep-mc2");
    let scenario = variant(
        dir.path(),
        "mc2",
        &[(
            "reporter = \"deepep\"",
            "reporter = \"mc2\"\nhierarchical = true",
        )],
    );
    let out = dir.path().join("run");
    let (code, ws) = run(&out, &scenario, &[], &[]);
    whole(&ws);
    assert_eq!(findings(&ws), vec![], "exclude_zeros = auto: nothing");
    assert_eq!(code, 0);
    // The same windows with the zeros in the point baseline (DeepXTrace's default): the
    // cross-server cells, 1 in 8 of the non-zero ones, stand out as false slow paths (S7).
    let cfg = dir.path().join("zeros.toml");
    std::fs::write(&cfg, "[moe]\nexclude_zeros = \"off\"\n").unwrap();
    let o = agent(&[
        "moe",
        out.to_str().unwrap(),
        "--json",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cross = v["windows"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["event"]["findings"].as_array().unwrap().clone())
        .filter(|f| {
            f["kind"] == "path_slow"
                && f["waiter"]
                    .as_u64()
                    .unwrap()
                    .abs_diff(f["peer"].as_u64().unwrap())
                    == 8
        })
        .count();
    assert!(
        cross > 0,
        "no false cross-server point without zero exclusion: {v:#}"
    );
}

#[test]
fn a_shaped_link_between_two_hosts_is_a_slow_path() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a slow link needs network namespaces, so root (CI runs tests as root)");
        return;
    }
    let _one = one_job_at_a_time();
    let dir = OutDir::new("moe-ep-link");
    // One rank per host, so the path 2 -> 11 is one cell; 32 KiB to each peer per all-to-all
    // (more than tbf's 16 kB burst) through 5 Mbit/s: about 26 ms more per all-to-all on that
    // cell, some 10 to 20 times a cell's usual wait (a point, not a row and a column: spec §1.9).
    let scenario = variant(dir.path(), "link", &[("ep = 262144", "ep = 524288")]);
    let (code, ws) = run(
        &dir.path().join("run"),
        &scenario,
        &["--hosts", "16", "--fault", "slowlink:a=2,b=11,rate=5mbit"],
        &[],
    );
    whole(&ws);
    let f = findings(&ws);
    let path = ("path_slow".to_string(), 11, Some(2));
    let hits = ws
        .iter()
        .filter(|w| findings(std::slice::from_ref(w)).contains(&path))
        .count();
    assert!(
        hits >= 3,
        "waiter 11 on peer 2 in {hits} of 4 windows: {f:?}"
    );
    // Nothing else but rank 11 itself sending late in the next all-to-all (it received late).
    let knock_on = ("sender_slow".to_string(), 11, None);
    assert!(f.iter().all(|x| *x == path || *x == knock_on), "{f:?}");
    assert_eq!(code, 1);
}

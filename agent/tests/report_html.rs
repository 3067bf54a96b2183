//! `comminsight-agent report`: the self-contained HTML page renders in headless Chromium (no
//! console output, scripts finish, nothing caught), names the injected straggler of a real
//! test-bed run, and stays readable and bounded for 4096 ranks × 100 steps. Screenshots are kept
//! under `target/report-screenshots/` for a human look.

#[path = "support/chromium.rs"]
mod chromium;
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use comminsight_agent::hang::model::{ChainLink, HangReport, Verdict, VerdictComm, VerdictKind};
use comminsight_agent::report::model::{OpRow, RankOps, StepOps};
use comminsight_agent::report::{build, render, Inputs};
use comminsight_agent::roles::{CommRole, Grid, JobRoles};
use comminsight_agent::straggler::{
    PeerWait, RankIndex, RankSummary, StepIndex, StragglerClass, StragglerReport,
};
use comminsight_wire::roles::Role;
use support::TempDir;

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .parent()
        .expect("target/debug")
        .to_path_buf()
}

fn screenshots() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/report-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What every rendered page must satisfy; returns the DOM.
fn check_page(page: &Path, name: &str) -> String {
    let html = std::fs::read_to_string(page).unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "{name}: the page references the network"
    );
    assert!(
        !html.contains("<link") && !html.contains(" src="),
        "{name}: external resources"
    );
    let dom = chromium::dump_dom(page);
    assert!(
        dom.console.is_empty(),
        "{name}: console output: {:#?}",
        dom.console
    );
    assert!(
        dom.stdout.contains("data-ready=\"1\""),
        "{name}: the page's script did not finish"
    );
    let errors = chromium::element_text(&dom.stdout, "errors").expect("#errors");
    assert!(errors.is_empty(), "{name}: the page caught: {errors}");
    for (w, h, tag) in [(1400, 1000, ""), (1400, 2600, "-full")] {
        let png = screenshots().join(format!("{name}{tag}.png"));
        let s = chromium::screenshot(page, &png, w, h);
        assert!(
            s.console.is_empty(),
            "{name}: console output: {:#?}",
            s.console
        );
    }
    eprintln!(
        "{name}: {} bytes, DOM dumped in {:.1} s",
        html.len(),
        dom.wall.as_secs_f64()
    );
    dom.stdout
}

#[test]
fn report_of_a_testbed_run_names_the_slow_rank() {
    let testbed = bin_dir().join("comminsight-testbed");
    assert!(
        testbed.exists(),
        "missing test tool {}: run `cargo xtask build`",
        testbed.display()
    );
    let lib = std::env::var_os("COMMINSIGHT_LIB_DIR")
        .map_or_else(|| bin_dir().join("lib"), PathBuf::from);
    assert!(
        lib.join("libnccl-profiler-comminsight.so").exists() && lib.join("libnccl.so.2").exists(),
        "missing test tool {}/libnccl-profiler-comminsight.so: run `cargo xtask build`",
        lib.display()
    );
    let dir = TempDir::new("report16");
    let out = dir.path().join("run");
    // A real run on a loaded 2-core machine is noisy: the analysis (not this page) may rank
    // another rank first now and then. Up to 3 runs until it names rank 5; the page must then
    // say what the analysis says.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let tb = Command::new(&testbed)
            .args(["run", "--scenario"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scenarios/megatron.toml"))
            .args(["--ranks", "16", "--hosts", "2", "--steps", "10"])
            .args(["--fault", "slow:rank=5,ms=40", "--out"])
            .arg(&out)
            .env("COMMINSIGHT_LIB_DIR", &lib)
            .output()
            .expect("run the test bed");
        assert!(
            tb.status.success(),
            "test bed: {}",
            String::from_utf8_lossy(&tb.stderr)
        );
        let st = support::agent(&["straggler", out.to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("straggler --json");
        let top = v["ranks"][0]["rank"].as_i64();
        // The summary leads with the first straggler by the root-cause rule (root index and own
        // excess), else names the highest rank: a run where scheduler noise made another rank a
        // straggler while rank 5 missed the rule is a noisy run too.
        let rule = |r: &serde_json::Value| {
            r["root_index"].as_f64().unwrap_or(0.0) > v["root_threshold"].as_f64().unwrap_or(0.0)
                && r["root_delay"].as_f64().unwrap_or(0.0)
                    > v["root_min_delay"].as_f64().unwrap_or(0.0)
        };
        let ranks = v["ranks"].as_array().cloned().unwrap_or_default();
        let first_straggler = ranks.iter().find(|r| rule(r)).map(|r| r["rank"].as_i64());
        if top == Some(5) && first_straggler.is_none_or(|r| r == Some(5)) {
            break;
        }
        eprintln!("run {attempts}: the analysis ranks {top:?} first, not 5");
        assert!(
            attempts < 3,
            "the analysis never ranked the slowed rank 5 first"
        );
    }
    let page = dir.path().join("report.html");
    let r = support::agent(&[
        "report",
        out.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "report: {stdout}\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(stdout.contains("16 ranks, 10 steps"), "{stdout}");
    let dom = check_page(&page, "report-16");
    let summary = chromium::element_text(&dom, "summary").expect("#summary");
    // Above the threshold it leads the list; below it (a loaded machine stretches the steps)
    // the summary still names the highest rank.
    assert!(
        summary.contains("top straggler(s) rank 5 on ") || summary.contains("; highest: rank 5 ("),
        "the summary does not name rank 5 first: {summary}"
    );
    assert!(summary.contains("16 ranks on 2 host(s)"), "{summary}");
    let traces = chromium::element_text(&dom, "traces").expect("#traces");
    assert!(
        traces.contains("comminsight-agent trace ") && traces.contains(" --steps "),
        "{traces}"
    );
    // The drill-down opened on the top straggler, with its ops (a top rank).
    let drill = chromium::element_text(&dom, "drill").expect("#drill");
    assert!(drill.starts_with("Rank 5 host host0"), "{drill}");
    assert!(drill.contains("AllReduce"), "no ops of rank 5: {drill}");
}

/// A deterministic pseudo-random sequence.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn comm(role: Role, hash: u64, ranks: Vec<i64>) -> CommRole {
    CommRole::dense(
        hash,
        &format!("{}:{hash}", role.as_str()),
        Some(role),
        ranks,
    )
}

/// 4096 ranks (tp 8 × pp 4 × dp 128) × 100 steps, every rank with 10 causes and 10 victims,
/// ops of the top 64 ranks, one hang verdict with stacks: the sizes a real large job gives.
fn large_inputs() -> Inputs {
    let (tp, pp, dp, steps) = (8i64, 4i64, 128i64, 100u64);
    let world = tp * pp * dp;
    let mut rng = Lcg(7);
    let slow = 1234i64;
    let base: Vec<f64> = (0..world)
        .map(|r| if r == slow { 35.0 } else { rng.next() * 6.0 })
        .collect();
    let mut step_rows = Vec::new();
    let mut durations = Vec::new();
    for s in 0..steps {
        let mut ranks: Vec<RankIndex> = (0..world)
            .map(|r| RankIndex {
                rank: r,
                index: (base[r as usize] + rng.next() * 3.0).min(100.0),
                avg_cause_us: 0.0,
                coverage_complete: true,
                ..Default::default()
            })
            .collect();
        ranks.sort_by(|a, b| b.index.total_cmp(&a.index).then(a.rank.cmp(&b.rank)));
        for r in 0..world {
            durations.push((r, s, 100_000 + (rng.next() * 8000.0) as u64));
        }
        step_rows.push(StepIndex {
            step: s,
            avg_step_us: 104_000.0,
            ranks,
            ..Default::default()
        });
    }
    let peers = |rng: &mut Lcg| -> Vec<PeerWait> {
        (0..10)
            .map(|_| PeerWait {
                rank: (rng.next() * world as f64) as i64,
                wait_us: (rng.next() * 1e6) as u64,
                steps: (rng.next() * 100.0) as u64,
            })
            .collect()
    };
    let mut ranks: Vec<RankSummary> = (0..world)
        .map(|r| {
            let over = base[r as usize] > 10.0;
            RankSummary {
                rank: r,
                host: format!("node{:03}", r / 8),
                index: base[r as usize] + 1.5,
                complete_steps: steps,
                max_index: base[r as usize] + 3.0,
                steps_over_threshold: if over { steps } else { 0 },
                top_causes: peers(&mut rng),
                top_victims: peers(&mut rng),
                class: if over {
                    StragglerClass::ComputeSlow
                } else {
                    StragglerClass::None
                },
                class_reason: "late arrival: arrives 3100 us after the median".into(),
                // The root cause names the same ranks (issue 17's rule: index and own excess).
                root_index: base[r as usize] / 2.0,
                root_delay: if over { 6.0 } else { 0.2 },
                saves_pct: if over { 4.0 } else { 0.0 },
                ..Default::default()
            }
        })
        .collect();
    ranks.sort_by(|a, b| b.index.total_cmp(&a.index).then(a.rank.cmp(&b.rank)));
    // Megatron order: rank = t + tp·(d + dp·p).
    let at = |t: i64, d: i64, p: i64| t + tp * (d + dp * p);
    let mut comms = vec![comm(Role::Global, 1, (0..world).collect())];
    let mut h = 100u64;
    for p in 0..pp {
        for d in 0..dp {
            h += 1;
            comms.push(comm(Role::Tp, h, (0..tp).map(|t| at(t, d, p)).collect()));
        }
        for t in 0..tp {
            h += 1;
            comms.push(comm(Role::Dp, h, (0..dp).map(|d| at(t, d, p)).collect()));
        }
    }
    for d in 0..dp {
        for t in 0..tp {
            h += 1;
            comms.push(comm(Role::Pp, h, (0..pp).map(|p| at(t, d, p)).collect()));
        }
    }
    let roles = JobRoles {
        job: "big".into(),
        world: world as u32,
        comms,
        grid: Grid {
            tp: tp as u32,
            cp: 1,
            pp: pp as u32,
            dp: dp as u32,
            ep: 1,
        },
        grid_confidence: 1.0,
    };
    let ops: Vec<RankOps> = ranks
        .iter()
        .take(64)
        .map(|r| RankOps {
            rank: r.rank,
            steps: (0..8)
                .map(|s| StepOps {
                    step: s * 10,
                    ops: (0..120)
                        .map(|i| -> OpRow { [5, 1 + (i % 3), i, i * 700, 450, 1 << 20] })
                        .collect(),
                    dropped: 0,
                })
                .collect(),
        })
        .collect();
    let stacks = serde_json::json!({
        "pid": 4242, "captured_us": 1, "elapsed_us": 900, "mode": "locked",
        "python_version": "3.11", "threads": [{"thread_id": 1, "name": "MainThread", "active": true,
        "owns_gil": true, "frames": [
            {"name": "train_step", "file": "train.py", "line": 88, "native": false},
            {"name": "ncclAllReduce", "file": "", "line": 0, "native": true}]}]
    });
    let hang = HangReport {
        verdicts: vec![Verdict {
            job: "big".into(),
            kind: VerdictKind::Hang,
            source_ranks: vec![slow],
            comm: VerdictComm {
                hash: 1,
                name: "world".into(),
                role: "dp".into(),
            },
            func: "AllReduce".into(),
            seq: 812,
            entered_ranks: (0..world).filter(|r| *r != slow).collect(),
            absent_ranks: vec![slow],
            chain: vec![ChainLink {
                rank: 0,
                comm: 1,
                func: "AllReduce".into(),
                seq: 812,
                waits_for: vec![slow],
            }],
            since_us: 5,
            gpu_fault: None,
            category: Some("missing".into()),
            evidence: serde_json::json!({
                "sources": [{"rank": slow, "stacks": stacks,
                             "proc_state": {"status": "sleeping", "detail": "wchan=futex_wait_queue"}}],
                "stacks": {}
            }),
        }],
        resolved: vec![],
        ep_incomplete: vec![],
    };
    let hosts: BTreeMap<i64, String> = (0..world)
        .map(|r| (r, format!("node{:03}", r / 8)))
        .collect();
    let mut inp = Inputs::new(
        "/data/big run".into(),
        StragglerReport {
            job: "big".into(),
            threshold: 10.0,
            steps: step_rows,
            ranks,
            root_threshold: 1.0,
            root_min_delay: 2.0,
        },
    );
    inp.roles = Some(roles);
    inp.hosts = hosts;
    inp.durations = durations;
    inp.template = Some("megatron-1f1b v2".into());
    inp.hang = Some(hang);
    inp.ops = ops;
    inp.ops_note = "op detail for the 64 ranks with the highest index".into();
    inp.funcs = comminsight_wire::names::Func::NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    inp
}

#[test]
fn report_of_4096_ranks_renders_and_stays_bounded() {
    let dir = TempDir::new("report4096");
    let t0 = std::time::Instant::now();
    let model = build(large_inputs());
    let html = render(&model);
    let built = t0.elapsed();
    let page = dir.path().join("report.html");
    std::fs::write(&page, &html).unwrap();
    eprintln!(
        "4096 ranks x 100 steps: {} bytes ({:.1} MB), built and rendered in {:.2} s",
        html.len(),
        html.len() as f64 / 1e6,
        built.as_secs_f64()
    );
    assert!(
        html.len() < 15_000_000,
        "the page is {} bytes (bound 15 MB)",
        html.len()
    );
    let dom = check_page(&page, "report-4096");
    let summary = chromium::element_text(&dom, "summary").expect("#summary");
    assert!(
        summary.contains("top straggler(s) rank 1234 on node154"),
        "{summary}"
    );
    assert!(summary.contains("tp=8 cp=1 pp=4 dp=128"), "{summary}");
    let note = chromium::element_text(&dom, "hmnote").expect("#hmnote");
    assert!(note.starts_with("4096 ranks; one cell per rank"), "{note}");
    // The grid is drawn on one canvas, not one element per rank.
    assert_eq!(dom.matches("<canvas").count(), 2, "heatmap and legend only");
    let hang = chromium::element_text(&dom, "hang").expect("#hang");
    assert!(hang.contains("hang source rank(s) 1234"), "{hang}");
    assert!(hang.contains("holds the GIL"), "{hang}");
    assert!(hang.contains("ncclAllReduce"), "{hang}");
    let traces = chromium::element_text(&dom, "traces").expect("#traces");
    assert!(
        traces.contains("comminsight-agent trace '/data/big run' --job big --steps "),
        "{traces}"
    );
    assert!(
        traces.contains("--ranks "),
        "4096 ranks: traces name their ranks: {traces}"
    );
}

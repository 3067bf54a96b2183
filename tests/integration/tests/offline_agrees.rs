//! Issue 15: the daemon and every offline command run the same engine with the same settings.
//! A daemon follows two real test-bed jobs through their shm rings and segments, with a site
//! configuration whose `[steps]` differ from the defaults (its own template directory, where the
//! Megatron templates carry other names, and a shorter reorder window), a lower straggler
//! threshold and a short settle time. Then `replay`, `steps`, `roles`, `straggler`, `hang`,
//! `report` and `trace`, each with `--config` of that file, over the jobs' segments (and
//! `replay`, `steps` over the agent's archive), must give the daemon's results: the same step
//! files byte for byte, the same roles, the same straggler report, the same hang verdict. A
//! control run without `--config` shows the built-in templates, so a command that ignored the
//! file would fail here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use comminsight_tests::*;
use serde_json::Value;

const SLOW_JOB: &str = "agree-slow";
const HANG_JOB: &str = "agree-hang";
const SLOW_RANK: i64 = 5;
const HUNG_RANK: i64 = 2;
const THRESHOLD: f64 = 10.0;

fn scenario() -> String {
    format!(
        "{}/../../tests/scenarios/megatron.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `comminsight-agent ARGS`, asserted to exit with one of `codes`; its stdout.
fn run_ok(args: &[&str], codes: &[i32]) -> String {
    let o = agent(args);
    assert!(
        o.status.code().is_some_and(|c| codes.contains(&c)),
        "comminsight-agent {}: {}\nstderr:\n{}",
        args.join(" "),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// The site's templates: the shipped Megatron file with every template renamed.
fn site_templates(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates/megatron.toml");
    let text = std::fs::read_to_string(src).unwrap();
    let renamed = text.replace("name = \"megatron", "name = \"site-megatron");
    assert_ne!(text, renamed, "the templates have names to change");
    std::fs::write(dir.join("megatron.toml"), renamed).unwrap();
}

/// One test-bed job of 8 ranks on 2 hosts into `out`, followed by the daemon through `shm`.
fn job(out: &Path, shm: &Path, id: &str, steps: &str, fault: &str, extra: &[&str]) -> bool {
    Command::new(bin_dir().join("comminsight-testbed"))
        .arg("run")
        .arg("--out")
        .arg(out)
        .args(["--scenario", &scenario(), "--ranks", "8", "--hosts", "2"])
        .args(["--steps", steps, "--job", id, "--fault", fault])
        .args(extra)
        .env("COMMINSIGHT_LIB_DIR", lib_dir())
        .env("COMMINSIGHT_SHM_DIR", shm)
        .env("COMMINSIGHT_OVERDUE_MS", "2000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("start the test bed")
        .success()
}

/// The fields of a step summary both the daemon's files and `steps --json` carry.
fn step_key(s: &Value) -> Value {
    serde_json::json!({
        "rank": s["rank"],
        "step": if s.get("raw_step").is_some() { &s["raw_step"] } else { &s["step"] },
        "first": s["first"], "anchor": s["anchor"], "last": s["last"],
        "duration_us": s["duration_us"], "ops": s["ops"],
        "coverage_complete": s["coverage_complete"], "closed_by": s["closed_by"],
    })
}

/// A verdict's identity: kind, sources, first non-progressing communication.
fn verdict_key(v: &Value) -> Value {
    serde_json::json!([
        v["kind"],
        v["source_ranks"],
        v["comm"]["hash"],
        v["func"],
        v["seq"]
    ])
}

/// A straggler report's numbers: threshold, and per rank its index, class and steps.
fn straggler_key(r: &Value) -> Value {
    let ranks: Vec<Value> = r["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            serde_json::json!([
                x["rank"],
                x["index"],
                x["max_index"],
                x["class"],
                x["steps_over_threshold"],
                x["complete_steps"]
            ])
        })
        .collect();
    serde_json::json!({ "threshold": r["threshold"], "ranks": ranks, "steps": r["steps"] })
}

#[test]
fn the_daemon_and_every_offline_command_agree_with_the_site_settings() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("offline-agrees");
    let jobs = out.path().join("jobs");
    let state = out.path().join("state");
    let archive = out.path().join("archive");
    let templates = out.path().join("templates");
    site_templates(&templates);
    let shm = ShmDir(PathBuf::from(format!(
        "/dev/shm/comminsight-it-agree-{}",
        std::process::id()
    )));
    let _ = std::fs::remove_dir_all(&shm.0);
    let logs = |j: &str| jobs.join(j).join("inspector_logs");
    for j in [SLOW_JOB, HANG_JOB] {
        std::fs::create_dir_all(logs(j)).unwrap();
    }
    let config = out.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_dir = {shm:?}\nsegment_dirs = [{a:?}, {b:?}]\nscan_interval_ms = 100\n\
             [master]\nlisten = \"\"\n[archive]\ndir = {archive:?}\n[otlp]\nenabled = false\n\
             [steps]\ntemplates_dir = {templates:?}\nsafe_window_ms = 500\nsettle_ops = 3000\n\
             [straggler]\nthreshold = {THRESHOLD:.1}\nsettle_s = 2\nreport_steps = 1000\n",
            shm = shm.0,
            a = logs(SLOW_JOB),
            b = logs(HANG_JOB),
        ),
    )
    .unwrap();
    let agent_log = out.path().join("agent.log");
    let mut daemon = start_agent(&config, &agent_log);
    let log = || std::fs::read_to_string(&agent_log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(30), || log()
            .contains("comminsight-agent running")),
        "the agent did not start:\n{}",
        log()
    );
    let slow = job(
        &jobs.join(SLOW_JOB),
        &shm.0,
        SLOW_JOB,
        "24",
        &format!("slow:rank={SLOW_RANK},ms=40"),
        &[],
    );
    assert!(slow, "the slow job failed");
    job(
        &jobs.join(HANG_JOB),
        &shm.0,
        HANG_JOB,
        "20",
        &format!("hang:rank={HUNG_RANK},step=12"),
        &["--timeout", "12"],
    );

    // The daemon's results: every slow stream ended, its last steps analysed, the hang seen.
    let job_json = state.join("results/steps").join(SLOW_JOB).join("job.json");
    let live_straggler = state.join(format!("results/straggler/{SLOW_JOB}.json"));
    let hang_views = || {
        let mut v = Vec::new();
        walk(&state.join("results/hang").join(HANG_JOB), &mut v);
        v.retain(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("verdict-"))
        });
        v
    };
    let ended = || {
        std::fs::read(&job_json)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["open_ops"].as_object().is_some_and(|m| m.len() == 8))
    };
    let live_steps = || {
        std::fs::read(&live_straggler)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map_or(0, |v| v["steps"].as_array().map_or(0, Vec::len))
    };
    assert!(
        wait_until(Duration::from_secs(60), || ended()
            && !hang_views().is_empty()),
        "the daemon did not end the slow job's streams or see the hang:\n{}",
        log()
    );
    // The live index analyses a step when every rank is past it, the last ones after settle_s.
    let mut last = 0;
    assert!(
        wait_until(Duration::from_secs(30), || {
            let n = live_steps();
            let stable = n > 0 && n == last;
            last = n;
            std::thread::sleep(Duration::from_millis(2500));
            stable
        }),
        "no stable live straggler report:\n{}",
        log()
    );
    let pid = daemon.pid().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    assert!(daemon.0.wait().unwrap().success(), "agent exit:\n{}", log());
    // Log flooding is bounded: a hang makes every op of every rank overdue, but the log says
    // so once per process per minute (it was one WARN per op: 134 for one 8-rank hang).
    let warns = log().lines().filter(|l| l.contains(" WARN ")).count();
    assert!(
        warns <= 40,
        "{warns} WARN lines for one slow and one hung 8-rank job:\n{}",
        log()
    );

    let cfg = config.to_str().unwrap();
    let dir = jobs.to_str().unwrap();
    let online_steps = tree(&state.join("results/steps").join(SLOW_JOB));
    assert_eq!(online_steps.len(), 9, "8 stream files and job.json");

    // replay (segments and archive): the step files byte for byte, the roles.
    let online_roles = json(&std::fs::read_to_string(state.join("results/roles.json")).unwrap());
    let roles_of = |v: &Value, job: &str| {
        v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["job"] == job)
            .cloned()
            .unwrap_or_else(|| panic!("no job {job} in {v}"))
    };
    for (name, input) in [("segments", dir), ("archive", archive.to_str().unwrap())] {
        let r = out.path().join(format!("replay-{name}"));
        run_ok(
            &[
                "replay",
                input,
                "--out",
                r.to_str().unwrap(),
                "--config",
                cfg,
            ],
            &[0],
        );
        let offline = tree(&r.join("steps").join(SLOW_JOB));
        assert_eq!(
            offline.keys().collect::<Vec<_>>(),
            online_steps.keys().collect::<Vec<_>>(),
            "replay of the {name}"
        );
        for (k, v) in &online_steps {
            assert!(
                v == &offline[k],
                "replay of the {name}: {} differs",
                k.display()
            );
        }
        let replayed = json(&std::fs::read_to_string(r.join("roles.json")).unwrap());
        assert_eq!(
            roles_of(&replayed, SLOW_JOB),
            roles_of(&online_roles, SLOW_JOB),
            "{name}"
        );
    }

    // steps: the site's template, every summary as the daemon wrote it.
    let mut want = Vec::new();
    for (k, v) in &online_steps {
        if k.extension().is_some_and(|e| e == "jsonl") {
            for line in String::from_utf8_lossy(v).lines() {
                want.push(step_key(&json(line)));
            }
        }
    }
    want.sort_by_key(|v| v.to_string());
    let steps_of = |extra: &[&str]| {
        let mut args = vec!["steps", dir, "--json", "--job", SLOW_JOB];
        args.extend_from_slice(extra);
        json(&run_ok(&args, &[0]))
    };
    let site = steps_of(&["--config", cfg]);
    assert_eq!(
        site["template"]["name"], "site-megatron-1f1b",
        "{}",
        site["template"]
    );
    let mut got: Vec<Value> = site["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(step_key)
        .collect();
    got.sort_by_key(|v| v.to_string());
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want, "steps --config equals the daemon's steps");
    // Control: without the site's file the built-in templates rebuild the steps.
    let control = steps_of(&[]);
    assert_eq!(
        control["template"]["name"], "megatron-1f1b",
        "{}",
        control["template"]
    );

    // roles.
    let mut roles = json(&run_ok(
        &["roles", dir, "--json", "--job", SLOW_JOB, "--config", cfg],
        &[0],
    ));
    // What the offline run skipped is its own (nothing here); the rest is the daemon's.
    let skipped = roles.as_object_mut().unwrap().remove("skipped");
    assert_eq!(skipped.unwrap()["corrupt_records"], 0);
    assert_eq!(roles, roles_of(&online_roles, SLOW_JOB));

    // straggler: the daemon's live report over every analysed step = the offline report.
    let live = json(&std::fs::read_to_string(&live_straggler).unwrap());
    let offline = json(&run_ok(
        &[
            "straggler",
            dir,
            "--json",
            "--job",
            SLOW_JOB,
            "--config",
            cfg,
        ],
        &[0, 1],
    ));
    assert_eq!(offline["threshold"], THRESHOLD);
    assert_eq!(
        offline["ranks"][0]["rank"], SLOW_RANK,
        "{}",
        offline["ranks"][0]
    );
    assert_eq!(
        straggler_key(&offline),
        straggler_key(&live),
        "live vs offline straggler"
    );

    // hang: this host's live verdict = the offline verdict.
    let views: Vec<Value> = hang_views()
        .iter()
        .flat_map(|p| {
            json(&std::fs::read_to_string(p).unwrap())
                .as_array()
                .unwrap()
                .clone()
        })
        .collect();
    let live_v = views.last().unwrap();
    assert_eq!(
        live_v["source_ranks"],
        serde_json::json!([HUNG_RANK]),
        "{live_v}"
    );
    let h = json(&run_ok(
        &["hang", dir, "--json", "--job", HANG_JOB, "--config", cfg],
        &[1],
    ));
    let offline_v = &h["verdicts"][0];
    assert_eq!(
        verdict_key(offline_v),
        verdict_key(live_v),
        "live vs offline hang verdict"
    );

    // report: the page's data carries the site's template, threshold and the same top rank.
    let html = out.path().join("report.html");
    let html_s = html.to_str().unwrap();
    run_ok(
        &[
            "report", dir, "-o", html_s, "--job", SLOW_JOB, "--config", cfg,
        ],
        &[0],
    );
    let page = std::fs::read_to_string(&html).unwrap();
    let data = page
        .split("<script type=\"application/json\" id=\"data\">")
        .nth(1)
        .and_then(|s| s.split("</script>").next())
        .expect("the embedded model");
    let model = json(data);
    assert_eq!(model["template"], "site-megatron-1f1b v2");
    assert_eq!(model["threshold"], THRESHOLD);
    assert_eq!(
        model["summary"]["top"][0]["rank"], SLOW_RANK,
        "{}",
        model["summary"]["top"]
    );

    // trace: the site's steps 2..4 of every rank.
    let pf = out.path().join("t.pftrace");
    let t = run_ok(
        &[
            "trace",
            dir,
            "--job",
            SLOW_JOB,
            "--steps",
            "2..4",
            "-o",
            pf.to_str().unwrap(),
            "--config",
            cfg,
        ],
        &[0],
    );
    assert!(t.contains("8 ranks, 24 steps"), "{t}");
}

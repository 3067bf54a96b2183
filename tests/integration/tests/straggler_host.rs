//! Issue 19: host context in the straggler classes. A daemon follows a test-bed job of 8 real
//! rank processes on this host: rank 2 is starved of CPU (its process is put in a cgroup with
//! a 2 % CPU quota, the cgroup v1 equivalent of `cpu.max`), rank 5 sleeps 40 ms longer in each
//! step's compute. The daemon's host stream records every rank's main-thread states; the
//! offline `straggler` over the job's segments and the host stream calls rank 2 `cpu-starved`
//! and rank 5 `compute-slow`, each with its measured on-CPU / runnable / blocked shares; so
//! does the daemon's live report (`results/straggler/`), from the host samples it pushes beside
//! its steps. While it runs, its `/status` names the host recorder (eBPF on, the sched probes
//! attached, the 8 ranks followed; `comminsight-agent status` prints it) and its `/metrics`
//! carries the main-thread time per scheduler state per rank: rank 2's runnable seconds stand
//! out from every other rank's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use comminsight_tests::*;
use serde_json::Value;

const STARVED: i64 = 2;
const SLOW: i64 = 5;

/// A cgroup v1 `cpu` group with a CPU quota, removed (its tasks moved back) on drop.
struct Throttle(PathBuf);

impl Throttle {
    fn new(name: &str, quota_us: u64) -> Option<Throttle> {
        let root = Path::new("/sys/fs/cgroup/cpu");
        if !root.join("cgroup.procs").exists() {
            return None;
        }
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").ok()?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()).ok()?;
        Some(Throttle(dir))
    }

    fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let tasks = std::fs::read_to_string(self.0.join("tasks")).unwrap_or_default();
        for t in tasks.lines() {
            let _ = std::fs::write("/sys/fs/cgroup/cpu/tasks", t);
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The pid of the rank process with `RANK=rank` among the rings in `shm`.
fn rank_pid(shm: &Path, rank: i64) -> Option<u32> {
    let want = format!("RANK={rank}");
    for user in std::fs::read_dir(shm).ok()?.flatten() {
        for ring in std::fs::read_dir(user.path()).ok()?.flatten() {
            let name = ring.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".ring") else {
                continue;
            };
            let Some(pid) = stem.rsplit('.').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
                return Some(pid);
            }
        }
    }
    None
}

/// The `<host>` directory name the job's segments use.
fn seg_host(logs: &Path) -> Option<String> {
    let job = std::fs::read_dir(logs).ok()?.flatten().next()?;
    let host = std::fs::read_dir(job.path()).ok()?.flatten().next()?;
    Some(host.file_name().to_string_lossy().into_owned())
}

/// GET `path` from the daemon's endpoint `addr` (one HTTP/1.1 request, connection closed).
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the daemon's endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "GET {path}: {reply}");
    reply
}

/// The value of the Prometheus sample `name{...}` whose labels include every pair of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The daemon's `/status` (its `status.json`) names the host recorder: eBPF on, thread times
/// from the sched probes, every sched probe attached, all 8 ranks followed; and
/// `comminsight-agent status` says so in its `host` line. Returns the endpoint's address.
fn host_recorder_in_status(state: &Path, config: &Path) -> String {
    let file = state.join("status.json");
    let read = || -> Option<Value> { serde_json::from_slice(&std::fs::read(&file).ok()?).ok() };
    wait_until(Duration::from_secs(20), || {
        read().is_some_and(|s| s["host_context"]["tracked"] == 8)
    });
    let status = read().unwrap_or(Value::Null);
    let hc = &status["host_context"];
    assert_eq!(hc["tracked"], 8, "{status:#}");
    assert_eq!(hc["ebpf"], "on", "{status:#}");
    assert_eq!(hc["threads"], "ebpf", "{status:#}");
    let sched: Vec<&Value> = hc["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("sched:")))
        .collect();
    assert!(
        !sched.is_empty() && sched.iter().all(|p| p["ok"] == true),
        "{status:#}"
    );
    let o = agent(&["status", "--config", config.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("host     ebpf on, threads from ebpf, ")
                && l.contains(", 8 ranks followed, ")),
        "comminsight-agent status: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    status["http"]
        .as_str()
        .expect("the endpoint serves")
        .to_string()
}

/// `/metrics`: every rank has its main-thread time in each scheduler state, and the starved
/// rank's runnable seconds are more than twice any other rank's; the loopback port under the
/// job's traffic counts transmitted bytes.
fn host_instruments_in_metrics(addr: &str, host: &str) {
    let text = http_get(addr, "/metrics");
    let name = "comminsight_host_thread_time_seconds_total";
    let secs = |rank: i64, state: &str| {
        let r = rank.to_string();
        sample(
            &text,
            name,
            &[
                ("comminsight_rank", &r),
                ("comminsight_thread_state", state),
            ],
        )
    };
    for r in 0..8 {
        for st in ["on_cpu", "runnable", "blocked", "blocked_io"] {
            assert!(secs(r, st).is_some(), "no {name} of rank {r}, {st}: {text}");
        }
    }
    let starved = secs(STARVED, "runnable").unwrap();
    let others = (0..8)
        .filter(|r| *r != STARVED)
        .filter_map(|r| secs(r, "runnable"))
        .fold(0.0_f64, f64::max);
    eprintln!("/metrics runnable seconds: rank {STARVED} {starved}, most of the others {others}");
    assert!(starved > 2.0 * others && starved > 0.2, "{text}");
    let lo = sample(
        &text,
        "comminsight_host_port_transmitted_bytes_total",
        &[("host_name", host), ("comminsight_port_device", "lo")],
    );
    assert!(lo.is_some_and(|b| b > 0.0), "no lo bytes: {text}");
}

#[test]
fn a_starved_rank_is_cpu_starved_and_a_sleeping_one_compute_slow() {
    let _g = one_job_at_a_time();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let Some(throttle) = root
        .then(|| Throttle::new(&format!("ci-starve-{}", std::process::id()), 2000))
        .flatten()
    else {
        let why = "needs root and the cgroup v1 cpu controller (/sys/fs/cgroup/cpu)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: {why}"
        );
        eprintln!("skipping: {why}");
        return;
    };
    let out = OutDir::new("straggler-host");
    std::fs::create_dir_all(out.path()).unwrap();
    let shm = out.path().join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let run = out.path().join("run");
    let mut tb = Child(
        Command::new(bin_dir().join("comminsight-testbed"))
            .arg("run")
            .arg("--out")
            .arg(&run)
            .args([
                "--scenario",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/ddp.toml"),
                "--ranks",
                "8",
                "--hosts",
                "1",
                "--steps",
                "30",
                "--timeout",
                "120",
                "--fault",
                &format!("slow:rank={SLOW},ms=40"),
            ])
            .env("COMMINSIGHT_LIB_DIR", lib_dir())
            .env("COMMINSIGHT_SHM_DIR", &shm)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(out.path().join("testbed.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let logs = run.join("inspector_logs");
    assert!(
        wait_until(Duration::from_secs(30), || seg_host(&logs).is_some()
            && rank_pid(&shm, STARVED).is_some()),
        "the test bed's ranks did not start: {}",
        std::fs::read_to_string(out.path().join("testbed.log")).unwrap_or_default()
    );
    let host = seg_host(&logs).unwrap();
    let state = out.path().join("state");
    let config = out.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\nhost_name = {host:?}\npoll_interval_ms = 20\n\
             [sources]\nshm_dir = {shm:?}\nsegment_dirs = [{logs:?}]\nscan_interval_ms = 50\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = false\n[http]\nlisten = \"127.0.0.1:0\"\n[probes]\ninterval_ms = 200\n\
             [straggler]\nsettle_s = 2\n"
        ),
    )
    .unwrap();
    let log = out.path().join("agent.log");
    let daemon = start_agent(&config, &log);
    let pid = rank_pid(&shm, STARVED).unwrap();
    throttle
        .add(pid)
        .expect("move the rank into the throttled cgroup");
    let addr = host_recorder_in_status(&state, &config);
    let done = wait_until(Duration::from_secs(150), || {
        matches!(tb.0.try_wait(), Ok(Some(_)))
    });
    assert!(done, "the test bed did not finish");
    // The daemon's own live straggler index (no master here) reads the same host windows from
    // the host samples its router hands over with the steps: its report calls the two ranks
    // as the offline one below does.
    let live_dir = state.join("results").join("straggler");
    let live_report = || -> Option<Value> {
        let f = std::fs::read_dir(&live_dir).ok()?.flatten().next()?;
        serde_json::from_slice(&std::fs::read(f.path()).ok()?).ok()
    };
    let class_of = |report: &Value, r: i64| -> Value {
        report["ranks"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["rank"] == r))
            .map_or(Value::Null, |x| x["class"].clone())
    };
    let live_agrees = |rep: &Value| {
        class_of(rep, STARVED) == "cpu-starved" && class_of(rep, SLOW) == "compute-slow"
    };
    wait_until(Duration::from_secs(20), || {
        live_report().is_some_and(|r| live_agrees(&r))
    });
    host_instruments_in_metrics(&addr, &host);
    let live = live_report().unwrap_or(Value::Null);
    assert!(
        live_agrees(&live),
        "the live report (results/straggler/) disagrees: rank {STARVED} {}, rank {SLOW} {}: {live:#}",
        class_of(&live, STARVED),
        class_of(&live, SLOW)
    );
    // Let the recorder write the last intervals and seal the host stream.
    std::thread::sleep(Duration::from_secs(2));
    drop(daemon);

    let o = agent(&["straggler", out.path().to_str().unwrap(), "--json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler --json: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let rank = |r: i64| {
        report["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["rank"] == r)
            .cloned()
            .unwrap_or(Value::Null)
    };
    for r in 0..8 {
        eprintln!(
            "rank {r}: class {} index {} shares {}",
            rank(r)["class"],
            rank(r)["root_index"],
            rank(r)["host_shares"]
        );
    }
    let starved = rank(STARVED);
    let slow = rank(SLOW);
    assert_eq!(starved["class"], "cpu-starved", "{starved:#}");
    assert_eq!(slow["class"], "compute-slow", "{slow:#}");
    let share = |v: &Value, k: &str| v["host_shares"][k].as_f64().unwrap_or(-1.0);
    assert!(share(&starved, "runnable_pct") >= 20.0, "{starved:#}");
    assert!(
        share(&slow, "blocked_pct") > share(&slow, "runnable_pct"),
        "{slow:#}"
    );
    for v in [&starved, &slow] {
        let sum = share(v, "on_cpu_pct") + share(v, "runnable_pct") + share(v, "blocked_pct");
        assert!((99.0..=101.0).contains(&sum), "shares add up: {v:#}");
    }
}

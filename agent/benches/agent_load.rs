//! Agent cost under load: `RANKS` producer processes, each the real plugin (dlopened, driven
//! through its ABI table at `RATE` collectives/s) writing its ring and segments, and one
//! `comminsight-agent run` following them. Reports the agent's CPU (share of one core, from
//! /proc/<pid>/stat over the measured window) and its peak RSS, for three configurations in the
//! same run: ingest + metrics only, + raw zstd archive, + Parquet.
//!
//! ```text
//! cargo build --release -p comminsight-plugin
//! cargo bench -p comminsight-agent --bench agent_load                 # 8 ranks x 20k ops/s, 20 s
//! cargo bench -p comminsight-agent --bench agent_load -- 8 20000 30
//! ```

#[path = "../../plugin/benches/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["producer", rate, secs] => producer(rate.parse().unwrap(), secs.parse().unwrap()),
        [ranks, rate, secs] => table(
            ranks.parse().unwrap(),
            rate.parse().unwrap(),
            secs.parse().unwrap(),
        ),
        _ => table(8, 20_000, 20.0),
    }
}

/// One rank: collectives at `rate`/s for `secs`, then finalize (seals its last segment).
fn producer(rate: u64, secs: f64) {
    let p = common::load();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let mut t = 1_764_000_000_000_000_000u64;
    loop {
        for _ in 0..64 {
            n += 1;
            t += 10_000;
            p.collective(n, t);
        }
        let now = Instant::now();
        if now >= end {
            break;
        }
        let due = t0 + Duration::from_secs_f64(n as f64 / rate as f64);
        if due > now {
            std::thread::sleep(due - now);
        }
    }
    p.finalize();
}

fn table(ranks: u32, rate: u64, secs: f64) {
    println!(
        "agent under load: {ranks} ranks x {rate} ops/s for {secs} s (real plugin producers; agent = bench-profile build)"
    );
    println!(
        "{:<32} {:>10} {:>10} {:>12} {:>12} {:>11}",
        "configuration", "ops/s", "agent CPU", "peak RSS", "(private)", "ops counted"
    );
    for (name, archive, parquet, level) in [
        ("ingest + metrics", false, false, 1),
        ("+ archive raw (zstd -3)", true, false, -3),
        ("+ archive raw (zstd 1)", true, false, 1),
        ("+ archive raw (zstd 1) + Parquet", true, true, 1),
    ] {
        let r = one(ranks, rate, secs, archive, parquet, level);
        println!(
            "{name:<32} {:>10.0} {:>9.2}% {:>8.1} MiB {:>8.1} MiB {:>11}",
            r.records as f64 / r.window_s,
            r.cpu_share * 100.0,
            r.peak_rss as f64 / (1 << 20) as f64,
            r.peak_anon as f64 / (1 << 20) as f64,
            r.records
        );
    }
}

struct Outcome {
    records: u64,
    window_s: f64,
    cpu_share: f64,
    peak_rss: u64,
    peak_anon: u64,
}

fn one(ranks: u32, rate: u64, secs: f64, archive: bool, parquet: bool, level: i32) -> Outcome {
    let dir = PathBuf::from(format!(
        "/dev/shm/comminsight-agent-bench-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let (logs, shm, state, arc) = (
        dir.join("logs"),
        dir.join("shm"),
        dir.join("state"),
        dir.join("archive"),
    );
    for d in [&logs, &shm, &state] {
        std::fs::create_dir_all(d).unwrap();
    }
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{}\"\n[sources]\nshm_dir = \"{}\"\nsegment_dirs = [\"{}\"]\n[master]\nlisten = \"\"\n[archive]\nenabled = {archive}\nparquet = {parquet}\nzstd_level = {level}\ndir = \"{}\"\n[log]\nlevel = \"warn\"\n",
            state.display(),
            shm.display(),
            logs.display(),
            arc.display()
        ),
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the agent");
    let exe = std::env::current_exe().unwrap();
    let producers: Vec<_> = (0..ranks)
        .map(|i| {
            Command::new(&exe)
                .args(["producer", &rate.to_string(), &secs.to_string()])
                .env("COMMINSIGHT_LOG_DIR", &logs)
                .env("COMMINSIGHT_SHM_DIR", &shm)
                .env("COMMINSIGHT_JOB_ID", "bench")
                // Seal a segment every ~3 s per rank so archiving runs inside the window.
                .env("COMMINSIGHT_SEGMENT_BYTES", (8u64 << 20).to_string())
                .env("COMMINSIGHT_HOSTNAME", format!("h{i}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a producer")
        })
        .collect();
    // Measure the middle of the run: skip 2 s of start-up, stop 1 s before the end.
    std::thread::sleep(Duration::from_secs(2));
    let pid = agent.id();
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    let window = Duration::from_secs_f64((secs - 3.0).max(1.0));
    let mut peak = 0u64;
    let mut peak_anon = 0u64;
    while t0.elapsed() < window {
        peak = peak.max(rss(pid));
        peak_anon = peak_anon.max(rss_anon(pid));
        std::thread::sleep(Duration::from_millis(250));
    }
    let (c1, w) = (cpu_ticks(pid), t0.elapsed().as_secs_f64());
    for mut p in producers {
        p.wait().unwrap();
    }
    peak = peak.max(rss(pid));
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = agent.wait();
    let records = ingested(&state);
    let _ = std::fs::remove_dir_all(&dir);
    Outcome {
        records,
        window_s: secs,
        cpu_share: (c1 - c0) as f64 / ticks_per_s() / w,
        peak_rss: peak,
        peak_anon,
    }
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm field: state is f[0]; utime and stime are fields 14 and 15 of stat.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn ticks_per_s() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn rss(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// Private (anonymous) resident memory: RSS without the plugins' shared ring pages.
fn rss_anon(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:")
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

/// Operations the agent counted (sum of `ops` over the job's series in its results).
fn ingested(state: &Path) -> u64 {
    let text = std::fs::read_to_string(state.join("results/metrics.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v.pointer("/jobs/bench/series")
        .and_then(|s| s.as_array())
        .map_or(0, |a| {
            a.iter()
                .filter_map(|x| x.pointer("/values/ops").and_then(|o| o.as_u64()))
                .sum()
        })
}

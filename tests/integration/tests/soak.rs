//! Soak: `RANKS` producer processes (the real plugin, dlopened and driven through its ABI table,
//! each writing its ring and segments) at `RATE` collectives/s each, followed by one
//! `comminsight-agent run` with everything on: the raw archive and Parquet, OTLP export to the
//! official-proto receiver, the Prometheus endpoint scraped every second, the master link (this
//! agent is its job's master), port counter sampling from the real `/sys`, and the eBPF probes
//! when the BPF object is built (CI builds it).
//!
//! Measured and checked: the agent's RSS every 2 s (the slope over the second half of the run
//! must stay under [`MAX_SLOPE_MIB_PER_MIN`]), its CPU (`utime + stime` over the run), the
//! records the plugins wrote against those the agent ingested (no drop while it keeps up), and
//! the archive against the segments (every written seq archived exactly once).
//!
//! In `cargo xtask test`: 2 minutes at 8 x 25 k ops/s, against the dev-profile agent CI builds
//! (opt-level 1: its archive writes ~210 k records/s on CI's 2 cores, so at 8 x 50 k it falls
//! behind by design and the run would mostly wait for it). The 30-minute soak of issue 23 runs
//! release builds at 8 x 50 k (BENCHMARKS.md "Soak"):
//!
//! ```text
//! cargo build --release -p comminsight-agent --bin comminsight-agent
//! cargo build --release -p comminsight-plugin    # one command with --bin would skip the plugin
//! COMMINSIGHT_BIN_DIR=$PWD/target/release COMMINSIGHT_SOAK_PLUGIN=$PWD/target/release/libnccl_profiler_comminsight.so \
//!   COMMINSIGHT_SOAK_S=1800 COMMINSIGHT_SOAK_RATE=50000 \
//!   cargo test -p comminsight-tests --test soak -- --nocapture
//! ```
//!
//! `COMMINSIGHT_SOAK_S`, `COMMINSIGHT_SOAK_RANKS`, `COMMINSIGHT_SOAK_RATE` change the defaults;
//! the table printed at the end goes into BENCHMARKS.md.

#[path = "../../../plugin/benches/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_tests::*;
use comminsight_wire::record::{Kind, FLAG_REPEAT};
use comminsight_wire::segment::{decode_segment_bytes, find_segments};

const ROLE: &str = "COMMINSIGHT_SOAK_ROLE";
/// RSS growth allowed over the second half of the run (MiB per minute): a leak of one byte per
/// record is 24 MiB/min at this load; allocator high-water steps of a short run stay below.
const MAX_SLOPE_MIB_PER_MIN: f64 = 4.0;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One rank: collectives at `rate`/s for `secs`, then finalize (seals its last segment).
#[test]
#[ignore = "a producer process of `soak_8_ranks_everything_on` (re-executed by it)"]
fn soak_producer() {
    let Ok(spec) = std::env::var(ROLE) else {
        return;
    };
    let (rate, secs) = spec.split_once(',').expect("rate,secs");
    let (rate, secs): (u64, f64) = (rate.parse().unwrap(), secs.parse().unwrap());
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
    println!("issued {n}");
}

/// `(utime + stime)` ticks, `VmRSS` and `RssAnon` (bytes) of `pid`.
fn sample(pid: u32) -> (u64, u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |x| x.1)
        .split_whitespace()
        .collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (tick(11) + tick(12), kib("VmRSS:"), kib("RssAnon:"))
}

/// Least-squares slope of `(seconds, bytes)` in MiB per minute.
fn slope_mib_per_min(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in points {
        num += (x - mx) * (y - my);
        den += (x - mx) * (x - mx);
    }
    if den == 0.0 {
        0.0
    } else {
        num / den * 60.0 / (1 << 20) as f64
    }
}

/// The seqs of one stream as a bitmap (a stream's seqs are dense from 0), with repeats counted.
#[derive(Debug, Default)]
struct SeqSet {
    bits: Vec<u64>,
    count: u64,
    dups: u64,
}

impl SeqSet {
    fn add(&mut self, seq: u64) {
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        if self.bits[w] >> b & 1 == 1 {
            self.dups += 1;
        } else {
            self.bits[w] |= 1 << b;
            self.count += 1;
        }
    }

    /// The first seq in one set and not the other, if any.
    fn first_difference(&self, other: &SeqSet) -> Option<u64> {
        let n = self.bits.len().max(other.bits.len());
        (0..n).find_map(|w| {
            let x =
                self.bits.get(w).copied().unwrap_or(0) ^ other.bits.get(w).copied().unwrap_or(0);
            (x != 0).then(|| w as u64 * 64 + u64::from(x.trailing_zeros()))
        })
    }

    fn same_seqs(&self, other: &SeqSet) -> bool {
        let trim = |v: &[u64]| v.len() - v.iter().rev().take_while(|w| **w == 0).count();
        self.bits[..trim(&self.bits)] == other.bits[..trim(&other.bits)]
    }
}

type Seqs = BTreeMap<String, SeqSet>;

fn keep(r: &comminsight_wire::Record) -> bool {
    r.flags & FLAG_REPEAT == 0 && r.kind() != Kind::Segment
}

/// Seqs of the plugins' sealed segments under `logs`, per `<job>/<host>/<pid>`, read as they
/// seal: the plugin keeps `COMMINSIGHT_RETENTION_BYTES` (1 GiB) of sealed segments per process
/// and deletes older ones (a 30-minute run writes ~11 GiB per rank), so the written seqs are
/// taken while the files are there (a sealed segment stays ~160 s at 50 k ops/s).
#[derive(Default)]
struct SegmentTap {
    seen: std::collections::HashSet<std::path::PathBuf>,
    seqs: Seqs,
    /// Each sealed segment read: `<job>/<host>/<pid>/seg-N.cis` -> (length, hash of its bytes).
    sums: BTreeMap<String, (usize, u64)>,
    /// Sealed segments with records that do not decode: (path, count, the first one); a copy
    /// of each is kept in `<out>/bad-segments/`.
    bad: Vec<String>,
}

fn hash_of(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The first undecodable record of `seg`: its index, the error and its first 32 bytes.
fn first_bad(bytes: &[u8], seg: &comminsight_wire::segment::SegmentRead) -> String {
    let Some((i, e)) = seg.bad.first() else {
        return String::new();
    };
    let at = *i as usize * comminsight_wire::RECORD_SIZE;
    let head: Vec<String> = bytes[at..(at + 32).min(bytes.len())]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "record {i} of {}: {e}; bytes {}",
        bytes.len() / 128,
        head.join("")
    )
}

impl SegmentTap {
    fn poll(&mut self, logs: &Path) {
        for f in find_segments(logs).expect("segments") {
            if self.seen.contains(&f) {
                continue;
            }
            // An open segment is read once sealed (renamed `.cis`).
            if f.extension().is_some_and(|e| e == "open") {
                continue;
            }
            // Deleted by the plugin's retention between listing and reading: it was read on an
            // earlier poll or the run fails below (its seqs missing from the written ones).
            let Ok(bytes) = std::fs::read(&f) else {
                continue;
            };
            let seg = decode_segment_bytes(&bytes);
            let rel = f.strip_prefix(logs).unwrap();
            if !seg.bad.is_empty() {
                let keep = logs.parent().unwrap().join("bad-segments").join(rel);
                std::fs::create_dir_all(keep.parent().unwrap()).unwrap();
                let _ = std::fs::write(&keep, &bytes);
                self.bad.push(format!(
                    "{}: {} bad records when sealed, {}",
                    rel.display(),
                    seg.bad.len(),
                    first_bad(&bytes, &seg)
                ));
            }
            self.sums.insert(
                rel.to_string_lossy().into_owned(),
                (bytes.len(), hash_of(&bytes)),
            );
            let key = rel.parent().unwrap();
            let v = self
                .seqs
                .entry(key.to_string_lossy().into_owned())
                .or_default();
            seg.records
                .iter()
                .filter(|r| keep(r))
                .for_each(|r| v.add(r.seq));
            self.seen.insert(f);
        }
    }
}

/// Whether every sealed segment now under `logs` has its archived copy under `raw`.
fn all_archived(logs: &Path, raw: &Path) -> bool {
    let sealed = files_ending(logs, ".cis");
    !sealed.is_empty()
        && sealed.iter().all(|f| {
            let rel = f.strip_prefix(logs).unwrap();
            raw.join(format!("{}.zst", rel.display())).is_file()
        })
}

/// Seqs of the archive's raw segments under `raw`, per `<job>/<host>/<pid>`; each archived
/// segment must decode whole and be byte for byte the segment the plugin sealed (`tap`).
fn archived(raw: &Path, tap: &SegmentTap) -> Seqs {
    let mut out = Seqs::new();
    let mut wrong = Vec::new();
    for f in files_ending(raw, ".cis.zst") {
        let key = f.parent().unwrap().strip_prefix(raw).unwrap();
        let mut bytes = Vec::new();
        zstd::stream::read::Decoder::new(std::fs::File::open(&f).unwrap())
            .unwrap()
            .read_to_end(&mut bytes)
            .unwrap();
        let seg = decode_segment_bytes(&bytes);
        let rel = f.strip_prefix(raw).unwrap().to_string_lossy();
        let rel = rel.strip_suffix(".zst").unwrap_or(&rel);
        let sealed = tap.sums.get(rel);
        if !seg.bad.is_empty() || sealed != Some(&(bytes.len(), hash_of(&bytes))) {
            wrong.push(format!(
                "{rel}: archived {} bytes, {} bad ({}); sealed {sealed:?}, archived hash {}",
                bytes.len(),
                seg.bad.len(),
                first_bad(&bytes, &seg),
                hash_of(&bytes)
            ));
        }
        let v = out.entry(key.to_string_lossy().into_owned()).or_default();
        seg.records
            .iter()
            .filter(|r| keep(r))
            .for_each(|r| v.add(r.seq));
    }
    assert!(
        wrong.is_empty() && tap.bad.is_empty(),
        "archived segments that differ from the sealed ones or do not decode:\n{}\n\
         sealed segments with undecodable records:\n{}",
        wrong.join("\n"),
        tap.bad.join("\n")
    );
    out
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.retain(|f| f.to_string_lossy().ends_with(suffix));
    files
}

fn config(dir: &Path, otlp_port: u16, probes: bool) -> std::path::PathBuf {
    let p = dir.join("agent.toml");
    std::fs::write(
        &p,
        format!(
            r#"[agent]
state_dir = "{state}"
[sources]
shm_dir = "{shm}"
segment_dirs = ["{logs}"]
[archive]
enabled = true
parquet = true
dir = "{archive}"
[otlp]
enabled = true
endpoint = "http://127.0.0.1:{otlp_port}"
export_interval_ms = 5000
[ports]
enabled = true
interval_ms = 1000
[probes]
enabled = {probes}
[log]
level = "warn"
"#,
            state = dir.join("state").display(),
            shm = dir.join("shm").display(),
            logs = dir.join("logs").display(),
            archive = dir.join("archive").display(),
        ),
    )
    .unwrap();
    p
}

/// The agent's Prometheus endpoint, read from its state directory's `http.addr` or the log.
fn scrape(addr: &str) -> Option<usize> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.starts_with("HTTP/1.").then_some(body.len())
}

struct Measured {
    secs: f64,
    cpu_share: f64,
    rss: Vec<(f64, f64)>,
    peak_rss: u64,
    peak_anon: u64,
    scrapes: u32,
}

fn measure(
    agent: u32,
    secs: u64,
    http: Option<&str>,
    producers: &mut [Child],
    (tap, logs): (&mut SegmentTap, &Path),
) -> Measured {
    let ticks = 100.0; // USER_HZ on Linux
    let (c0, _, _) = sample(agent);
    let t0 = Instant::now();
    let mut m = Measured {
        secs: 0.0,
        cpu_share: 0.0,
        rss: Vec::new(),
        peak_rss: 0,
        peak_anon: 0,
        scrapes: 0,
    };
    let mut next = Duration::ZERO;
    while producers
        .iter_mut()
        .any(|p| p.0.try_wait().ok().flatten().is_none())
    {
        if t0.elapsed() >= next {
            let (_, rss, anon) = sample(agent);
            m.rss.push((t0.elapsed().as_secs_f64(), rss as f64));
            m.peak_rss = m.peak_rss.max(rss);
            m.peak_anon = m.peak_anon.max(anon);
            if http.and_then(scrape).is_some() {
                m.scrapes += 1;
            }
            tap.poll(logs);
            next += Duration::from_secs(2);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs * 2 + 60),
            "the producers did not finish"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (c1, _, _) = sample(agent);
    m.secs = t0.elapsed().as_secs_f64();
    m.cpu_share = (c1 - c0) as f64 / ticks / m.secs;
    m
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The BPF object the agent loads its probes from, when it is built (CI builds it).
fn probes_available() -> bool {
    std::env::var_os("COMMINSIGHT_BPF_OBJECT").is_some_and(|p| Path::new(&p).is_file()) && is_root()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[test]
fn soak_8_ranks_everything_on() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let _one = one_job_at_a_time();
    let secs = env_or("COMMINSIGHT_SOAK_S", 120);
    let ranks = env_or("COMMINSIGHT_SOAK_RANKS", 8);
    let rate = env_or("COMMINSIGHT_SOAK_RATE", 25_000);
    let out = OutDir::new("soak");
    let dir = out.path();
    for d in ["logs", "shm", "state"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let otlp_port = free_port();
    let _receiver = backends::otlp_receiver(&dir.join("otlp.jsonl"), otlp_port);
    let probes = probes_available();
    let cfg = config(dir, otlp_port, probes);
    let http = format!("127.0.0.1:{}", free_port());
    let master = format!("127.0.0.1:{}", free_port());
    let mut agent = start_agent_env(
        &cfg,
        &dir.join("agent.log"),
        &[
            ("COMMINSIGHT_HTTP_LISTEN", http.as_str()),
            ("COMMINSIGHT_MASTER_LISTEN", master.as_str()),
        ],
    );
    assert!(
        wait_until(Duration::from_secs(30), || scrape(&http).is_some()),
        "the agent's endpoint did not come up: {}",
        std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
    );
    let plugin = std::env::var_os("COMMINSIGHT_SOAK_PLUGIN").map_or_else(
        || lib_dir().join("libnccl-profiler-comminsight.so"),
        Into::into,
    );
    let exe = std::env::current_exe().unwrap();
    let mut producers: Vec<Child> = (0..ranks)
        .map(|i| {
            Child(
                Command::new(&exe)
                    .args([
                        "--exact",
                        "soak_producer",
                        "--include-ignored",
                        "--nocapture",
                    ])
                    .env(ROLE, format!("{rate},{secs}"))
                    .env("COMMINSIGHT_BENCH_PLUGIN", &plugin)
                    .env("COMMINSIGHT_LOG_DIR", dir.join("logs"))
                    .env("COMMINSIGHT_SHM_DIR", dir.join("shm"))
                    .env("COMMINSIGHT_JOB_ID", "soak")
                    // The plugin's default 64 MiB segments: one sealed every ~10 s per rank, so
                    // archiving runs all along, at the size a site gets.
                    .env("COMMINSIGHT_HOSTNAME", format!("h{i}"))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start a producer"),
            )
        })
        .collect();
    let mut tap = SegmentTap::default();
    let logs = dir.join("logs");
    let m = measure(
        agent.pid(),
        secs,
        Some(&http),
        &mut producers,
        (&mut tap, &logs),
    );
    let mut issued = 0u64;
    for p in &mut producers {
        let mut s = String::new();
        p.0.stdout.take().unwrap().read_to_string(&mut s).unwrap();
        issued += s
            .lines()
            .find_map(|l| l.strip_prefix("issued "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .expect("a producer's count");
    }
    tap.poll(&logs); // the segments sealed at finalize
    report_and_check(
        dir,
        &mut agent,
        &m,
        tap,
        (ranks, rate, secs, issued, probes),
    );
}

/// Coll rows of the Parquet archive (read by DuckDB).
fn parquet_colls(archive: &Path) -> u64 {
    let q = format!(
        "import duckdb\n\
         t = \"read_parquet('{}/parquet/**/*.parquet', hive_partitioning=true)\"\n\
         print(duckdb.sql(f\"select count(*) from {{t}} where kind = 'coll'\").fetchall()[0][0])\n",
        archive.display()
    );
    let res = Command::new(test_tool("venv/bin/python"))
        .arg("-c")
        .arg(&q)
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "duckdb: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    String::from_utf8_lossy(&res.stdout).trim().parse().unwrap()
}

/// After the producers: the archive completes, the agent stops cleanly, and the numbers.
fn report_and_check(
    dir: &Path,
    agent: &mut Child,
    m: &Measured,
    tap: SegmentTap,
    (ranks, rate, secs, issued, probes): (u64, u64, u64, u64, bool),
) {
    let (logs, raw) = (dir.join("logs"), dir.join("archive/raw"));
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let t_end = Instant::now();
    // Every sealed segment archived (file names: cheap); the seqs are compared once after.
    let complete = wait_until(Duration::from_secs(secs + 60), || all_archived(&logs, &raw));
    let catch_up = t_end.elapsed().as_secs_f64();
    let a = archived(&raw, &tap);
    let w = tap.seqs;
    assert!(
        complete,
        "the archive did not catch up in {} s; log:\n{}",
        secs + 60,
        log()
    );
    let pid = agent.pid().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let stopped = agent.0.wait().unwrap();
    let mut written_total = 0;
    assert_eq!(w.len() as u64, ranks, "streams written");
    for (k, seqs) in &w {
        let got = &a[k];
        assert!(
            seqs.same_seqs(got) && seqs.dups == 0 && got.dups == 0,
            "{k}: archived seqs differ from written ones ({} written, {} archived, {} repeated; \
             first seq in one only: {:?})",
            seqs.count,
            got.count,
            got.dups,
            seqs.first_difference(got)
        );
        written_total += seqs.count;
    }
    let colls = parquet_colls(&dir.join("archive"));
    let half: Vec<(f64, f64)> = m
        .rss
        .iter()
        .copied()
        .filter(|(t, _)| *t >= m.secs / 2.0)
        .collect();
    let slope = slope_mib_per_min(&half);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "soak: {ranks} ranks x {rate} ops/s for {secs} s (probes {}, agent at {})",
        if probes { "on" } else { "off" },
        bin_dir().display()
    );
    println!(
        "  collectives issued        {issued} ({:.0}/s)",
        issued as f64 / m.secs
    );
    println!(
        "  records written           {written_total} in {} streams",
        w.len()
    );
    println!(
        "  records archived (raw)    {} (equal per stream, no duplicate)",
        a.values().map(|s| s.count).sum::<u64>()
    );
    println!("  coll rows in Parquet      {colls}");
    println!("  archive caught up         {catch_up:.1} s after the producers ended");
    println!(
        "  agent CPU                 {:.1} % of one core over {:.0} s",
        m.cpu_share * 100.0,
        m.secs
    );
    println!("  agent RSS                 peak {:.1} MiB (private {:.1} MiB), slope {slope:+.2} MiB/min over the second half", mib(m.peak_rss), mib(m.peak_anon));
    println!(
        "  RSS samples (s, MiB)      {}",
        m.rss
            .iter()
            .step_by((m.rss.len() / 12).max(1))
            .map(|(t, r)| format!("{t:.0}:{:.1}", r / (1 << 20) as f64))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("  Prometheus scrapes        {}", m.scrapes);
    let otlp = std::fs::read_to_string(dir.join("otlp.jsonl")).unwrap_or_default();
    let exports = otlp.lines().filter(|l| l.contains("\"metrics\"")).count();
    println!("  OTLP metric exports       {exports}");
    assert!(
        exports as f64 >= m.secs / 5.0 * 0.5,
        "OTLP exports missing: {exports}"
    );
    assert!(
        stopped.success(),
        "the agent's exit on SIGTERM: {stopped}; log:\n{}",
        log()
    );
    assert_eq!(
        colls, issued,
        "Parquet coll rows != collectives issued (drops or duplicates)"
    );
    assert!(
        m.scrapes as f64 >= m.secs / 2.0 * 0.8,
        "Prometheus scrapes failed: {}",
        m.scrapes
    );
    assert!(
        slope < MAX_SLOPE_MIB_PER_MIN,
        "agent RSS grows {slope:.2} MiB/min"
    );
    let l = log();
    assert!(!l.contains("ERROR"), "the agent logged errors:\n{l}");
}

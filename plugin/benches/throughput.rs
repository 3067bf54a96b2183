//! Throughput benchmark: drives the real plugin (dlopened by path, through its ABI table) with
//! DEFAULT plugin settings (only the log and shm directories point at a scratch directory) and
//! reports what the plugin itself says it lost: the final `stats` record of its segments.
//!
//! ```text
//! cargo bench -p comminsight-plugin --bench throughput             # the table below
//! cargo bench -p comminsight-plugin --bench throughput -- case 2000000 4 3 none
//! cargo bench -p comminsight-plugin --bench throughput -- cost poll
//! cargo bench -p comminsight-plugin --bench throughput -- seq 100000 coll   # callgrind driver
//! ```
//! * `case <rate/s, 0 = max> <threads> <secs> <reader>`: collective sequences (one record each)
//!   from `threads` threads, paced to `rate` in total, for `secs`; then finalize and read the
//!   segments. `reader` = `none`, `poll` (a `RingReader` following the ring, polling every 1 ms,
//!   as the agent would) or `spin` (a reader polling without pause: the worst case).
//! * `cost <reader>`: per-sequence cost from one thread (batch medians, wall and thread CPU), with
//!   or without a reader following the ring.
//! * `seq <n> <coll|p2p>`: n sequences and finalize, nothing else (for callgrind).
//!
//! Without arguments every case of the table runs in its own child process (a fresh plugin).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use comminsight_wire::record::{Body, RawRecord};
use comminsight_wire::ring::RingReader;
use comminsight_wire::segment::{find_segments, read_segment};

use common::{load, set_default_env, thread_cpu_ns, Plugin};

/// Sequences between two pacing checks.
const CHUNK: u64 = 256;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["case", rate, threads, secs, reader] => {
            case(
                rate.parse().expect("rate"),
                threads.parse().expect("threads"),
                secs.parse().expect("secs"),
                reader,
            );
        }
        ["cost", reader] => cost(reader),
        ["seq", n, kind] => seq(n.parse().expect("n"), kind),
        [] => table(),
        _ => panic!("usage: see the file header of plugin/benches/throughput.rs"),
    }
}

/// Every case, each in a fresh child process.
fn table() {
    let exe = std::env::current_exe().expect("current_exe");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&exe)
            .args(args)
            .output()
            .expect("spawn");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            panic!("{args:?} failed");
        }
    };
    println!(
        "{:>9} {:>7} {:>6} {:>11} {:>11} {:>10} {:>10} {:>8} {:>8} {:>11} {:>8}",
        "rate/s",
        "threads",
        "reader",
        "achieved/s",
        "ops",
        "recs_pushd",
        "ring_drops",
        "pool_drp",
        "io_lost",
        "reader_read",
        "rd_lost"
    );
    for reader in ["none", "poll"] {
        for (rate, threads) in [("2000000", "1"), ("2000000", "4"), ("0", "1"), ("0", "4")] {
            run(&["case", rate, threads, "3", reader]);
        }
    }
    for reader in ["none", "poll", "spin"] {
        run(&["cost", reader]);
    }
}

/// A reader thread following the plugin's ring (the agent's view). Returns (read, lost).
fn spawn_reader(
    shm: PathBuf,
    mode: &str,
    stop: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<(u64, u64)>> {
    let pause = match mode {
        "none" => return None,
        "poll" => Some(Duration::from_millis(1)),
        "spin" => None,
        m => panic!("reader mode {m}"),
    };
    let path = std::fs::read_dir(&shm)
        .expect("shm dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "ring"))
        .expect("ring file");
    let mut r = RingReader::open(&path).expect("open ring");
    Some(std::thread::spawn(move || {
        let mut buf: Vec<RawRecord> = Vec::with_capacity(4096);
        let (mut read, mut lost) = (0u64, 0u64);
        loop {
            let done = stop.load(Ordering::Acquire);
            loop {
                buf.clear();
                let st = r.read_into(&mut buf, 4096);
                read += st.records as u64;
                lost += st.lost;
                if st.records < 4096 {
                    break;
                }
            }
            if done {
                return (read, lost);
            }
            match pause {
                Some(d) => std::thread::sleep(d),
                None => std::hint::spin_loop(),
            }
        }
    }))
}

/// What the plugin's segments say after the last finalize.
struct Written {
    colls: u64,
    last_stats: Option<comminsight_wire::record::Stats>,
}

fn read_written(log_dir: &Path) -> Written {
    let mut w = Written {
        colls: 0,
        last_stats: None,
    };
    for seg in find_segments(log_dir).unwrap_or_default() {
        let Ok(r) = read_segment(&seg) else { continue };
        for rec in r.records {
            match rec.body {
                Body::Coll(_) => w.colls += 1,
                Body::Stats(s) => w.last_stats = Some(s),
                _ => {}
            }
        }
    }
    w
}

fn dirs() -> (Option<PathBuf>, PathBuf, PathBuf) {
    let tmp = set_default_env(&[]);
    let log = PathBuf::from(std::env::var_os("COMMINSIGHT_LOG_DIR").expect("log dir"));
    let shm = PathBuf::from(std::env::var_os("COMMINSIGHT_SHM_DIR").expect("shm dir"));
    (tmp, log, shm)
}

fn case(rate: u64, threads: u64, secs: f64, reader: &str) {
    let (tmp, log, shm) = dirs();
    let p = Arc::new(load());
    let stop = Arc::new(AtomicBool::new(false));
    let rd = spawn_reader(shm, reader, stop.clone());
    let ops = Arc::new(AtomicU64::new(0));
    let per_thread = rate as f64 / threads as f64;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let (p, ops) = (p.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut t = 1_764_000_000_000_000_000u64 + i * 1_000_000_000_000;
                loop {
                    for _ in 0..CHUNK {
                        n += 1;
                        t += 10_000;
                        p.collective(n, t);
                    }
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    if rate > 0 {
                        let due = t0 + Duration::from_secs_f64(n as f64 / per_thread);
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                    }
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let elapsed = t0.elapsed().as_secs_f64();
    p.finalize();
    stop.store(true, Ordering::Release);
    let (rd_read, rd_lost) = rd.map_or((0, 0), |h| h.join().expect("reader"));
    let ops = ops.load(Ordering::Relaxed);
    let w = read_written(&log);
    let st = w.last_stats.expect("a stats record in the segments");
    let r = if rate == 0 {
        "max".to_string()
    } else {
        rate.to_string()
    };
    println!(
        "{r:>9} {threads:>7} {reader:>6} {:>11.0} {ops:>11} {:>10} {:>10} {:>8} {:>8} {:>11} {:>8}",
        ops as f64 / elapsed,
        st.records_pushed,
        st.ring_drops,
        st.pool_drops,
        st.records_lost_io,
        rd_read,
        rd_lost
    );
    // Segments beyond the retention budget are deleted by design; when none were, every op
    // pushed must be in them.
    if st.segments_deleted == 0 && st.ring_drops == 0 && st.pool_drops == 0 {
        assert_eq!(w.colls, ops, "every op in the segments");
    }
    if let Some(d) = tmp {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Batch-median cost of one collective sequence from one thread, with an optional reader.
fn cost(reader: &str) {
    let (tmp, _log, shm) = dirs();
    let p = load();
    let stop = Arc::new(AtomicBool::new(false));
    let rd = spawn_reader(shm, reader, stop.clone());
    let mut seq = 0u64;
    let mut t = 1_764_000_000_000_000_000u64;
    const BATCHES: usize = 300;
    const PER: u64 = 10_000;
    let mut wall = Vec::with_capacity(BATCHES);
    let mut cpu = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let c0 = thread_cpu_ns();
        let t0 = Instant::now();
        for _ in 0..PER {
            seq += 1;
            t += 10_000;
            p.collective(seq, t);
        }
        wall.push(t0.elapsed().as_nanos() as f64 / PER as f64);
        cpu.push((thread_cpu_ns() - c0) as f64 / PER as f64);
    }
    p.finalize();
    stop.store(true, Ordering::Release);
    let (rd_read, rd_lost) = rd.map_or((0, 0), |h| h.join().expect("reader"));
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    println!(
        "cost reader={reader:<4}: collective sequence wall batch median {:.1} ns (p10 {:.1}, p90 {:.1}), thread-CPU median {:.1} ns; reader read {rd_read} lost {rd_lost}",
        wall[BATCHES / 2],
        wall[BATCHES / 10],
        wall[BATCHES * 9 / 10],
        cpu[BATCHES / 2]
    );
    if let Some(d) = tmp {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// `n` sequences, then finalize (callgrind: `--toggle-collect` on `Plugin::*` or diff two n).
fn seq(n: u64, kind: &str) {
    let (tmp, _log, _shm) = dirs();
    let p: Plugin = load();
    let mut t = 1_764_000_000_000_000_000u64;
    for i in 0..n {
        t += 10_000;
        match kind {
            "coll" => p.collective(i, t),
            "p2p" => p.p2p(t),
            k => panic!("kind {k}"),
        }
    }
    p.finalize();
    if let Some(d) = tmp {
        let _ = std::fs::remove_dir_all(d);
    }
}

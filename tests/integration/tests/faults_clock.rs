//! Issue 23, clock faults: CLOCK_REALTIME stepped by +10 s and by −10 s while a job runs, as
//! an administrator or a broken NTP would step it. Stepping the real clock is not safe on a
//! shared CI machine, so an LD_PRELOAD shim (`tests/clock-step/clockstep.c`, compiled here with
//! `cc`) shifts CLOCK_REALTIME, `gettimeofday` and `time` by an offset the test rewrites in a
//! mapped file; it is loaded into the ranks (through the test bed) and into the agent daemon.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_tests::*;
use comminsight_wire::record::{Body, Kind, FLAG_REPEAT};
use comminsight_wire::segment::{decode_segment_bytes, find_segments, read_segment};

/// `cc -shared` the shim into `dir`; its path.
fn build_shim(dir: &Path) -> PathBuf {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../clock-step/clockstep.c");
    let so = dir.join("clockstep.so");
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
        ])
        .arg(&so)
        .arg(src)
        .arg("-ldl")
        .output()
        .expect("run cc (the clock-step shim is C)");
    assert!(
        o.status.success(),
        "cc clockstep.c: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    so
}

/// The offset file the shim maps: 8 bytes, rewritten in place.
struct Offset(PathBuf);

impl Offset {
    fn new(dir: &Path) -> Offset {
        let p = dir.join("clock-offset");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        Offset(p)
    }
    fn set(&self, secs: i64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.0)
            .unwrap();
        f.write_all_at(&(secs * 1_000_000_000).to_le_bytes(), 0)
            .unwrap();
    }
}

/// Steps rank 0 has finished (its truth file, line-buffered).
fn steps_done(job: &Path) -> usize {
    std::fs::read_to_string(job.join("run/rank-0.json"))
        .unwrap_or_default()
        .matches("\"step_end\"")
        .count()
}

/// `(pid dir, seq)` of every stream record under the segments or the raw archive.
fn seqs(recs: Vec<comminsight_wire::Record>, key: &str, out: &mut Vec<(String, u64)>) {
    out.extend(
        recs.into_iter()
            .filter(|r| r.flags & FLAG_REPEAT == 0 && r.kind() != Kind::Segment)
            .map(|r| (key.to_string(), r.seq)),
    );
}

fn disk_seqs(logs: &Path) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    for f in find_segments(logs).unwrap() {
        let key = f.parent().unwrap().strip_prefix(logs).unwrap();
        let seg = read_segment(&f).unwrap();
        assert!(seg.bad.is_empty());
        seqs(seg.records, &key.to_string_lossy(), &mut v);
    }
    v.sort();
    v
}

fn archive_seqs(raw: &Path) -> Vec<(String, u64)> {
    let mut files = Vec::new();
    walk(raw, &mut files);
    let mut v = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.to_string_lossy().ends_with(".cis.zst"))
    {
        let mut bytes = Vec::new();
        zstd::stream::read::Decoder::new(std::fs::File::open(f).unwrap())
            .unwrap()
            .read_to_end(&mut bytes)
            .unwrap();
        let key = f.parent().unwrap().strip_prefix(raw).unwrap();
        seqs(
            decode_segment_bytes(&bytes).records,
            &key.to_string_lossy(),
            &mut v,
        );
    }
    v.sort();
    v
}

fn agent_config(dir: &Path, shm: &Path, logs: &Path) -> PathBuf {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{d}/state\"\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_dir = \"{shm}\"\nsegment_dirs = [\"{logs}\"]\nscan_interval_ms = 100\n\
             [master]\nlisten = \"\"\n[archive]\ndir = \"{d}/archive\"\nzstd_level = 1\n\
             [probes]\nenabled = false\n[gpu]\nenabled = false\n",
            d = dir.display(),
            shm = shm.display(),
            logs = logs.display()
        ),
    )
    .unwrap();
    config
}

/// Ops the ranks ran (the test bed's truth), asserting every rank finished `steps` steps.
fn truth_ops(job: &Path, steps: usize) -> u64 {
    let t = truth(job);
    let mut n = 0;
    for (rank, v) in t["steps"].as_object().expect("truth steps") {
        let v = v.as_array().unwrap();
        assert_eq!(v.len(), steps, "rank {rank} finished {} steps", v.len());
        n += v
            .iter()
            .map(|r| r[1].as_u64().unwrap() + 1 - r[0].as_u64().unwrap())
            .sum::<u64>();
    }
    n
}

/// One process' records: its ops are sane across the steps (no negative duration, none of
/// 5 s or more invented, no 5 s jump between consecutive ops, all within the job's wall time); its
/// op count and the step its last `stats` calibration pair shows against its `proc_start` one.
fn check_timeline(recs: &[comminsight_wire::Record], wall: Duration) -> (u64, i64) {
    let (mut max_dur, mut ends, mut cal) = (0u64, Vec::new(), (0i64, 0i64));
    for r in recs {
        match &r.body {
            Body::Coll(o) | Body::P2p(o) => {
                assert!(
                    o.enqueue_ns <= o.start_ns && o.start_ns <= o.end_ns,
                    "{o:?}"
                );
                max_dur = max_dur.max(o.end_ns - o.enqueue_ns);
                ends.push(o.end_ns);
            }
            Body::ProcStart(p) => cal.0 = p.real_ns as i64 - p.mono_ns as i64,
            Body::Stats(s) => cal.1 = s.real_ns as i64 - s.mono_ns as i64,
            _ => {}
        }
    }
    ends.sort_unstable();
    let span = ends.last().unwrap() - ends[0];
    let max_gap = ends.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    assert!(
        span <= wall.as_nanos() as u64,
        "ops span {span} ns, job {wall:?}"
    );
    assert!(max_dur < 5_000_000_000, "an op of {max_dur} ns");
    assert!(max_gap < 5_000_000_000, "{max_gap} ns between two ops");
    (ends.len() as u64, cal.1 - cal.0)
}

/// Issue 23, fault 3: CLOCK_REALTIME of the ranks and of the agent daemon steps +10 s after
/// 100 of 400 steps, back by −10 s after 200 and by −10 s more after 300 (4 ranks, ddp).
///
/// * Job: completes with exit 0, every step done.
/// * Lost: nothing. The plugin's timestamps are CLOCK_MONOTONIC + an offset fixed at start, so
///   every op is recorded once (contiguous seqs, op count = the test bed's truth), no duration
///   is negative or 5 s or more (the steps are 10 and 20 s), no two consecutive ops of a rank are 5 s apart, and all ops lie
///   within the job's wall time; the steps show only in the `stats` records' fresh
///   CLOCK_REALTIME pairs (−10 s at exit against `proc_start`'s), which is how they are seen.
/// * Agent: keeps running through the steps, counts every op once, archives every sealed
///   segment exactly once (archived seqs = the plugin's), and its step engine writes steps
///   0..399 once per rank, each under 5 s, covering every op.
#[test]
fn realtime_stepped_forward_and_back_mid_job_loses_and_invents_nothing() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("fault-clock-step");
    let job = out.path().join("job");
    let logs = job.join("inspector_logs");
    let adir = out.path().join("agent");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::create_dir_all(&adir).unwrap();
    let so = build_shim(out.path());
    let off = Offset::new(out.path());
    let shm = ShmDir(PathBuf::from(format!(
        "/dev/shm/comminsight-it-clock-{}",
        std::process::id()
    )));
    let env = [
        ("LD_PRELOAD", so.to_str().unwrap()),
        ("CLOCKSTEP_FILE", off.0.to_str().unwrap()),
    ];
    let alog = out.path().join("agent.log");
    let daemon = start_agent_env(&agent_config(&adir, &shm.0, &logs), &alog, &env);
    let t0 = Instant::now();
    let mut tb = Child(
        Command::new(bin_dir().join("comminsight-testbed"))
            .arg("run")
            .arg("--out")
            .arg(&job)
            .arg("--scenario")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../scenarios/ddp.toml"
            ))
            .args([
                "--ranks", "4", "--hosts", "1", "--steps", "400", "--job", "clock",
            ])
            .env("COMMINSIGHT_LIB_DIR", lib_dir())
            .env("COMMINSIGHT_SHM_DIR", &shm.0)
            .env("COMMINSIGHT_SEGMENT_BYTES", "65536")
            .envs(env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the test bed"),
    );
    for (at, secs) in [(100, 10), (200, 0), (300, -10)] {
        assert!(
            wait_until(Duration::from_secs(60), || steps_done(&job) >= at),
            "rank 0 did {} steps",
            steps_done(&job)
        );
        off.set(secs);
    }
    let st = tb.0.wait().unwrap();
    let wall = t0.elapsed();
    assert!(st.success(), "the job failed across the clock steps: {st}");
    let want = truth_ops(&job, 400);

    // The plugin: every op once, on a timeline that never stepped.
    let mut ops = 0;
    for dir in std::fs::read_dir(logs.join("clock/host0")).unwrap() {
        let dir = dir.unwrap().path();
        let (n, shift) = check_timeline(&records(&dir), wall);
        ops += n;
        assert!(
            (shift + 10_000_000_000).abs() < 1_000_000_000,
            "{}: the stats pair moved {shift} ns (the shim did not reach the plugin?)",
            dir.display()
        );
    }
    assert_eq!(ops, want, "ops on disk vs truth");
    let disk = disk_seqs(&logs);
    let mut dedup = disk.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), disk.len(), "duplicate seqs on disk");

    agent_saw_everything_once(daemon, &adir, &alog, want, &disk);
    eprintln!(
        "clock steps: job {wall:?}, {ops} ops on disk and in the agent, {} records archived once",
        disk.len()
    );
}

/// The daemon's step rows of job `clock` (`results/steps/clock/<host>/<pid>.jsonl`): their
/// number and ops, asserting steps 0.. each once per rank and every duration under 5 s.
fn step_rows(adir: &Path) -> (usize, u64) {
    let mut files = Vec::new();
    walk(&adir.join("state/results/steps/clock"), &mut files);
    let (mut rows, mut ops) = (0, 0);
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "jsonl"))
    {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (i, l) in text.lines().enumerate() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["step"], i, "{}: step rows in order, once", f.display());
            let d = v["duration_us"].as_u64().unwrap();
            assert!(d < 5_000_000, "{}: a step of {d} us: {v}", f.display());
            ops += v["ops"].as_u64().unwrap();
            rows += 1;
        }
    }
    (rows, ops)
}

/// Op records the daemon counted for job `job` (its `results/metrics.json`).
fn agent_json(adir: &Path, file: &str, job: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(adir.join("state").join(file)).unwrap_or_default())
            .unwrap_or_default();
    v["jobs"][job]["series"].as_array().map_or(0, |s| {
        s.iter()
            .map(|x| x["values"]["ops"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// The agent daemon through the steps: every op once (`want`), every sealed segment archived
/// once (archived seqs = `disk`), steps 0..399 once per rank; its own clock was shifted too;
/// it stops cleanly with no error logged.
fn agent_saw_everything_once(
    mut daemon: Child,
    adir: &Path,
    alog: &Path,
    want: u64,
    disk: &[(String, u64)],
) {
    let ckpt = |k: &str| agent_json(adir, "results/metrics.json", k);
    assert!(
        wait_until(Duration::from_secs(30), || ckpt("clock") == want
            && archive_seqs(&adir.join("archive/raw")) == *disk),
        "agent: {} of {want} ops, {} of {} records archived; log:\n{}",
        ckpt("clock"),
        archive_seqs(&adir.join("archive/raw")).len(),
        disk.len(),
        std::fs::read_to_string(alog).unwrap_or_default()
    );
    assert!(
        wait_until(Duration::from_secs(20), || step_rows(adir) == (1600, want)),
        "agent steps (rows, ops): {:?}",
        step_rows(adir)
    );
    assert!(daemon.0.try_wait().unwrap().is_none(), "the agent died");
    // The shim reached the agent too: its status is stamped 10 s behind this process' clock.
    let behind_ms = || {
        let v: serde_json::Value = serde_json::from_slice(
            &std::fs::read(adir.join("state/status.json")).unwrap_or_default(),
        )
        .unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        now - v["taken_unix_ms"].as_i64().unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(10), || (9_000..11_000)
            .contains(&behind_ms())),
        "agent status {} ms behind",
        behind_ms()
    );
    let pid = daemon.pid().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    assert!(daemon.0.wait().unwrap().success());
    let log = std::fs::read_to_string(alog).unwrap();
    assert!(!log.contains("ERROR") && !log.contains("panicked"), "{log}");
}

//! Issue 23, storage faults: a full `/dev/shm` and a log disk that fills mid-job, each on a
//! small tmpfs mounted by the test (root; CI runs as root; unmounted by a guard even when the
//! test fails), with a root agent daemon following the job. Each test states what the job saw,
//! what was lost and where it is counted, and how observation recovered.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_tests::*;
use comminsight_wire::record::{Body, Kind, FLAG_REPEAT};
use comminsight_wire::segment::{find_segments, read_segment};

fn scenario() -> String {
    format!(
        "{}/../../tests/scenarios/ddp.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// An agent daemon config: rings under `shm`, segments under `logs`, state and archive in `dir`.
fn agent_config(dir: &Path, shm: &Path, logs: &Path) -> PathBuf {
    let config = dir.join("agent.toml");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{d}/state\"\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_dir = \"{shm}\"\nsegment_dirs = [\"{logs}\"]\nscan_interval_ms = 100\n\
             [master]\nlisten = \"\"\n[archive]\ndir = \"{d}/archive\"\nzstd_level = 1\n\
             [straggler]\nenabled = false\n[probes]\nenabled = false\n[gpu]\nenabled = false\n",
            d = dir.display(),
            shm = shm.display(),
            logs = logs.display()
        ),
    )
    .unwrap();
    config
}

/// A `--python` for the test bed that points the plugin's segment root at `logs` (the test
/// bed itself sets `COMMINSIGHT_LOG_DIR=<out>/inspector_logs`; its own outputs stay there).
fn python_with_log_dir(dir: &Path, logs: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let tag = logs.file_name().unwrap().to_string_lossy();
    let p = dir.join(format!("python-{tag}.sh"));
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\nCOMMINSIGHT_LOG_DIR='{}' exec python3 \"$@\"\n",
            logs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// `comminsight-testbed run` in the background (ddp, 4 ranks, 1 host, 1 MiB rings: a whole stream fits, a ring follower is never lapped).
fn spawn_job(out: &Path, steps: &str, job: &str, python: Option<&Path>, shm: &Path) -> Child {
    let mut c = Command::new(bin_dir().join("comminsight-testbed"));
    c.arg("run").arg("--out").arg(out).args([
        "--scenario",
        &scenario(),
        "--ranks",
        "4",
        "--hosts",
        "1",
        "--steps",
        steps,
        "--job",
        job,
        "--timeout",
        "60",
    ]);
    if let Some(p) = python {
        c.arg("--python").arg(p);
    }
    c.env("COMMINSIGHT_LIB_DIR", lib_dir())
        .env("COMMINSIGHT_SHM_DIR", shm)
        .env("COMMINSIGHT_SEGMENT_BYTES", "65536")
        .env("COMMINSIGHT_RING_BYTES", "1048576")
        .env("NCCL_DEBUG", "WARN")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Child(c.spawn().expect("start the test bed"))
}

/// Wait for the job; its exit status and wall time.
fn finish(mut job: Child, t0: Instant) -> (std::process::ExitStatus, Duration) {
    let st = job.0.wait().expect("test bed");
    (st, t0.elapsed())
}

/// Every rank's log (`<out>/ranks/rank-N.log`), concatenated.
fn rank_logs(out: &Path) -> String {
    let mut files = Vec::new();
    walk(&out.join("ranks"), &mut files);
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect()
}

/// Op records the daemon counted for `job` (its `results/metrics.json`).
fn agent_ops(dir: &Path, job: &str) -> u64 {
    let p = dir.join("state/results/metrics.json");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&p).unwrap_or_default()).unwrap_or_default();
    v["jobs"][job]["series"].as_array().map_or(0, |s| {
        s.iter()
            .map(|x| x["values"]["ops"].as_u64().unwrap_or(0))
            .sum()
    })
}

/// SIGTERM (as systemd stops it), then the exit status.
fn terminate(c: &mut Child) -> std::process::ExitStatus {
    let pid = c.pid().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    c.0.wait().unwrap()
}

/// Stream records (no segment headers, no preamble repeats) of every segment under `dir`,
/// `.open` ones included; asserts every record decodes (a torn tail is ignored by the reader).
fn disk_records(dir: &Path) -> Vec<comminsight_wire::Record> {
    let mut out = Vec::new();
    for f in find_segments(dir).expect("segments") {
        let seg = read_segment(&f).expect("read segment");
        assert!(seg.bad.is_empty(), "{}: {:?}", f.display(), seg.bad);
        out.extend(
            seg.records
                .into_iter()
                .filter(|r| r.flags & FLAG_REPEAT == 0 && r.kind() != Kind::Segment),
        );
    }
    out
}

/// Ops the ranks ran (the test bed's truth), asserting every rank finished `steps` steps.
fn truth_ops(out: &Path, steps: usize) -> u64 {
    let t = truth(out);
    let by_rank = t["steps"].as_object().expect("truth steps");
    assert_eq!(by_rank.len(), 4, "4 ranks");
    let mut n = 0;
    for (rank, v) in by_rank {
        let v = v.as_array().unwrap();
        assert_eq!(v.len(), steps, "rank {rank} finished {} steps", v.len());
        n += v
            .iter()
            .map(|r| r[1].as_u64().unwrap() + 1 - r[0].as_u64().unwrap())
            .sum::<u64>();
    }
    n
}

fn coll_count(recs: &[comminsight_wire::Record]) -> usize {
    recs.iter()
        .filter(|r| matches!(r.body, Body::Coll(_) | Body::P2p(_)))
        .count()
}

/// Issue 23, fault 1: `/dev/shm` full when the ranks start.
///
/// * Job: 4 ranks × 100 steps complete with exit 0 in about the wall time of the same job
///   with a working shm dir (bound: 2 × + 5 s), every step done.
/// * Lost: only the live feed (no shared ring can be created): every rank says so in one NCCL
///   WARN line naming the ring path and ENOSPC, and counts it in the plugin's `shm_fallbacks`
///   counter (not part of the `stats` record: the WARN line is what can be seen outside), then
///   keeps a private ring. Nothing else: every collective lands in the segments (op count = the
///   test bed's truth) and the agent daemon counts the same number of ops from them.
/// * Recovered: the space freed, the next job's ranks create their shared rings again (ring
///   files appear, a ring follower reads every op of that job from them) and log no fallback.
#[test]
fn full_dev_shm_falls_back_to_a_private_ring_and_segments_still_land() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("fault-shm-full");
    let fs = Tmpfs::mount(&out.path().join("shm-fs"), "8m");
    let shm = fs.0.join("comminsight");
    let fill = fs.fill("fill", 0);
    assert!(fs.free() < 4096, "tmpfs still has {} bytes free", fs.free());
    let logs = out.path().join("job/inspector_logs");
    std::fs::create_dir_all(&logs).unwrap();
    let adir = out.path().join("agent");
    let mut daemon = start_agent(&agent_config(&adir, &shm, &logs), &out.path().join("a.log"));

    let t0 = Instant::now();
    let base_shm = out.path().join("base-shm");
    let base = spawn_job(&out.path().join("base"), "100", "base", None, &base_shm);
    let (st, base_wall) = finish(base, t0);
    let _ = std::fs::remove_dir_all(&base_shm);
    assert!(st.success(), "unfaulted job: {st}");

    let t0 = Instant::now();
    let job = spawn_job(&out.path().join("job"), "100", "shmfull", None, &shm);
    let (st, wall) = finish(job, t0);
    assert!(st.success(), "the job with /dev/shm full failed: {st}");
    let limit = base_wall * 2 + Duration::from_secs(5);
    assert!(wall <= limit, "job took {wall:?}, unfaulted {base_wall:?}");
    let text = rank_logs(&out.path().join("job"));
    let warns = text
        .lines()
        .filter(|l| l.contains("shared-memory ring unavailable") && l.contains("No space left"))
        .count();
    assert_eq!(warns, 4, "one fallback WARN per rank:\n{text}");

    // Nothing but the live feed was lost: segments hold every op; the daemon counts them.
    let recs = disk_records(&logs);
    let ops = coll_count(&recs) as u64;
    let want = truth_ops(&out.path().join("job"), 100);
    assert_eq!(ops, want, "ops on disk vs the test bed's truth");
    assert!(
        wait_until(Duration::from_secs(20), || agent_ops(&adir, "shmfull")
            == ops),
        "agent counted {} of {ops} ops; its log:\n{}",
        agent_ops(&adir, "shmfull"),
        std::fs::read_to_string(out.path().join("a.log")).unwrap_or_default()
    );
    assert!(daemon.0.try_wait().unwrap().is_none(), "the agent died");

    // Recovery: free the space; the next job gets shared rings (a follower reads them).
    std::fs::remove_file(&fill).unwrap();
    let tap = RingTap::start(&shm);
    let job2 = spawn_job(&out.path().join("job2"), "40", "shmfree", None, &shm);
    let (st, _) = finish(job2, Instant::now());
    assert!(st.success(), "job after freeing /dev/shm: {st}");
    let fed = tap.finish();
    let text2 = rank_logs(&out.path().join("job2"));
    assert!(!text2.contains("ring unavailable"), "{text2}");
    assert_eq!(fed.len(), 4, "4 shared rings followed");
    for (pid, recs) in &fed {
        assert!(
            coll_count(recs) >= 40,
            "pid {pid}: {} ops",
            coll_count(recs)
        );
    }
    assert!(terminate(&mut daemon).success());
    eprintln!(
        "shm full: job {wall:?} (unfaulted {base_wall:?}), {warns} fallback WARNs, {ops} ops on disk and in the agent; after freeing, {} rings followed",
        fed.len()
    );
}

/// Issue 23, fault 2: the log disk (the plugin's segment root, a 2 MiB tmpfs already mostly
/// full) fills while a 4-rank × 600-step job runs; space is freed again while it still runs.
///
/// * Job: completes with exit 0, every step done, wall time within 1.5 × + 3 s of the same
///   job on a roomy disk (a full disk only stops the plugin's writes).
/// * Lost: the records after the fill, from the segments only. Counted in each plugin's
///   `stats` record (`writer_failed` = 1, `io_errors` ≥ 1, `records_lost_io` = exactly the
///   stream records that did not reach the disk), delivered over the live ring since it can no
///   longer reach a segment, and said once per rank in an NCCL WARN line naming ENOSPC. What
///   reached the disk before the fill decodes without a bad record (sealed segments and the
///   `.open` one the writer left). The agent daemon keeps running and, following the rings,
///   counts every op of the job (it used to miss each rank's last records: the ring was let
///   go at its unlink as if the plugin had drained it to disk first, fixed in
///   agent/src/sources/cursor). The agent does not report `records_lost_io` (its drops count
///   ring and pool drops only): the loss is seen in the plugin's stats and WARN line.
/// * Recovered: the plugin does not retry (by design, wire/src/segment.rs: the first I/O error
///   stops a writer for good): freeing space mid-job brings no new segment from these
///   processes. The next job on the freed disk writes and seals its segments normally.
#[test]
fn log_disk_full_mid_job_drops_and_counts_segments_and_the_job_runs_on() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("fault-log-full");
    let shm = ShmDir(PathBuf::from(format!(
        "/dev/shm/comminsight-it-logfull-{}",
        std::process::id()
    )));
    let base_logs = out.path().join("base-logs");
    let py = python_with_log_dir(out.path(), &base_logs);
    let t0 = Instant::now();
    let (st, base_wall) = finish(
        spawn_job(&out.path().join("base"), "600", "base", Some(&py), &shm.0),
        t0,
    );
    assert!(st.success(), "unfaulted job: {st}");

    let fs = Tmpfs::mount(&out.path().join("log-fs"), "2m");
    let fill = fs.fill("fill", 384 << 10);
    let adir = out.path().join("agent");
    let mut daemon = start_agent(
        &agent_config(&adir, &shm.0, &fs.0),
        &out.path().join("a.log"),
    );
    let py = python_with_log_dir(out.path(), &fs.0);
    let tap = RingTap::start(&shm.0);
    let t0 = Instant::now();
    let job = spawn_job(&out.path().join("job"), "600", "logfull", Some(&py), &shm.0);
    let failed = || {
        rank_logs(&out.path().join("job"))
            .lines()
            .filter(|l| l.contains("No space left") && l.contains("records_lost_io"))
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(40), || failed() == 4),
        "{} writers stopped",
        failed()
    );
    let mut before = tree(&fs.0);
    before.remove(Path::new("fill"));
    std::fs::remove_file(&fill).unwrap();
    let (st, wall) = finish(job, t0);
    assert!(st.success(), "the job with a full log disk failed: {st}");
    assert!(
        wall <= base_wall * 3 / 2 + Duration::from_secs(3),
        "job {wall:?}, unfaulted {base_wall:?}"
    );
    assert_eq!(
        tree(&fs.0).keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "no retry: nothing new"
    );

    let fed = tap.finish();
    let stats = last_stats(&fed);
    let want = truth_ops(&out.path().join("job"), 600);
    let (mut lost_total, mut excess_total) = (0, 0);
    for (pid, s) in &stats {
        let dir = fs.0.join(format!("logfull/host0/{pid}"));
        let on_disk = disk_records(&dir).len() as u64;
        let fed_n = fed[pid].len() as u64;
        assert_eq!(
            (s.writer_failed, s.io_errors >= 1),
            (1, true),
            "pid {pid}: {s:?}"
        );
        // Every record is on disk or counted lost (the final `stats` itself comes after its
        // count). A short write that failed is counted whole although the reader recovers its
        // complete records from the torn tail: the count may exceed the loss by < one write
        // buffer (1024 records), never fall short of it.
        let excess = (on_disk + s.records_lost_io).checked_sub(fed_n - 1);
        assert!(
            excess.is_some_and(|e| e < 1024),
            "pid {pid}: {on_disk} on disk, {fed_n} fed: {s:?}"
        );
        excess_total += excess.unwrap();
        lost_total += s.records_lost_io;
    }
    assert_eq!(
        stats.len(),
        4,
        "a final stats record from every rank over its ring"
    );
    assert!(
        wait_until(Duration::from_secs(20), || agent_ops(&adir, "logfull")
            == want),
        "agent counted {} of {want} ops; status: {}\nlog:\n{}",
        agent_ops(&adir, "logfull"),
        std::fs::read_to_string(adir.join("state/status.json")).unwrap_or_default(),
        std::fs::read_to_string(out.path().join("a.log")).unwrap_or_default()
    );
    assert!(daemon.0.try_wait().unwrap().is_none(), "the agent died");
    assert!(terminate(&mut daemon).success());

    // Recovery: a new job on the freed disk seals its segments and reports no I/O loss.
    let (st, _) = finish(
        spawn_job(&out.path().join("after"), "20", "after", Some(&py), &shm.0),
        Instant::now(),
    );
    assert!(st.success());
    let recs = disk_records(&fs.0.join("after"));
    let ok = recs
        .iter()
        .filter(
            |r| matches!(&r.body, Body::Stats(s) if s.writer_failed == 0 && s.records_lost_io == 0),
        )
        .count();
    assert_eq!(ok, 4, "4 final stats on disk with no loss");
    eprintln!("log disk full: job {wall:?} (unfaulted {base_wall:?}), {lost_total} records counted lost to ENOSPC ({excess_total} of them on disk after all), {want} ops in the agent");
}

/// A moto_server (the S3 stand-in of agent/tests/archive_s3.rs) with bucket `ci-archive`,
/// killed on drop; its port.
struct Moto {
    _server: Child,
    port: u16,
}

impl Moto {
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Command::new(test_tool("venv/bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let m = Moto {
            _server: Child(c),
            port,
        };
        assert!(wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }));
        m.s3(&["create"]);
        m
    }

    /// `agent/tests/py/archive_s3.py ENDPOINT ci-archive ARGS...` (stdout).
    fn s3(&self, args: &[&str]) -> String {
        let o = Command::new(test_tool("venv/bin/python"))
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../agent/tests/py/archive_s3.py"
            ))
            .arg(format!("http://127.0.0.1:{}", self.port))
            .arg("ci-archive")
            .args(args)
            .output()
            .expect("run archive_s3.py");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The store's objects under `fault/`: key without it -> (size, sha256).
    fn objects(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(&self.s3(&["list"])).unwrap();
        v.as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("fault/")?.to_string(), v.clone())))
            .collect()
    }
}

/// Issue 23, fault 4: the agent daemon is killed (SIGKILL) while it uploads its archive to an
/// S3-compatible store (moto_server) during a 4-rank × 500-step job with 64 KiB segments,
/// and restarted.
///
/// * Job: untouched (exit 0; it never talks to the agent).
/// * Lost: nothing. Every local archive file (raw `.cis.zst` segments and Parquet) is in the
///   store exactly once by key with the same bytes (sha256), nothing else is there, and the
///   archived raw segments hold every record the plugin wrote, each seq once.
/// * Recovered: the restarted daemon continues from its checkpoint and uploads what the killed
///   one had not (or had only partly) uploaded.
#[test]
fn agent_killed_mid_upload_leaves_every_object_in_the_store_exactly_once() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("fault-upload-kill");
    let shm = ShmDir(PathBuf::from(format!(
        "/dev/shm/comminsight-it-upload-{}",
        std::process::id()
    )));
    let moto = Moto::start();
    let job = out.path().join("job");
    let logs = job.join("inspector_logs");
    std::fs::create_dir_all(&logs).unwrap();
    let adir = out.path().join("agent");
    let config = agent_config(&adir, &shm.0, &logs);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[archive.object_store]\nenabled = true\nbucket = \"ci-archive\"\nprefix = \"fault\"\n\
         endpoint = \"http://127.0.0.1:{}\"\nallow_http = true\nretry_initial_ms = 200\nretry_max_ms = 1000\n",
        moto.port
    ));
    std::fs::write(&config, text).unwrap();
    let env = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let alog = out.path().join("agent.log");
    let mut daemon = start_agent_env(&config, &alog, &env);
    let tb = spawn_job(&job, "500", "upload", None, &shm.0);
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(60), || moto.objects().len() >= 6),
        "nothing uploaded; log:\n{}",
        std::fs::read_to_string(&alog).unwrap_or_default()
    );
    let at_kill = moto.objects().len();
    let pid = daemon.pid().to_string();
    assert!(Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap()
        .success());
    let _ = daemon.0.wait();
    let mut daemon = start_agent_env(&config, &alog, &env);
    let (st, wall) = finish(tb, t0);
    assert!(st.success(), "job: {st}");
    assert!(at_kill > 0);

    let local = || {
        let mut m = std::collections::BTreeMap::new();
        for sub in ["raw", "parquet"] {
            for (k, v) in tree(&adir.join("archive").join(sub)) {
                m.insert(format!("{sub}/{}", k.display()), v);
            }
        }
        m
    };
    let sealed = find_segments(&logs).unwrap().len();
    let raw_count = |m: &std::collections::BTreeMap<String, Vec<u8>>| {
        m.keys().filter(|k| k.ends_with(".cis.zst")).count()
    };
    assert!(
        wait_until(Duration::from_secs(60), || {
            let l = local();
            raw_count(&l) == sealed && moto.objects().len() == l.len()
        }),
        "{} of {sealed} segments archived, {} objects for {} files; log:\n{}",
        raw_count(&local()),
        moto.objects().len(),
        local().len(),
        std::fs::read_to_string(&alog).unwrap_or_default()
    );
    // Same keys, same bytes: no object twice, none missing, none torn.
    let objs = moto.objects();
    let hashes: serde_json::Value =
        serde_json::from_str(&moto.s3(&["hash", adir.join("archive").to_str().unwrap()])).unwrap();
    let want: std::collections::BTreeMap<String, serde_json::Value> = hashes
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("raw/") || k.starts_with("parquet/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(objs, want, "store vs local archive (key -> size, sha256)");
    archive_holds_every_record_once(&local(), &logs);
    assert!(daemon.0.try_wait().unwrap().is_none());
    assert!(terminate(&mut daemon).success());
    eprintln!("upload kill: killed with {at_kill} objects stored, job {wall:?}, {} objects in the end for {sealed} segments", objs.len());
}

/// The archived raw segments (`raw/...cis.zst` of `local`) hold every record the plugin wrote
/// under `logs`, each seq once.
fn archive_holds_every_record_once(
    local: &std::collections::BTreeMap<String, Vec<u8>>,
    logs: &Path,
) {
    let mut arch = Vec::new();
    for (k, bytes) in local.iter().filter(|(k, _)| k.ends_with(".cis.zst")) {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut zstd::stream::read::Decoder::new(&bytes[..]).unwrap(),
            &mut raw,
        )
        .unwrap();
        let pid = Path::new(k)
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let seg = comminsight_wire::segment::decode_segment_bytes(&raw);
        arch.extend(
            seg.records
                .into_iter()
                .filter(|r| r.flags & FLAG_REPEAT == 0 && r.kind() != Kind::Segment)
                .map(|r| (pid.clone(), r.seq)),
        );
    }
    let mut disk = Vec::new();
    for f in find_segments(logs).unwrap() {
        let pid = f
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let seg = read_segment(&f).unwrap();
        disk.extend(
            seg.records
                .into_iter()
                .filter(|r| r.flags & FLAG_REPEAT == 0 && r.kind() != Kind::Segment)
                .map(|r| (pid.clone(), r.seq)),
        );
    }
    arch.sort();
    disk.sort();
    assert_eq!(arch.len(), disk.len(), "archived vs written records");
    assert_eq!(arch, disk);
}

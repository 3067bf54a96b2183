//! Issue 3 acceptance, end to end: the agent daemon follows a real 8-rank test-bed job (real
//! plugin, real rings and segments), is killed with SIGKILL mid-run and restarted, and in the
//! end its archive holds every record the plugin wrote exactly once (raw zstd segments and
//! Parquet read back by DuckDB), and its online results equal `replay` of the same segments
//! byte for byte.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use comminsight_tests::*;
use comminsight_wire::record::{Body, Kind, FLAG_REPEAT};
use comminsight_wire::segment::{decode_segment_bytes, find_segments, read_segment};

fn scenario() -> String {
    format!(
        "{}/../../tests/scenarios/megatron.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `(process dir, seq)` of every stream record (no segment headers, no preamble repeats).
type Keys = BTreeMap<String, Vec<u64>>;

fn stream_keys(
    recs: impl IntoIterator<Item = comminsight_wire::Record>,
    key: &str,
    out: &mut Keys,
) {
    for r in recs {
        if r.flags & FLAG_REPEAT != 0 || r.kind() == Kind::Segment {
            continue;
        }
        out.entry(key.to_string()).or_default().push(r.seq);
    }
}

/// Records of the plugin's segments under `logs`, keyed by `<job>/<host>/<pid>`.
fn source_keys(logs: &Path) -> (Keys, BTreeMap<String, u64>) {
    let mut keys = Keys::new();
    let mut ops: BTreeMap<String, u64> = BTreeMap::new();
    for f in find_segments(logs).expect("segments") {
        let rel = f.parent().unwrap().strip_prefix(logs).unwrap();
        let seg = read_segment(&f).expect("read");
        for r in &seg.records {
            if r.flags & FLAG_REPEAT != 0 {
                continue;
            }
            if let Body::Coll(o) | Body::P2p(o) = &r.body {
                *ops.entry(format!("0x{:016x}", o.comm_hash)).or_default() += 1;
            }
        }
        stream_keys(seg.records, &rel.to_string_lossy(), &mut keys);
    }
    (keys, ops)
}

fn archive_keys(raw: &Path) -> Keys {
    let mut keys = Keys::new();
    let mut files = Vec::new();
    walk(raw, &mut files);
    for f in files {
        if !f.to_string_lossy().ends_with(".cis.zst") {
            continue;
        }
        let rel = f.parent().unwrap().strip_prefix(raw).unwrap();
        let mut bytes = Vec::new();
        zstd::stream::read::Decoder::new(std::fs::File::open(&f).unwrap())
            .unwrap()
            .read_to_end(&mut bytes)
            .unwrap();
        let seg = decode_segment_bytes(&bytes);
        assert!(
            seg.bad.is_empty(),
            "{}: corrupt archived records",
            f.display()
        );
        stream_keys(seg.records, &rel.to_string_lossy(), &mut keys);
    }
    keys
}

fn count_files(dir: &Path, suffix: &str) -> usize {
    let mut v = Vec::new();
    walk(dir, &mut v);
    v.iter()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .count()
}

#[test]
fn agent_archives_every_record_exactly_once_across_a_kill_9() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("agent-daemon");
    let job = out.path().join("job");
    let logs = job.join("inspector_logs");
    let state = out.path().join("state");
    let archive = out.path().join("archive");
    let shm = PathBuf::from(format!("/dev/shm/comminsight-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&shm);
    std::fs::create_dir_all(&logs).unwrap();
    // A real OTLP backend: VictoriaMetrics receives the daemon's metrics.
    let vm = comminsight_tests::backends::VictoriaMetrics::start(&out.path().join("vm"));
    let vm_port = vm.port;
    let config = out.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"[agent]
state_dir = "{state}"
poll_interval_ms = 20
checkpoint_interval_ms = 200

[sources]
shm_dir = "{shm}"
segment_dirs = ["{logs}"]
scan_interval_ms = 200

[master]
listen = ""

[archive]
dir = "{archive}"
zstd_level = 1

[otlp]
enabled = true
metrics_endpoint = "http://127.0.0.1:{vm_port}/opentelemetry/v1/metrics"
export_interval_ms = 500

# This test is about ingest and the archive (no warning allowed); the straggler index is noisy
# with 8 ranks on 2 cores (healthy steps reach its threshold) and is tested elsewhere.
[straggler]
enabled = false
"#,
            state = state.display(),
            shm = shm.display(),
            logs = logs.display(),
            archive = archive.display()
        ),
    )
    .unwrap();
    let agent_log = out.path().join("agent.log");
    let mut daemon = start_agent(&config, &agent_log);

    // 8 ranks, 2 hosts, 200 steps; small segments so many are sealed while the job runs.
    let mut tb = Child(
        Command::new(bin_dir().join("comminsight-testbed"))
            .arg("run")
            .arg("--out")
            .arg(&job)
            .args([
                "--scenario",
                &scenario(),
                "--ranks",
                "8",
                "--hosts",
                "2",
                "--steps",
                "200",
            ])
            .env("COMMINSIGHT_LIB_DIR", lib_dir())
            .env("COMMINSIGHT_SHM_DIR", &shm)
            .env("COMMINSIGHT_SEGMENT_BYTES", "65536")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the test bed"),
    );

    // Kill the agent once it has archived a few segments, while the job still runs.
    assert!(
        wait_until(Duration::from_secs(60), || count_files(
            &archive.join("raw"),
            ".cis.zst"
        ) >= 4),
        "the agent archived nothing within 60 s; its log:\n{}",
        std::fs::read_to_string(&agent_log).unwrap_or_default()
    );
    assert!(
        tb.0.try_wait().unwrap().is_none(),
        "the job ended before the agent could be killed mid-run; make it longer"
    );
    assert!(
        wait_until(Duration::from_secs(10), || state
            .join("checkpoint.json")
            .exists()),
        "no checkpoint written; agent log:\n{}",
        std::fs::read_to_string(&agent_log).unwrap_or_default()
    );
    let killed_at = count_files(&archive.join("raw"), ".cis.zst");
    kill9(&mut daemon);
    std::thread::sleep(Duration::from_millis(500));
    let mut daemon = start_agent(&config, &agent_log);

    let status = tb.0.wait().expect("test bed");
    assert!(status.success(), "test bed failed: {status}");
    let sealed = count_files(&logs, ".cis");
    assert_eq!(
        count_files(&logs, ".cis.open"),
        0,
        "every segment sealed at exit"
    );
    assert!(
        wait_until(Duration::from_secs(60), || count_files(
            &archive.join("raw"),
            ".cis.zst"
        ) == sealed),
        "archive holds {} of {sealed} segments after 60 s; agent log:\n{}",
        count_files(&archive.join("raw"), ".cis.zst"),
        std::fs::read_to_string(&agent_log).unwrap_or_default()
    );
    // Stop it cleanly (SIGTERM): final checkpoint and results.
    let st = terminate(&mut daemon);
    let log_text = std::fs::read_to_string(&agent_log).unwrap_or_default();
    assert!(st.success(), "agent exit {st}; log:\n{log_text}");
    assert!(
        !log_text.contains("ERROR") && !log_text.contains("WARN"),
        "the agent logged errors or warnings:\n{log_text}"
    );
    assert!(
        log_text.contains("continuing from the checkpoint"),
        "the restarted agent did not resume from its checkpoint:\n{log_text}"
    );
    let _ = std::fs::remove_dir_all(&shm);

    // Every record the plugin wrote, by sequence number, exactly once in the raw archive.
    let (src, ops_by_comm) = source_keys(&logs);
    let arc = archive_keys(&archive.join("raw"));
    assert_eq!(src.len(), 8, "8 rank processes");
    for (stream, seqs) in &src {
        let mut s = seqs.clone();
        s.sort_unstable();
        let n = s.len();
        s.dedup();
        assert_eq!(s.len(), n, "{stream}: the plugin wrote each seq once");
        assert_eq!(
            s,
            (s[0]..s[0] + n as u64).collect::<Vec<_>>(),
            "{stream}: the plugin dropped nothing"
        );
        let mut a = arc.get(stream).cloned().unwrap_or_default();
        a.sort_unstable();
        assert_eq!(
            a.len(),
            n,
            "{stream}: archived {} records, plugin wrote {n} (killed after {killed_at} segments)",
            a.len()
        );
        assert_eq!(a, s, "{stream}: archived seqs differ");
    }
    assert_eq!(arc.len(), src.len());

    // Parquet, read by DuckDB: per-comm op counts equal the records, no duplicate seq per pid.
    let py = test_tool("venv/bin/python");
    let q = format!(
        "import duckdb, json\n\
         t = \"read_parquet('{}/parquet/**/*.parquet', hive_partitioning=true)\"\n\
         ops = dict(duckdb.sql(f\"select comm_hash, count(*) from {{t}} where kind in ('coll','p2p') group by all\").fetchall())\n\
         dup = duckdb.sql(f\"select count(*) - count(distinct (pid, seq)) from {{t}}\").fetchall()[0][0]\n\
         jobs = [r[0] for r in duckdb.sql(f\"select distinct job from {{t}}\").fetchall()]\n\
         err = duckdb.sql(f\"select max(clock_err_ns) from {{t}}\").fetchall()[0][0]\n\
         g = duckdb.sql(f\"select count(*), count(aligned_gpu_start_ns), max(gpu_clock_err_ns) from {{t}} where kind = 'coll' and timing = 'kernel_gpu'\").fetchall()[0]\n\
         print(json.dumps({{'ops': ops, 'dup': dup, 'jobs': jobs, 'err': err, 'gpu': list(g)}}))\n",
        archive.display()
    );
    let res = Command::new(&py).arg("-c").arg(&q).output().unwrap();
    assert!(
        res.status.success(),
        "duckdb: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&res.stdout).unwrap();
    assert_eq!(v["dup"], 0, "duplicate rows in Parquet");
    let got: BTreeMap<String, u64> = v["ops"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
        .collect();
    assert_eq!(got, ops_by_comm, "per-comm op counts from DuckDB");
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1);
    // No master configured: this host is the reference; only the plugins' calibration error
    // (microseconds) remains in every aligned time.
    let err = v["err"].as_u64().unwrap();
    assert!(err < 1_000_000, "clock error bound {err} ns");
    // GPU-timed ops also carry GPU timer values on the job timeline (the GPU timer fitted to
    // the host clock from the same ops), with a bound.
    let gpu = v["gpu"].as_array().unwrap();
    assert!(
        gpu[0].as_u64().unwrap() > 0,
        "GPU-timed collectives in the job"
    );
    assert_eq!(gpu[1], gpu[0], "every GPU-timed op has aligned GPU times");
    assert!(
        gpu[2].as_u64().unwrap() < 1_000_000,
        "GPU clock bound {}",
        gpu[2]
    );

    // Offline replay of the same segments gives the online results byte for byte.
    let rp = out.path().join("replay");
    let r = agent(&[
        "replay",
        job.to_str().unwrap(),
        "--out",
        rp.to_str().unwrap(),
    ]);
    assert!(
        r.status.success(),
        "replay: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    for file in ["metrics.json", "roles.json"] {
        let online = std::fs::read(state.join("results").join(file)).unwrap();
        let offline = std::fs::read(rp.join(file)).unwrap();
        assert!(
            online == offline,
            "online and replayed {file} differ:\n--- online\n{}\n--- replay\n{}",
            String::from_utf8_lossy(&online),
            String::from_utf8_lossy(&offline)
        );
    }
    // The roles went with the archive too, and name the scenario's communicators.
    let role_files: Vec<PathBuf> = std::fs::read_dir(archive.join("roles"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(role_files.len(), 1, "{role_files:?}");
    let archived: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&role_files[0]).unwrap()).unwrap();
    let comms = archived["jobs"][0]["comms"].as_array().unwrap();
    assert!(!comms.is_empty());
    assert!(comms.iter().all(|c| c["role"] != "unknown"), "{archived}");
    let streams: BTreeSet<String> = src.keys().cloned().collect();
    assert_eq!(streams.len(), 8);

    // The backend holds the daemon's op counts (cumulative across the kill -9: the
    // aggregator resumed from its checkpoint), queried back by name and value.
    let total_ops: u64 = ops_by_comm.values().sum();
    let q = format!(
        "import json, time, urllib.request, urllib.parse\n\
         best = 0\n\
         for _ in range(100):\n\
         \x20   body = urllib.parse.urlencode({{'match[]': '{{__name__=\"comminsight.op.duration_count\"}}'}}).encode()\n\
         \x20   r = urllib.request.urlopen('http://127.0.0.1:{vm_port}/api/v1/export', body).read().decode()\n\
         \x20   rows = [json.loads(l) for l in r.splitlines() if l.strip()]\n\
         \x20   best = sum(row['values'][-1] for row in rows if row['metric'].get('comminsight.job.id') == 'megatron')\n\
         \x20   if best == {total_ops}: break\n\
         \x20   time.sleep(0.2)\n\
         print(int(best))\n"
    );
    let res = Command::new(&py).arg("-c").arg(&q).output().unwrap();
    assert!(
        res.status.success(),
        "VictoriaMetrics query: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    let got: u64 = String::from_utf8_lossy(&res.stdout).trim().parse().unwrap();
    assert_eq!(
        got, total_ops,
        "comminsight.op.duration_count in VictoriaMetrics vs op records"
    );
}

/// SIGTERM through the `kill` command (as systemd stops the service), then its exit status.
fn terminate(c: &mut Child) -> std::process::ExitStatus {
    let pid = c.pid().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    c.0.wait().unwrap()
}

/// SIGKILL through the `kill` command (no unsafe in tests).
fn kill9(c: &mut Child) {
    let pid = c.pid().to_string();
    assert!(Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap()
        .success());
    let _ = c.0.wait();
}

/// Two daemons on this host: one serves the agent link, the other measures its clock offset
/// against it NTP-style and keeps every measurement (with its error bound) in its state dir.
#[test]
fn member_agent_measures_its_offset_to_the_master() {
    let out = OutDir::new("agent-link");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = |name: &str, master: &str| {
        let dir = out.path().join(name);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let path = dir.join("agent.toml");
        std::fs::write(
            &path,
            format!(
                "[agent]\nstate_dir = \"{d}/state\"\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{d}/logs\"]\n\
                 [archive]\nenabled = false\n[clock]\nsync_interval_s = 1\n{master}\n",
                d = dir.display()
            ),
        )
        .unwrap();
        (dir, path)
    };
    let (mdir, mconf) = conf(
        "master",
        &format!("[master]\nlisten = \"127.0.0.1:{port}\""),
    );
    // No token configured: the master generates its own (0600) and this member, standing in
    // for a second host, is given that file.
    let token = mdir.join("state/master.token");
    let (bdir, bconf) = conf(
        "member",
        &format!(
            "[master]\nlisten = \"\"\naddress = \"127.0.0.1:{port}\"\ntoken_file = {:?}",
            token.display().to_string()
        ),
    );
    let _master = start_agent(&mconf, &out.path().join("master.log"));
    assert!(
        wait_until(Duration::from_secs(30), || token.exists()),
        "the master generated no token"
    );
    let _member = start_agent(&bconf, &out.path().join("member.log"));
    let book = bdir.join("state/clock/host-offsets.jsonl");
    let lines = || {
        std::fs::read_to_string(&book)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(20), || lines().len() >= 2),
        "no offset measurements in {}; member log:\n{}",
        book.display(),
        std::fs::read_to_string(out.path().join("member.log")).unwrap_or_default()
    );
    for v in lines() {
        let off = v["offset_ns"].as_i64().unwrap();
        let err = v["err_ns"].as_u64().unwrap();
        // Same host, same clock: the true offset is 0, so it must lie within the bound.
        assert!(
            off.unsigned_abs() <= err,
            "offset {off} ns outside ±{err} ns: {v}"
        );
        assert!(err < 50_000_000, "error bound {err} ns on loopback");
        assert_eq!(v["master"], format!("127.0.0.1:{port}"));
    }
}

/// A corrupt checkpoint (disk trouble, a hand edit) is moved aside with a warning and the agent
/// starts over from the segments on disk instead of refusing to start.
#[test]
fn corrupt_checkpoint_is_set_aside_and_the_agent_starts_over() {
    let out = OutDir::new("agent-corrupt-ckpt");
    let state = out.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(out.path().join("logs")).unwrap();
    std::fs::write(
        state.join("checkpoint.json"),
        b"{\"version\": 1, \"cursors\": [tru",
    )
    .unwrap();
    let conf = out.path().join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = \"{s}\"\ncheckpoint_interval_ms = 100\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{l}\"]\n[master]\nlisten = \"\"\n[archive]\nenabled = false\n",
            s = state.display(),
            l = out.path().join("logs").display()
        ),
    )
    .unwrap();
    let log = out.path().join("agent.log");
    let mut a = start_agent(&conf, &log);
    let fresh = || {
        std::fs::read_to_string(state.join("checkpoint.json"))
            .is_ok_and(|t| serde_json::from_str::<serde_json::Value>(&t).is_ok())
    };
    assert!(
        wait_until(Duration::from_secs(20), fresh),
        "no fresh checkpoint; log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(terminate(&mut a).success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("corrupt agent checkpoint") && text.contains("starting over"),
        "{text}"
    );
    let aside = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("checkpoint.json.corrupt-")
        })
        .count();
    assert_eq!(aside, 1, "the corrupt file is kept for inspection");
}

/// A finished process whose directory is removed (plugin retention, cleanup) is forgotten:
/// it leaves the checkpoint, so a daemon running for months does not track every process ever.
#[test]
fn finished_streams_that_are_gone_leave_the_checkpoint() {
    use comminsight_wire::record::{ProcStart, Record};
    use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
    let out = OutDir::new("agent-prune");
    let logs = out.path().join("logs");
    let state = out.path().join("state");
    for pid in [501u32, 502] {
        let mut w = SegmentWriter::new(
            SegmentConfig {
                dir: logs.join("j").join("h").join(pid.to_string()),
                ..SegmentConfig::default()
            },
            pid,
        );
        let mut r = Record::new(Body::ProcStart(ProcStart {
            pid,
            ..Default::default()
        }))
        .encode();
        r.set_seq(0);
        w.write(&[r]);
        w.seal();
    }
    let conf = out.path().join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = \"{s}\"\ncheckpoint_interval_ms = 100\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{l}\"]\nscan_interval_ms = 100\n[master]\nlisten = \"\"\n[archive]\nenabled = false\n",
            s = state.display(),
            l = logs.display()
        ),
    )
    .unwrap();
    let streams = || -> Vec<String> {
        std::fs::read_to_string(state.join("checkpoint.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["cursors"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|c| c[0]["pid"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let mut a = start_agent(&conf, &out.path().join("agent.log"));
    assert!(
        wait_until(Duration::from_secs(20), || streams().len() == 2),
        "{:?}",
        streams()
    );
    std::fs::remove_dir_all(logs.join("j/h/501")).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || streams()
            == vec!["502".to_string()]),
        "{:?}",
        streams()
    );
    assert!(terminate(&mut a).success());
}

//! Issue 20: GPU telemetry bound to ranks. A daemon follows a test-bed job of 8 real rank
//! processes, each selecting its GPU through the test bed's CUDA stand-in (rank r on device r,
//! PCI addresses of a DGX H100 board); the daemon samples them through the NVML stand-in
//! (loaded by `[gpu] library` through nvml-wrapper), scripted so that rank 5's GPU is held
//! down by HW slowdown / thermal the whole run and one of its NVLinks counts rising CRC
//! errors, while rank 5 is also 40 ms late in each step's compute. The daemon's live straggler
//! report and the offline `straggler` over the job's segments and the host stream both call
//! rank 5 `gpu-throttled`, with the slowdown share, the SM clock and the NVLink errors in its
//! evidence; the archive holds the GPU records of every metric; `/metrics` carries the
//! `hw.gpu.*` instruments with the rank and the GPU. A second job hangs on rank 3 after its
//! GPU raised XID 79: `hang` says so first.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use comminsight_tests::*;
use serde_json::Value;

const SLOW: i64 = 5;
/// Rank 5's device: the sixth address of the stand-ins' DGX H100 list.
const SLOW_PCI: &str = "0000:ab:00.0";

fn seg_host(logs: &Path) -> Option<String> {
    let job = std::fs::read_dir(logs).ok()?.flatten().next()?;
    let host = std::fs::read_dir(job.path()).ok()?.flatten().next()?;
    Some(host.file_name().to_string_lossy().into_owned())
}

/// A test-bed run of `args` into `out/run`, rings in `out/shm`.
fn testbed_job(out: &Path, args: &[&str]) -> Child {
    let shm = out.join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    Child(
        Command::new(bin_dir().join("comminsight-testbed"))
            .arg("run")
            .arg("--out")
            .arg(out.join("run"))
            .args(args)
            .env("COMMINSIGHT_LIB_DIR", lib_dir())
            .env("COMMINSIGHT_SHM_DIR", &shm)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(out.join("testbed.log")).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// The daemon over `out`'s job, sampling the GPUs through the NVML stand-in with `script`.
fn gpu_daemon(out: &Path, host: &str, script: &str, extra: &str) -> Child {
    let state = out.join("state");
    let logs = out.join("run").join("inspector_logs");
    let shm = out.join("shm");
    let lib = lib_dir().join("gpu-standin").join("libnvidia-ml.so.1");
    assert!(
        lib.exists(),
        "{} (cargo xtask build stages it)",
        lib.display()
    );
    let script_file = out.join("nvml.script");
    std::fs::write(&script_file, script).unwrap();
    let config = out.join("agent.toml");
    let archive = out.join("archive");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\nhost_name = {host:?}\npoll_interval_ms = 20\n\
             [sources]\nshm_dir = {shm:?}\nsegment_dirs = [{logs:?}]\nscan_interval_ms = 50\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = true\ndir = {archive:?}\nparquet = false\n\
             [http]\nlisten = \"127.0.0.1:0\"\n[probes]\nenabled = false\ninterval_ms = 200\n\
             [gpu]\nlibrary = {lib:?}\ninterval_ms = 200\n[straggler]\nsettle_s = 2\n{extra}"
        ),
    )
    .unwrap();
    start_agent_env(
        &config,
        &out.join("agent.log"),
        &[("NVML_STANDIN_SCRIPT", script_file.to_str().unwrap())],
    )
}

fn status(state: &Path) -> Value {
    std::fs::read(state.join("status.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

fn rank_of(report: &Value, r: i64) -> Value {
    report["ranks"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["rank"] == r))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Rank 5's GPU evidence: held down most of the time, SM clock at the throttled 1100 MHz,
/// NVLink 3 of its GPU with errors.
fn assert_gpu_evidence(r: &Value, what: &str) {
    assert_eq!(r["class"], "gpu-throttled", "{what}: {r:#}");
    let g = &r["host_gpu"];
    assert!(
        g["slowdown_pct"].as_f64().unwrap_or(0.0) > 80.0,
        "{what}: {r:#}"
    );
    assert_eq!(g["min_sm_clock_mhz"], 1100, "{what}: {r:#}");
    let reasons: Vec<&str> = g["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        reasons.contains(&"hw_slowdown") && reasons.contains(&"hw_thermal"),
        "{what}: {r:#}"
    );
    assert!(
        g["nvlink_errors"].as_u64().unwrap_or(0) > 10,
        "{what}: {r:#}"
    );
    assert_eq!(g["links"][0]["gpu"], SLOW_PCI, "{what}: {r:#}");
    assert_eq!(g["links"][0]["link"], 3, "{what}: {r:#}");
    let reason = r["class_reason"].as_str().unwrap_or("");
    assert!(reason.contains("GPU clocks held down"), "{what}: {reason}");
}

#[test]
fn a_rank_on_a_throttled_gpu_is_gpu_throttled_live_and_offline() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("straggler-gpu");
    std::fs::create_dir_all(out.path()).unwrap();
    let mut tb = testbed_job(
        out.path(),
        &[
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
        ],
    );
    let logs = out.path().join("run").join("inspector_logs");
    assert!(
        wait_until(Duration::from_secs(30), || seg_host(&logs).is_some()),
        "the test bed's ranks did not start: {}",
        std::fs::read_to_string(out.path().join("testbed.log")).unwrap_or_default()
    );
    let host = seg_host(&logs).unwrap();
    let daemon = gpu_daemon(
        out.path(),
        &host,
        &format!("throttle {SLOW} 0x48 0 -1\nnvlink_errors {SLOW} 3 200 0\n"),
        "",
    );
    let state = out.path().join("state");
    wait_until(Duration::from_secs(20), || {
        status(&state)["host_context"]["gpu"]["sampled"] == 8
    });
    let st = status(&state);
    assert_eq!(
        st["host_context"]["gpu"]["nvml"], "on (8 GPUs, driver 570.133.20)",
        "{st:#}"
    );
    assert_eq!(
        st["host_context"]["gpu"]["sampled"], 8,
        "every rank's GPU: {st:#}"
    );
    let addr = st["http"]
        .as_str()
        .expect("the endpoint serves")
        .to_string();
    assert!(wait_until(Duration::from_secs(150), || matches!(
        tb.0.try_wait(),
        Ok(Some(_))
    )));
    let live_dir = state.join("results").join("straggler");
    let live = || -> Option<Value> {
        let f = std::fs::read_dir(&live_dir).ok()?.flatten().next()?;
        serde_json::from_slice(&std::fs::read(f.path()).ok()?).ok()
    };
    wait_until(Duration::from_secs(20), || {
        live().is_some_and(|r| rank_of(&r, SLOW)["class"] == "gpu-throttled")
    });
    assert_gpu_evidence(&rank_of(&live().unwrap_or(Value::Null), SLOW), "live");
    metrics_name_the_rank_and_its_gpu(&addr);
    // The job's processes are gone: its host stream is sealed, and archived.
    let archive = out.path().join("archive");
    let archived_host = || {
        let mut files = Vec::new();
        walk(&archive.join("raw"), &mut files);
        files.iter().any(|f| {
            f.to_string_lossy().contains("/host-") && f.to_string_lossy().ends_with(".cis.zst")
        })
    };
    assert!(
        wait_until(Duration::from_secs(30), archived_host),
        "the host stream was not archived"
    );
    std::thread::sleep(Duration::from_secs(1));
    drop(daemon);

    let o = agent(&["straggler", out.path().to_str().unwrap(), "--json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler --json: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_gpu_evidence(&rank_of(&report, SLOW), "offline");
    for r in (0..8).filter(|r| *r != SLOW) {
        let v = rank_of(&report, r);
        assert_ne!(v["class"], "gpu-throttled", "{v:#}");
        assert_eq!(
            v["host_gpu"]["slowdown_pct"], 0.0,
            "rank {r} has its own, healthy GPU: {v:#}"
        );
    }
    host_stream_holds_every_metric(&out.path().join("state").join("host-streams"));
    // The archive alone rebuilds the same GPU evidence.
    let o = agent(&["straggler", archive.to_str().unwrap(), "--json"]);
    let from_archive: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler ARCHIVE --json: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let a = rank_of(&from_archive, SLOW);
    assert_gpu_evidence(&a, "archive");
    assert_eq!(
        a["host_gpu"],
        rank_of(&report, SLOW)["host_gpu"],
        "archive and segments agree"
    );
}

/// `/metrics`: the `hw.gpu.*` instruments with the rank bound to each GPU.
fn metrics_name_the_rank_and_its_gpu(addr: &str) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("comminsight_gpu_clock{")
                && l.contains(&format!("comminsight_gpu_pci=\"{SLOW_PCI}\""))
                && l.contains("clock_type=\"sm\"")
        })
        .unwrap_or_else(|| panic!("no SM clock of {SLOW_PCI}: {text}"));
    assert!(
        line.contains(&format!("comminsight_rank=\"{SLOW}\"")),
        "{line}"
    );
    assert!(line.ends_with(" 1100.0"), "{line}");
    let util = text
        .lines()
        .filter(|l| l.starts_with("hw_gpu_utilization_ratio{"))
        .count();
    assert_eq!(util, 8, "{text}");
}

/// The host stream holds `gpu` records with every metric the stand-in supports, and `nvlink`
/// records with state, throughput and errors.
fn host_stream_holds_every_metric(streams: &Path) {
    let o = agent(&[
        "dump",
        streams.to_str().unwrap(),
        "--json",
        "--kind",
        "gpu,nvlink",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    let recs: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let gpus: Vec<&Value> = recs.iter().filter(|r| r["kind"] == "gpu").collect();
    assert!(
        gpus.len() >= 8 * 5,
        "{} gpu records: {}",
        gpus.len(),
        String::from_utf8_lossy(&o.stderr)
    );
    let all = comminsight_wire::gpu::gpu_valid::SM_ACTIVE - 1;
    let later: Vec<&&Value> = gpus
        .iter()
        .filter(|g| g["interval_ns"].as_u64() > Some(0))
        .collect();
    assert!(
        later
            .iter()
            .all(|g| g["valid"].as_u64() == Some(u64::from(all))),
        "{:#}",
        later[0]
    );
    let slow = comminsight_wire::gpu::pci::parse(SLOW_PCI).unwrap();
    assert!(later
        .iter()
        .filter(|g| g["pci"] == slow)
        .all(|g| g["sm_clock_mhz"] == 1100 && g["hw_thermal_share"].as_u64() > Some(9000)));
    let links: Vec<&Value> = recs.iter().filter(|r| r["kind"] == "nvlink").collect();
    assert!(
        links.iter().all(|l| l["valid"] == 7 && l["up"] == 1),
        "{:#}",
        links[0]
    );
    assert!(links
        .iter()
        .any(|l| l["pci"] == slow && l["link"] == 3 && l["crc_flit"].as_u64() > Some(0)));
}

#[test]
fn a_hang_whose_source_gpu_raised_an_xid_says_so_first() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("hang-xid");
    std::fs::create_dir_all(out.path()).unwrap();
    let _tb = testbed_job(
        out.path(),
        &[
            "--scenario",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/ddp.toml"),
            "--ranks",
            "4",
            "--hosts",
            "1",
            "--steps",
            "200",
            "--timeout",
            "25",
            "--fault",
            "hang:rank=3,step=3",
        ],
    );
    let logs = out.path().join("run").join("inspector_logs");
    assert!(wait_until(Duration::from_secs(30), || seg_host(&logs).is_some()));
    let host = seg_host(&logs).unwrap();
    // Rank 3's GPU (0000:5d:00.0) raises XID 79 a second into the daemon's life.
    let daemon = gpu_daemon(
        out.path(),
        &host,
        "xid 3 79 1000\n",
        "[hang]\nmin_wait_s = 0\n",
    );
    let state = out.path().join("state");
    // results/hang/<job>/<event>/verdict-<host>.json (docs/contracts.md "Hang").
    let verdict = || -> Option<Value> {
        let mut files = Vec::new();
        walk(&state.join("results").join("hang"), &mut files);
        files
            .iter()
            .filter(|f| {
                f.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("verdict-"))
            })
            .filter_map(|f| serde_json::from_slice::<Value>(&std::fs::read(f).ok()?).ok())
            // A host's verdicts: a JSON array.
            .find_map(|v| v.as_array().and_then(|a| a.first()).cloned())
    };
    let found = wait_until(Duration::from_secs(60), || {
        verdict().is_some_and(|v| v["gpu_fault"].is_string())
    });
    let v = verdict().unwrap_or(Value::Null);
    assert!(
        found,
        "no verdict with the XID: {v:#}\n{}",
        std::fs::read_to_string(out.path().join("agent.log")).unwrap_or_default()
    );
    assert_eq!(v["source_ranks"][0], 3, "{v:#}");
    let f = v["gpu_fault"].as_str().unwrap();
    assert!(
        f.starts_with("rank 3: GPU 0000:5d:00.0 (CUDA device 3) raised XID 79 "),
        "{f}"
    );
    drop(daemon);
    let o = agent(&["hang", out.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("  GPU FAULT: rank 3: GPU 0000:5d:00.0")),
        "offline hang: {text}"
    );
}

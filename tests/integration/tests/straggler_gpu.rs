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

use comminsight_tests::backends::VictoriaMetrics;
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

/// The daemon over `out`'s job, sampling the GPUs through the NVML stand-in with `script`
/// (`nvml`: else `[gpu] library` names no library and NVML is off), with `gpu` added to its
/// `[gpu]` section and `extra` after it.
fn gpu_daemon(out: &Path, host: &str, script: &str, nvml: bool, gpu: &str, extra: &str) -> Child {
    let state = out.join("state");
    let logs = out.join("run").join("inspector_logs");
    let shm = out.join("shm");
    let lib = if nvml {
        lib_dir().join("gpu-standin").join("libnvidia-ml.so.1")
    } else {
        out.join("no-driver").join("libnvidia-ml.so.1")
    };
    assert!(
        lib.exists() || !nvml,
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
             [gpu]\nlibrary = {lib:?}\ninterval_ms = 200\n{gpu}\n[straggler]\nsettle_s = 2\n{extra}"
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

/// The job of the straggler tests: 8 ranks on one host, rank [`SLOW`] 40 ms late in each
/// step; returns the test bed and the host its segments name.
fn slow_rank_job(out: &Path) -> (Child, String) {
    let tb = testbed_job(
        out,
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
    let logs = out.join("run").join("inspector_logs");
    assert!(
        wait_until(Duration::from_secs(30), || seg_host(&logs).is_some()),
        "the test bed's ranks did not start: {}",
        std::fs::read_to_string(out.join("testbed.log")).unwrap_or_default()
    );
    let host = seg_host(&logs).unwrap();
    (tb, host)
}

/// Once the job is over: the daemon's live straggler report, when rank [`SLOW`] is
/// gpu-throttled in it (within 20 s).
fn live_gpu_throttled(state: &Path, tb: &mut Child) -> Value {
    assert!(wait_until(Duration::from_secs(150), || matches!(
        tb.0.try_wait(),
        Ok(Some(_))
    )));
    wait_until(Duration::from_secs(20), || {
        read_live(state).is_some_and(|r| rank_of(&r, SLOW)["class"] == "gpu-throttled")
    });
    read_live(state).unwrap_or(Value::Null)
}

/// The daemon's live straggler report (`results/straggler/<job>.json`).
fn read_live(state: &Path) -> Option<Value> {
    let dir = state.join("results").join("straggler");
    let f = std::fs::read_dir(dir).ok()?.flatten().next()?;
    serde_json::from_slice(&std::fs::read(f.path()).ok()?).ok()
}

/// Wait until the job's host stream is archived (its processes are gone), then stop the daemon.
fn archived_then_stop(out: &Path, daemon: Child) {
    let archive = out.join("archive");
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
}

/// Offline over the steps the live report analysed, rank [`SLOW`]'s GPU evidence is the live
/// one, value for value.
fn same_gpu_evidence_over_the_live_steps(dir: &Path, live: &Value) {
    let steps: Vec<u64> = live["steps"]
        .as_array()
        .expect("the live report's steps")
        .iter()
        .filter_map(|s| s["step"].as_u64())
        .collect();
    let (first, last) = (steps.iter().min().unwrap(), steps.iter().max().unwrap());
    let o = agent(&[
        "straggler",
        dir.to_str().unwrap(),
        "--steps",
        &format!("{first}..{last}"),
        "--json",
    ]);
    let offline: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler --steps {first}..{last}: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(
        rank_of(&offline, SLOW)["host_gpu"],
        rank_of(live, SLOW)["host_gpu"],
        "steps {first}..{last}: offline and live"
    );
}

/// `straggler DIR --json`.
fn offline_report(dir: &Path) -> Value {
    let o = agent(&["straggler", dir.to_str().unwrap(), "--json"]);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler {} --json: {e}: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// A dcgm-exporter beside NVML, saying what NVML measures otherwise (SM clock 500 MHz, no
/// clock-event reason, NVLink errors on GPU 0, XID 43 on GPU 2) and the SM activity NVML
/// cannot read: the NVML values must win, the SM activity must arrive.
fn contradicting_dcgm() -> comminsight_tests::dcgm::DcgmExporter {
    use comminsight_tests::dcgm::{body, DcgmExporter, GpuLines, DGX_H100};
    DcgmExporter::start(|n| {
        let gpus: Vec<GpuLines> = DGX_H100
            .iter()
            .enumerate()
            .map(|(i, p)| GpuLines {
                index: i,
                pci: p.to_string(),
                no_pci_label: false,
                fields: vec![
                    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "500".into()),
                    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "0".into()),
                    (
                        "DCGM_FI_PROF_SM_ACTIVE",
                        "gauge",
                        if i as i64 == SLOW { "0.61" } else { "0.93" }.into(),
                    ),
                    (
                        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                        "counter",
                        if i == 0 { 100 * n } else { 0 }.to_string(),
                    ),
                    (
                        "DCGM_FI_DEV_XID_ERRORS",
                        "gauge",
                        if i == 2 && n >= 3 { "43" } else { "0" }.into(),
                    ),
                ],
            })
            .collect();
        body(&gpus)
    })
}

#[test]
fn a_rank_on_a_throttled_gpu_is_gpu_throttled_live_and_offline() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("straggler-gpu");
    std::fs::create_dir_all(out.path()).unwrap();
    let (mut tb, host) = slow_rank_job(out.path());
    let vm = VictoriaMetrics::start(&out.path().join("vm"));
    let dcgm = contradicting_dcgm();
    let daemon = gpu_daemon(
        out.path(),
        &host,
        &format!("throttle {SLOW} 0x48 0 -1\nnvlink_errors {SLOW} 3 200 0\n"),
        true,
        &format!("dcgm_url = {:?}\ndcgm_interval_ms = 200", dcgm.url),
        &format!(
            "[otlp]\nenabled = true\nmetrics_endpoint = {:?}\nexport_interval_ms = 500\n",
            vm.otlp_metrics_url()
        ),
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
    let live = live_gpu_throttled(&state, &mut tb);
    assert_gpu_evidence(&rank_of(&live, SLOW), "live");
    assert_eq!(
        rank_of(&live, 0)["host_gpu"]["nvlink_errors"],
        0,
        "DCGM's NVLink errors of an NVML-sampled GPU are not counted: {live:#}"
    );
    metrics_name_the_rank_and_its_gpu(&addr);
    every_metric_reaches_victoria_metrics(&vm);
    assert!(dcgm.scrapes() > 3, "the exporter was scraped");
    archived_then_stop(out.path(), daemon);

    // The daemon's last live report (every host sample it got was in it).
    same_gpu_evidence_over_the_live_steps(out.path(), &read_live(&state).unwrap());
    let report = offline_report(out.path());
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
    let from_archive = offline_report(&out.path().join("archive"));
    let a = rank_of(&from_archive, SLOW);
    assert_gpu_evidence(&a, "archive");
    assert_eq!(
        a["host_gpu"],
        rank_of(&report, SLOW)["host_gpu"],
        "archive and segments agree"
    );
    trace_draws_the_gpu_counters(out.path(), "NVLink 3 errors");
    report_drill_down_shows_the_gpu(out.path());
}

/// The HTML report, rendered by headless Chromium: the drill-down opens on rank [`SLOW`] with
/// its class and a GPU row saying its clocks were held down and which NVLink counted errors.
fn report_drill_down_shows_the_gpu(out: &Path) {
    let page = out.join("report.html");
    let b = comminsight_tests::report_dom(out, &page);
    let drill = comminsight_tests::chromium::element_text(&b.stdout, "drill").expect("#drill");
    assert!(drill.starts_with(&format!("Rank {SLOW} ")), "{drill}");
    assert!(drill.contains("gpu-throttled"), "{drill}");
    let gpu = drill
        .find("GPU GPU clocks held down")
        .map(|at| &drill[at..])
        .unwrap_or_else(|| panic!("no GPU row: {drill}"));
    assert!(
        gpu.contains("SM clock down to 1100 MHz")
            && gpu.contains(&format!("NVLink 3 of {SLOW_PCI} +")),
        "{gpu}"
    );
}

/// The Perfetto trace, read with Perfetto's protos: rank [`SLOW`]'s GPU counters show its
/// clocks held down (the whole period), its SM clock and its NVLink errors (`errors_track`);
/// no other rank's GPU was held down or counted NVLink errors.
fn trace_draws_the_gpu_counters(out: &Path, errors_track: &str) {
    let pf = out.join("gpu.pftrace");
    comminsight_tests::write_trace(out, "0..29", &pf);
    let tracks = comminsight_tests::backends::trace_counters(&pf);
    let max = |name: &str, rank: i64| {
        tracks
            .iter()
            .filter(|t| t["name"] == name && t["rank"] == rank)
            .filter_map(|t| t["max"].as_f64())
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    assert_eq!(
        max("GPU clocks held down", SLOW),
        Some(100.0),
        "{tracks:#?}"
    );
    assert!(
        max(errors_track, SLOW).is_some_and(|v| v > 0.0),
        "{tracks:#?}"
    );
    for r in (0..8).filter(|r| *r != SLOW) {
        assert_eq!(
            max("GPU clocks held down", r),
            Some(0.0),
            "rank {r}: {tracks:#?}"
        );
        assert!(
            max("GPU SM clock", r).is_some_and(|v| v >= 1980.0),
            "rank {r}"
        );
        assert!(
            max(errors_track, r).is_none_or(|v| v == 0.0),
            "rank {r}: {tracks:#?}"
        );
    }
}

/// VictoriaMetrics, the OTLP receiver, holds every GPU instrument of rank [`SLOW`]'s GPU with
/// the stand-in's scripted values (and DCGM's SM activity).
fn every_metric_reaches_victoria_metrics(vm: &VictoriaMetrics) {
    // (instrument, its other labels, lowest and highest value expected)
    type Want<'a> = (&'a str, &'a [(&'a str, &'a str)], f64, f64);
    let want: &[Want<'_>] = &[
        ("hw.gpu.utilization", &[], 0.85, 0.85),
        ("hw.gpu.memory.utilization", &[], 0.40, 0.40),
        (
            "hw.gpu.memory.usage",
            &[],
            61.0 * 1073741824.0,
            61.0 * 1073741824.0,
        ),
        ("hw.power", &[], 350.0, 350.0),
        ("hw.energy", &[], 1.0, f64::MAX),
        ("hw.errors", &[("error.type", "ecc_corrected")], 0.0, 0.0),
        ("hw.errors", &[("error.type", "ecc_uncorrected")], 0.0, 0.0),
        ("hw.errors", &[("error.type", "pcie_replay")], 0.0, 0.0),
        (
            "comminsight.gpu.clock",
            &[("comminsight.gpu.clock_type", "sm")],
            1100.0,
            1100.0,
        ),
        (
            "comminsight.gpu.clock",
            &[("comminsight.gpu.clock_type", "memory")],
            2619.0,
            2619.0,
        ),
        (
            "comminsight.gpu.throttle.time",
            &[("comminsight.gpu.throttle_reason", "hw_thermal")],
            0.5,
            f64::MAX,
        ),
        (
            "comminsight.gpu.throttle.time",
            &[("comminsight.gpu.throttle_reason", "sw_power_cap")],
            0.0,
            0.0,
        ),
        ("comminsight.gpu.temperature", &[], 91.0, 91.0),
        (
            "comminsight.gpu.pcie.throughput",
            &[("network.io.direction", "transmit")],
            1.2e9,
            1.2e9,
        ),
        (
            "comminsight.gpu.pcie.throughput",
            &[("network.io.direction", "receive")],
            0.8e9,
            0.8e9,
        ),
        (
            "comminsight.gpu.nvlink.io",
            &[
                ("comminsight.gpu.nvlink", "3"),
                ("network.io.direction", "transmit"),
            ],
            1.0,
            f64::MAX,
        ),
        (
            "comminsight.gpu.nvlink.errors",
            &[("comminsight.gpu.nvlink", "3"), ("error.type", "crc_flit")],
            10.0,
            f64::MAX,
        ),
        (
            "comminsight.gpu.nvlink.errors",
            &[("comminsight.gpu.nvlink", "0"), ("error.type", "crc_flit")],
            0.0,
            0.0,
        ),
        (
            "comminsight.gpu.nvlink.up",
            &[("comminsight.gpu.nvlink", "3")],
            1.0,
            1.0,
        ),
        ("comminsight.gpu.memory.retired_pages", &[], 0.0, 0.0),
        ("comminsight.gpu.memory.remapped_rows", &[], 0.0, 0.0),
        ("comminsight.gpu.sm.active", &[], 0.61, 0.61),
        ("comminsight.gpu.xid", &[], 0.0, 0.0),
    ];
    let ours = |row: &Value, labels: &[(&str, &str)]| {
        let m = &row["metric"];
        m["comminsight.gpu.pci"] == SLOW_PCI
            && m["comminsight.rank"].as_str().and_then(|r| r.parse().ok()) == Some(SLOW)
            && m["hw.type"] == "gpu"
            && m["hw.id"]
                .as_str()
                .is_some_and(|u| u.starts_with("GPU-5c1ab1e0-"))
            && labels.iter().all(|(k, v)| m[*k] == *v)
    };
    let mut missing = Vec::new();
    let mut seen = (0, Value::Null);
    let done = wait_until(Duration::from_secs(20), || {
        let rows = vm.export("hw[.].*|comminsight[.]gpu[.].*");
        seen = (rows.len(), rows.first().cloned().unwrap_or_default());
        missing = want
            .iter()
            .filter(|(name, labels, lo, hi)| {
                !rows.iter().any(|r| {
                    r["metric"]["__name__"] == *name
                        && ours(r, labels)
                        && r["values"]
                            .as_array()
                            .and_then(|v| v.last())
                            .and_then(Value::as_f64)
                            .is_some_and(|v| v >= *lo - 1e-9 && v <= *hi)
                })
            })
            .map(|w| format!("{} {:?}", w.0, w.1))
            .collect();
        missing.is_empty()
    });
    assert!(
        done,
        "not in VictoriaMetrics with the scripted value: {missing:#?}\n{} series, the first: {:#}",
        seen.0, seen.1
    );
}

/// `/metrics`: the `hw.gpu.*` instruments with the rank bound to each GPU.
fn metrics_name_the_rank_and_its_gpu(addr: &str) {
    let text = http_get(addr, "/metrics");
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

/// The host stream's `gpu` / `nvlink` / `xid` records (`comminsight-agent dump --json`).
fn dump_gpu_records(streams: &Path) -> Vec<Value> {
    let o = agent(&[
        "dump",
        streams.to_str().unwrap(),
        "--json",
        "--kind",
        "gpu,nvlink,xid",
    ]);
    assert!(
        o.status.success(),
        "dump: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The host stream holds NVML `gpu` records with every metric the stand-in supports, and
/// `nvlink` records with state, throughput and errors; of the DCGM scrapes beside NVML, only
/// the SM activity (and no XID: NVML's event thread has them).
fn host_stream_holds_every_metric(streams: &Path) {
    use comminsight_wire::gpu::{gpu_source, gpu_valid};
    let recs = dump_gpu_records(streams);
    let source = |r: &&Value, s: u8| r["source"] == s;
    let gpus: Vec<&Value> = recs
        .iter()
        .filter(|r| r["kind"] == "gpu" && source(r, gpu_source::NVML))
        .collect();
    assert!(gpus.len() >= 8 * 5, "{} NVML gpu records", gpus.len());
    let all = gpu_valid::SM_ACTIVE - 1;
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
        links
            .iter()
            .all(|l| l["valid"] == 7 && l["up"] == 1 && source(l, gpu_source::NVML)),
        "{:#}",
        links[0]
    );
    assert!(links
        .iter()
        .any(|l| l["pci"] == slow && l["link"] == 3 && l["crc_flit"].as_u64() > Some(0)));
    let dcgm: Vec<&Value> = recs
        .iter()
        .filter(|r| source(r, gpu_source::DCGM))
        .collect();
    assert!(dcgm.len() >= 8, "{} DCGM records", dcgm.len());
    assert!(
        dcgm.iter().all(|r| r["kind"] == "gpu"
            && r["valid"] == gpu_valid::SM_ACTIVE
            && r["sm_clock_mhz"] == 0),
        "{:#?}",
        dcgm.iter().find(|r| r["valid"] != gpu_valid::SM_ACTIVE)
    );
    assert!(
        !recs.iter().any(|r| r["kind"] == "xid"),
        "no XID was raised"
    );
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
        true,
        "",
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

/// dcgm-exporter's fields for the DCGM-only test: rank [`SLOW`]'s GPU held down by HW slowdown
/// and thermal at 1100 MHz with its NVLink CRC total rising 40 per scrape; rank 3's GPU raises
/// XID 79 from the 4th scrape; GPU 7 is named by its UUID alone (an older exporter).
fn throttled_dcgm() -> comminsight_tests::dcgm::DcgmExporter {
    use comminsight_tests::dcgm::{body, DcgmExporter, GpuLines, DGX_H100};
    DcgmExporter::start(|n| {
        let gpus: Vec<GpuLines> = DGX_H100
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let slow = i as i64 == SLOW;
                let v = |a: &str, b: &str| if slow { a.to_string() } else { b.to_string() };
                GpuLines {
                    index: i,
                    pci: p.to_string(),
                    no_pci_label: i == 7,
                    fields: vec![
                        ("DCGM_FI_DEV_SM_CLOCK", "gauge", v("1100", "1980")),
                        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "2619".into()),
                        ("DCGM_FI_DEV_GPU_TEMP", "gauge", v("91", "64")),
                        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "612.5".into()),
                        (
                            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                            "counter",
                            (1_000_000 + 120_000 * n).to_string(),
                        ),
                        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "97".into()),
                        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "41".into()),
                        ("DCGM_FI_DEV_FB_USED", "gauge", "62464".into()),
                        ("DCGM_FI_PROF_SM_ACTIVE", "gauge", v("0.61", "0.93")),
                        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", v("72", "0")),
                        (
                            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                            "counter",
                            if slow { 100 + 40 * n } else { 3 }.to_string(),
                        ),
                        ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "2.5e+10".into()),
                        (
                            "DCGM_FI_DEV_XID_ERRORS",
                            "gauge",
                            if i == 3 && n >= 3 { "79" } else { "0" }.into(),
                        ),
                        // Not supported on this GPU: DCGM's blank.
                        (
                            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                            "counter",
                            "9223372036854775794".into(),
                        ),
                    ],
                }
            })
            .collect();
        body(&gpus)
    })
}

/// Rank [`SLOW`]'s GPU evidence from DCGM: held down, 1100 MHz, errors on all its NVLinks.
fn assert_dcgm_evidence(r: &Value, what: &str) {
    assert_eq!(r["class"], "gpu-throttled", "{what}: {r:#}");
    let g = &r["host_gpu"];
    assert!(g["slowdown_pct"].as_f64() > Some(80.0), "{what}: {r:#}");
    assert_eq!(g["min_sm_clock_mhz"], 1100, "{what}: {r:#}");
    assert!(g["nvlink_errors"].as_u64() > Some(10), "{what}: {r:#}");
    assert_eq!(g["links"][0]["gpu"], SLOW_PCI, "{what}: {r:#}");
    assert_eq!(g["links"][0]["link"], 255, "{what}: all links: {r:#}");
    let reason = r["class_reason"].as_str().unwrap_or("");
    assert!(reason.contains("GPU clocks held down"), "{what}: {reason}");
}

#[test]
fn dcgm_exporter_alone_names_the_throttled_gpu_live_and_offline() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("straggler-dcgm");
    std::fs::create_dir_all(out.path()).unwrap();
    let (mut tb, host) = slow_rank_job(out.path());
    let dcgm = throttled_dcgm();
    let daemon = gpu_daemon(
        out.path(),
        &host,
        "",
        false,
        &format!("dcgm_url = {:?}\ndcgm_interval_ms = 200", dcgm.url),
        "",
    );
    let state = out.path().join("state");
    let gpu = || status(&state)["host_context"]["gpu"].clone();
    let all = wait_until(Duration::from_secs(20), || {
        gpu()["dcgm"]
            .as_str()
            .is_some_and(|d| d.ends_with(": 8 GPUs"))
    });
    assert!(all, "GPU 7 by its UUID too: {:#}", gpu());
    let g = gpu();
    assert!(
        g["nvml"]
            .as_str()
            .is_some_and(|n| n.starts_with("off: cannot load")),
        "{g:#}"
    );
    assert_eq!(g["dcgm"], format!("on ({}): 8 GPUs", dcgm.url), "{g:#}");
    let addr = status(&state)["http"].as_str().unwrap().to_string();
    let live = live_gpu_throttled(&state, &mut tb);
    assert_dcgm_evidence(&rank_of(&live, SLOW), "live");
    let text = http_get(&addr, "/metrics");
    let active = text
        .lines()
        .find(|l| {
            l.starts_with("comminsight_gpu_sm_active_ratio{")
                && l.contains(&format!("comminsight_gpu_pci=\"{SLOW_PCI}\""))
        })
        .unwrap_or_else(|| panic!("no SM activity of {SLOW_PCI}: {text}"));
    assert!(
        active.contains(&format!("comminsight_rank=\"{SLOW}\"")) && active.ends_with(" 0.61"),
        "{active}"
    );
    archived_then_stop(out.path(), daemon);
    same_gpu_evidence_over_the_live_steps(out.path(), &read_live(&state).unwrap());

    let report = offline_report(out.path());
    assert_dcgm_evidence(&rank_of(&report, SLOW), "offline");
    let from_archive = offline_report(&out.path().join("archive"));
    assert_eq!(
        rank_of(&from_archive, SLOW)["host_gpu"],
        rank_of(&report, SLOW)["host_gpu"],
        "archive and segments agree"
    );
    let recs = dump_gpu_records(&state.join("host-streams"));
    let xids: Vec<&Value> = recs.iter().filter(|r| r["kind"] == "xid").collect();
    let rank3 = comminsight_wire::gpu::pci::parse("0000:5d:00.0").unwrap();
    assert!(
        xids.len() == 1
            && xids[0]["xid"] == 79
            && xids[0]["pci"] == rank3
            && xids[0]["source"] == 2,
        "{xids:#?}"
    );
    let slow = comminsight_wire::gpu::pci::parse(SLOW_PCI).unwrap();
    let g = recs
        .iter()
        .rfind(|r| r["kind"] == "gpu" && r["pci"] == slow)
        .unwrap();
    assert_eq!(
        (
            &g["power_mw"],
            &g["temperature_c"],
            &g["sm_active_share"],
            &g["memory_used_bytes"]
        ),
        (
            &Value::from(612_500),
            &Value::from(91),
            &Value::from(6100),
            &Value::from(61u64 << 30)
        ),
        "{g:#}"
    );
    assert_eq!(
        g["valid"].as_u64().unwrap() & u64::from(comminsight_wire::gpu::gpu_valid::PCIE_REPLAYS),
        0,
        "a blank field is absent: {g:#}"
    );
    trace_draws_the_gpu_counters(out.path(), "NVLinks (all) errors");
}

/// `GET path` from the daemon's endpoint at `addr`: the body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

//! OTLP export against real components: VictoriaMetrics (metrics over OTLP/HTTP, queried back;
//! a 30 s outage) and a Python receiver decoding with the official opentelemetry-proto classes
//! (log records over HTTP, an outage with a bounded backlog, metrics and logs over gRPC).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comminsight_agent::config::{OtlpConfig, OtlpProtocol};
use comminsight_agent::metrics::{MetricsAggregator, SelfMetrics};
use comminsight_agent::sinks::{AttrValue, LogEvent, OtlpSink, Severity};
use comminsight_agent::StreamId;
use comminsight_wire::names::{Algo, DataType, Func, Proto};
use comminsight_wire::record::{Body, CommInit, OpRecord, Overdue, Record, Timing};
use serde_json::Value;

fn tool(rel: &str) -> PathBuf {
    let root = std::env::var_os("COMMINSIGHT_TEST_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-tools"))
        });
    let p = root.join(rel);
    assert!(
        p.exists(),
        "missing test tool {}: run `cargo xtask deps`",
        p.display()
    );
    p
}

/// A unique temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("ci-otlp-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (and reaped) on drop, also on panic.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A minimal HTTP/1.0 exchange; the response body on status 200.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}

fn comm_init(seq: u64, hash: u64, name: &str, nranks: u32) -> Record {
    let mut r = Record::new(Body::CommInit(CommInit {
        comm_hash: hash,
        nranks,
        comm_name: name.into(),
        ..Default::default()
    }));
    r.seq = seq;
    r
}

/// An AllReduce of `bytes` bytes that took `us` µs on the GPU.
fn allreduce(seq: u64, hash: u64, bytes: u64, us: u64) -> Record {
    let start = 1_764_000_000_000_000_000 + seq * 1_000_000;
    let mut r = Record::new(Body::Coll(OpRecord {
        comm_hash: hash,
        coll_sn: seq,
        count: bytes / 4,
        bytes,
        start_ns: start,
        end_ns: start + us * 1000 + 5_000,
        gpu_start_ns: 7_000,
        gpu_end_ns: 7_000 + us * 1000,
        func: Func::ALL_REDUCE,
        datatype: DataType::from_name("ncclFloat32"),
        algo: Algo::from_name("RING"),
        proto: Proto::from_name("LL128"),
        timing: Timing::KernelGpu,
        ..Default::default()
    }));
    r.seq = seq;
    r
}

fn config(protocol: OtlpProtocol) -> OtlpConfig {
    OtlpConfig {
        enabled: true,
        protocol,
        export_interval_ms: 1000,
        timeout_ms: 2000,
        retry_initial_ms: 200,
        retry_max_ms: 1000,
        ..OtlpConfig::default()
    }
}

/// Observe `n` AllReduces (durations 1..=n * 7 µs, 1 MiB) from sequence `first` on; returns
/// (sum of durations in µs, how many took <= 100 µs).
fn feed(agg: &Mutex<MetricsAggregator>, stream: &StreamId, first: u64, n: u64) -> (u64, u64) {
    let mut agg = agg.lock().unwrap();
    let (mut sum, mut le100) = (0, 0);
    for i in first..first + n {
        let us = 7 * (i % 40 + 1);
        agg.observe(stream, &allreduce(i, 0xd0, 1 << 20, us));
        sum += us;
        le100 += u64::from(us <= 100);
    }
    (sum, le100)
}

// ---------------------------------------------------------------- VictoriaMetrics

fn start_vm(port: u16, data: &Path) -> Server {
    let child = Command::new(tool("victoria-metrics/usr/bin/victoria-metrics"))
        .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
        .arg(format!("-storageDataPath={}", data.display()))
        .args([
            "-search.latencyOffset=0s",
            "-retentionPeriod=1d",
            "-loggerLevel=ERROR",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start victoria-metrics");
    let server = Server(child);
    wait_until("VictoriaMetrics /health", Duration::from_secs(20), || {
        http(port, "GET", "/health", "").filter(|b| b.trim() == "OK")
    });
    server
}

/// Latest value of every exported series whose name starts with `comminsight.`, keyed by
/// `name{label=value,...}` (labels sorted, `le` included).
fn vm_latest(port: u16) -> Vec<(String, serde_json::Map<String, Value>, f64)> {
    let body = http(
        port,
        "POST",
        "/api/v1/export",
        "match[]=%7B__name__%3D~%22comminsight.*%22%7D",
    )
    .unwrap_or_default();
    body.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let mut metric = v["metric"].as_object()?.clone();
            let name = metric.remove("__name__")?.as_str()?.to_owned();
            let last = v["values"].as_array()?.last()?.as_f64()?;
            Some((name, metric, last))
        })
        .collect()
}

fn vm_value(
    series: &[(String, serde_json::Map<String, Value>, f64)],
    name: &str,
    host: &str,
    le: Option<f64>,
) -> Option<f64> {
    series
        .iter()
        .find(|(n, m, _)| {
            let label = |k: &str| m.get(k).and_then(|v| v.as_str());
            n == name
                && label("comminsight.comm.name") == Some("dp")
                && label("host.name") == Some(host)
                && le.is_none_or(|le| label("le").and_then(|v| v.parse::<f64>().ok()) == Some(le))
        })
        .map(|s| s.2)
}

/// Wait until VictoriaMetrics has `host`'s native histogram: count, sum (seconds), the
/// 100 µs bucket and +Inf, and the payload counter.
fn wait_for_vm_totals(port: u16, host: &str, ops: u64, sum_us: u64, le100: u64) {
    wait_until(
        &format!("VictoriaMetrics to hold {ops} ops of {host}"),
        Duration::from_secs(15),
        || {
            let s = vm_latest(port);
            let h = "comminsight.op.duration";
            let count = vm_value(&s, &format!("{h}_count"), host, None)?;
            let sum = vm_value(&s, &format!("{h}_sum"), host, None)?;
            let b100 = vm_value(&s, &format!("{h}_bucket"), host, Some(1e-4))?;
            let inf = vm_value(&s, &format!("{h}_bucket"), host, Some(f64::INFINITY))?;
            let payload = vm_value(&s, "comminsight.op.payload", host, None)?;
            let want_sum = sum_us as f64 / 1e6;
            ((count, b100, inf, payload)
                == (ops as f64, le100 as f64, ops as f64, (ops << 20) as f64)
                && (sum - want_sum).abs() <= 1e-9 * want_sum.max(1.0))
            .then_some(())
        },
    );
}

/// Captured `tracing` output of this test binary.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The tracing output of this test binary (one subscriber per process: every test that calls
/// this shares the buffer and filters it by its own endpoint).
fn capture_tracing() -> Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let cap = Captured::default();
            let writer = cap.clone();
            let _ = tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .try_init();
            cap
        })
        .clone()
}

#[test]
fn victoria_metrics_receives_totals_across_a_30s_outage() {
    let logs = capture_tracing();
    let data = TempDir::new("vm");
    let port = free_port();
    let vm = start_vm(port, &data.0);
    let stream = StreamId::new("job-vm", "node-1", "4242");
    let agg = Arc::new(Mutex::new(MetricsAggregator::new(100)));
    agg.lock()
        .unwrap()
        .observe(&stream, &comm_init(0, 0xd0, "dp", 8));
    let (sum1, le1) = feed(&agg, &stream, 1, 100);

    let metrics_url = format!("http://127.0.0.1:{port}/opentelemetry/v1/metrics");
    let cfg = OtlpConfig {
        metrics_endpoint: metrics_url.clone(),
        logs_endpoint: format!("http://127.0.0.1:{}/v1/logs", free_port()),
        ..config(OtlpProtocol::HttpProtobuf)
    };
    let agent = Arc::new(SelfMetrics::default());
    let sink = OtlpSink::start(&cfg, "node-1", agg.clone(), agent.clone()).unwrap();
    // A second agent, same job and communicator name, another host: its series stay apart.
    let stream2 = StreamId::new("job-vm", "node-2", "77");
    let agg2 = Arc::new(Mutex::new(MetricsAggregator::new(100)));
    agg2.lock()
        .unwrap()
        .observe(&stream2, &comm_init(0, 0xd0, "dp", 8));
    let (sum_b, le_b) = feed(&agg2, &stream2, 1, 30);
    let sink2 = OtlpSink::start(&cfg, "node-2", agg2, Arc::default()).unwrap();
    wait_for_vm_totals(port, "node-1", 100, sum1, le1);
    wait_for_vm_totals(port, "node-2", 30, sum_b, le_b);
    sink2.shutdown();
    let series = vm_latest(port);
    let (_, labels, _) = series
        .iter()
        .find(|s| {
            s.0 == "comminsight.op.duration_count"
                && s.1.get("host.name").and_then(|v| v.as_str()) == Some("node-1")
        })
        .unwrap();
    let text = serde_json::to_string(labels).unwrap();
    for want in [
        "job-vm",
        "node-1",
        "comminsight-agent",
        "AllReduce",
        "<=1MiB",
        "RING",
        "LL128",
    ] {
        assert!(text.contains(want), "{want} missing from the labels {text}");
    }
    let busbw = vm_value(&series, "comminsight.op.busbw", "node-1", None).unwrap();
    // By/s now (was GB/s).
    let want_busbw = (100u64 << 20) as f64 / (sum1 as f64 * 1000.0) * 14.0 / 8.0 * 1e9;
    assert!(
        (busbw - want_busbw).abs() < 1e-6 * want_busbw,
        "busbw {busbw} want {want_busbw}"
    );

    // Outage: 30 s without the backend while records keep arriving.
    drop(vm);
    let failures_before = sink.stats().metric_failures;
    let outage = Instant::now();
    let (sum2, le2) = feed(&agg, &stream, 101, 50);
    while outage.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let st = sink.stats();
    assert!(st.metric_failures >= failures_before + 5, "{st:?}");
    assert_eq!(st.metric_failure_streaks, 1, "{st:?}");
    assert!(agent.values().sink_errors >= 5);
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&metrics_url) && l.contains("export failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per failure streak:\n{text}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(!text.contains("ERROR"), "{text}");

    let _vm = start_vm(port, &data.0);
    wait_for_vm_totals(port, "node-1", 150, sum1 + sum2, le1 + le2);
    let st = sink.stats();
    assert_eq!(st.metric_failure_streaks, 1, "{st:?}");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("works again"), "{text}");
    sink.shutdown();
}

// ---------------------------------------------------------------- Python OTLP receiver

struct Receiver {
    _server: Server,
    out: PathBuf,
}

fn start_receiver(dir: &Path, http_port: u16, grpc_port: Option<u16>) -> Receiver {
    let out = dir.join(format!("received-{http_port}.jsonl"));
    let mut cmd = Command::new(tool("venv/bin/python"));
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/py/otlp_receiver.py"
    ))
    .arg(&out)
    .arg(http_port.to_string());
    if let Some(p) = grpc_port {
        cmd.arg(p.to_string());
    }
    let server = Server(
        cmd.stdout(Stdio::null())
            .spawn()
            .expect("start the OTLP receiver"),
    );
    for port in [Some(http_port), grpc_port].into_iter().flatten() {
        wait_until("the OTLP receiver", Duration::from_secs(20), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
    }
    Receiver {
        _server: server,
        out,
    }
}

/// Requests the receiver got, as (transport, signal, request).
fn received(r: &Receiver) -> Vec<(String, String, Value)> {
    received_with_headers(r)
        .into_iter()
        .map(|(t, s, req, _)| (t, s, req))
        .collect()
}

/// Requests the receiver got, as (transport, signal, request, headers).
fn received_with_headers(r: &Receiver) -> Vec<(String, String, Value, Value)> {
    std::fs::read_to_string(&r.out)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            (
                s("transport"),
                s("signal"),
                v["request"].clone(),
                v["headers"].clone(),
            )
        })
        .collect()
}

/// The log records of every logs request.
fn log_records(r: &Receiver, transport: &str) -> Vec<(Value, Value)> {
    let mut out = Vec::new();
    for (t, sig, req) in received(r) {
        if t != transport || sig != "logs" {
            continue;
        }
        for rl in req["resourceLogs"].as_array().into_iter().flatten() {
            for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                for lr in sl["logRecords"].as_array().into_iter().flatten() {
                    out.push((rl["resource"].clone(), lr.clone()));
                }
            }
        }
    }
    out
}

fn attr<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn overdue(age_ms: u32) -> LogEvent {
    let o = Overdue {
        comm_hash: 0xfeed,
        coll_sn: 17,
        rank: 5,
        age_ms,
        func: Func::ALL_GATHER,
        phase: 0,
        now_ns: 1_764_000_000_123_000_000,
        ..Default::default()
    };
    LogEvent::overdue("job-logs", "node-2", Some("tp"), &o)
}

fn assert_overdue_record(resource: &Value, rec: &Value, age_ms: u32) {
    assert_eq!(rec["severityNumber"], "SEVERITY_NUMBER_WARN", "{rec}");
    assert_eq!(rec["severityText"], "WARN");
    assert_eq!(rec["eventName"], "comminsight.op.overdue", "{rec}");
    assert_eq!(rec["timeUnixNano"], "1764000000123000000");
    let body = rec["body"]["stringValue"].as_str().unwrap();
    assert!(
        body.starts_with(
            "AllGather collective on comm tp (0x000000000000feed) seq 17 rank 5 overdue: enqueued"
        ),
        "{body}"
    );
    assert_eq!(
        attr(rec, "comminsight.job.id").unwrap()["stringValue"],
        "job-logs"
    );
    assert_eq!(
        attr(rec, "comminsight.op.func").unwrap()["stringValue"],
        "AllGather"
    );
    assert_eq!(
        attr(rec, "comminsight.op.age").unwrap()["doubleValue"].as_f64(),
        Some(f64::from(age_ms) / 1e3)
    );
    assert_eq!(attr(rec, "comminsight.rank").unwrap()["intValue"], "5");
    assert_eq!(
        attr(resource, "service.name").unwrap()["stringValue"],
        "comminsight-agent"
    );
    assert_eq!(
        attr(resource, "host.name").unwrap()["stringValue"],
        "node-2"
    );
    // The full resource: an agent is its own instance.
    assert_eq!(
        attr(resource, "service.instance.id").unwrap()["stringValue"],
        "node-2"
    );
    assert!(attr(resource, "service.version").is_some(), "{resource}");
}

#[test]
fn log_records_arrive_over_http_and_survive_an_outage() {
    let dir = TempDir::new("logs");
    let port = free_port();
    let cfg = OtlpConfig {
        endpoint: format!("http://127.0.0.1:{port}/"),
        max_backlog: 3,
        headers: vec!["x-ci-token=s3cret".into()],
        ..config(OtlpProtocol::HttpProtobuf)
    };
    let agg = Arc::new(Mutex::new(MetricsAggregator::new(100)));
    let agent = Arc::new(SelfMetrics::default());
    // Started from async code, as the daemon does.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sink = rt
        .block_on(async { OtlpSink::start(&cfg, "node-2", agg.clone(), agent.clone()) })
        .unwrap();
    // Backend down: five findings, a backlog of three -> the two oldest are dropped.
    for age in 1..=5 {
        sink.emit(overdue(30_000 + age));
    }
    wait_until("a failed log export", Duration::from_secs(10), || {
        (agent.values().sink_errors >= 2).then_some(())
    });
    let st = sink.stats();
    assert_eq!(
        (st.logs_sent, st.logs_dropped, st.logs_pending),
        (0, 2, 3),
        "{st:?}"
    );
    assert_eq!(agent.values().logs_dropped, 2);

    let stream = StreamId::new("job-logs", "node-2", "7");
    agg.lock()
        .unwrap()
        .observe(&stream, &comm_init(0, 0xd0, "dp", 8));
    feed(&agg, &stream, 1, 10);
    let rx = start_receiver(&dir.0, port, None);
    let recs = wait_until(
        "the backlog after the receiver started",
        Duration::from_secs(10),
        || {
            let r = log_records(&rx, "http");
            (r.len() >= 3).then_some(r)
        },
    );
    assert_eq!(recs.len(), 3, "each record delivered once");
    for (i, (res, rec)) in recs.iter().enumerate() {
        assert_overdue_record(res, rec, 30_003 + i as u32);
    }
    // The receiver can hold the records before the exporter has seen its reply and counted
    // them sent: wait for the counters (they must reach exactly these values).
    let st = wait_until("the backlog counted sent", Duration::from_secs(10), || {
        let st = sink.stats();
        (st.logs_pending == 0).then_some(st)
    });
    assert_eq!(
        (st.logs_sent, st.logs_dropped, st.logs_pending),
        (3, 2, 0),
        "{st:?}"
    );

    // A finding while the backend is up arrives promptly; metrics arrive on /v1/metrics.
    sink.emit(LogEvent {
        event_name: "ci.test".into(),
        severity: Severity::Error,
        body: "hang".into(),
        attributes: vec![("comminsight.ok".into(), AttrValue::Bool(false))],
        time_ns: 0,
    });
    let recs = wait_until("the fourth record", Duration::from_secs(10), || {
        let r = log_records(&rx, "http");
        (r.len() == 4).then_some(r)
    });
    assert_eq!(recs[3].1["severityNumber"], "SEVERITY_NUMBER_ERROR");
    assert_eq!(
        attr(&recs[3].1, "comminsight.ok").unwrap()["boolValue"],
        false
    );
    wait_until("metrics over HTTP", Duration::from_secs(10), || {
        received(&rx)
            .iter()
            .any(|(t, s, req)| t == "http" && s == "metrics" && ops_value(req) == Some(10))
            .then_some(())
    });
    // Every request was gzip-compressed and carried the configured header (the receiver
    // decompresses and records both).
    let all = received_with_headers(&rx);
    assert!(!all.is_empty());
    for (_, _, _, h) in &all {
        assert_eq!(h["content-encoding"], "gzip", "{h}");
        assert_eq!(h["x-ci-token"], "s3cret", "{h}");
    }
    sink.shutdown();
}

/// The count of the native `comminsight.op.duration` histogram for comm `dp` in a metrics
/// request (checking it is cumulative, in seconds, with the host on the point).
fn ops_value(req: &Value) -> Option<u64> {
    for rm in req["resourceMetrics"].as_array()? {
        for sm in rm["scopeMetrics"].as_array()? {
            for m in sm["metrics"].as_array()? {
                if m["name"] != "comminsight.op.duration" {
                    continue;
                }
                assert_eq!(m["unit"], "s");
                assert_eq!(
                    m["histogram"]["aggregationTemporality"],
                    "AGGREGATION_TEMPORALITY_CUMULATIVE"
                );
                for dp in m["histogram"]["dataPoints"].as_array()? {
                    if attr(dp, "comminsight.comm.name")?["stringValue"] == "dp" {
                        assert!(attr(dp, "host.name").is_some(), "{dp}");
                        let n = dp["bucketCounts"].as_array()?.len();
                        assert_eq!(n, dp["explicitBounds"].as_array()?.len() + 1);
                        return dp["count"].as_str()?.parse().ok();
                    }
                }
            }
        }
    }
    None
}

#[test]
fn metrics_and_logs_arrive_over_grpc() {
    let dir = TempDir::new("grpc");
    let (http_port, grpc_port) = (free_port(), free_port());
    let rx = start_receiver(&dir.0, http_port, Some(grpc_port));
    let cfg = OtlpConfig {
        endpoint: format!("http://127.0.0.1:{grpc_port}"),
        headers: vec!["x-ci-token=grpc-secret".into()],
        ..config(OtlpProtocol::Grpc)
    };
    let agg = Arc::new(Mutex::new(MetricsAggregator::new(100)));
    let stream = StreamId::new("job-logs", "node-2", "8");
    agg.lock()
        .unwrap()
        .observe(&stream, &comm_init(0, 0xd0, "dp", 8));
    feed(&agg, &stream, 1, 25);
    let agent = Arc::new(SelfMetrics::default());
    agent.add_records(26, 26 * 128);
    // Started from async code, as the daemon does; the sink brings its own gRPC runtime.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sink = rt
        .block_on(async { OtlpSink::start(&cfg, "node-2", agg, agent) })
        .unwrap();
    sink.emit(overdue(31_000));
    let recs = wait_until("a log record over gRPC", Duration::from_secs(10), || {
        let r = log_records(&rx, "grpc");
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(recs.len(), 1);
    assert_overdue_record(&recs[0].0, &recs[0].1, 31_000);
    wait_until("metrics over gRPC", Duration::from_secs(10), || {
        received(&rx)
            .iter()
            .any(|(t, s, req)| t == "grpc" && s == "metrics" && ops_value(req) == Some(25))
            .then_some(())
    });
    assert!(received(&rx).iter().all(|(t, _, _)| t == "grpc"));
    for (_, _, _, h) in received_with_headers(&rx) {
        assert_eq!(h["x-ci-token"], "grpc-secret", "{h}");
    }
    rt.block_on(async { tokio::task::spawn_blocking(move || sink.shutdown()).await })
        .unwrap();
}

/// Run `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (cargo xtask deps installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `<name>.pem` (with its key) in `dir`.
fn make_ca(dir: &Path, name: &str) {
    let (key, pem, subj) = (
        format!("{name}.key"),
        format!("{name}.pem"),
        format!("/CN={name}"),
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subj,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A server certificate for 127.0.0.1 signed by CA `ca`: `server.pem`, `server.key`.
fn make_server_cert(dir: &Path, ca: &str) {
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

#[test]
fn grpc_over_tls_with_a_test_ca_and_a_wrong_ca_fails_in_one_line() {
    let logs = capture_tracing();
    let dir = TempDir::new("tls");
    make_ca(&dir.0, "ci-ca");
    make_ca(&dir.0, "other-ca");
    make_server_cert(&dir.0, "ci-ca");
    let (http_port, grpc_port) = (free_port(), free_port());
    let out = dir.0.join("received-tls.jsonl");
    let server = Server(
        Command::new(tool("venv/bin/python"))
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/py/otlp_receiver.py"
            ))
            .arg(&out)
            .arg(http_port.to_string())
            .arg(grpc_port.to_string())
            .arg(dir.0.join("server.pem"))
            .arg(dir.0.join("server.key"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start the OTLP receiver"),
    );
    wait_until("the TLS receiver", Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", grpc_port)).ok()
    });
    let rx = Receiver {
        _server: server,
        out,
    };
    let endpoint = format!("https://127.0.0.1:{grpc_port}");
    let agg = Arc::new(Mutex::new(MetricsAggregator::new(100)));
    let stream = StreamId::new("job-tls", "node-3", "9");
    agg.lock()
        .unwrap()
        .observe(&stream, &comm_init(0, 0xd0, "dp", 8));
    feed(&agg, &stream, 1, 12);
    let rt = tokio::runtime::Runtime::new().unwrap();

    // The right CA: metrics arrive over TLS.
    let good = OtlpConfig {
        endpoint: endpoint.clone(),
        ca_file: dir.0.join("ci-ca.pem").display().to_string(),
        ..config(OtlpProtocol::Grpc)
    };
    let sink = rt
        .block_on(async { OtlpSink::start(&good, "node-3", agg.clone(), Arc::default()) })
        .unwrap();
    wait_until("metrics over gRPC/TLS", Duration::from_secs(15), || {
        received(&rx)
            .iter()
            .any(|(t, s, req)| t == "grpc" && s == "metrics" && ops_value(req) == Some(12))
            .then_some(())
    });
    assert_eq!(sink.stats().metric_failures, 0, "{:?}", sink.stats());
    rt.block_on(async { tokio::task::spawn_blocking(move || sink.shutdown()).await })
        .unwrap();

    // Another CA: every export fails, with one warning line that says why.
    let wrong = OtlpConfig {
        ca_file: dir.0.join("other-ca.pem").display().to_string(),
        ..good.clone()
    };
    let sink = rt
        .block_on(async { OtlpSink::start(&wrong, "node-3", agg.clone(), Arc::default()) })
        .unwrap();
    let st = wait_until("a failed TLS export", Duration::from_secs(15), || {
        let st = sink.stats();
        (st.metric_failures >= 1).then_some(st)
    });
    assert_eq!(st.metric_exports, 0, "{st:?}");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&endpoint) && l.contains("export failed"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("UnknownIssuer") || lines[0].contains("certificate"),
        "the warning names the certificate problem: {}",
        lines[0]
    );
    rt.block_on(async { tokio::task::spawn_blocking(move || sink.shutdown()).await })
        .unwrap();

    // A CA file that is no PEM: start fails with one line naming the file.
    std::fs::write(dir.0.join("junk.pem"), "not a certificate").unwrap();
    let junk = OtlpConfig {
        ca_file: dir.0.join("junk.pem").display().to_string(),
        ..good
    };
    let err = rt
        .block_on(async { OtlpSink::start(&junk, "node-3", agg, Arc::default()) })
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("[otlp] ca_file = ") && err.contains("junk.pem") && !err.contains('\n'),
        "{err}"
    );
}

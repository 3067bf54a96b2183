//! Issue 18's acceptance for `/metrics`: Debian's Prometheus server (started here on loopback)
//! scrapes two real daemons (different state directories and host names) every second; their
//! series stay distinct per host (`host_name` and `instance`), and `histogram_quantile` over
//! `comminsight_op_duration_seconds_bucket` lands in the bucket of the known operation times.

use std::process::{Command, Stdio};
use std::time::Duration;

use comminsight_agent::http::client::get;

mod daemon_support;
mod support;
use daemon_support::{http_addr, setup, start, wait_for, write_stream};
use support::TempDir;

/// The Prometheus server binary: `cargo xtask deps` installs Debian's `prometheus`.
const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A child killed on drop.
struct Server(std::process::Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `query` percent-encoded for a URL.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The result vector of an instant query: `(labels, value)`.
fn query(prom: &str, q: &str) -> Vec<(serde_json::Map<String, serde_json::Value>, f64)> {
    let Ok(r) = get(prom, &format!("/api/v1/query?query={}", encode(q))) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| {
                    let labels = x["metric"].as_object()?.clone();
                    let val = x["value"][1].as_str()?.parse::<f64>().ok()?;
                    Some((labels, val))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn prometheus_scrapes_two_agents_with_distinct_hosts_and_right_quantiles() {
    assert!(
        std::path::Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} missing: run `cargo xtask deps` (installs Debian's prometheus)"
    );
    let dir = TempDir::new("prometheus");
    // node-a: 90 ops of 30 µs and 10 of 3 ms; node-b: 100 ops of 300 µs.
    let a = setup(&dir.path().join("a"), "node-a", "");
    let b = setup(&dir.path().join("b"), "node-b", "");
    let mut times_a = vec![30u64; 90];
    times_a.extend([3_000u64; 10]);
    write_stream(&a.logs, "jobp", "node-a", 100, 0, &times_a);
    write_stream(&b.logs, "jobp", "node-b", 200, 1, &[300; 100]);
    let _da = start(&a, &[]);
    let _db = start(&b, &[]);
    let (addr_a, addr_b) = (http_addr(&a), http_addr(&b));
    // Both daemons have taken every op in (their own /metrics counts them).
    for addr in [&addr_a, &addr_b] {
        wait_for(
            &format!("100 ops on http://{addr}/metrics"),
            Duration::from_secs(30),
            || {
                let body = String::from_utf8(get(addr, "/metrics").ok()?.body).ok()?;
                body.lines()
                    .any(|l| {
                        l.starts_with("comminsight_op_duration_seconds_count")
                            && l.ends_with(" 100")
                    })
                    .then_some(())
            },
        );
    }
    let prom_port = free_port();
    let prom = format!("127.0.0.1:{prom_port}");
    let pdir = dir.path().join("prom");
    std::fs::create_dir_all(&pdir).unwrap();
    let conf = pdir.join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: comminsight\n    static_configs:\n      - targets: ['{addr_a}', '{addr_b}']\n"
        ),
    )
    .unwrap();
    let _p = Server(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                pdir.join("data").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(pdir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus"),
    );
    // Both targets up.
    let up = wait_for(
        "both targets up in Prometheus",
        Duration::from_secs(60),
        || {
            let r = query(&prom, "up == 1");
            (r.len() == 2).then_some(r)
        },
    );
    let mut instances: Vec<String> = up
        .iter()
        .map(|(l, _)| l["instance"].as_str().unwrap_or_default().to_string())
        .collect();
    instances.sort();
    let mut want = vec![addr_a.clone(), addr_b.clone()];
    want.sort();
    assert_eq!(instances, want);
    // One count series per host, each on its own instance, with its own total.
    let counts = wait_for("op counts of both hosts", Duration::from_secs(30), || {
        let r = query(
            &prom,
            "sum by (host_name, instance) (comminsight_op_duration_seconds_count)",
        );
        (r.len() == 2).then_some(r)
    });
    for (labels, v) in &counts {
        let host = labels["host_name"].as_str().unwrap_or_default();
        let inst = labels["instance"].as_str().unwrap_or_default();
        let expect = if host == "node-a" { &addr_a } else { &addr_b };
        assert!(["node-a", "node-b"].contains(&host), "{labels:?}");
        assert_eq!(inst, expect, "{labels:?}");
        assert_eq!(*v, 100.0, "{labels:?}");
    }
    let q = |p: f64, host: &str| {
        let r = query(
            &prom,
            &format!("histogram_quantile({p}, sum by (le) (comminsight_op_duration_seconds_bucket{{host_name=\"{host}\"}}))"),
        );
        assert_eq!(r.len(), 1, "{p} {host}: {r:?}");
        r[0].1
    };
    let (a50, a99, b50, b99) = (
        q(0.5, "node-a"),
        q(0.99, "node-a"),
        q(0.5, "node-b"),
        q(0.99, "node-b"),
    );
    eprintln!("node-a p50 {a50} p99 {a99}; node-b p50 {b50} p99 {b99}");
    // 30 µs is in (10, 50] µs, 3 ms in (1, 5] ms, 300 µs in (100, 500] µs.
    assert!(a50 > 10e-6 && a50 <= 50e-6, "node-a p50 {a50}");
    assert!(a99 > 1e-3 && a99 <= 5e-3, "node-a p99 {a99}");
    assert!(b50 > 100e-6 && b50 <= 500e-6, "node-b p50 {b50}");
    assert!(b99 > 100e-6 && b99 <= 500e-6, "node-b p99 {b99}");
    // And exactly Prometheus' linear interpolation inside those buckets: the series carry the
    // counts the records make (node-a: 90 in (10, 50] µs, 10 in (1, 5] ms; node-b: 100 in
    // (100, 500] µs).
    let near = |got: f64, want: f64| (got - want).abs() < 1e-9;
    assert!(near(a50, 10e-6 + 40e-6 * 50.0 / 90.0), "node-a p50 {a50}");
    assert!(near(a99, 1e-3 + 4e-3 * 9.0 / 10.0), "node-a p99 {a99}");
    assert!(near(b50, 100e-6 + 400e-6 * 0.5), "node-b p50 {b50}");
    assert!(near(b99, 100e-6 + 400e-6 * 0.99), "node-b p99 {b99}");
}

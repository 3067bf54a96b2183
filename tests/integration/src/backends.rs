//! The real backends and readers the end-to-end tests check against: VictoriaMetrics (an OTLP
//! metrics receiver, queried back over its export API) and Perfetto's own protos
//! (`tests/py/trace_facts.py` in the test venv).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::{test_tool, Child};

/// A VictoriaMetrics server on a free loopback port, its data under `dir`; killed when
/// dropped.
pub struct VictoriaMetrics {
    pub port: u16,
    _child: Child,
}

impl VictoriaMetrics {
    pub fn start(dir: &Path) -> VictoriaMetrics {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Child(
            Command::new(test_tool("victoria-metrics/usr/bin/victoria-metrics"))
                .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
                .arg(format!("-storageDataPath={}", dir.display()))
                .args([
                    "-search.latencyOffset=0s",
                    "-retentionPeriod=1d",
                    "-loggerLevel=ERROR",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start victoria-metrics"),
        );
        VictoriaMetrics {
            port,
            _child: child,
        }
    }

    /// Where the agent's `[otlp] metrics_endpoint` points.
    pub fn otlp_metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/opentelemetry/v1/metrics", self.port)
    }

    /// The series whose name matches the regular expression `name_re` (a MetricsQL string:
    /// write `[.]` for a dot), as
    /// `/api/v1/export` gives them (`{"metric": {labels}, "values": [..], ...}` per line);
    /// empty when the server does not answer (yet).
    pub fn export(&self, name_re: &str) -> Vec<Value> {
        let selector = format!("{{__name__=~\"{name_re}\"}}");
        let encoded: String = selector
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let body = format!("match%5B%5D={encoded}");
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return Vec::new();
        };
        let req = format!(
            "POST /api/v1/export HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            return Vec::new();
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let Some((head, rest)) = text.split_once("\r\n\r\n") else {
            return Vec::new();
        };
        if !head.starts_with("HTTP/1.1 200") {
            return Vec::new();
        }
        let rest = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        rest.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The counter tracks of the Perfetto trace at `pf`, read with Perfetto's protos:
/// `{"name", "rank" (null: a host's), "values", "max"}` each.
pub fn trace_counters(pf: &Path) -> Vec<Value> {
    trace_facts(pf)["counter_tracks"]
        .as_array()
        .expect("counter_tracks")
        .clone()
}

/// Everything `tests/py/trace_facts.py` says of the Perfetto trace at `pf` (read with
/// Perfetto's protos).
pub fn trace_facts(pf: &Path) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/trace_facts.py");
    let o = Command::new(test_tool("venv/bin/python"))
        .arg(script)
        .arg(pf)
        .output()
        .expect("run trace_facts.py");
    assert!(
        o.status.success(),
        "trace_facts.py: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("trace_facts JSON")
}

/// The OTLP receiver of the agent tests (`agent/tests/py/otlp_receiver.py`: gRPC and HTTP,
/// decoded with the official opentelemetry-proto classes), writing every request it gets to
/// `got` as one JSON line; listening on 127.0.0.1:`port` when this returns.
pub fn otlp_receiver(got: &Path, port: u16) -> Child {
    let child = Child(
        Command::new(test_tool("venv/bin/python"))
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../agent/tests/py/otlp_receiver.py"
            ))
            .arg(got)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the OTLP receiver"),
    );
    assert!(
        crate::wait_until(std::time::Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }),
        "the OTLP receiver did not start"
    );
    child
}

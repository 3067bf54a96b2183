//! Operating the daemon (issue 18, Deliver 3 and 4), against real `comminsight-agent run`
//! processes: `STATUS=` lines to a real notify socket, the HTTP endpoint, `comminsight-agent
//! status`, and the configuration's `COMMINSIGHT_CONFIG` and `conf.d/` drop-ins.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use comminsight_agent::http::client::get;

mod daemon_support;
mod support;
use daemon_support::{http_addr, ready_status, setup, start, wait_for, write_stream};
use support::{agent, TempDir};

/// Every datagram that arrives within `limit`, until `done` says the list is complete.
fn datagrams(
    sock: &UnixDatagram,
    limit: Duration,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let until = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < until && !done(&got) {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    got
}

/// systemd gets READY=1, then a STATUS= line at once, a new one (within the 10 s period) when
/// the daemon follows a stream, and STOPPING=1 at SIGTERM.
#[test]
fn the_daemon_sends_status_lines_to_the_notify_socket() {
    let dir = TempDir::new("sdnotify");
    let s = setup(dir.path(), "node-s", "");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let mut d = start(&s, &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())]);
    let first = datagrams(&sock, Duration::from_secs(60), |g| {
        g.iter().any(|m| m.starts_with("STATUS="))
    });
    let ready = first.iter().position(|m| m == "READY=1").expect("READY=1");
    let status = first.iter().position(|m| m.starts_with("STATUS=")).unwrap();
    assert!(ready < status, "{first:?}");
    assert!(
        first[status].starts_with("STATUS=following 0 streams (0 live); 0 records/s; lag 0 ms; 0 dropped; last verdict: none"),
        "{first:?}"
    );
    // A stream appears: the next line (at most one period later) says so.
    write_stream(&s.logs, "job1", "node-s", 4242, 0, &[30; 50]);
    let t0 = Instant::now();
    let later = datagrams(&sock, Duration::from_secs(30), |g| {
        g.iter()
            .any(|m| m.starts_with("STATUS=following 1 streams"))
    });
    let line = later
        .iter()
        .find(|m| m.starts_with("STATUS=following 1 streams"))
        .unwrap_or_else(|| panic!("no status line with the stream: {later:?}"));
    assert!(!line.contains('\n'), "{line}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    eprintln!("second STATUS after {:?}: {line}", t0.elapsed());
    assert!(d
        .terminate(Duration::from_secs(30))
        .is_some_and(|st| st.success()));
    let end = datagrams(&sock, Duration::from_secs(2), |g| {
        g.iter().any(|m| m == "STOPPING=1")
    });
    assert!(end.iter().any(|m| m == "STOPPING=1"), "{end:?}");
}

/// The endpoint answers /healthz, /readyz, /metrics and /status; `comminsight-agent status`
/// shows the daemon's streams in one screen; after the daemon stops, `status` says so in one
/// line.
#[test]
fn the_endpoint_and_the_status_command_show_the_running_daemon() {
    let dir = TempDir::new("endpoint");
    let s = setup(dir.path(), "node-e", "");
    write_stream(&s.logs, "job9", "node-e", 777, 3, &[30; 40]);
    let mut d = start(&s, &[]);
    let addr = http_addr(&s);
    assert_eq!(get(&addr, "/healthz").unwrap().code, 200);
    assert_eq!(get(&addr, "/readyz").unwrap().code, 200);
    assert_eq!(get(&addr, "/nothing").unwrap().code, 404);
    let m = get(&addr, "/metrics").unwrap();
    assert_eq!(
        (m.code, m.content_type.as_str()),
        (200, "text/plain; version=0.0.4; charset=utf-8")
    );
    // The stream is followed and its records counted.
    let st = wait_for("the stream in /status", Duration::from_secs(30), || {
        let r = get(&addr, "/status").ok()?;
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        (v["streams"][0]["records"].as_u64()? >= 42).then_some(v)
    });
    assert_eq!(st["host"], "node-e");
    assert_eq!(st["pid"].as_u64(), Some(u64::from(d.pid())));
    assert_eq!(st["streams"][0]["job"], "job9");
    assert_eq!(st["streams"][0]["rank"], 3);
    // Its newest record was written just before the daemon started: read seconds later.
    let lag = st["streams"][0]["lag_ms"].as_u64().unwrap();
    assert!(lag < 60_000, "lag {lag} ms");
    let conf = s.conf.to_str().unwrap();
    let o = agent(&["status", "--config", conf]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!(
            "comminsight-agent {} on node-e (pid {}): ready, up ",
            env!("CARGO_PKG_VERSION"),
            d.pid()
        )) && first.ends_with(&format!("http://{addr}/")),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("job9"))
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..5], ["job9", "3", "node-e", "777", "42"], "{row}");
    print!("{out}");
    // `--json`: the state as /status serves it.
    let o = agent(&["status", "--json", "--config", conf]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["streams"][0]["records"], 42);
    assert!(d
        .terminate(Duration::from_secs(30))
        .is_some_and(|st| st.success()));
    let o = agent(&["status", "--config", conf]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no comminsight-agent runs on") && err.contains("start it"),
        "{err}"
    );
}

/// With `[http] listen = ""` there is no endpoint, and `status` reads `status.json`.
#[test]
fn status_reads_the_state_file_when_the_endpoint_is_off() {
    let dir = TempDir::new("statusfile");
    let s = setup(dir.path(), "node-f", "");
    let text = std::fs::read_to_string(&s.conf)
        .unwrap()
        .replace("listen = \"127.0.0.1:0\"", "listen = \"\"");
    std::fs::write(&s.conf, text).unwrap();
    let _d = start(&s, &[]);
    let st = ready_status(&s, Duration::from_secs(60));
    assert!(st["http"].is_null(), "{st}");
    let o = agent(&["status", "--config", s.conf.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("on node-f") && out.contains("streams: 0"),
        "{out}"
    );
}

/// `COMMINSIGHT_CONFIG` names the file when `--config` is absent; `conf.d/*.toml` beside it are
/// merged over it in lexical order and the environment wins over both; an unknown key in a
/// drop-in is one line naming the drop-in.
#[test]
fn drop_ins_merge_in_order_and_comminsight_config_names_the_file() {
    let dir = TempDir::new("dropins");
    let main = dir.path().join("agent.toml");
    std::fs::write(
        &main,
        "[agent]\nhost_name = \"main\"\npoll_interval_ms = 7\n[log]\nlevel = \"warn\"\n",
    )
    .unwrap();
    let confd = dir.path().join("conf.d");
    std::fs::create_dir_all(&confd).unwrap();
    std::fs::write(
        confd.join("20-late.toml"),
        "[agent]\nhost_name = \"late\"\n",
    )
    .unwrap();
    std::fs::write(
        confd.join("10-early.toml"),
        "[agent]\nhost_name = \"early\"\nchannel_records = 99\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .args(["config", "check", "--json", main.to_str().unwrap()])
        .env("COMMINSIGHT_LOG_LEVEL", "debug")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["agent"]["host_name"], "late");
    assert_eq!(v["agent"]["channel_records"], 99);
    assert_eq!(v["agent"]["poll_interval_ms"], 7);
    assert_eq!(v["log"]["level"], "debug");
    let o = agent(&["config", "check", main.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("10-early.toml") && out.contains("20-late.toml"),
        "{out}"
    );
    // An unknown key in a drop-in names the drop-in; `run` reads it through COMMINSIGHT_CONFIG.
    let bad = confd.join("30-bad.toml");
    std::fs::write(&bad, "[agent]\nhost_nmae = \"x\"\n").unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .arg("run")
        .env("COMMINSIGHT_CONFIG", &main)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "{}: unknown key `agent.host_nmae` (did you mean `agent.host_name`?)",
            bad.display()
        )),
        "{err}"
    );
    // A named file that is missing is an error naming it and the variable.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .args(["status"])
        .env("COMMINSIGHT_CONFIG", dir.path().join("absent.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("absent.toml") && err.contains("COMMINSIGHT_CONFIG"),
        "{err}"
    );
}

//! The job master link end to end: the real `comminsight-agent run` daemon serves the link (its
//! store under `<state_dir>/master/`); the agents' side is the library's `LinkClient` and
//! `Outbox` over real sockets on 127.0.0.1.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_agent::master::proto::PushRequest;
use comminsight_agent::master::{ClientSetup, LinkClient, LinkError, Outbox, OutboxLimits};
use support::TempDir;
use tokio::sync::watch;

const TOKEN: &str = "0123456789abcdef-link-token";

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The master daemon's files: config, log, state.
struct MasterFiles {
    dir: PathBuf,
    port: u16,
}

impl MasterFiles {
    /// A master config in `dir` listening on `port`; `extra` lines go into `[master]`.
    fn new(dir: &Path, port: u16, token: bool, extra: &str) -> MasterFiles {
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let token_line = if token {
            let t = dir.join("token");
            std::fs::write(&t, format!("{TOKEN}\n")).unwrap();
            std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o600)).unwrap();
            format!("token_file = \"{}\"\n", t.display())
        } else {
            String::new()
        };
        std::fs::write(
            dir.join("agent.toml"),
            format!(
                "[agent]\nstate_dir = \"{d}/state\"\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{d}/logs\"]\n\
                 [archive]\nenabled = false\n[steps]\nenabled = false\n[master]\nlisten = \"127.0.0.1:{port}\"\n{token_line}{extra}\n",
                d = dir.display()
            ),
        )
        .unwrap();
        MasterFiles {
            dir: dir.to_path_buf(),
            port,
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("master.log")).unwrap_or_default()
    }

    fn store(&self) -> PathBuf {
        self.dir.join("state/master")
    }

    /// Start the daemon (its stderr appended to `master.log`).
    fn start(&self) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("master.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
            .args(["run", "--config"])
            .arg(self.dir.join("agent.toml"))
            .env_remove("COMMINSIGHT_OTLP_ENABLED")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start comminsight-agent run");
        Daemon(child)
    }
}

/// The daemon, killed (SIGKILL) and reaped on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn client(addr: &str, token: Option<&str>) -> LinkClient {
    let mut s = ClientSetup::plain(addr, token);
    s.host = "h1".into();
    LinkClient::new(&s).unwrap()
}

async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until the master answers `Time` through `c`.
async fn ready(c: &LinkClient, daemon: &mut Daemon, log: impl Fn() -> String) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if c.time(1).await.is_ok() {
            return;
        }
        if let Ok(Some(st)) = daemon.0.try_wait() {
            panic!("the master exited ({st}); log:\n{}", log());
        }
        assert!(
            Instant::now() < end,
            "the master never answered; log:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn msg(kind: &str, job: &str, seq: u64, payload: &[u8]) -> PushRequest {
    PushRequest {
        kind: kind.into(),
        job: job.into(),
        host: "h1".into(),
        seq,
        payload: payload.to_vec(),
    }
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn limits() -> OutboxLimits {
    OutboxLimits {
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        ..OutboxLimits::default()
    }
}

fn steps_lines(range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("{{\"step\":{i}}}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_token_time_and_push_land_in_the_store() {
    let tmp = TempDir::new("mlink-ok");
    let m = MasterFiles::new(tmp.path(), free_port(), true, "");
    let mut d = m.start();
    let c = client(&m.addr(), Some(TOKEN));
    ready(&c, &mut d, || m.log()).await;
    let t1 = 1_700_000_000_000_000_000;
    let r = c.time(t1).await.unwrap();
    assert_eq!(r.t1, t1);
    assert!(r.t2 > 0 && r.t3 >= r.t2, "{r:?}");
    c.push(msg("hang", "job7", 1, b"{\"snapshot\":1}"))
        .await
        .unwrap();
    c.push(msg("steps", "job7", 2, b"{\"step\":0}\n"))
        .await
        .unwrap();
    // Acknowledged means stored: no waiting.
    let store = m.store();
    assert_eq!(read(store.join("job7/hang/h1.json")), "{\"snapshot\":1}");
    assert_eq!(read(store.join("job7/steps/h1.jsonl")), "{\"step\":0}\n");
    // A resend is acknowledged and not stored twice.
    c.push(msg("steps", "job7", 2, b"{\"step\":0}\n"))
        .await
        .unwrap();
    assert_eq!(read(store.join("job7/steps/h1.jsonl")), "{\"step\":0}\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_wrong_tokens_are_refused_stored_nowhere_and_logged() {
    let tmp = TempDir::new("mlink-refuse");
    let m = MasterFiles::new(tmp.path(), free_port(), true, "");
    let mut d = m.start();
    ready(&client(&m.addr(), Some(TOKEN)), &mut d, || m.log()).await;
    for token in [None, Some("wrong-token")] {
        let c = client(&m.addr(), token);
        let e = c.push(msg("hang", "job7", 1, b"{}")).await.unwrap_err();
        assert!(
            matches!(e, LinkError::Refused { .. }) && e.is_auth(),
            "{token:?}: {e}"
        );
        assert!(e.to_string().contains("token_file"), "{e}");
        let e = c.time(5).await.unwrap_err();
        assert!(e.is_auth(), "{e}");
    }
    let entries = std::fs::read_dir(m.store()).unwrap().count();
    assert_eq!(entries, 0, "nothing stored");
    wait_for("the refusal line", Duration::from_secs(10), || {
        m.log()
            .lines()
            .any(|l| l.contains("refused Push from 127.0.0.1:") && l.contains("missing token"))
    })
    .await;
    // Later refusals from the same address within the minute are counted, not logged.
    let log = m.log();
    assert_eq!(
        log.matches("agent link: refused").count(),
        1,
        "one line per peer per minute:\n{log}"
    );

    // The outbox keeps messages the master refuses for the token.
    let otmp = TempDir::new("mlink-refuse-outbox");
    let o = Outbox::open(otmp.path(), "h1", limits()).unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(o.clone().run(client(&m.addr(), Some("wrong-token")), rx));
    o.push("hang", "job7", b"{}").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(o.pending(), 1);
    assert_eq!(std::fs::read_dir(m.store()).unwrap().count(), 0);
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_made_while_the_master_is_down_arrive_in_order_exactly_once() {
    let tmp = TempDir::new("mlink-down");
    let m = MasterFiles::new(&tmp.path().join("master"), free_port(), true, "");
    let o = Outbox::open(&tmp.path().join("outbox"), "h1", limits()).unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(o.clone().run(client(&m.addr(), Some(TOKEN)), rx));
    const N: u32 = 40;
    for i in 0..N {
        o.push("steps", "job7", steps_lines(i..i + 1).as_bytes())
            .unwrap();
        if i % 10 == 9 {
            o.push("hang", "job7", format!("{{\"snapshot\":{i}}}").as_bytes())
                .unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        o.pending(),
        N as usize + 4,
        "all kept while the master is down"
    );

    let mut d = m.start();
    ready(&client(&m.addr(), Some(TOKEN)), &mut d, || m.log()).await;
    wait_for("the outbox to drain", Duration::from_secs(30), || {
        o.pending() == 0
    })
    .await;
    let store = m.store();
    assert_eq!(read(store.join("job7/steps/h1.jsonl")), steps_lines(0..N));
    assert_eq!(read(store.join("job7/hang/h1.json")), "{\"snapshot\":39}");
    assert_eq!(o.dropped() + o.rejected(), 0);
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_keeps_what_it_stored_and_gets_the_rest_after_a_restart() {
    let tmp = TempDir::new("mlink-kill");
    let m = MasterFiles::new(&tmp.path().join("master"), free_port(), true, "");
    let o = Outbox::open(&tmp.path().join("outbox"), "h1", limits()).unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(o.clone().run(client(&m.addr(), Some(TOKEN)), rx));
    let mut d = m.start();
    ready(&client(&m.addr(), Some(TOKEN)), &mut d, || m.log()).await;

    o.push("hang", "job7", b"{\"snapshot\":\"before\"}")
        .unwrap();
    const N: u32 = 400;
    for i in 0..N {
        o.push("steps", "job7", steps_lines(i..i + 1).as_bytes())
            .unwrap();
    }
    // Kill -9 in the middle of the stream.
    wait_for("some deliveries", Duration::from_secs(30), || {
        o.pending() < (N as usize) * 9 / 10
    })
    .await;
    drop(d);
    let left = o.pending();
    assert!(left > 0, "the kill came too late to test anything");
    let store = m.store();
    assert_eq!(
        read(store.join("job7/hang/h1.json")),
        "{\"snapshot\":\"before\"}"
    );
    let before = read(store.join("job7/steps/h1.jsonl"));
    assert!(steps_lines(0..N).starts_with(&before));
    o.push("hang", "job7", b"{\"snapshot\":\"after\"}").unwrap();

    let mut d = m.start();
    ready(&client(&m.addr(), Some(TOKEN)), &mut d, || m.log()).await;
    wait_for("the outbox to drain", Duration::from_secs(60), || {
        o.pending() == 0
    })
    .await;
    assert_eq!(read(store.join("job7/steps/h1.jsonl")), steps_lines(0..N));
    assert_eq!(
        read(store.join("job7/hang/h1.json")),
        "{\"snapshot\":\"after\"}"
    );
    stop.send(true).unwrap();
    task.await.unwrap();
    drop(d);
}

/// Run `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the TLS test needs it installed)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_and_plaintext_is_not_served() {
    let tmp = TempDir::new("mlink-tls");
    let dir = tmp.path();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-days",
            "1",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ],
    );
    let extra = format!(
        "tls_cert = \"{d}/cert.pem\"\ntls_key = \"{d}/key.pem\"",
        d = dir.display()
    );
    let m = MasterFiles::new(&dir.join("master"), free_port(), true, &extra);
    let mut d = m.start();
    let tls = |domain: &str| {
        LinkClient::new(&ClientSetup {
            tls_ca: Some(std::fs::read(dir.join("cert.pem")).unwrap()),
            tls_domain: domain.into(),
            host: "h1".into(),
            ..ClientSetup::plain(&m.addr(), Some(TOKEN))
        })
        .unwrap()
    };
    let c = tls("localhost");
    ready(&c, &mut d, || m.log()).await;
    let r = c.time(42).await.unwrap();
    assert_eq!(r.t1, 42);
    c.push(msg("hang", "job7", 1, b"{\"tls\":true}"))
        .await
        .unwrap();
    assert_eq!(read(m.store().join("job7/hang/h1.json")), "{\"tls\":true}");
    // The certificate does not name this host: refused by the client.
    let e = tls("other.example").time(1).await.unwrap_err();
    assert!(matches!(e, LinkError::Unreachable { .. }), "{e}");
    // Plaintext to a TLS master fails, and the store is unchanged.
    let e = client(&m.addr(), Some(TOKEN))
        .push(msg("hang", "job7", 2, b"{\"tls\":false}"))
        .await
        .unwrap_err();
    assert!(!e.is_auth(), "{e}");
    assert_eq!(read(m.store().join("job7/hang/h1.json")), "{\"tls\":true}");
}

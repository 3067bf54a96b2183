use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::proto::*;
use super::server::{check_access, RefusalLog};
use super::*;
use crate::clock::ClockConfig;

/// A unique temporary directory, removed on drop.
struct Tmp(PathBuf);

impl Tmp {
    fn new(name: &str) -> Tmp {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("ciagent-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A master on a free loopback port with a skewed clock; stopped on drop.
struct Master {
    addr: String,
    store: Arc<MasterStore>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<Result<(), LinkError>>>,
}

impl Master {
    async fn start(dir: &Path, token: Option<&str>, skew_ns: i64) -> Master {
        Master::start_on("127.0.0.1:0", dir, token, skew_ns).await
    }

    async fn start_on(bind: &str, dir: &Path, token: Option<&str>, skew_ns: i64) -> Master {
        let listener = TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, rx) = watch::channel(false);
        let mut setup = ServerSetup::plain(token.map(Into::into));
        setup.clock = Arc::new(move || realtime_ns().saturating_add_signed(skew_ns));
        let store = Arc::new(MasterStore::open(dir).unwrap());
        let task = tokio::spawn(serve(listener, setup, store.clone(), rx));
        Master {
            addr,
            store,
            stop,
            task: Some(task),
        }
    }

    async fn shutdown(mut self) {
        self.stop.send(true).unwrap();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("serve returns on shutdown")
            .unwrap()
            .unwrap();
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn cfg() -> ClockConfig {
    ClockConfig {
        samples: 8,
        max_rtt_ms: 50,
        ..Default::default()
    }
}

fn client(addr: &str, token: Option<&str>, host: &str) -> LinkClient {
    let mut s = ClientSetup::plain(addr, token);
    s.host = host.into();
    LinkClient::new(&s).unwrap()
}

fn push(kind: &str, job: &str, host: &str, seq: u64, payload: &[u8]) -> PushRequest {
    PushRequest {
        kind: kind.into(),
        job: job.into(),
        host: host.into(),
        seq,
        payload: payload.to_vec(),
    }
}

#[test]
fn messages_round_trip_and_match_the_protobuf_encoding() {
    // Field 1 varint 150: the protobuf spec's own example.
    assert_eq!(TimeRequest { t1: 150 }.encode_to_vec(), [0x08, 0x96, 0x01]);
    let r = TimeReply {
        t1: 1,
        t2: u64::MAX,
        t3: 0,
    };
    assert_eq!(TimeReply::decode(r.encode_to_vec().as_slice()).unwrap(), r);
    let p = push("steps", "job-1", "h1", 42, b"{\"a\":1}\n\x00\xff");
    let bytes = p.encode_to_vec();
    // kind = field 1, length-delimited: tag 0x0a, length 5, "steps".
    assert_eq!(&bytes[..7], b"\x0a\x05steps");
    assert_eq!(PushRequest::decode(bytes.as_slice()).unwrap(), p);
    assert!(PushReply {}.encode_to_vec().is_empty());
    assert!(PushRequest::decode(&b"\x0a\xff"[..]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_masters_are_measured_within_the_error_bound() {
    let tmp = Tmp::new("skew");
    for skew in [37_000_000i64, -5_000_000_000] {
        let m = Master::start(&tmp.0, Some("s3cret"), skew).await;
        let h = measure(&m.addr, Some("s3cret"), &cfg()).await.unwrap();
        assert!(
            (h.offset_ns - skew).unsigned_abs() <= h.err_ns,
            "skew {skew}: {h:?}"
        );
        assert!(h.err_ns < 25_000_000, "{h:?}");
        assert_eq!(h.master, m.addr);
        assert!(h.rtt_ns <= 50_000_000);
        // The measuring host is seen (no host name given: its address).
        assert!(m.store.last_seen().contains_key("127.0.0.1"));
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_tokens_are_refused_and_the_master_survives() {
    let tmp = Tmp::new("token");
    let m = Master::start(&tmp.0, Some("s3cret"), 0).await;
    let e = measure(&m.addr, Some("guess"), &cfg()).await.unwrap_err();
    assert!(matches!(e, LinkError::Refused { .. }) && e.is_auth(), "{e}");
    assert!(e.to_string().contains("token"), "{e}");
    let e = measure(&m.addr, None, &cfg()).await.unwrap_err();
    assert!(matches!(e, LinkError::Refused { .. }) && e.is_auth(), "{e}");
    let bad = client(&m.addr, Some("guess"), "h1");
    let e = bad
        .push(push("hang", "j", "h1", 1, b"{}"))
        .await
        .unwrap_err();
    assert!(e.is_auth(), "{e}");
    assert!(m.store.jobs().is_empty() && m.store.last_seen().is_empty());

    // A bad message is refused for good (not an auth problem), the master keeps serving.
    let good = client(&m.addr, Some("s3cret"), "h1");
    for (kind, job) in [("nope", "j"), ("hang", "../etc"), ("hang", "")] {
        let e = good
            .push(push(kind, job, "h1", 1, b"{}"))
            .await
            .unwrap_err();
        assert!(
            matches!(e, LinkError::Refused { .. }) && !e.is_auth(),
            "{e}"
        );
    }
    assert!(m.store.jobs().is_empty());

    // Many clients at once.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let addr = m.addr.clone();
        tasks.push(tokio::spawn(async move {
            measure(&addr, Some("s3cret"), &cfg()).await
        }));
    }
    for t in tasks {
        let h = t.await.unwrap().unwrap();
        assert!(h.offset_ns.unsigned_abs() <= h.err_ns, "{h:?}");
    }
    m.shutdown().await;
}

#[test]
fn access_needs_the_token_loopback_included() {
    let want = Some("Bearer abc");
    assert_eq!(check_access(want, b"Bearer abc"), Ok(()));
    assert_eq!(check_access(want, b"Bearer abd"), Err("wrong token"));
    assert_eq!(check_access(want, b""), Err("missing token"));
    // No token configured: nobody is served, whatever the peer says.
    assert!(check_access(None, b"").is_err());
    assert!(check_access(None, b"Bearer abc").is_err());
}

#[test]
fn a_single_host_master_generates_a_private_token_its_agent_reads() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = Tmp::new("auto-token");
    let c = MasterConfig::default();
    assert_eq!(super::token::client_token(&c, &tmp.0).unwrap(), None);
    let t = super::token::server_token(&c, &tmp.0).unwrap();
    assert_eq!(t.len(), 64, "{t}");
    let path = super::token::auto_token_path(&tmp.0);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The same token on the next start, and for the agent of this host.
    assert_eq!(super::token::server_token(&c, &tmp.0).unwrap(), t);
    assert_eq!(super::token::client_token(&c, &tmp.0).unwrap(), Some(t));
    // A token readable by others, or a link planted in its place, is refused.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(super::token::server_token(&c, &tmp.0).is_err());
    std::fs::remove_file(&path).unwrap();
    std::fs::write(tmp.0.join("other"), "x".repeat(64)).unwrap();
    std::os::unix::fs::symlink(tmp.0.join("other"), &path).unwrap();
    let e = super::token::server_token(&c, &tmp.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("symbolic link"), "{e}");
}

#[test]
fn refusals_are_logged_once_per_peer_per_minute_with_a_count() {
    let mut log = RefusalLog::default();
    let t0 = Instant::now();
    let a = "10.0.0.1".parse().unwrap();
    let b = "10.0.0.2".parse().unwrap();
    assert_eq!(log.note(a, t0), Some(0));
    for i in 1..=5 {
        assert_eq!(log.note(a, t0 + Duration::from_secs(i)), None);
    }
    assert_eq!(log.note(b, t0 + Duration::from_secs(2)), Some(0));
    assert_eq!(log.note(a, t0 + Duration::from_secs(61)), Some(5));
    assert_eq!(log.note(a, t0 + Duration::from_secs(62)), None);
}

#[tokio::test]
async fn an_unreachable_master_names_the_address_and_the_fix() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let e = measure(&addr, None, &cfg()).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LinkError::Unreachable { .. }), "{msg}");
    assert!(
        msg.contains(&addr) && msg.contains("[master] address"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    // The cause once, not repeated by each layer.
    let parts: Vec<&str> = msg.split(": ").collect();
    let unique: std::collections::BTreeSet<&str> = parts.iter().copied().collect();
    assert_eq!(parts.len(), unique.len(), "{msg}");
}

#[tokio::test]
async fn round_trips_over_max_rtt_are_refused() {
    let tmp = Tmp::new("rtt");
    let m = Master::start(&tmp.0, Some("t"), 0).await;
    let slow = || {
        use std::sync::atomic::{AtomicU64, Ordering};
        static T: AtomicU64 = AtomicU64::new(1_000_000_000_000);
        T.fetch_add(100_000_000, Ordering::Relaxed) // every read 100 ms later
    };
    let e = measure_with_clock(&m.addr, Some("t"), &cfg(), &slow)
        .await
        .unwrap_err();
    assert!(matches!(e, LinkError::TooSlow { .. }), "{e}");
    assert!(e.to_string().contains("max_rtt_ms"), "{e}");
    m.shutdown().await;
}

#[test]
fn the_store_keeps_each_message_once_across_reopening() {
    let tmp = Tmp::new("store");
    let hooked = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let s = MasterStore::open(&tmp.0).unwrap();
        let h = hooked.clone();
        s.set_on_push(Box::new(move |m| {
            h.lock().unwrap().push(format!("{}/{}", m.kind, m.job))
        }));
        assert!(s
            .store(&push("steps", "j1", "h1", 5, b"{\"s\":1}"))
            .unwrap());
        assert!(s
            .store(&push("steps", "j1", "h1", 7, b"{\"s\":2}\n"))
            .unwrap());
        assert!(!s
            .store(&push("steps", "j1", "h1", 7, b"{\"s\":2}\n"))
            .unwrap());
        assert!(!s
            .store(&push("steps", "j1", "h1", 6, b"{\"s\":9}\n"))
            .unwrap());
        assert!(s.store(&push("hang", "j1", "h2", 3, b"{\"v\":1}")).unwrap());
        assert!(s.store(&push("hang", "j1", "h2", 9, b"{\"v\":2}")).unwrap());
        assert!(!s.store(&push("hang", "j1", "h2", 8, b"{\"v\":0}")).unwrap());
        assert!(s.store(&push("hang", "j2", "h1", 1, b"{}")).unwrap());
        assert!(s.store(&push("hang", "j1", "h1", 0, b"{}")).is_err());
    }
    assert_eq!(
        *hooked.lock().unwrap(),
        ["steps/j1", "steps/j1", "hang/j1", "hang/j1", "hang/j2"]
    );
    // A crash after an append but before its mark: the tail is not counted and is cut.
    let jsonl = tmp.0.join("j1/steps/h1.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&jsonl)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"s\":3}\n").unwrap();
    drop(f);

    let s = MasterStore::open(&tmp.0).unwrap();
    assert_eq!(s.jobs(), ["j1", "j2"]);
    // A reopened store (a restarted master) knows each job's hosts, whatever they sent.
    assert_eq!(s.hosts("j1"), ["h1", "h2"]);
    assert_eq!(s.hosts("j2"), ["h1"]);
    assert!(s.hosts("../j1").is_empty());
    assert_eq!(
        s.steps("j1"),
        [("h1".into(), b"{\"s\":1}\n{\"s\":2}\n".to_vec())]
    );
    assert!(!s
        .store(&push("steps", "j1", "h1", 7, b"{\"s\":2}\n"))
        .unwrap());
    assert!(s
        .store(&push("steps", "j1", "h1", 8, b"{\"s\":3}\n"))
        .unwrap());
    assert_eq!(
        std::fs::read_to_string(&jsonl).unwrap(),
        "{\"s\":1}\n{\"s\":2}\n{\"s\":3}\n"
    );
    assert_eq!(
        s.hang_snapshots("j1"),
        [("h2".to_string(), b"{\"v\":2}".to_vec())]
    );
    assert!(s.hang_snapshots("../j1").is_empty());
}

#[test]
fn the_outbox_drops_oldest_steps_then_hang_when_full_and_keeps_seq_growing() {
    let tmp = Tmp::new("outbox");
    let one = push("steps", "j", "h", realtime_ns() / 1000, &[b'x'; 1000]).encoded_len() as u64;
    let limits = OutboxLimits {
        max_bytes: one * 4 + 10,
        ..OutboxLimits::default()
    };
    let (seqs, last) = {
        let o = Outbox::open(&tmp.0, "h", limits).unwrap();
        let x = [b'x'; 1000];
        let s1 = o.push("hang", "j", &x).unwrap();
        let s2 = o.push("steps", "j", &x).unwrap();
        let s3 = o.push("hang", "j", &x).unwrap();
        let s4 = o.push("steps", "j", &x).unwrap();
        assert!(s1 < s2 && s2 < s3 && s3 < s4, "{s1} {s2} {s3} {s4}");
        assert_eq!((o.pending(), o.dropped()), (4, 0));
        let s5 = o.push("hang", "j", &x).unwrap(); // drops s2 (oldest steps)
        let s6 = o.push("hang", "j", &x).unwrap(); // drops s4
        let s7 = o.push("hang", "j", &x).unwrap(); // drops s1 (oldest hang)
        assert_eq!((o.pending(), o.dropped()), (4, 3));
        assert!(o.push("hang", "j", &[0u8; 8000]).is_err());
        assert!(o.push("other", "j", b"{}").is_err());
        assert!(o.push("hang", "a/b", b"{}").is_err());
        (vec![s3, s5, s6, s7], s7)
    };
    let mut names: Vec<String> = std::fs::read_dir(&tmp.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".msg"))
        .collect();
    names.sort();
    let want: Vec<String> = seqs.iter().map(|s| format!("{s:020}-hang.msg")).collect();
    assert_eq!(names, want);
    // Reopened: the messages are still there, new numbers are larger.
    let o = Outbox::open(&tmp.0, "h", limits).unwrap();
    assert_eq!(o.pending(), 4);
    assert!(o.push("steps", "j", b"{}").unwrap() > last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_sends_in_order_once_after_the_master_comes_up() {
    let (mtmp, otmp) = (Tmp::new("ob-master"), Tmp::new("ob-agent"));
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let limits = OutboxLimits {
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(200),
        ..OutboxLimits::default()
    };
    let o = Outbox::open(&otmp.0, "h1", limits).unwrap();
    let (stop, rx) = watch::channel(false);
    let sender = tokio::spawn(o.clone().run(client(&addr, Some("t"), "h1"), rx));
    for i in 0..20 {
        o.push("steps", "j", format!("{{\"i\":{i}}}\n").as_bytes())
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(o.pending(), 20, "nothing is lost while the master is down");
    let m = Master::start_on(&addr, &mtmp.0, Some("t"), 0).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while o.pending() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(o.pending(), 0);
    let want: String = (0..20).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let got = m.store.steps("j");
    assert_eq!(got.len(), 1);
    assert_eq!(String::from_utf8_lossy(&got[0].1), want);
    assert!(m.store.last_seen().contains_key("h1"));
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), sender)
        .await
        .unwrap()
        .unwrap();
    m.shutdown().await;
}

#[test]
fn tokens_compare_exactly() {
    assert!(token_eq(b"abc", b"abc"));
    for g in [&b"abd"[..], b"ab", b"abcd", b""] {
        assert!(!token_eq(g, b"abc"), "{g:?}");
    }
}

#[test]
fn token_files_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = Tmp::new("token-file");
    let dir = &tmp.0;
    let path = dir.join("token");
    std::fs::write(&path, "  tok123\n").unwrap();
    let mut c = MasterConfig::default();
    assert_eq!(load_token(&c).unwrap(), None);
    c.token_file = path.clone();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(load_token(&c).unwrap().as_deref(), Some("tok123"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = load_token(&c).unwrap_err();
    assert!(
        matches!(e, LinkError::TokenWorldReadable { mode: 0o644, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("chmod 600"), "{e}");
    std::fs::write(&path, "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(load_token(&c).unwrap_err().to_string().contains("empty"));
    c.token_file = dir.join("missing");
    assert!(matches!(load_token(&c), Err(LinkError::TokenFile { .. })));
}

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::*;
use crate::config::ClockConfig;

/// A master on a free loopback port with a skewed clock; stopped on drop.
struct Master {
    addr: String,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Master {
    async fn start(token: Option<&str>, skew_ns: i64) -> Master {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, rx) = watch::channel(false);
        let clock: ServerClock = Arc::new(move || realtime_ns().saturating_add_signed(skew_ns));
        let task = tokio::spawn(serve_with_clock(listener, token.map(Into::into), rx, clock));
        Master {
            addr,
            stop,
            task: Some(task),
        }
    }

    async fn shutdown(mut self) {
        self.stop.send(true).unwrap();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("serve returns on shutdown")
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

/// Send raw bytes, return what the master answers until it closes.
async fn raw(addr: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut rd = BufReader::new(s);
    let mut all = String::new();
    let read = async {
        loop {
            let mut line = String::new();
            match rd.read_line(&mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => all.push_str(&line),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the master closes a refused connection");
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_masters_are_measured_within_the_error_bound() {
    for skew in [37_000_000i64, -5_000_000_000] {
        let m = Master::start(Some("s3cret"), skew).await;
        let h = measure(&m.addr, Some("s3cret"), &cfg()).await.unwrap();
        assert!(
            (h.offset_ns - skew).unsigned_abs() <= h.err_ns,
            "skew {skew}: {h:?}"
        );
        assert!(h.err_ns < 25_000_000, "{h:?}");
        assert_eq!(h.master, m.addr);
        assert!(h.rtt_ns <= 50_000_000);
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_and_garbage_are_refused_and_the_master_survives() {
    let m = Master::start(Some("s3cret"), 0).await;
    let e = measure(&m.addr, Some("guess"), &cfg()).await.unwrap_err();
    assert!(matches!(e, LinkError::Refused { .. }), "{e}");
    assert!(e.to_string().contains("token"), "{e}");
    let e = measure(&m.addr, None, &cfg()).await.unwrap_err();
    assert!(matches!(e, LinkError::Refused { .. }), "{e}");

    let answer = raw(&m.addr, b"not json\n").await;
    assert_eq!(answer.lines().count(), 1, "{answer}");
    assert!(answer.contains("\"error\""), "{answer}");
    let answer = raw(&m.addr, &vec![b'x'; MAX_LINE * 4]).await;
    assert!(answer.contains("longer than"), "{answer}");
    let answer = raw(&m.addr, b"{\"v\":9,\"type\":\"time\",\"t1\":1}\n").await;
    assert!(answer.contains("version 9"), "{answer}");
    let answer = raw(&m.addr, &[0xff, 0xfe, 0, 1, b'\n']).await;
    assert!(answer.contains("\"error\""), "{answer}");

    // Still serving, many clients at once.
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
}

#[tokio::test]
async fn round_trips_over_max_rtt_are_refused() {
    let m = Master::start(None, 0).await;
    let slow = || {
        use std::sync::atomic::{AtomicU64, Ordering};
        static T: AtomicU64 = AtomicU64::new(1_000_000_000_000);
        T.fetch_add(100_000_000, Ordering::Relaxed) // every read 100 ms later
    };
    let e = measure_with_clock(&m.addr, None, &cfg(), &slow)
        .await
        .unwrap_err();
    assert!(matches!(e, LinkError::TooSlow { .. }), "{e}");
    assert!(e.to_string().contains("max_rtt_ms"), "{e}");
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
    let dir = std::env::temp_dir().join(format!("ciagent-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = Rm(dir.clone());
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

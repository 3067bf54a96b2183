use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// A one-route server: answers `code` with `body` to every request until `stop`.
fn serve(code: Arc<AtomicU16>, body: &'static str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let c = code.load(Ordering::Relaxed);
            let _ = write!(
                s,
                "HTTP/1.1 {c} X\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}/metrics")
}

fn wait(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn scrapes_arrive_parsed_and_a_failing_exporter_is_counted_with_its_url() {
    let code = Arc::new(AtomicU16::new(200));
    let url = serve(
        Arc::clone(&code),
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\nDCGM_FI_DEV_SM_CLOCK{gpu=\"0\",pci_bus_id=\"00000000:1B:00.0\"} 1980\n",
    );
    let s = DcgmScraper::start(
        &url,
        Duration::from_millis(50),
        Duration::from_secs(2),
        Box::new(|| (1, 2)),
    )
    .unwrap();
    wait("a scrape", || s.state().ok >= 2);
    let got = s.take();
    assert!(!got.is_empty());
    assert_eq!(got[0].exposition.series[0].value, Some(1980.0));
    assert_eq!((got[0].mono_ns, got[0].host_ns), (1, 2));
    code.store(503, Ordering::Relaxed);
    wait("a failure", || s.state().failed >= 1);
    let st = s.state();
    assert!(
        st.last_error.contains(&url) && st.last_error.contains("503"),
        "{st:?}"
    );
    code.store(200, Ordering::Relaxed);
    let ok = s.state().ok;
    wait("recovery", || {
        s.state().ok > ok && s.state().last_error.is_empty()
    });
}

#[test]
fn nobody_listening_is_an_error_naming_the_url() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", l.local_addr().unwrap());
    drop(l);
    let s = DcgmScraper::start(
        &url,
        Duration::from_millis(50),
        Duration::from_millis(500),
        Box::new(|| (0, 0)),
    )
    .unwrap();
    wait("a failure", || s.state().failed >= 1);
    assert!(s.state().last_error.starts_with(&url), "{:?}", s.state());
    assert!(s.take().is_empty());
}

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

/// A server that hands each connection, after reading the request, to `answer`.
fn serve_with(answer: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let a = Arc::clone(&answer);
            std::thread::spawn(move || a(s));
        }
    });
    format!("http://{addr}/metrics")
}

/// Sample lines of a wanted field, `n` of them, each naming its own GPU.
fn wanted_lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!("DCGM_FI_DEV_SM_CLOCK{{gpu=\"{i}\",pci_bus_id=\"00000000:1B:00.0\"}} 1980\n")
        })
        .collect()
}

/// An exporter (or whoever binds its port) that sends a body without end, chunked: the scrape
/// stops at `MAX_BODY`, fails naming the URL, and the next one is tried.
#[test]
fn an_endless_body_is_cut_at_the_bound_and_the_scrape_fails_naming_the_url() {
    let url = serve_with(|mut s| {
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        let chunk = wanted_lines(1000);
        let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
        // Until the client hangs up (a write fails).
        while s.write_all(framed.as_bytes()).is_ok() {}
    });
    let s = DcgmScraper::start(
        &url,
        Duration::from_millis(100),
        Duration::from_secs(20),
        Box::new(|| (0, 0)),
    )
    .unwrap();
    wait("two failures", || s.state().failed >= 2);
    let st = s.state();
    assert!(
        st.last_error.starts_with(&url)
            && st
                .last_error
                .contains(&format!("body over {MAX_BODY} bytes")),
        "{st:?}"
    );
    assert_eq!(st.ok, 0);
    assert!(s.take().is_empty());
}

/// An exporter that answers a byte at a time: the whole request, body included, ends at
/// `dcgm_timeout_ms`, and the thread goes on scraping at its interval.
#[test]
fn a_trickling_body_ends_at_the_timeout() {
    let url = serve_with(|mut s| {
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n",
        );
        while s.write_all(b"#").is_ok() {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let t0 = Instant::now();
    let s = DcgmScraper::start(
        &url,
        Duration::from_millis(100),
        Duration::from_millis(400),
        Box::new(|| (0, 0)),
    )
    .unwrap();
    wait("two failures", || s.state().failed >= 2);
    let took = t0.elapsed();
    // Two scrapes of 400 ms each (plus connection set-up), not 100000 x 20 ms.
    assert!(took < Duration::from_secs(3), "{took:?}");
    let st = s.state();
    assert!(
        st.last_error.starts_with(&url) && st.last_error.contains("timed out"),
        "{st:?}"
    );
}

/// A body under `MAX_BODY` with more than `exposition::MAX_LINES` sample lines: the first
/// `MAX_LINES` are parsed, the rest counted as bad, and the scrape still arrives.
#[test]
fn a_body_of_too_many_lines_is_parsed_up_to_the_line_bound() {
    let n = exposition::MAX_LINES + 5000;
    let body = wanted_lines(n);
    assert!(body.len() < MAX_BODY);
    let body: &'static str = Box::leak(body.into_boxed_str());
    let url = serve(Arc::new(AtomicU16::new(200)), body);
    let s = DcgmScraper::start(
        &url,
        Duration::from_millis(200),
        Duration::from_secs(5),
        Box::new(|| (0, 0)),
    )
    .unwrap();
    wait("a scrape", || s.state().ok >= 1);
    let got = s.take();
    let e = &got[0].exposition;
    assert_eq!(
        e.series.len(),
        exposition::MAX_LINES,
        "parsed up to the bound"
    );
    assert_eq!(e.skipped, 5000, "the rest counted");
    assert!(
        e.first_skipped.contains("over 100000 lines"),
        "{}",
        e.first_skipped
    );
}

//! The endpoint's server: hyper 1 over tokio, HTTP/1.1, `GET` / `HEAD` only, bounded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// `Content-Type` of `/metrics`: the Prometheus text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Largest request head read (bytes); a larger one is refused by hyper.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// A client must send its request head within this time.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one connection is served (keep-alive included); a scraper reconnects.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(60);

/// What the endpoint serves; the daemon implements it. `metrics` and `status` may take locks
/// and are called on a blocking thread.
pub trait Routes: Send + Sync + 'static {
    /// `/healthz`: the daemon's loop runs.
    fn alive(&self) -> bool;
    /// `/readyz`: sources and sinks are up and the daemon is not shutting down.
    fn ready(&self) -> bool;
    /// `/metrics`: the Prometheus text exposition.
    fn metrics(&self) -> String;
    /// `/status`: the daemon's state as JSON.
    fn status(&self) -> Vec<u8>;
}

/// Why the endpoint cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// `listen` is not a socket address.
    #[error("[http] listen = {listen:?}: not a host:port address ({message}); write e.g. \"127.0.0.1:9464\", or \"\" for no endpoint")]
    Address {
        /// The configured value.
        listen: String,
        /// The parser's message.
        message: String,
    },
    /// The address cannot be bound.
    #[error("[http] listen = {listen:?}: cannot listen ({source}); set http.listen to a free address, or \"\" for no endpoint")]
    Bind {
        /// The configured value.
        listen: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Parse `listen` (checked by the configuration too).
pub fn parse_listen(listen: &str) -> Result<SocketAddr, HttpError> {
    listen
        .trim()
        .parse::<SocketAddr>()
        .map_err(|e| HttpError::Address {
            listen: listen.to_string(),
            message: e.to_string(),
        })
}

/// Bind `listen`.
pub async fn bind(listen: &str) -> Result<TcpListener, HttpError> {
    let addr = parse_listen(listen)?;
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind {
            listen: listen.to_string(),
            source,
        })
}

/// Serve `routes` on `listener` until `stop` becomes true, at most `max_connections` at once
/// (more are closed unanswered).
pub async fn serve(
    listener: TcpListener,
    routes: Arc<dyn Routes>,
    max_connections: usize,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let mut refused: u64 = 0;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|v| *v) => return,
        };
        let (stream, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::debug!("http: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!("http: {refused} connections refused: more than [http] max_connections = {max_connections} at once");
            }
            continue;
        };
        let routes = routes.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, routes.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, conn).await;
            drop(permit);
        });
    }
}

fn reply(code: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

const TEXT: &str = "text/plain; charset=utf-8";

/// Run `f` on a blocking thread (it may wait for the aggregator's lock).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn handle(
    req: Request<Incoming>,
    routes: Arc<dyn Routes>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET and HEAD\n");
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return Ok(r);
    }
    let r = match req.uri().path() {
        "/healthz" if routes.alive() => reply(StatusCode::OK, TEXT, "ok\n"),
        "/healthz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "the ingest loop made no round recently\n",
        ),
        "/readyz" if routes.ready() => reply(StatusCode::OK, TEXT, "ready\n"),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "starting or stopping\n",
        ),
        "/metrics" => match blocking(move || routes.metrics()).await {
            Some(text) => reply(StatusCode::OK, METRICS_CONTENT_TYPE, text),
            None => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                TEXT,
                "rendering failed\n",
            ),
        },
        "/status" => match blocking(move || routes.status()).await {
            Some(json) => reply(StatusCode::OK, "application/json", json),
            None => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                TEXT,
                "rendering failed\n",
            ),
        },
        "/" => reply(
            StatusCode::OK,
            TEXT,
            "comminsight-agent: /healthz /readyz /metrics /status\n",
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found; the endpoint serves /healthz /readyz /metrics /status\n",
        ),
    };
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Fake {
        ready: AtomicBool,
    }
    impl Routes for Fake {
        fn alive(&self) -> bool {
            true
        }
        fn ready(&self) -> bool {
            self.ready.load(Ordering::Relaxed)
        }
        fn metrics(&self) -> String {
            "# TYPE x counter\nx_total 1\n".into()
        }
        fn status(&self) -> Vec<u8> {
            b"{\"pid\":1}".to_vec()
        }
    }

    #[test]
    fn serves_the_routes_and_bounds_requests() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let fake = Arc::new(Fake {
            ready: AtomicBool::new(false),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let listener = rt.block_on(bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        rt.spawn(serve(listener, fake.clone(), 2, stop_rx));
        let get = |path: &str| super::super::client::get(&addr, path).unwrap();
        assert_eq!(get("/healthz").code, 200);
        assert_eq!(get("/readyz").code, 503);
        fake.ready.store(true, Ordering::Relaxed);
        assert_eq!(get("/readyz").code, 200);
        let m = get("/metrics");
        assert_eq!(
            (m.code, m.content_type.as_str(), m.body.as_slice()),
            (
                200,
                METRICS_CONTENT_TYPE,
                &b"# TYPE x counter\nx_total 1\n"[..]
            )
        );
        assert_eq!(get("/status").body, b"{\"pid\":1}");
        assert_eq!(get("/nope").code, 404);
        // A head larger than the bound is refused, not buffered.
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        use std::io::{Read, Write};
        let huge = format!(
            "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        let _ = s.write_all(huge.as_bytes());
        let mut back = String::new();
        let _ = s.read_to_string(&mut back);
        assert!(!back.contains("{\"pid\":1}"), "{back}");
        assert!(
            back.is_empty() || back.starts_with("HTTP/1.1 431"),
            "{back}"
        );
        // A POST gets 405 with Allow.
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(
            b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut back = String::new();
        s.read_to_string(&mut back).unwrap();
        assert!(
            back.starts_with("HTTP/1.1 405") && back.contains("allow: GET, HEAD"),
            "{back}"
        );
        let _ = stop_tx.send(true);
    }

    #[test]
    fn bad_addresses_are_one_line_errors_naming_the_key() {
        let e = parse_listen("localhost").unwrap_err().to_string();
        assert!(
            e.starts_with("[http] listen = \"localhost\"") && e.contains("\"\""),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }
}

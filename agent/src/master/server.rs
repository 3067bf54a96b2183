//! The master's side of the link: the `comminsight.link.v1.Link` service, written the way
//! tonic's generated code is (a tower service routing on the request path).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::BoxFuture;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::server::{TcpConnectInfo, TcpIncoming, TlsConnectInfo};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

use super::config::{MasterConfig, DEFAULT_MAX_MESSAGE_MB};
use super::proto::{
    PushReply, PushRequest, TimeReply, TimeRequest, HOST_HEADER, PUSH_PATH, SERVICE, TIME_PATH,
};
use super::store::MasterStore;
use super::{read_tls, realtime_ns, token_eq, LinkError};

/// The master's clock (realtime ns); injectable for tests.
pub type ServerClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Calls served at once on one connection.
pub const MAX_CLIENTS_PER_CONN: usize = 64;
/// One refusal line per peer per this long.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// How the master serves the link.
#[derive(Clone)]
pub struct ServerSetup {
    /// The shared token callers must present; `None` = loopback peers only.
    pub token: Option<String>,
    /// TLS certificate chain and key (PEM); `None` = plaintext.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// Largest message accepted (bytes).
    pub max_message_bytes: usize,
    /// The master's clock.
    pub clock: ServerClock,
}

impl ServerSetup {
    /// Plaintext, with `token` if given, messages up to [`DEFAULT_MAX_MESSAGE_MB`] MiB, the
    /// realtime clock.
    pub fn plain(token: Option<String>) -> ServerSetup {
        ServerSetup {
            token,
            tls: None,
            max_message_bytes: (DEFAULT_MAX_MESSAGE_MB as usize) << 20,
            clock: Arc::new(realtime_ns),
        }
    }

    /// From `[master]` (`token_file`, `tls_cert`, `tls_key`, `max_message_mb`); without a
    /// `token_file`, the generated `<state_dir>/master.token` (created when missing).
    pub fn from_config(cfg: &MasterConfig, state_dir: &Path) -> Result<ServerSetup, LinkError> {
        let cert = read_tls(&cfg.tls_cert, "tls_cert")?;
        let key = read_tls(&cfg.tls_key, "tls_key")?;
        let tls = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(LinkError::Tls {
                    reason: "only one of tls_cert and tls_key is set; set both (or neither)".into(),
                })
            }
        };
        Ok(ServerSetup {
            token: Some(super::token::server_token(cfg, state_dir)?),
            tls,
            max_message_bytes: (cfg.max_message_mb.max(1) as usize).saturating_mul(1 << 20),
            clock: Arc::new(realtime_ns),
        })
    }
}

/// Serve the link on `listener` into `store` until `shutdown` turns true (or its sender is
/// dropped); then stop accepting and wait for the calls in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    setup: ServerSetup,
    store: Arc<MasterStore>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(), LinkError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let fail = |reason: String| LinkError::Serve {
        addr: addr.clone(),
        reason,
    };
    let mut builder = Server::builder()
        .concurrency_limit_per_connection(MAX_CLIENTS_PER_CONN)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some((cert, key)) = &setup.tls {
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        builder = builder.tls_config(tls).map_err(|e| LinkError::Tls {
            reason: e.to_string(),
        })?;
    }
    let svc = LinkService(Arc::new(Shared {
        token: setup.token.map(|t| format!("Bearer {t}")),
        store,
        clock: setup.clock,
        max_message: setup.max_message_bytes,
        refusals: Mutex::new(RefusalLog::default()),
    }));
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let signal = async move {
        let _ = shutdown.wait_for(|v| *v).await;
    };
    tracing::info!(
        "agent link: serving {SERVICE} on {addr}{}",
        if setup.tls.is_some() { " (TLS)" } else { "" }
    );
    builder
        .serve_with_incoming_shutdown(svc, incoming, signal)
        .await
        .map_err(|e| fail(e.to_string()))
}

struct Shared {
    /// `Bearer <token>`.
    token: Option<String>,
    store: Arc<MasterStore>,
    clock: ServerClock,
    max_message: usize,
    refusals: Mutex<RefusalLog>,
}

/// Whether a caller may use the link: `expected` is `Bearer <token>` (`None`: no token is
/// configured, and the link serves no one: loopback is reachable by every local user), `given`
/// the `authorization` header. The refusal reason.
pub(crate) fn check_access(expected: Option<&str>, given: &[u8]) -> Result<(), &'static str> {
    match expected {
        Some(expected) if token_eq(given, expected.as_bytes()) => Ok(()),
        Some(_) if given.is_empty() => Err("missing token"),
        Some(_) => Err("wrong token"),
        None => Err("no token is configured, so the link serves no one"),
    }
}

/// Rate limit of the refusal log: one line per peer address per minute.
#[derive(Default)]
pub(crate) struct RefusalLog {
    /// Per peer: when its last line was written, refusals since.
    peers: HashMap<IpAddr, (Instant, u64)>,
}

impl RefusalLog {
    /// Note a refusal of `ip` at `now`; `Some(refusals not logged since the last line)` when a
    /// line is due.
    pub(crate) fn note(&mut self, ip: IpAddr, now: Instant) -> Option<u64> {
        if self.peers.len() > 4096 {
            self.peers
                .retain(|_, (at, _)| now.duration_since(*at) < REFUSAL_LOG_EVERY);
        }
        match self.peers.get_mut(&ip) {
            Some((at, n)) if now.duration_since(*at) < REFUSAL_LOG_EVERY => {
                *n += 1;
                None
            }
            Some((at, n)) => {
                let more = *n;
                *at = now;
                *n = 0;
                Some(more)
            }
            None => {
                self.peers.insert(ip, (now, 0));
                Some(0)
            }
        }
    }
}

impl Shared {
    /// Check the caller's credentials; the refusal status when they are not good.
    fn authorize(&self, req: &http::Request<Body>, method: &str) -> Result<(), Status> {
        let peer = peer_of(req);
        let given = req
            .headers()
            .get("authorization")
            .map(|v| v.as_bytes())
            .unwrap_or(b"");
        let Err(reason) = check_access(self.token.as_deref(), given) else {
            return Ok(());
        };
        let ip = peer.map_or(IpAddr::from([0, 0, 0, 0]), |p| p.ip());
        let note = self
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(ip, Instant::now());
        if let Some(more) = note {
            let peer = peer.map_or("an unknown peer".to_string(), |p| p.to_string());
            tracing::warn!(
                "agent link: refused {method} from {peer}: {reason} ({more} more refused from this address in the last minute)"
            );
        }
        Err(Status::unauthenticated(if self.token.is_some() {
            "wrong or missing token; use the same [master] token_file on both hosts"
        } else {
            "this master has no token and serves no one; set [master] token_file on both hosts"
        }))
    }

    fn seen(&self, req: &Request<impl Sized>, fallback: &str) {
        let host = req
            .metadata()
            .get(HOST_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(fallback);
        if !host.is_empty() {
            self.store.seen(host);
        } else if let Some(a) = req.remote_addr() {
            self.store.seen(&a.ip().to_string());
        }
    }
}

fn peer_of(req: &http::Request<Body>) -> Option<SocketAddr> {
    let ext = req.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}

#[derive(Clone)]
struct LinkService(Arc<Shared>);

impl NamedService for LinkService {
    const NAME: &'static str = SERVICE;
}

impl tonic::codegen::Service<http::Request<Body>> for LinkService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let shared = self.0.clone();
        let method = match req.uri().path() {
            TIME_PATH => "Time",
            PUSH_PATH => "Push",
            other => {
                let s = Status::unimplemented(format!(
                    "{other} is not a method of {SERVICE}; run the same agent version on both hosts"
                ));
                return Box::pin(async move { Ok(s.into_http()) });
            }
        };
        if let Err(s) = shared.authorize(&req, method) {
            return Box::pin(async move { Ok(s.into_http()) });
        }
        let max = shared.max_message;
        Box::pin(async move {
            Ok(if method == "Time" {
                Grpc::new(ProstCodec::<TimeReply, TimeRequest>::default())
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max)
                    .unary(TimeSvc(shared), req)
                    .await
            } else {
                Grpc::new(ProstCodec::<PushReply, PushRequest>::default())
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max)
                    .unary(PushSvc(shared), req)
                    .await
            })
        })
    }
}

struct TimeSvc(Arc<Shared>);

impl UnaryService<TimeRequest> for TimeSvc {
    type Response = TimeReply;
    type Future = BoxFuture<Response<TimeReply>, Status>;

    fn call(&mut self, req: Request<TimeRequest>) -> Self::Future {
        let t2 = (self.0.clock)();
        let shared = self.0.clone();
        Box::pin(async move {
            shared.seen(&req, "");
            let t1 = req.into_inner().t1;
            let t3 = (shared.clock)();
            Ok(Response::new(TimeReply { t1, t2, t3 }))
        })
    }
}

struct PushSvc(Arc<Shared>);

impl UnaryService<PushRequest> for PushSvc {
    type Response = PushReply;
    type Future = BoxFuture<Response<PushReply>, Status>;

    fn call(&mut self, req: Request<PushRequest>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            let peer = req.remote_addr();
            let msg = req.into_inner();
            if let Some(p) = peer {
                tracing::trace!(%p, kind = %msg.kind, job = %msg.job, seq = msg.seq, "agent link: push");
            }
            let store = shared.store.clone();
            let host = msg.host.clone();
            let stored = tokio::task::spawn_blocking(move || store.store(&msg))
                .await
                .map_err(|e| Status::internal(format!("the store task failed: {e}")))?;
            match stored {
                Ok(_) => {
                    shared.store.seen(&host);
                    Ok(Response::new(PushReply {}))
                }
                Err(e @ LinkError::BadMessage { .. }) => {
                    Err(Status::invalid_argument(e.to_string()))
                }
                Err(e) => {
                    tracing::error!("agent link: {e}");
                    Err(Status::internal(e.to_string()))
                }
            }
        })
    }
}

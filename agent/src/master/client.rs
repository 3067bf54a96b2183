//! The agents' side of the link: one kept-alive gRPC channel to the master.

use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;
use tonic_prost::ProstCodec;

use super::config::{MasterConfig, DEFAULT_MAX_MESSAGE_MB};
use super::proto::{
    PushReply, PushRequest, TimeReply, TimeRequest, HOST_HEADER, PUSH_PATH, TIME_PATH,
};
use super::{read_tls, realtime_ns, LinkError};
use crate::clock::{estimate_within, ClockConfig, Exchange, HostOffset};

/// Longest wait for the connection to the master.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait for one `Time` reply.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for one `Push` reply (a large message on a slow network).
const PUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// How to reach the master.
#[derive(Clone, Debug, Default)]
pub struct ClientSetup {
    /// The master's `host:port`.
    pub address: String,
    /// The shared token, sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// CA certificate(s) (PEM) to verify the master with; `None` = plaintext.
    pub tls_ca: Option<Vec<u8>>,
    /// Name the master's certificate must carry; empty = the host of `address`.
    pub tls_domain: String,
    /// This agent's host name, sent with every call.
    pub host: String,
    /// Largest message sent or received (bytes).
    pub max_message_bytes: usize,
}

impl ClientSetup {
    /// Plaintext to `address`, with `token` if given.
    pub fn plain(address: &str, token: Option<&str>) -> ClientSetup {
        ClientSetup {
            address: address.into(),
            token: token.map(Into::into),
            max_message_bytes: (DEFAULT_MAX_MESSAGE_MB as usize) << 20,
            ..ClientSetup::default()
        }
    }

    /// From `[master]` (`address`, `token_file`, `tls_ca`, `tls_domain`, `max_message_mb`).
    /// Without a `token_file`, the token a master on this host generated in
    /// `<state_dir>/master.token` (when it exists; else calls go without one and are refused).
    pub fn from_config(
        cfg: &MasterConfig,
        host: &str,
        state_dir: &std::path::Path,
    ) -> Result<ClientSetup, LinkError> {
        Ok(ClientSetup {
            address: cfg.address.clone(),
            token: super::token::client_token(cfg, state_dir)?,
            tls_ca: read_tls(&cfg.tls_ca, "tls_ca")?,
            tls_domain: cfg.tls_domain.clone(),
            host: host.into(),
            max_message_bytes: (cfg.max_message_mb.max(1) as usize).saturating_mul(1 << 20),
        })
    }
}

/// A client of the master's link; cheap to clone (clones share one connection, which is opened
/// on first use and re-opened after a failure).
#[derive(Clone, Debug)]
pub struct LinkClient {
    addr: String,
    grpc: tonic::client::Grpc<Channel>,
    auth: Option<AsciiMetadataValue>,
    host: Option<AsciiMetadataValue>,
}

impl LinkClient {
    /// A client for `setup` (no connection yet). Must be called inside a tokio runtime.
    pub fn new(setup: &ClientSetup) -> Result<LinkClient, LinkError> {
        let addr = setup.address.clone();
        let scheme = if setup.tls_ca.is_some() {
            "https"
        } else {
            "http"
        };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| LinkError::Unreachable {
                addr: addr.clone(),
                reason: format!("not a host:port ({e})"),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(Duration::from_secs(60)))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20));
        if let Some(ca) = &setup.tls_ca {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
            if !setup.tls_domain.is_empty() {
                tls = tls.domain_name(setup.tls_domain.clone());
            }
            ep = ep.tls_config(tls).map_err(|e| LinkError::Tls {
                reason: error_chain(&e),
            })?;
        }
        let max = setup.max_message_bytes.max(1 << 20);
        let grpc = tonic::client::Grpc::new(ep.connect_lazy())
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let header = |v: String, what: &str| {
            MetadataValue::try_from(v).map_err(|_| LinkError::BadMessage {
                kind: "link".into(),
                job: String::new(),
                reason: format!("the {what} is not printable ASCII; fix [master] token_file or [agent] host_name"),
            })
        };
        let auth = match &setup.token {
            Some(t) => Some(header(format!("Bearer {t}"), "token")?),
            None => None,
        };
        let host = match setup.host.as_str() {
            "" => None,
            h => Some(header(h.to_string(), "host name")?),
        };
        Ok(LinkClient {
            addr,
            grpc,
            auth,
            host,
        })
    }

    /// The master's address.
    pub fn address(&self) -> &str {
        &self.addr
    }

    /// One `Time` exchange (at most [`EXCHANGE_TIMEOUT`] once connected).
    pub async fn time(&self, t1: u64) -> Result<TimeReply, LinkError> {
        self.call(TimeRequest { t1 }, TIME_PATH, EXCHANGE_TIMEOUT)
            .await
    }

    /// Send one message; `Ok` once the master stored it durably (or had stored it before).
    pub async fn push(&self, msg: PushRequest) -> Result<(), LinkError> {
        let _: PushReply = self.call(msg, PUSH_PATH, PUSH_TIMEOUT).await?;
        Ok(())
    }

    async fn call<M1, M2>(
        &self,
        msg: M1,
        path: &'static str,
        limit: Duration,
    ) -> Result<M2, LinkError>
    where
        M1: prost::Message + Send + Sync + 'static,
        M2: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = self.grpc.clone();
        let mut req = tonic::Request::new(msg);
        if let Some(a) = &self.auth {
            req.metadata_mut().insert("authorization", a.clone());
        }
        if let Some(h) = &self.host {
            req.metadata_mut().insert(HOST_HEADER, h.clone());
        }
        let exchange = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(error_chain(&e)))?;
            grpc.unary(
                req,
                PathAndQuery::from_static(path),
                ProstCodec::<M1, M2>::default(),
            )
            .await
        };
        // The connection (at most CONNECT_TIMEOUT) plus the exchange.
        match tokio::time::timeout(CONNECT_TIMEOUT + limit, exchange).await {
            Err(_) => Err(LinkError::Timeout {
                addr: self.addr.clone(),
                ms: limit.as_millis() as u64,
            }),
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(self.status_error(s)),
        }
    }

    fn status_error(&self, s: tonic::Status) -> LinkError {
        let addr = self.addr.clone();
        let mut parts = vec![s.message().to_string()];
        let mut cur = std::error::Error::source(&s);
        while let Some(c) = cur {
            let t = c.to_string();
            if !parts.iter().any(|p| p.contains(&t)) {
                parts.push(t);
            }
            cur = c.source();
        }
        let message = parts.join(": ").replace('\n', " ");
        match s.code() {
            Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::OutOfRange
            | Code::ResourceExhausted
            | Code::Unimplemented => LinkError::Refused { addr, message },
            Code::DeadlineExceeded | Code::Cancelled if message.contains("imeout") => {
                LinkError::Timeout {
                    addr,
                    ms: CONNECT_TIMEOUT.as_millis() as u64,
                }
            }
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted => {
                LinkError::Unreachable {
                    addr,
                    reason: message,
                }
            }
            c => LinkError::Protocol {
                addr,
                message: format!("{c:?}: {message}"),
            },
        }
    }
}

/// An error and its sources on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}

/// Measure this host's offset to the master at `addr` (plaintext): `cfg.samples` round trips
/// over one connection, the fastest within `cfg.max_rtt_ms` wins.
pub async fn measure(
    addr: &str,
    token: Option<&str>,
    cfg: &ClockConfig,
) -> Result<HostOffset, LinkError> {
    measure_with_clock(addr, token, cfg, &realtime_ns).await
}

/// [`measure`] with this host's clock given.
pub async fn measure_with_clock(
    addr: &str,
    token: Option<&str>,
    cfg: &ClockConfig,
    clock: &(dyn Fn() -> u64 + Send + Sync),
) -> Result<HostOffset, LinkError> {
    let client = LinkClient::new(&ClientSetup::plain(addr, token))?;
    measure_with(&client, cfg, clock).await
}

/// [`measure`] over an existing client (TLS, host name and token as it was set up).
pub async fn measure_with(
    client: &LinkClient,
    cfg: &ClockConfig,
    clock: &(dyn Fn() -> u64 + Send + Sync),
) -> Result<HostOffset, LinkError> {
    let addr = client.address();
    let mut samples = Vec::with_capacity(cfg.samples as usize);
    for _ in 0..cfg.samples.max(1) {
        let t1 = clock();
        let reply = client.time(t1).await?;
        let t4 = clock();
        if reply.t1 != t1 {
            return Err(LinkError::Protocol {
                addr: addr.into(),
                message: format!("echoed t1 {} (sent {t1})", reply.t1),
            });
        }
        samples.push(Exchange {
            t1,
            t2: reply.t2,
            t3: reply.t3,
            t4,
        });
    }
    let max_rtt_ns = cfg.max_rtt_ms.saturating_mul(1_000_000);
    let mut best = estimate_within(&samples, max_rtt_ns).ok_or_else(|| LinkError::TooSlow {
        addr: addr.into(),
        max_rtt_ms: cfg.max_rtt_ms,
        best_rtt_us: samples.iter().map(Exchange::rtt_ns).min().unwrap_or(0) / 1000,
    })?;
    best.master = addr.to_string();
    Ok(best)
}

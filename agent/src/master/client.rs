//! The measuring side of the link.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{realtime_ns, LinkError, Reply, Request, LINK_VERSION, MAX_LINE};
use crate::clock::{estimate_within, Exchange, HostOffset};
use crate::config::ClockConfig;

/// Longest wait for the connection to the master.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest wait for one reply.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// Measure this host's offset to the master at `addr`: `cfg.samples` round trips over one
/// connection, the fastest within `cfg.max_rtt_ms` wins.
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
    let unreachable = |reason: String| LinkError::Unreachable {
        addr: addr.into(),
        reason,
    };
    let timeout = |d: Duration| LinkError::Timeout {
        addr: addr.into(),
        ms: d.as_millis() as u64,
    };
    let protocol = |message: String| LinkError::Protocol {
        addr: addr.into(),
        message,
    };
    let sock = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| timeout(CONNECT_TIMEOUT))?
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = sock.set_nodelay(true);
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    let mut samples = Vec::with_capacity(cfg.samples as usize);
    let mut line = Vec::with_capacity(256);
    for _ in 0..cfg.samples.max(1) {
        let t1 = clock();
        let req = Request {
            v: LINK_VERSION,
            kind: "time".into(),
            token: token.map(Into::into),
            t1,
        };
        let mut out = serde_json::to_vec(&req).map_err(|e| protocol(e.to_string()))?;
        out.push(b'\n');
        line.clear();
        let exchange = async {
            wr.write_all(&out).await?;
            (&mut rd)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)
                .await
        };
        let n = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .map_err(|_| timeout(EXCHANGE_TIMEOUT))?
            .map_err(|e| unreachable(e.to_string()))?;
        let t4 = clock();
        if n == 0 {
            return Err(unreachable("the connection was closed".into()));
        }
        let reply: Reply = serde_json::from_slice(&line).map_err(|e| protocol(e.to_string()))?;
        if let Some(message) = reply.error {
            return Err(LinkError::Refused {
                addr: addr.into(),
                message,
            });
        }
        if reply.v != LINK_VERSION || reply.t1 != t1 {
            return Err(protocol(format!(
                "version {} / echoed t1 {} (sent {t1})",
                reply.v, reply.t1
            )));
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

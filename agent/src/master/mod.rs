//! The agent link: one agent per job is the master; the others measure their clock offset
//! against it (NTP-style) and send it hang snapshots and step summaries through a durable
//! [`Outbox`]; the master keeps them in a [`MasterStore`].
//!
//! Transport: gRPC over HTTP/2 (tonic), service `comminsight.link.v1.Link`, messages in
//! [`proto`] (hand-written prost, no build script):
//!
//! * `Time(TimeRequest{t1}) -> TimeReply{t1, t2, t3}`: t1 client send, t2 master receive, t3
//!   master send (realtime ns); [`measure`] does `[clock] samples` of them and keeps the fastest.
//! * `Push(PushRequest{kind, job, host, seq, payload}) -> PushReply{}`: kind `hang` (a JSON
//!   `JobSnapshot`) or `steps` (JSON lines of step summaries); OK means stored durably on the
//!   master; a resend of a stored `seq` is acknowledged and not stored twice. Messages are at most
//!   `[master] max_message_mb`.
//!
//! Authentication: every call carries `authorization: Bearer <token>`; the master compares in
//! constant time and answers `UNAUTHENTICATED` to a missing or wrong token, loopback peers
//! included (any local user can reach a loopback port). The token is `[master] token_file`, or,
//! when that is empty, one the master generates in `<state_dir>/master.token` (0600, root's)
//! and an agent on the same host with the same `state_dir` reads ([`token`]). Refusals are
//! logged (one line per peer per minute, with a count). Each call also carries `comminsight-host: <host>`
//! (the master's `last_seen`). TLS is optional: `[master] tls_cert` + `tls_key` on the master,
//! `tls_ca` (+ `tls_domain`) on the agents; empty = plaintext.

mod client;
pub mod config;
mod outbox;
pub mod proto;
mod server;
mod store;
pub mod token;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use client::{
    measure, measure_with, measure_with_clock, ClientSetup, LinkClient, CONNECT_TIMEOUT,
    EXCHANGE_TIMEOUT,
};
pub use config::MasterConfig;
pub use outbox::{Outbox, OutboxLimits};
pub use server::{serve, ServerClock, ServerSetup, MAX_CLIENTS_PER_CONN};
pub use store::{MasterStore, OnPush};
pub use token::{load_token, preflight};

/// Why the link could not be used. Each message names the address or file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot reach the master at {addr}: {reason}; check [master] address and that the master's agent is running")]
    Unreachable { addr: String, reason: String },
    #[error("the master at {addr} did not answer within {ms} ms; check [master] address and the network")]
    Timeout { addr: String, ms: u64 },
    #[error("the master at {addr} refused: {message}")]
    Refused { addr: String, message: String },
    #[error("the master at {addr} sent an invalid reply ({message}); run the same agent version on both hosts")]
    Protocol { addr: String, message: String },
    #[error("every round trip to the master at {addr} exceeded [clock] max_rtt_ms = {max_rtt_ms} (fastest {best_rtt_us} us); raise max_rtt_ms or check the network")]
    TooSlow {
        addr: String,
        max_rtt_ms: u64,
        best_rtt_us: u64,
    },
    #[error("{path}: cannot read the link token ({reason}); check [master] token_file")]
    TokenFile { path: PathBuf, reason: String },
    #[error(
        "{path}: the link token is readable by every user (mode {mode:o}); run `chmod 600 {path}`"
    )]
    TokenWorldReadable { path: PathBuf, mode: u32 },
    #[error("{path}: cannot read the TLS file ({reason}); check [master] {key}")]
    TlsFile {
        path: PathBuf,
        key: &'static str,
        reason: String,
    },
    #[error("the link's TLS setup failed ({reason}); check [master] tls_cert, tls_key, tls_ca and tls_domain")]
    Tls { reason: String },
    #[error("{path}: cannot write {what} ({reason}); check that [agent] state_dir is writable and has space")]
    Disk {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("cannot send a {kind:?} message for job {job:?} to the master: {reason}")]
    BadMessage {
        kind: String,
        job: String,
        reason: String,
    },
    #[error("cannot serve the agent link on {addr}: {reason}; set another [master] listen address or leave it empty")]
    Serve { addr: String, reason: String },
}

impl LinkError {
    /// True when the master refused this agent's credentials (missing or wrong token).
    pub fn is_auth(&self) -> bool {
        matches!(self, LinkError::Refused { message, .. } if message.contains("token") || message.contains("loopback"))
    }
}

fn disk(path: &Path, what: &'static str, e: impl std::fmt::Display) -> LinkError {
    LinkError::Disk {
        path: path.to_path_buf(),
        what,
        reason: e.to_string(),
    }
}

pub(crate) use crate::util::fs::write_atomic;

/// fsync a directory (so a rename or a new file in it survives a crash).
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn read_tls(path: &Path, key: &'static str) -> Result<Option<Vec<u8>>, LinkError> {
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| LinkError::TlsFile {
            path: path.to_path_buf(),
            key,
            reason: e.to_string(),
        })
}

/// The link's parts this agent runs (see [`start`]).
#[derive(Default)]
pub struct Link {
    /// The master's store, when this agent serves the link (`[master] listen`).
    pub store: Option<Arc<MasterStore>>,
    /// The outbox to the master, when one is configured (`[master] address`).
    pub outbox: Option<Arc<Outbox>>,
    /// The client of the master (`[master] address`), for clock sync.
    pub client: Option<LinkClient>,
    /// The tasks started (server, outbox sender); they end when `shutdown` turns true.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What [`start`] needs from the agent's configuration: the `[master]` section and where the
/// agent keeps its state (`[agent] state_dir`). The configuration converts into it
/// (`From<&AgentConfig>`), so `start(&cfg, ..)` takes the whole configuration.
#[derive(Clone, Copy, Debug)]
pub struct LinkConfig<'a> {
    /// `[master]`.
    pub master: &'a MasterConfig,
    /// `[agent] state_dir`: the master's store and the outbox live below it.
    pub state_dir: &'a Path,
}

/// Start this agent's side of the link from `cfg`: serve it with a [`MasterStore`] under
/// `<state_dir>/master/` when `[master] listen` is set (a port that cannot be bound is logged and
/// skipped), and open the [`Outbox`] under `<state_dir>/outbox/` with its sender when
/// `[master] address` is set. Token, TLS or disk problems are errors.
pub async fn start<'a>(
    cfg: impl Into<LinkConfig<'a>>,
    host: &str,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<Link, LinkError> {
    let LinkConfig {
        master: m,
        state_dir,
    } = cfg.into();
    let mut link = Link::default();
    if !m.listen.is_empty() {
        let setup = ServerSetup::from_config(m, state_dir)?;
        let store = Arc::new(MasterStore::open(&state_dir.join("master"))?);
        match tokio::net::TcpListener::bind(&m.listen).await {
            Ok(l) => {
                let (st, sd) = (store.clone(), shutdown.clone());
                link.tasks.push(tokio::spawn(async move {
                    if let Err(e) = serve(l, setup, st, sd).await {
                        tracing::error!("{e}");
                    }
                }));
            }
            Err(e) => tracing::warn!(
                "[master] listen = {:?}: cannot listen ({e}); this agent will not serve the agent link (set another address or leave it empty)",
                m.listen
            ),
        }
        link.store = Some(store);
    }
    if !m.address.is_empty() {
        let client = LinkClient::new(&ClientSetup::from_config(m, host, state_dir)?)?;
        let limits = OutboxLimits {
            max_bytes: m.outbox_max_mb.saturating_mul(1 << 20),
            ..OutboxLimits::default()
        };
        let outbox = Outbox::open(&state_dir.join("outbox"), host, limits)?;
        link.tasks.push(tokio::spawn(
            outbox.clone().run(client.clone(), shutdown.clone()),
        ));
        link.outbox = Some(outbox);
        link.client = Some(client);
    }
    Ok(link)
}

/// Equal byte strings, in time that depends only on `expected`'s length.
pub(crate) fn token_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(!e);
    }
    diff == 0
}

/// This host's realtime in ns.
pub(crate) fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;

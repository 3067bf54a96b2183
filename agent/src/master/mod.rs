//! The agent link: one agent per job is the master; the others measure their clock offset
//! against it (NTP-style) and, in later issues, send it job aggregates over the same link.
//!
//! Wire format: one JSON object per line, each carrying the link version `v` (today 1) and a
//! `type`. A client sends `{"v":1,"type":"time","token":"…","t1":<ns>}`; the master answers
//! `{"v":1,"type":"time","t1":<ns>,"t2":<ns>,"t3":<ns>}` (t2: received, t3: sent, master
//! realtime). Errors are `{"v":1,"error":"<one line>"}` followed by closing the connection.
//! Lines are at most [`MAX_LINE`] bytes. Tokens are compared in constant time.

mod client;
mod server;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use client::{measure, measure_with_clock, CONNECT_TIMEOUT, EXCHANGE_TIMEOUT};
pub use server::{serve, serve_with_clock, ServerClock, IDLE_TIMEOUT, MAX_CLIENTS};

use crate::config::MasterConfig;

/// Version of the link's messages.
pub const LINK_VERSION: u32 = 1;
/// Longest accepted line, newline included.
pub const MAX_LINE: usize = 4096;

/// A request on the link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default)]
    pub t1: u64,
}

/// A reply on the link: the time stamps, or an error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub v: u32,
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub t1: u64,
    #[serde(default)]
    pub t2: u64,
    #[serde(default)]
    pub t3: u64,
}

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
}

/// The shared token from `[master] token_file` (trimmed); `None` when no file is configured.
/// A file readable by every user, an unreadable file or an empty token is refused.
pub fn load_token(cfg: &MasterConfig) -> Result<Option<String>, LinkError> {
    let path = &cfg.token_file;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    let fail = |reason: String| LinkError::TokenFile {
        path: path.clone(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o004 != 0 {
        return Err(LinkError::TokenWorldReadable {
            path: path.clone(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    Ok(Some(token.to_string()))
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

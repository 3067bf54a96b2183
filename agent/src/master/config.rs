//! `[master]` of the agent's configuration: the agent link (one agent per job is the master;
//! the others sync to it).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default of `listen`: serve the link on loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7117";
/// Default of `max_message_mb`.
pub const DEFAULT_MAX_MESSAGE_MB: u64 = 16;
/// Default of `outbox_max_mb`.
pub const DEFAULT_OUTBOX_MAX_MB: u64 = 256;

/// `[master]`: the agent link (one agent per job is the master; the others sync to it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// Serve the agent link on this address (empty = do not serve).
    pub listen: String,
    /// The master's address (host:port) to sync with; empty = this host is the time reference.
    pub address: String,
    /// File holding the shared token both ends must present; empty = no token (loopback only).
    pub token_file: PathBuf,
    /// Largest message on the link (MiB).
    pub max_message_mb: u64,
    /// Largest outbox to the master (MiB); beyond it the oldest steps, then hang messages go.
    pub outbox_max_mb: u64,
    /// The master's TLS certificate chain (PEM); empty = plaintext. Needs `tls_key`.
    pub tls_cert: PathBuf,
    /// The master's TLS private key (PEM).
    pub tls_key: PathBuf,
    /// CA certificate(s) (PEM) the agents verify the master with; empty = plaintext.
    pub tls_ca: PathBuf,
    /// Name the master's certificate must carry; empty = the host of `address`.
    pub tls_domain: String,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            listen: DEFAULT_LISTEN.into(),
            address: String::new(),
            token_file: PathBuf::new(),
            max_message_mb: DEFAULT_MAX_MESSAGE_MB,
            outbox_max_mb: DEFAULT_OUTBOX_MAX_MB,
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
            tls_ca: PathBuf::new(),
            tls_domain: String::new(),
        }
    }
}

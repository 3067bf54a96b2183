//! `[http]` of the agent's configuration: the local endpoint.

use serde::{Deserialize, Serialize};

/// Default of `listen`: loopback, the port OpenTelemetry's Prometheus exporters use.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
/// Default of `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 16;

/// `[http]`: `/healthz`, `/readyz`, `/metrics` and `/status` on one address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Serve the endpoint on this host:port (empty = no endpoint; port 0 = any free port).
    pub listen: String,
    /// Connections served at once; more are closed at once.
    pub max_connections: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: DEFAULT_LISTEN.into(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl HttpConfig {
    /// Whether the endpoint is served.
    pub fn enabled(&self) -> bool {
        !self.listen.trim().is_empty()
    }
}

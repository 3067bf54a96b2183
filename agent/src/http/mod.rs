//! The local HTTP endpoint of the daemon (`[http]`, loopback by default): `/healthz`, `/readyz`,
//! `/metrics` (the Prometheus text exposition of the same snapshot OTLP exports) and `/status`
//! (the daemon's state as JSON, what `comminsight-agent status` shows).
//!
//! The server ([`server`]) knows nothing of the pipeline: the daemon hands it a [`Routes`]
//! implementation. Requests are bounded (headers only, 16 KiB, a header timeout, at most
//! `max_connections` at once, each connection at most [`server::CONNECTION_LIMIT`]); rendering
//! runs on a blocking thread, never on the ingest loop. [`client`] is the one-request client the
//! `status` command uses.

pub mod client;
mod config;
pub mod server;

pub use config::{HttpConfig, DEFAULT_LISTEN, DEFAULT_MAX_CONNECTIONS};
pub use server::{bind, serve, HttpError, Routes, METRICS_CONTENT_TYPE};

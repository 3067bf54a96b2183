//! `[otlp]` of the agent's configuration: metrics and log records to the site's OTLP backend.

use serde::{Deserialize, Serialize};

/// Default of `enabled`: no export.
pub const DEFAULT_ENABLED: bool = false;
/// Default of `endpoint`: a collector on this host (http/protobuf port).
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4318";
/// Default of `protocol`.
pub const DEFAULT_PROTOCOL: OtlpProtocol = OtlpProtocol::HttpProtobuf;
/// Default of `export_interval_ms`.
pub const DEFAULT_EXPORT_INTERVAL_MS: u64 = 10_000;
/// Default of `timeout_ms`.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Default of `max_series`.
pub const DEFAULT_MAX_SERIES: usize = 2000;
/// Default of `max_backlog`.
pub const DEFAULT_MAX_BACKLOG: usize = 10_000;
/// Default of `retry_initial_ms`.
pub const DEFAULT_RETRY_INITIAL_MS: u64 = 1000;
/// Default of `retry_max_ms`.
pub const DEFAULT_RETRY_MAX_MS: u64 = 60_000;

/// Default of `compression`.
pub const DEFAULT_COMPRESSION: OtlpCompression = OtlpCompression::Gzip;

/// Request body compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpCompression {
    /// Uncompressed.
    #[serde(rename = "none")]
    None,
    /// gzip (`Content-Encoding: gzip` over HTTP, `grpc-encoding: gzip` over gRPC).
    #[serde(rename = "gzip")]
    Gzip,
}

/// OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

/// `[otlp]`: metrics and log records to the site's OTLP backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// Export metrics and log records over OTLP.
    pub enabled: bool,
    /// Base endpoint: `http://host:4318` for http/protobuf (the `/v1/metrics` and `/v1/logs`
    /// paths are appended), `http://host:4317` for grpc.
    pub endpoint: String,
    /// Full URL for metrics, overriding `endpoint` (e.g. VictoriaMetrics' `/opentelemetry/v1/metrics`).
    pub metrics_endpoint: String,
    /// Full URL for log records, overriding `endpoint`.
    pub logs_endpoint: String,
    /// `http/protobuf` or `grpc`.
    pub protocol: OtlpProtocol,
    /// Metrics export period (ms).
    pub export_interval_ms: u64,
    /// Per-request timeout (ms).
    pub timeout_ms: u64,
    /// Most distinct attribute sets per metric; further ones are folded into `comm="other"`.
    pub max_series: usize,
    /// Log records (findings, overdue operations) waiting for the backend; oldest dropped and counted beyond.
    pub max_backlog: usize,
    /// First retry delay when the backend is down (ms); doubles up to `retry_max_ms`, each
    /// delay drawn at random from its upper half (jitter).
    pub retry_initial_ms: u64,
    /// Longest retry delay (ms).
    pub retry_max_ms: u64,
    /// Extra request headers, each `name=value` (authentication for hosted backends).
    pub headers: Vec<String>,
    /// `gzip` or `none`.
    pub compression: OtlpCompression,
    /// PEM file of the CA(s) that sign the backend's certificate; empty = the system's roots.
    /// When set, only these CAs are trusted.
    pub ca_file: String,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: DEFAULT_ENABLED,
            endpoint: DEFAULT_ENDPOINT.into(),
            metrics_endpoint: String::new(),
            logs_endpoint: String::new(),
            protocol: DEFAULT_PROTOCOL,
            export_interval_ms: DEFAULT_EXPORT_INTERVAL_MS,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            max_series: DEFAULT_MAX_SERIES,
            max_backlog: DEFAULT_MAX_BACKLOG,
            retry_initial_ms: DEFAULT_RETRY_INITIAL_MS,
            retry_max_ms: DEFAULT_RETRY_MAX_MS,
            headers: Vec::new(),
            compression: DEFAULT_COMPRESSION,
            ca_file: String::new(),
        }
    }
}

//! `[archive]` and `[archive.object_store]` of the agent's configuration.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default of `enabled`.
pub const DEFAULT_ENABLED: bool = true;
/// Default of `dir`.
pub const DEFAULT_DIR: &str = "/var/lib/comminsight/archive";
/// Default of `zstd_level`: zstd's fastest regular level.
pub const DEFAULT_ZSTD_LEVEL: i32 = 1;
/// Default of `parquet`.
pub const DEFAULT_PARQUET: bool = true;
/// Default of `retention_bytes`: 50 GiB.
pub const DEFAULT_RETENTION_BYTES: u64 = 50 << 30;
/// Default of `retention_days`.
pub const DEFAULT_RETENTION_DAYS: u64 = 14;

/// Default of `object_store.enabled`: no upload.
pub const DEFAULT_UPLOAD_ENABLED: bool = false;
/// Default of `object_store.prefix`.
pub const DEFAULT_PREFIX: &str = "comminsight";
/// Default of `object_store.region`.
pub const DEFAULT_REGION: &str = "us-east-1";
/// Default of `object_store.allow_http`.
pub const DEFAULT_ALLOW_HTTP: bool = false;
/// Default of `object_store.retry_initial_ms`.
pub const DEFAULT_RETRY_INITIAL_MS: u64 = 1000;
/// Default of `object_store.retry_max_ms`.
pub const DEFAULT_RETRY_MAX_MS: u64 = 60_000;

/// `[archive]`: compressed raw segments, Parquet, retention and the object-store upload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiveConfig {
    /// Archive sealed segments (raw zstd and Parquet).
    pub enabled: bool,
    /// Archive root: `raw/<job>/<host>/<pid>/seg-*.cis.zst` and `parquet/job=/host=/hour=/`.
    pub dir: PathBuf,
    /// zstd level for raw segments (1 fastest .. 19).
    pub zstd_level: i32,
    /// Also write every sealed segment as a Parquet file.
    pub parquet: bool,
    /// Keep at most this many bytes in the archive; oldest uploaded files go first.
    pub retention_bytes: u64,
    /// Delete archived files older than this (days; 0 = no age limit).
    pub retention_days: u64,
    /// `[archive.object_store]`.
    pub object_store: ObjectStoreConfig,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            enabled: DEFAULT_ENABLED,
            dir: PathBuf::from(DEFAULT_DIR),
            zstd_level: DEFAULT_ZSTD_LEVEL,
            parquet: DEFAULT_PARQUET,
            retention_bytes: DEFAULT_RETENTION_BYTES,
            retention_days: DEFAULT_RETENTION_DAYS,
            object_store: ObjectStoreConfig::default(),
        }
    }
}

/// `[archive.object_store]`: optional upload to an S3-compatible store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// Upload archived files.
    pub enabled: bool,
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket.
    pub prefix: String,
    /// Endpoint URL (empty = AWS for the region).
    pub endpoint: String,
    /// Region of the bucket.
    pub region: String,
    /// Allow plain http endpoints (test stores, on-prem gateways).
    pub allow_http: bool,
    /// Credentials come from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (never from this file).
    /// First retry delay after a failed upload (ms); doubles up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    /// Longest retry delay (ms).
    pub retry_max_ms: u64,
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig {
            enabled: DEFAULT_UPLOAD_ENABLED,
            bucket: String::new(),
            prefix: DEFAULT_PREFIX.into(),
            endpoint: String::new(),
            region: DEFAULT_REGION.into(),
            allow_http: DEFAULT_ALLOW_HTTP,
            retry_initial_ms: DEFAULT_RETRY_INITIAL_MS,
            retry_max_ms: DEFAULT_RETRY_MAX_MS,
        }
    }
}

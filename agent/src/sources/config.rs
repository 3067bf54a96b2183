//! `[sources]` of the agent's configuration: where the plugin's rings and segments are found.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default of `shm_enabled`: follow the live rings.
pub const DEFAULT_SHM_ENABLED: bool = true;
/// Default of `shm_dir` (the plugin's default `COMMINSIGHT_SHM_DIR`).
pub const DEFAULT_SHM_DIR: &str = "/dev/shm/comminsight";
/// Default of `segment_dirs` (the plugin's default `COMMINSIGHT_LOG_DIR`).
pub const DEFAULT_SEGMENT_DIR: &str = "/var/log/comminsight/inspector_logs";
/// Default of `scan_interval_ms`.
pub const DEFAULT_SCAN_INTERVAL_MS: u64 = 1000;
/// Default of `stale_after_s`.
pub const DEFAULT_STALE_AFTER_S: u64 = 120;

/// `[sources]`: where the plugin's rings and segments are found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourcesConfig {
    /// Follow the plugins' live shared-memory rings.
    pub shm_enabled: bool,
    /// Directory of the plugins' rings (the plugin's `COMMINSIGHT_SHM_DIR`).
    pub shm_dir: PathBuf,
    /// Segment roots (the plugins' `COMMINSIGHT_LOG_DIR`), each holding `<job>/<host>/<pid>/seg-*.cis`.
    pub segment_dirs: Vec<PathBuf>,
    /// How often the directories are rescanned for new processes and segments (ms).
    pub scan_interval_ms: u64,
    /// An unsealed segment whose writer is gone and that did not grow for this long is final (s).
    pub stale_after_s: u64,
    /// Only the streams of these hosts (the `<host>` level of the layout); empty = every host.
    /// For a log directory shared by several hosts (NFS): each agent takes its own.
    pub hosts: Vec<String>,
}

impl Default for SourcesConfig {
    fn default() -> Self {
        SourcesConfig {
            shm_enabled: DEFAULT_SHM_ENABLED,
            shm_dir: PathBuf::from(DEFAULT_SHM_DIR),
            segment_dirs: vec![PathBuf::from(DEFAULT_SEGMENT_DIR)],
            scan_interval_ms: DEFAULT_SCAN_INTERVAL_MS,
            stale_after_s: DEFAULT_STALE_AFTER_S,
            hosts: Vec::new(),
        }
    }
}

//! `AgentConfig`: one TOML file (`--config`, else `$COMMINSIGHT_CONFIG`, else
//! `/etc/comminsight/agent.toml`) and its drop-ins (`conf.d/*.toml` beside it, merged in lexical
//! order: [`files`]), every key documented with its default in `agent/config.example.toml`,
//! overridden by `COMMINSIGHT_*` environment variables.
//!
//! Each section belongs to one component, which defines it (its `XxxConfig`, the `Default` with
//! named `DEFAULT_*` constants, and the conversion into the component's runtime settings) and
//! reads only its own section; this module only aggregates them (and keeps `[agent]` and
//! `[log]`, which belong to no component). The dependency goes one way: `config` -> components.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod error;
pub mod example;
pub mod files;
pub mod keys;
mod load;
pub mod validate;

pub use error::{ConfigError, DEFAULT_PATH};
pub use example::example_toml;
pub use load::{check, load_env_only, load_with_warnings, process_env, Loaded};

pub use crate::archive::{ArchiveConfig, ObjectStoreConfig};
pub use crate::clock::ClockConfig;
pub use crate::hang::HangConfig;
pub use crate::host::gpu::GpuConfig;
pub use crate::host::ports::PortsConfig;
pub use crate::http::HttpConfig;
pub use crate::master::MasterConfig;
pub use crate::moe::MoeConfig;
pub use crate::probes::ProbesConfig;
pub use crate::sinks::otlp::{OtlpConfig, OtlpProtocol};
pub use crate::sources::SourcesConfig;
pub use crate::steps::StepsConfig;
pub use crate::straggler::StragglerConfig;

/// The whole agent configuration. `Default` is the documented default of every key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    pub agent: AgentSection,
    pub sources: SourcesConfig,
    pub clock: ClockConfig,
    pub master: MasterConfig,
    pub http: HttpConfig,
    pub archive: ArchiveConfig,
    pub otlp: OtlpConfig,
    pub steps: StepsConfig,
    pub hang: HangConfig,
    pub straggler: StragglerConfig,
    pub probes: ProbesConfig,
    pub ports: PortsConfig,
    pub gpu: GpuConfig,
    pub moe: MoeConfig,
    pub log: LogConfig,
}

/// Default of `[agent] state_dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/comminsight";
/// Default of `[agent] poll_interval_ms`.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 100;
/// Default of `[agent] checkpoint_interval_ms`.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 5000;
/// Default of `[agent] channel_records`.
pub const DEFAULT_CHANNEL_RECORDS: usize = 262_144;

/// `[agent]`: identity, state and pacing of the daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    /// Checkpoints, clock samples and results live here.
    pub state_dir: PathBuf,
    /// This host's name in metrics and archives; empty = the kernel host name.
    pub host_name: String,
    /// How often the sources are polled for new records (ms).
    pub poll_interval_ms: u64,
    /// How often the per-source checkpoint is written (ms).
    pub checkpoint_interval_ms: u64,
    /// Records buffered between the sources and the pipeline before the sources wait.
    pub channel_records: usize,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            host_name: String::new(),
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            checkpoint_interval_ms: DEFAULT_CHECKPOINT_INTERVAL_MS,
            channel_records: DEFAULT_CHANNEL_RECORDS,
        }
    }
}

/// The agent link's part of the configuration: `[master]` and `[agent] state_dir`.
impl<'a> From<&'a AgentConfig> for crate::master::LinkConfig<'a> {
    fn from(c: &'a AgentConfig) -> Self {
        crate::master::LinkConfig {
            master: &c.master,
            state_dir: &c.agent.state_dir,
        }
    }
}

/// Default of `[log] level`.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// Default of `[log] format`.
pub const DEFAULT_LOG_FORMAT: &str = "text";

/// `[log]`: the agent's own log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `error`, `warn`, `info`, `debug`, `trace` or a tracing filter string.
    pub level: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: DEFAULT_LOG_LEVEL.into(),
            format: DEFAULT_LOG_FORMAT.into(),
        }
    }
}

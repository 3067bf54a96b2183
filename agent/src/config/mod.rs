//! `AgentConfig`: one TOML file (`/etc/comminsight/agent.toml`), every key documented with its
//! default in `agent/config.example.toml`, overridden by `COMMINSIGHT_*` environment variables.
//!
//! Each section belongs to one component (sources, clock, master link, archive, OTLP, logging);
//! the component reads only its own section.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub mod example;
pub mod keys;
mod load;
pub mod validate;

pub use example::example_toml;
pub use load::{
    check, load_env_only, load_with_warnings, process_env, ConfigError, Loaded, DEFAULT_PATH,
};

/// The whole agent configuration. `Default` is the documented default of every key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    pub agent: AgentSection,
    pub sources: SourcesConfig,
    pub clock: ClockConfig,
    pub master: MasterConfig,
    pub archive: ArchiveConfig,
    pub otlp: OtlpConfig,
    pub steps: StepsConfig,
    pub hang: HangConfig,
    pub straggler: StragglerConfig,
    pub log: LogConfig,
}

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
            state_dir: PathBuf::from("/var/lib/comminsight"),
            host_name: String::new(),
            poll_interval_ms: 100,
            checkpoint_interval_ms: 5000,
            channel_records: 262_144,
        }
    }
}

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
            shm_enabled: true,
            shm_dir: PathBuf::from("/dev/shm/comminsight"),
            segment_dirs: vec![PathBuf::from("/var/log/comminsight/inspector_logs")],
            scan_interval_ms: 1000,
            stale_after_s: 120,
            hosts: Vec::new(),
        }
    }
}

/// `[clock]`: per-process calibration and the host offset against the job master.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockConfig {
    /// How often this host measures its offset against the master (s).
    pub sync_interval_s: u64,
    /// Round trips per measurement; the one with the smallest round trip wins.
    pub samples: u32,
    /// Round trips slower than this are discarded (ms).
    pub max_rtt_ms: u64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            sync_interval_s: 60,
            samples: 8,
            max_rtt_ms: 50,
        }
    }
}

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
            listen: "127.0.0.1:7117".into(),
            address: String::new(),
            token_file: PathBuf::new(),
            max_message_mb: 16,
            outbox_max_mb: 256,
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
            tls_ca: PathBuf::new(),
            tls_domain: String::new(),
        }
    }
}

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
            enabled: true,
            dir: PathBuf::from("/var/lib/comminsight/archive"),
            zstd_level: 1,
            parquet: true,
            retention_bytes: 50 << 30,
            retention_days: 14,
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
            enabled: false,
            bucket: String::new(),
            prefix: "comminsight".into(),
            endpoint: String::new(),
            region: "us-east-1".into(),
            allow_http: false,
            retry_initial_ms: 1000,
            retry_max_ms: 60_000,
        }
    }
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
    /// First retry delay when the backend is down (ms); doubles up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    /// Longest retry delay (ms).
    pub retry_max_ms: u64,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: false,
            endpoint: "http://127.0.0.1:4318".into(),
            metrics_endpoint: String::new(),
            logs_endpoint: String::new(),
            protocol: OtlpProtocol::HttpProtobuf,
            export_interval_ms: 10_000,
            timeout_ms: 10_000,
            max_series: 2000,
            max_backlog: 10_000,
            retry_initial_ms: 1000,
            retry_max_ms: 60_000,
        }
    }
}

/// `[steps]`: training steps rebuilt online from each GPU's operations (templates).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepsConfig {
    /// Rebuild steps online (`<state_dir>/results/steps/`).
    pub enabled: bool,
    /// Directory of template files (`*.toml`); empty = the built-in templates.
    pub templates_dir: PathBuf,
    /// Operations may arrive this late (start time) without changing the result (ms).
    pub safe_window_ms: u64,
    /// Operations of a job seen before its template is chosen (roles settle first).
    pub settle_ops: u64,
    /// Operations held per job while its template is not chosen; the choice is forced here.
    pub max_held_ops: u64,
    /// No step for this long closes the rank's step session (circuit breaker; minutes).
    pub breaker_minutes: u64,
    /// A stream without a ring whose segments are all read has ended after this long without a
    /// new one (its step session drains; seconds). Streams with a ring end with it.
    pub stream_end_s: u64,
}

impl Default for StepsConfig {
    fn default() -> Self {
        StepsConfig {
            enabled: true,
            templates_dir: PathBuf::new(),
            safe_window_ms: 2000,
            settle_ops: 20_000,
            max_held_ops: 500_000,
            breaker_minutes: 30,
            stream_end_s: 600,
        }
    }
}

impl StepsConfig {
    /// The engine's settings.
    pub fn settings(&self) -> crate::steps::engine::StepSettings {
        crate::steps::engine::StepSettings {
            safe_window_us: self.safe_window_ms.saturating_mul(1000),
            settle_ops: self.settle_ops,
            max_held_ops: self.max_held_ops,
            breaker_us: self.breaker_minutes.saturating_mul(60_000_000),
        }
    }

    /// The templates: `templates_dir`, or the built-in ones.
    pub fn templates(
        &self,
    ) -> Result<crate::steps::template::TemplateSet, crate::steps::template::TemplateError> {
        if self.templates_dir.as_os_str().is_empty() {
            Ok(crate::steps::template::TemplateSet::builtin())
        } else {
            crate::steps::template::TemplateSet::load_dir(&self.templates_dir)
        }
    }
}

/// `[hang]`: hang and failure localisation (overdue operations -> wait-for graph -> source
/// ranks), stacks of the local ranks, evidence under `<state_dir>/results/hang/`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HangConfig {
    /// Watch overdue operations and name the ranks that stopped the job.
    pub enabled: bool,
    /// Never call a wait shorter than this a hang (s); 0 = the plugin's overdue threshold
    /// (`COMMINSIGHT_OVERDUE_MS`) and the learned gaps decide. Set it above the longest pause a
    /// job makes before its first checkpoint or evaluation has been seen.
    pub min_wait_s: u64,
    /// A wait must also exceed this many times the job's longest normal quiet interval seen so
    /// far (longest finished op, longest gap between ops: checkpoints, evaluation); 0 = no
    /// learning.
    pub gap_factor: u64,
    /// Capture Python stacks (py-spy; needs CAP_SYS_PTRACE) of a hung job's local ranks, once per
    /// hang, with one short locked dump each.
    pub stacks: bool,
    /// Native frames too (libunwind).
    pub native_stacks: bool,
}

impl Default for HangConfig {
    fn default() -> Self {
        HangConfig {
            enabled: true,
            min_wait_s: 0,
            gap_factor: 2,
            stacks: true,
            native_stacks: true,
        }
    }
}

impl HangConfig {
    /// The analysis settings.
    pub fn settings(&self) -> crate::hang::HangSettings {
        crate::hang::HangSettings {
            min_wait_us: self.min_wait_s.saturating_mul(1_000_000),
            gap_factor: self.gap_factor as f64,
        }
    }
}

/// `[straggler]`: the straggler index of each step (DESIGN.md §5), computed live on the job
/// master (or on this agent when it has none) from every rank's step arrivals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StragglerConfig {
    /// Compute the index live; OTLP gauge `comminsight.straggler.index` per rank.
    pub enabled: bool,
    /// Report a rank whose index is above this in `min_steps_over` of the last `window_steps`
    /// steps (percent of the step time its peers wait for it).
    pub threshold: f64,
    /// The n of "m of n steps".
    pub window_steps: u64,
    /// The m of "m of n steps".
    pub min_steps_over: u64,
    /// `results/straggler/<job>.json` covers the last this many analysed steps.
    pub report_steps: u64,
    /// A step is analysed when every rank reported a later one, or this long after its first
    /// report (s).
    pub settle_s: u64,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        StragglerConfig {
            enabled: true,
            threshold: crate::straggler::DEFAULT_THRESHOLD,
            window_steps: 5,
            min_steps_over: 3,
            report_steps: 20,
            settle_s: 30,
        }
    }
}

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
            level: "info".into(),
            format: "text".into(),
        }
    }
}

//! The key table: every configuration key once, with its type and its one-line documentation.
//!
//! Everything else is derived from it: the environment variable names (`COMMINSIGHT_<SECTION>_<KEY>`),
//! the type checks of file and environment values, "did you mean" hints and the generated
//! `agent/config.example.toml`. A test checks that the table and `AgentConfig::default()` hold the
//! same keys.

/// The TOML type of a key, and what its environment variable must hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueKind {
    /// `true` / `false` (environment: also `1` / `0`).
    Bool,
    /// An integer in `min..=max`.
    Int {
        /// Smallest value the field's type holds.
        min: i64,
        /// Largest value the field's type holds.
        max: i64,
    },
    /// A number in `min..=max` (TOML: an integer or a float).
    Float {
        /// Smallest value allowed.
        min: f64,
        /// Largest value allowed.
        max: f64,
    },
    /// Any string.
    Str,
    /// A file system path.
    Path,
    /// A list of paths (environment: comma-separated).
    PathList,
    /// A list of strings (environment: comma-separated).
    StrList,
    /// One of these strings.
    OneOf(&'static [&'static str]),
}

const U64: ValueKind = ValueKind::Int {
    min: 0,
    max: i64::MAX,
};
const U32: ValueKind = ValueKind::Int {
    min: 0,
    max: u32::MAX as i64,
};
const I32: ValueKind = ValueKind::Int {
    min: i32::MIN as i64,
    max: i32::MAX as i64,
};
/// A non-negative factor: every integer [`U64`] holds, and the fractions between them.
const FACTOR: ValueKind = ValueKind::Float {
    min: 0.0,
    max: i64::MAX as f64,
};

/// The OTLP protocol names (`otlp.protocol`).
pub const OTLP_PROTOCOLS: &[&str] = &["http/protobuf", "grpc"];
/// The OTLP compressions (`otlp.compression`).
pub const OTLP_COMPRESSIONS: &[&str] = &["gzip", "none"];
/// The agent log formats (`log.format`).
pub const LOG_FORMATS: &[&str] = &["text", "json"];

/// One configuration key.
#[derive(Clone, Copy, Debug)]
pub struct KeyDoc {
    /// Dotted path: `section.key` or `archive.object_store.key`.
    pub path: &'static str,
    /// Its type.
    pub kind: ValueKind,
    /// One line of documentation (units, meaning of special values).
    pub doc: &'static str,
}

/// The prefix of every agent (and plugin) environment variable.
pub const ENV_PREFIX: &str = "COMMINSIGHT_";

impl KeyDoc {
    /// `COMMINSIGHT_OTLP_ENDPOINT` for `otlp.endpoint`.
    pub fn env_name(&self) -> String {
        format!("{ENV_PREFIX}{}", self.path.replace('.', "_").to_uppercase())
    }

    /// The table holding the key (`archive.object_store` for `archive.object_store.bucket`).
    pub fn table(&self) -> &'static str {
        self.path.rsplit_once('.').map_or("", |(t, _)| t)
    }

    /// The key's own name (`bucket` for `archive.object_store.bucket`).
    pub fn name(&self) -> &'static str {
        self.path.rsplit_once('.').map_or(self.path, |(_, n)| n)
    }

    /// The unit named by the key's suffix, for messages: `_ms` -> milliseconds, `_s` -> seconds, ...
    pub fn unit(&self) -> Option<&'static str> {
        let n = self.name();
        [
            ("_ms", "milliseconds"),
            ("_s", "seconds"),
            ("_days", "days"),
            ("_bytes", "bytes"),
        ]
        .into_iter()
        .find(|(suffix, _)| n.ends_with(suffix))
        .map(|(_, unit)| unit)
    }

    /// What a value of this key must look like: "an integer (milliseconds)", "`true` or `false`", ...
    pub fn expected(&self) -> String {
        match self.kind {
            ValueKind::Bool => "expected `true` or `false`".into(),
            ValueKind::Int { min, max } => {
                let unit = self.unit().map(|u| format!(" ({u})")).unwrap_or_default();
                if min == 0 {
                    format!("expected a non-negative integer{unit} up to {max}")
                } else {
                    format!("expected an integer{unit} in {min}..={max}")
                }
            }
            ValueKind::Float { min, max } => format!("expected a number in {min}..={max}"),
            ValueKind::Str => "expected a string".into(),
            ValueKind::Path => "expected a path".into(),
            ValueKind::PathList => "expected a list of paths (environment: comma-separated)".into(),
            ValueKind::StrList => {
                "expected a list of strings (environment: comma-separated)".into()
            }
            ValueKind::OneOf(names) => format!("expected one of {}", quote_list(names)),
        }
    }
}

/// `"a", "b"` for messages.
pub fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

const fn key(path: &'static str, kind: ValueKind, doc: &'static str) -> KeyDoc {
    KeyDoc { path, kind, doc }
}

/// Every key, in file order (sections in `AgentConfig` order, keys in struct order).
pub const KEYS: &[KeyDoc] = &[
    key("agent.state_dir", ValueKind::Path, "Checkpoints, clock samples and results live here."),
    key("agent.host_name", ValueKind::Str, "This host's name in metrics and archives; empty = the kernel host name."),
    key("agent.poll_interval_ms", U64, "How often the sources are polled for new records (milliseconds, >= 1)."),
    key("agent.checkpoint_interval_ms", U64, "How often the per-source checkpoint is written (milliseconds, >= 1)."),
    key("agent.channel_records", U64, "Records buffered between the sources and the pipeline before the sources wait (>= 1)."),
    key("sources.shm_enabled", ValueKind::Bool, "Follow the plugins' live shared-memory rings."),
    key("sources.shm_dir", ValueKind::Path, "Directory of the plugins' rings (the plugin's COMMINSIGHT_SHM_DIR)."),
    key("sources.segment_dirs", ValueKind::PathList, "Segment roots (the plugins' COMMINSIGHT_LOG_DIR), each holding <job>/<host>/<pid>/seg-*.cis."),
    key("sources.scan_interval_ms", U64, "How often the directories are rescanned for new processes and segments (milliseconds, >= 1)."),
    key("sources.stale_after_s", U64, "An unsealed segment whose writer is gone and that did not grow for this long is final (seconds, >= 1)."),
    key("sources.hosts", ValueKind::StrList, "Only the streams of these hosts (the <host> level of <job>/<host>/<pid>); empty = every host. For a log directory shared by several hosts (environment: comma-separated)."),
    key("clock.sync_interval_s", U64, "How often this host measures its offset against the master (seconds, >= 1)."),
    key("clock.samples", U32, "Round trips per measurement; the one with the smallest round trip wins (1..=1000)."),
    key("clock.max_rtt_ms", U64, "Round trips slower than this are discarded (milliseconds, >= 1)."),
    key("master.listen", ValueKind::Str, "Serve the agent link on this host:port (empty = do not serve); a non-loopback address needs token_file."),
    key("master.address", ValueKind::Str, "The master's host:port to sync with; empty = this host is the time reference."),
    key("master.token_file", ValueKind::Path, "File holding the shared token both ends must present; empty = no token (loopback only)."),
    key("master.max_message_mb", U64, "Largest message on the link (MiB, 1..=1024)."),
    key("master.outbox_max_mb", U64, "Largest outbox to the master (MiB, >= 1); beyond it the oldest steps, then hang messages are dropped (counted, logged)."),
    key("master.tls_cert", ValueKind::Path, "The master's TLS certificate chain (PEM); empty = plaintext link. Needs tls_key."),
    key("master.tls_key", ValueKind::Path, "The master's TLS private key (PEM)."),
    key("master.tls_ca", ValueKind::Path, "CA certificate(s) (PEM) agents verify the master with; empty = plaintext link."),
    key("master.tls_domain", ValueKind::Str, "Name the master's certificate must carry; empty = the host of master.address."),
    key("http.listen", ValueKind::Str, "Serve /healthz, /readyz, /metrics (Prometheus) and /status on this host:port (empty = no endpoint; port 0 = any free port). A non-loopback address exposes the job's metrics to the network."),
    key("http.max_connections", U64, "Connections the endpoint serves at once; more are closed unanswered (1..=1024)."),
    key("archive.enabled", ValueKind::Bool, "Archive sealed segments (raw zstd and Parquet)."),
    key("archive.dir", ValueKind::Path, "Archive root: raw/<job>/<host>/<pid>/seg-*.cis.zst and parquet/job=/host=/hour=/."),
    key("archive.zstd_level", I32, "zstd level for raw segments: -7..=-1 (zstd's fast levels, least CPU), 1 ..= 19 (smallest); ultra levels are not offered."),
    key("archive.parquet", ValueKind::Bool, "Also write every sealed segment as a Parquet file."),
    key("archive.retention_bytes", U64, "Keep at most this many bytes in the archive; oldest uploaded files go first (>= 1)."),
    key("archive.retention_days", U64, "Delete archived files older than this (days; 0 = no age limit)."),
    key("archive.object_store.enabled", ValueKind::Bool, "Upload archived files to an S3-compatible store (credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."),
    key("archive.object_store.bucket", ValueKind::Str, "Bucket name (required when enabled)."),
    key("archive.object_store.prefix", ValueKind::Str, "Key prefix inside the bucket."),
    key("archive.object_store.endpoint", ValueKind::Str, "Endpoint URL, http:// or https:// (empty = AWS for the region)."),
    key("archive.object_store.region", ValueKind::Str, "Region of the bucket."),
    key("archive.object_store.allow_http", ValueKind::Bool, "Allow plain http endpoints (test stores, on-prem gateways)."),
    key("archive.object_store.retry_initial_ms", U64, "First retry delay after a failed upload (milliseconds, >= 1); doubles up to retry_max_ms."),
    key("archive.object_store.retry_max_ms", U64, "Longest retry delay (milliseconds, >= retry_initial_ms)."),
    key("otlp.enabled", ValueKind::Bool, "Export metrics and log records over OTLP."),
    key("otlp.endpoint", ValueKind::Str, "Base URL: http://host:4318 for http/protobuf (/v1/metrics and /v1/logs appended), http://host:4317 for grpc."),
    key("otlp.metrics_endpoint", ValueKind::Str, "Full URL for metrics, overriding endpoint (e.g. VictoriaMetrics' /opentelemetry/v1/metrics); empty = derived; http/protobuf only (grpc uses endpoint)."),
    key("otlp.logs_endpoint", ValueKind::Str, "Full URL for log records, overriding endpoint; empty = derived; http/protobuf only (grpc uses endpoint)."),
    key("otlp.protocol", ValueKind::OneOf(OTLP_PROTOCOLS), "Transport: \"http/protobuf\" or \"grpc\"."),
    key("otlp.export_interval_ms", U64, "Metrics export period (milliseconds, >= 1)."),
    key("otlp.timeout_ms", U64, "Per-request timeout (milliseconds, >= 1)."),
    key("otlp.max_series", U64, "Most distinct attribute sets per metric; further ones are folded into comm=\"other\" (>= 1)."),
    key("otlp.max_backlog", U64, "Log records waiting for the backend; the oldest are dropped and counted beyond (>= 1)."),
    key("otlp.retry_initial_ms", U64, "First retry delay when the backend is down (milliseconds, >= 1); doubles up to retry_max_ms."),
    key("otlp.retry_max_ms", U64, "Longest retry delay (milliseconds, >= retry_initial_ms)."),
    key("otlp.headers", ValueKind::StrList, "Extra request headers, each \"name=value\" (e.g. \"authorization=Bearer ...\"); environment: comma-separated."),
    key("otlp.compression", ValueKind::OneOf(OTLP_COMPRESSIONS), "Request compression: \"gzip\" or \"none\"."),
    key("otlp.ca_file", ValueKind::Path, "PEM file of the CA(s) that sign the backend's TLS certificate (https / grpc over TLS); empty = the system's roots. When set, only these CAs are trusted."),
    key("steps.enabled", ValueKind::Bool, "Rebuild training steps online from each GPU's operations (<state_dir>/results/steps/)."),
    key("steps.templates_dir", ValueKind::Path, "Directory of step template files (*.toml, format in templates/README.md); empty = the built-in templates."),
    key("steps.safe_window_ms", U64, "Operations may arrive this late (by start time) without changing the steps (milliseconds, >= 1)."),
    key("steps.settle_ops", U64, "Operations of a job seen before its template is chosen, so its communicator roles settle first (>= 1)."),
    key("steps.max_held_ops", U64, "Operations held per job until its template is chosen; the choice is forced at this many (>= 1)."),
    key("steps.breaker_minutes", U64, "No step for this long closes a rank's step session; raw records are kept (minutes, >= 1)."),
    key("steps.stream_end_s", U64, "A process seen only through segments (no ring) has ended after this long without a new segment; its step session drains (seconds, >= 1; longer than the plugin's segment age)."),
    key("hang.enabled", ValueKind::Bool, "Watch overdue operations and name the ranks that stopped the job (<state_dir>/results/hang/)."),
    key("hang.min_wait_s", U64, "Never call a wait shorter than this a hang (seconds); 0 = the plugin's overdue threshold and the learned gaps decide."),
    key("hang.gap_factor", FACTOR, "A wait must also exceed this many times the job's longest normal quiet interval seen so far (checkpoints, evaluation); 0 = no learning."),
    key("hang.stacks", ValueKind::Bool, "Capture Python stacks of a hung job's local ranks (py-spy, one short locked dump each; needs CAP_SYS_PTRACE)."),
    key("hang.native_stacks", ValueKind::Bool, "Native frames too when capturing stacks."),
    key("straggler.enabled", ValueKind::Bool, "Compute the straggler index of each step (on the job master, or here without one): OTLP gauge comminsight.straggler.index per rank, results/straggler/."),
    key("straggler.threshold", ValueKind::Float { min: 0.0, max: 100.0 }, "Seed straggler index (percent of the step its peers wait for it) above which a step counts in steps_over_threshold and a rank gets a class; shown beside the root index."),
    key("straggler.root_min_delay", ValueKind::Float { min: 0.0, max: 100.0 }, "A rank counts over root_threshold only when its own excess self time over its role peers (root_delay, percent of the step) is above this too: healthy jitter stays below it."),
    key("straggler.root_threshold", ValueKind::Float { min: 0.0, max: 100.0 }, "A rank whose root-cause index (the waiting its own slowness started, percent of the step) is above this in min_steps_over of the last window_steps steps is reported (OTLP log record, agent log); straggler exits 1."),
    key("straggler.window_steps", U64, "The n of \"m of n steps\" (>= 1)."),
    key("straggler.min_steps_over", U64, "The m of \"m of n steps\" (1..=window_steps)."),
    key("straggler.report_steps", U64, "results/straggler/<job>.json covers the last this many analysed steps (the index mean, causes, victims, classes over them; >= 1)."),
    key("straggler.settle_s", U64, "A step is analysed when every rank of the job has reported a later step, or this long after its first report (seconds, >= 1)."),
    key("straggler.warmup_steps", U64, "The first this many steps of a job (communicator set-up, staggered start) are left out of the index, live and in the offline straggler and report commands (0 = none)."),
    key("probes.enabled", ValueKind::Bool, "Load the eBPF host probes for the ranks' processes (needs root, or CAP_BPF + CAP_PERFMON + CAP_DAC_READ_SEARCH, and an unlimited RLIMIT_MEMLOCK on kernels before 5.11); without them thread states come from /proc schedstat."),
    key("probes.libibverbs", ValueKind::Path, "The libibverbs.so.1 the ranks load, for the verbs uprobes; empty = found in the usual library directories."),
    key("probes.verbs", ValueKind::Bool, "ibverbs control-path uprobes: device open, PD, MR, CQ, QP create / modify / destroy, async events (the QP map)."),
    key("probes.sched", ValueKind::Bool, "Scheduler tracepoints: each rank thread's on-CPU, runnable and blocked time."),
    key("probes.tcp", ValueKind::Bool, "TCP tracepoints: retransmits and state changes of the ranks' sockets, by peer."),
    key("probes.mount_tracefs", ValueKind::Bool, "Mount tracefs at /sys/kernel/tracing when it is not mounted (the tracepoints need it)."),
    key("probes.interval_ms", U64, "How often the ranks' thread states, QP events and TCP counters are written into the host stream (milliseconds, >= 100)."),
    key("ports.enabled", ValueKind::Bool, "Sample NIC / RDMA port counters from sysfs (InfiniBand / RoCE ports/*/counters and hw_counters, Ethernet statistics)."),
    key("ports.sysfs_root", ValueKind::Path, "Root of the sysfs tree read for the ports (class/infiniband, class/net)."),
    key("ports.interval_ms", U64, "How often the port counters are sampled and written (milliseconds, >= 100)."),
    key("ports.devices", ValueKind::StrList, "Devices the jobs' traffic uses (mlx5_0, eth0): only they are sampled, and where no queue pair names a rank's port their errors count for every rank of the host. Empty = every device."),
    key("gpu.enabled", ValueKind::Bool, "Sample the GPUs the local ranks run on (NVML; a host without NVIDIA driver logs one line and goes on)."),
    key("gpu.library", ValueKind::Path, "The NVML library to load. Empty: libnvidia-ml.so.1 as the dynamic loader finds it."),
    key("gpu.interval_ms", U64, "How often the GPUs are sampled (milliseconds, >= 10)."),
    key("gpu.fast_interval_ms", U64, "How often while an operation of a job on this host has been open for 5 s: a hang may be under way (milliseconds, >= 10)."),
    key("gpu.dcgm_url", ValueKind::Str, "A dcgm-exporter /metrics URL to scrape for DCGM's fields (profiling fields such as DCGM_FI_PROF_SM_ACTIVE, NVLink bytes, XID), bound to ranks by its pci_bus_id / UUID labels (e.g. \"http://127.0.0.1:9400/metrics\"). Empty = no DCGM source."),
    key("gpu.dcgm_interval_ms", U64, "How often dcgm-exporter is scraped (milliseconds, >= 100); it refreshes its values every -c ms (30000 by default)."),
    key("gpu.dcgm_timeout_ms", U64, "Time limit of one scrape, connection included (milliseconds, >= 10)."),
    key("moe.enabled", ValueKind::Bool, "Analyse the MoE expert-parallel wait records (DeepEP / Ascend MC2 counters the ranks' producers write) with DeepXTrace's detector."),
    key("moe.threshold_col", FACTOR, "A peer everyone waited on more than this many times the mean is a slow sender (DeepXTrace's DEEPEP_DIAGNOSE_THRESHOLD_COL)."),
    key("moe.threshold_row", FACTOR, "A rank that waited on everyone more than this many times the mean is a slow receiver (DEEPEP_DIAGNOSE_THRESHOLD_ROW)."),
    key("moe.threshold_point", FACTOR, "A single waiter/peer cell above this many times the mean is a slow path (DEEPEP_DIAGNOSE_THRESHOLD_POINT)."),
    key("moe.exclude_zeros", ValueKind::OneOf(&crate::moe::EXCLUDE_ZEROS), "The point baseline leaves zero cells out: auto (only MC2's hierarchical layout, whose structural zeros would make false points), on, off (DeepXTrace's default)."),
    key("moe.assemble_timeout_s", U64, "How long a window waits for every EP rank's row; then it is an incomplete window naming the missing ranks (seconds, >= 1)."),
    key("moe.aggregate_windows", U64, "Windows summed before detection (1..=100; DeepXTrace: 1)."),
    key("moe.min_excess_ms", FACTOR, "Not in DeepXTrace (E1): a finding needs at least this excess per step over its baseline (ms; DeepEP cycles counted at 2 GHz); 0 = off."),
    key("moe.persistence_m", U64, "Not in DeepXTrace (E2): a finding is reported only when it recurs in persistence_m of the last persistence_n windows; 0 = off."),
    key("moe.persistence_n", U64, "The window count of persistence_m (1..=100)."),
    key("moe.path_reclassify", ValueKind::Bool, "Not in DeepXTrace (E3): a flagged waiter row and peer column that meet in one cell holding half of both are one slow path."),
    key("moe.robust_baseline", ValueKind::Bool, "Not in DeepXTrace (E4): rows and columns against the median of their means (a third or more of the ranks slow no longer hides them)."),
    key("moe.topology_mask", ValueKind::Bool, "Not in DeepXTrace (E5): for MC2's hierarchical layout, means over the cells the layout can fill only."),
    key("log.level", ValueKind::Str, "error, warn, info, debug, trace or a tracing filter (e.g. \"info,comminsight_agent::sources=debug\")."),
    key("log.format", ValueKind::OneOf(LOG_FORMATS), "Agent log format: \"text\" or \"json\"."),
];

/// The key with this dotted path.
pub fn find(path: &str) -> Option<&'static KeyDoc> {
    KEYS.iter().find(|k| k.path == path)
}

/// True when `path` is a table (`agent`, `archive.object_store`) holding keys.
pub fn is_table(path: &str) -> bool {
    KEYS.iter().any(|k| {
        k.path.len() > path.len()
            && k.path.starts_with(path)
            && k.path.as_bytes()[path.len()] == b'.'
    })
}

/// Environment variables the NCCL plugin (docs/contracts.md) and the test tools read. They share
/// the `COMMINSIGHT_` prefix and are not agent keys: the agent ignores them without a warning.
pub const FOREIGN_VARS: &[&str] = &[
    "COMMINSIGHT_DISABLE",
    "COMMINSIGHT_JOB_ID",
    "COMMINSIGHT_HOSTNAME",
    "COMMINSIGHT_LOG_DIR",
    "COMMINSIGHT_SHM_DIR",
    "COMMINSIGHT_RING_BYTES",
    "COMMINSIGHT_OVERDUE_MS",
    "COMMINSIGHT_EVENT_MASK",
    "COMMINSIGHT_INSPECTOR_COMPAT",
    "COMMINSIGHT_SEGMENT_BYTES",
    "COMMINSIGHT_SEGMENT_SECS",
    "COMMINSIGHT_RETENTION_BYTES",
    "COMMINSIGHT_FLUSH_MS",
    "COMMINSIGHT_MAX_INFLIGHT",
    "COMMINSIGHT_LIB_DIR",
    "COMMINSIGHT_BIN_DIR",
    "COMMINSIGHT_TEST_TOOLS",
    "COMMINSIGHT_BLESS",
    "COMMINSIGHT_BENCH_PLUGIN",
    "COMMINSIGHT_KEEP_TEST_OUTPUT",
    "COMMINSIGHT_PYTHON",
    "COMMINSIGHT_UPDATE_SNAPSHOTS",
    // Build information agent/build.rs passes to the compiler (cargo sets them for tests too).
    "COMMINSIGHT_GIT_COMMIT",
    "COMMINSIGHT_BUILD_DATE",
    // The BPF object `cargo xtask build` embeds, and its switch to build without it.
    "COMMINSIGHT_BPF_OBJECT",
    "COMMINSIGHT_NO_EBPF",
];

/// Prefixes of foreign variable families (the CPU test bed's stand-in NCCL).
pub const FOREIGN_PREFIXES: &[&str] = &["COMMINSIGHT_TESTBED_"];

/// True for a `COMMINSIGHT_*` variable that is not the agent's (plugin, test bed, test tools).
pub fn is_foreign_var(name: &str) -> bool {
    FOREIGN_VARS.contains(&name) || FOREIGN_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Edit distance with adjacent transpositions counted as one edit (small inputs only).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The closest of `candidates` to `wrong`, if it is close enough to be a typo.
pub fn closest<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (wrong.len() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .map(|c| (distance(&wrong.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Every dotted key and table path, for "did you mean" hints on file keys.
pub fn all_paths() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = KEYS.iter().map(|k| k.path).collect();
    for k in KEYS {
        let mut t = k.table();
        while !t.is_empty() {
            if !v.contains(&t) {
                v.push(t);
            }
            t = t.rsplit_once('.').map_or("", |(p, _)| p);
        }
    }
    v
}

//! The command line: `Cli`, the subcommands, and the exit-code mapping. Each subcommand is one
//! library call plus rendering.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod config;
mod doctor;
mod dump;
mod encode;
mod generate;
mod gpus;
mod hang;
mod import;
mod moe;
pub mod offline;
pub mod pipe;
mod probe;
mod replay;
mod report;
mod roles;
mod run;
mod status;
mod steps;
mod straggler;
mod trace;

/// CommInsight: communication-centric observability and diagnosis for GPU/NPU training jobs.
#[derive(Debug, Parser)]
#[command(
    name = "comminsight-agent",
    // Build information from agent/build.rs: `0.1.0 (commit abc1234+dirty, built 2026-...Z)`.
    version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (commit ",
        env!("COMMINSIGHT_GIT_COMMIT"),
        ", built ",
        env!("COMMINSIGHT_BUILD_DATE"),
        ")"
    ),
    about,
    after_help = "Exit codes: 0 ok (also when standard output was closed early, e.g. `| head`); \
1 a finding (hang: a verdict; straggler: a rank above the threshold; moe: a slow EP rank or a \
window missing a rank); 2 a usage or input error \
(a bad option, a missing or unreadable input, no CommInsight record at all in the input, a bad \
configuration). Offline commands that skipped input end with one `skipped ...` line on stderr."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host daemon: follow the plugins' rings and segments, archive, export OTLP.
    Run(RunArgs),
    /// The running daemon's state in one screen: streams, lag, drops, sinks, last verdicts.
    Status(status::StatusArgs),
    /// Re-run the pipeline offline over segments (same code as the daemon, same results).
    Replay(ReplayArgs),
    /// Check this host: kernel BTF, capabilities, /dev/shm, plugin, NCCL, NVML, endpoints.
    Doctor(DoctorArgs),
    /// Attach the eBPF host probes to running processes: ibverbs calls, QPs, thread states, TCP.
    Probe(probe::ProbeArgs),
    /// The GPUs as the agent reads them through NVML: devices, NVLinks, sampled values, metrics off.
    Gpus(gpus::GpusArgs),
    /// Print the documented example configuration, or check a configuration file.
    Config(ConfigArgs),
    /// Which communicator is DP, TP, PP, EP, CP or the world, and the parallel grid.
    Roles(RolesArgs),
    /// Training steps rebuilt from the communication records, per rank, with templates.
    Steps(StepsArgs),
    /// Who stopped the job: source ranks, wait-for chains and evidence of hangs and failures.
    Hang(HangArgs),
    /// Who makes the others wait: the straggler index per rank and step, causes and victims.
    Straggler(straggler::StragglerArgs),
    /// MoE expert-parallel slow ranks: DeepXTrace's wait matrices of the DeepEP / Ascend MC2 counters.
    Moe(moe::MoeArgs),
    /// A Perfetto timeline (step -> phase -> op slices, flows across ranks) of steps or a time window.
    Trace(trace::TraceArgs),
    /// One self-contained HTML report per job: summary, step durations, straggler heatmap, hangs, traces.
    Report(report::ReportArgs),
    /// Other tools' evidence as CommInsight records: Flight Recorder dumps, Kineto traces, NCCL Inspector logs.
    Import(import::ImportArgs),
    /// Print the records of a segment file or of every segment under a directory.
    Dump(DumpArgs),
    /// Turn JSON lines (as printed by `dump --json`) back into a binary segment file.
    Encode(EncodeArgs),
    /// Man pages and shell completions from this CLI (hidden; `cargo xtask dist` packages them).
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// A segment file (seg-*.cis), a process directory, or any directory above segments
    /// (e.g. a job's inspector_logs or a test-bed output directory).
    pub path: PathBuf,
    /// One JSON object per line (field names as in DESIGN.md §4).
    #[arg(long)]
    pub json: bool,
    /// Print a per-process / per-communicator summary instead of the records.
    #[arg(long)]
    pub summary: bool,
    /// Only these kinds (comma-separated: coll,p2p,overdue,comm_init,...).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct EncodeArgs {
    /// JSON-lines input ("-" for standard input).
    pub input: PathBuf,
    /// Binary output file.
    #[arg(long)]
    pub out: PathBuf,
    /// Print what was written as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The documented default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/comminsight/agent.toml";

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Configuration file (TOML; every key documented in agent/config.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log as JSON lines (same as `[log] format = "json"`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Segments: a segment root, a test-bed output directory, a job directory or an agent archive.
    pub dir: PathBuf,
    /// Where the results are written (metrics.json, roles.json, streams.json, steps/ as the
    /// daemon's results/steps/).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Configuration file (for the same settings as the daemon).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RolesArgs {
    /// Segments: a segment root, a test-bed output directory, a job directory or an agent archive.
    pub dir: PathBuf,
    /// Only this job (default: every job found).
    #[arg(long)]
    pub job: Option<String>,
    #[command(flatten)]
    pub config: offline::ConfigArg,
    /// JSON: one job's `{"job", "world", "comms": [...], "grid", "grid_confidence"}`, or
    /// `{"jobs": [...]}` when there are several.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct StepsArgs {
    /// Segments: a segment root, a test-bed output directory, a job directory or an agent archive.
    pub dir: PathBuf,
    /// Only these ranks (e.g. 0,3,8-11).
    #[arg(long)]
    pub ranks: Option<String>,
    /// Only these steps (a..b, both included, or one step).
    #[arg(long)]
    pub steps: Option<String>,
    /// Step templates from this directory (every *.toml) instead of the built-in ones.
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
    /// Align step numbers across ranks by the anchors: `preview` shows it, `apply` saves it with
    /// the job (DIR/.comminsight/steps-calibration.json; later reads use it), `clear` removes it.
    /// Without this option the saved calibration is used when there is one, else raw numbers.
    #[arg(long, value_name = "MODE", value_parser = ["preview", "apply", "clear"])]
    pub calibrate: Option<String>,
    /// Only this job (default: every job found).
    #[arg(long)]
    pub job: Option<String>,
    #[command(flatten)]
    pub config: offline::ConfigArg,
    /// JSON: one job's `{"job", "template", "features", "steps": [...], "open_ops"}`, or
    /// `{"jobs": [...]}` when there are several.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct HangArgs {
    /// Segments (a segment root, a test-bed output directory, a job directory or an agent
    /// archive) and/or archived hang evidence (`*.snapshot.json`, re-analysed with the current
    /// rules).
    pub dir: PathBuf,
    /// Only this job (default: every job found).
    #[arg(long)]
    pub job: Option<String>,
    /// Never call a wait shorter than this a hang (seconds; default: `[hang] min_wait_s` of the
    /// configuration, 0: the plugin's overdue threshold and the job's learned gaps decide).
    #[arg(long, value_name = "S")]
    pub min_wait_s: Option<f64>,
    /// A wait must exceed this many times the job's longest normal quiet interval (default:
    /// `[hang] gap_factor` of the configuration, 2).
    #[arg(long, value_name = "F")]
    pub gap_factor: Option<f64>,
    #[command(flatten)]
    pub config: offline::ConfigArg,
    /// JSON: `{"verdicts": [...], "resolved": [...]}` (empty lists when no hang).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Configuration file whose paths and endpoints are checked.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print every key with its default and documentation (agent/config.example.toml).
    Example {
        /// The defaults as one JSON object instead of the documented TOML.
        #[arg(long)]
        json: bool,
    },
    /// Load FILE plus the COMMINSIGHT_* environment and report the first problem.
    Check {
        file: PathBuf,
        /// Print the effective configuration as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Load the configuration: `path`, else the default file if it exists, plus the environment.
pub fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<crate::AgentConfig> {
    let env = crate::config::process_env();
    let loaded = crate::config::load_with_warnings(path, &env)?;
    for w in &loaded.warnings {
        eprintln!("comminsight-agent: warning: {w}");
    }
    Ok(loaded.config)
}

/// Install the tracing subscriber for the daemon's log (`level`: a filter; `format`: text|json).
pub fn init_tracing(level: &str, format: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| {
        anyhow::anyhow!("[log] level = {level:?}: {e}; use error, warn, info, debug or trace")
    })?;
    // Colours only for a person at a terminal: a log file or journald gets no ANSI codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let res = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    res.map_err(|e| anyhow::anyhow!("cannot install the log subscriber: {e}"))
}

/// `--job J`: keep only job `J` of `jobs` (all when `None`); an unknown job is an error naming the
/// jobs found under `dir`.
pub fn keep_job<T>(
    jobs: &mut Vec<T>,
    job: Option<&str>,
    dir: &std::path::Path,
    id: impl Fn(&T) -> &String,
) -> anyhow::Result<()> {
    let Some(j) = job else { return Ok(()) };
    let known: Vec<String> = jobs.iter().map(|x| id(x).clone()).collect();
    jobs.retain(|x| id(x) == j);
    if jobs.is_empty() {
        anyhow::bail!(
            "{}: no job {j:?} (jobs found: {}); pass one of them to --job",
            dir.display(),
            known.join(", ")
        );
    }
    Ok(())
}

/// Exit codes shared by every subcommand (README "Exit codes").
pub mod exit {
    /// Done; nothing found (also when standard output was closed early, e.g. `| head`).
    pub const OK: u8 = 0;
    /// Done; a finding: a hang or failure verdict (`hang`), a straggler above the threshold
    /// (`straggler`).
    pub const FINDING: u8 = 1;
    /// Usage or input error: a bad option, a missing or unreadable input, an input without a
    /// single CommInsight record (garbage or empty segment files), a configuration problem.
    pub const INPUT: u8 = 2;
}

/// Run one command and map its outcome to the exit code.
pub fn dispatch(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(a) => run::run(&a),
        Command::Status(a) => status::run(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Doctor(a) => doctor::run(&a),
        Command::Probe(a) => probe::run(&a),
        Command::Gpus(a) => gpus::run(&a),
        Command::Config(a) => config::run(&a),
        Command::Roles(a) => roles::run(&a),
        Command::Steps(a) => steps::run(&a),
        Command::Hang(a) => hang::run(&a),
        Command::Straggler(a) => straggler::run(&a),
        Command::Moe(a) => moe::run(&a),
        Command::Trace(a) => trace::run(&a),
        Command::Report(a) => report::run(&a),
        Command::Import(a) => import::run(&a),
        Command::Dump(a) => dump::run(&a),
        Command::Encode(a) => encode::run(&a),
        Command::Generate(a) => generate::run(&a),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader of standard output went away (`| head`): nothing more to say.
        Err(e) if pipe::is_broken_pipe(&e) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("comminsight-agent: {e:#}");
            ExitCode::from(exit::INPUT)
        }
    }
}

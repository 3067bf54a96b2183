//! The `comminsight-testbed` command line (a stable contract: options may be added, not changed).
//!
//! ```text
//! comminsight-testbed run --scenario tests/scenarios/NAME.toml --out DIR [--ranks N] [--hosts H]
//!     [--steps N] [--seed N] [--synthetic] [--timeout SECS] [--fault SPEC]...
//! comminsight-testbed eval hang --out DIR [--scenarios N] [--synthetic] [--max-ranks R]
//!     [--healthy H] [--seed S] [--keep] ...          (see crate::eval)
//! comminsight-testbed eval straggler --out DIR [--scenarios N] [--synthetic] [--max-ranks R]
//!     [--healthy H] [--seed S] [--keep] [--agent-arg ARG]...
//! ```
//! Exit codes: 0 the run went as the scenario and faults say; 1 a rank failed or the run timed
//! out without an injected fault to explain it; 2 usage or input error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use crate::fault::Fault;
use crate::layout::check_hosts;
use crate::plan;
use crate::runner::{self, RunConfig};
use crate::scenario::Scenario;
use crate::synthetic::{self, SyntheticConfig};
use crate::truth::Truth;

/// Default `--timeout`, seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;

/// CommInsight CPU test bed: run a training-like job of N rank processes over the libnccl
/// stand-in, with injected faults, and write the truth to score the analysis against.
#[derive(Debug, Parser)]
#[command(name = "comminsight-testbed", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario; writes DIR/truth.json, DIR/inspector_logs/, DIR/ranks/, DIR/run/.
    Run(RunArgs),
    /// Randomised evaluation of an analysis against the truth of many runs.
    #[command(subcommand)]
    Eval(crate::eval::EvalCommand),
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Scenario file (TOML, see tests/scenarios/README.md).
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// Output directory (its run/, ranks/, inspector_logs/ and truth.json are replaced).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of ranks: rescales the scenario's dp (tp, cp, pp, ep stay). [default: the scenario's]
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Simulated hosts; ranks are spread in equal blocks. [default: the scenario's]
    #[arg(long, value_name = "H")]
    pub hosts: Option<usize>,
    /// Training steps. [default: the scenario's]
    #[arg(long, value_name = "N")]
    pub steps: Option<u32>,
    /// Seed (event loss, synthetic jitter). [default: the scenario's]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Write the records of every rank directly from a simulation (no processes).
    #[arg(long)]
    pub synthetic: bool,
    /// End the run after this many seconds (hung ranks get SIGTERM, then SIGKILL).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout: u64,
    /// Inject a fault (repeatable): slow:rank=R,ms=X[,steps=A..B] | hang:rank=R,step=S |
    /// pyhang:rank=R,step=S | kill:rank=R,step=S | mismatch:rank=R,step=S |
    /// stall:rank=R,step=S,ms=X[,every=N] | slowlink:a=R1,b=R2,rate=10mbit |
    /// droplink:a=R1,b=R2,pct=P | loss:pct=P (steps are 0-based; stall is a healthy
    /// checkpoint-like pause, no culprit).
    #[arg(long = "fault", value_name = "SPEC", value_parser = parse_fault)]
    pub faults: Vec<Fault>,
    /// Directory with libnccl.so.2 and the plugin. [default: $COMMINSIGHT_LIB_DIR, else
    /// <dir of this executable>/lib]
    #[arg(long, value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,
    /// Run with NCCL_PROFILER_PLUGIN=none (to measure the plugin's overhead).
    #[arg(long)]
    pub no_plugin: bool,
    /// Job id (COMMINSIGHT_JOB_ID). [default: the scenario name]
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Run every simulated host in its own network namespace even without a slow link.
    #[arg(long)]
    pub netns: bool,
    /// Python interpreter for the ranks. [default: $COMMINSIGHT_PYTHON, else python3]
    #[arg(long, value_name = "PATH")]
    pub python: Option<String>,
    /// Keep the shared-memory rings that killed ranks leave behind (default: removed after the run).
    #[arg(long)]
    pub keep_rings: bool,
    /// Print a machine-readable summary (JSON) instead of the human one.
    #[arg(long)]
    pub json: bool,
    /// Multiply the scenario's `[compute]` times by this (> 0): longer steps with the same
    /// communication, e.g. training-like steps of 100+ ms where the scheduler's millisecond
    /// stalls are a small part of a step.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub compute_scale: f64,
}

impl RunArgs {
    /// A `--synthetic` run of `scenario` into `out` with `ranks` ranks (8 per host) and `steps`
    /// steps, every other option at its default (benches and tests).
    pub fn synthetic(scenario: PathBuf, out: PathBuf, ranks: usize, steps: u32) -> RunArgs {
        RunArgs {
            scenario,
            out,
            ranks: Some(ranks),
            hosts: Some(ranks.div_ceil(8)),
            steps: Some(steps),
            seed: None,
            synthetic: true,
            timeout: 600,
            faults: vec![],
            lib_dir: None,
            no_plugin: false,
            job: None,
            netns: false,
            python: None,
            keep_rings: false,
            json: false,
            compute_scale: 1.0,
        }
    }
}

fn parse_fault(s: &str) -> Result<Fault, String> {
    s.parse()
        .map_err(|e: crate::fault::FaultSpecError| e.to_string())
}

/// A usage or input error (exit code 2), as opposed to a failed run (exit code 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// What `run` reports.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub ok: bool,
    pub scenario: String,
    pub synthetic: bool,
    pub ranks: usize,
    pub hosts: usize,
    pub steps: u32,
    pub steps_completed_min: usize,
    pub steps_completed_max: usize,
    pub faults: Vec<String>,
    pub culprit_ranks: Vec<usize>,
    pub timed_out: bool,
    pub interrupted: bool,
    pub unexpected_failures: Vec<usize>,
    pub wall_s: f64,
    pub out: PathBuf,
    pub records_written: Option<u64>,
}

impl Summary {
    fn new(truth: &Truth, steps: u32, out: &Path, wall: Duration) -> Summary {
        let done: Vec<usize> = (0..truth.ranks).map(|r| truth.steps_done(r)).collect();
        Summary {
            ok: true,
            scenario: truth.scenario.clone(),
            synthetic: truth.synthetic,
            ranks: truth.ranks,
            hosts: truth.hosts,
            steps,
            steps_completed_min: done.iter().copied().min().unwrap_or(0),
            steps_completed_max: done.iter().copied().max().unwrap_or(0),
            faults: truth.faults.iter().map(ToString::to_string).collect(),
            culprit_ranks: truth.culprit_ranks.clone(),
            timed_out: false,
            interrupted: false,
            unexpected_failures: Vec::new(),
            wall_s: wall.as_secs_f64(),
            out: out.to_path_buf(),
            records_written: None,
        }
    }

    /// The human rendering.
    pub fn render(&self) -> String {
        let mut s = format!(
            "comminsight-testbed: {}{}: {} ranks on {} host(s), {} steps\n",
            self.scenario,
            if self.synthetic { " (synthetic)" } else { "" },
            self.ranks,
            self.hosts,
            self.steps
        );
        s += &format!(
            "  steps completed per rank: min {} max {}\n",
            self.steps_completed_min, self.steps_completed_max
        );
        if self.faults.is_empty() {
            s += "  faults: none\n";
        } else {
            s += &format!(
                "  faults: {} (culprit ranks {:?})\n",
                self.faults.join(" "),
                self.culprit_ranks
            );
        }
        if self.timed_out {
            s += "  timed out: remaining ranks were ended (SIGTERM, then SIGKILL)\n";
        }
        if self.interrupted {
            s += "  INTERRUPTED: a stop signal ended the run early\n";
        }
        if !self.unexpected_failures.is_empty() {
            s += &format!(
                "  FAILED ranks (no fault explains it): {:?}; see ranks/rank-<r>.log\n",
                self.unexpected_failures
            );
        }
        if let Some(n) = self.records_written {
            s += &format!("  records written: {n}\n");
        }
        s += &format!("  wall time: {:.2} s\n", self.wall_s);
        let o = self.out.display();
        s += &format!("  out: {o}/truth.json  {o}/inspector_logs/  {o}/ranks/\n");
        s
    }
}

/// Where libnccl.so.2 and the plugin are.
pub fn resolve_lib_dir(arg: Option<&Path>) -> Result<PathBuf> {
    let dir = match arg {
        Some(d) => d.to_path_buf(),
        None => match std::env::var_os("COMMINSIGHT_LIB_DIR") {
            Some(d) => PathBuf::from(d),
            None => std::env::current_exe()
                .context("locating the comminsight-testbed executable")?
                .parent()
                .map(|p| p.join("lib"))
                .unwrap_or_default(),
        },
    };
    if !dir.join("libnccl.so.2").exists() {
        return Err(InputError(format!(
            "libnccl.so.2 not found in {}: run `cargo xtask build` (or pass --lib-dir / set COMMINSIGHT_LIB_DIR)",
            dir.display()
        ))
        .into());
    }
    Ok(std::fs::canonicalize(&dir).unwrap_or(dir))
}

/// Execute `run`; `Ok(summary)` with `summary.ok == false` is a failed run (exit 1);
/// errors downcasting to [`InputError`] are usage errors (exit 2).
pub fn run(args: &RunArgs) -> Result<Summary> {
    let input = |e: String| anyhow::Error::from(InputError(e));
    let mut scenario = Scenario::load(&args.scenario).map_err(|e| input(e.to_string()))?;
    if !(args.compute_scale.is_finite() && args.compute_scale > 0.0) {
        return Err(input(format!(
            "--compute-scale {}: must be a finite number above 0 (1 = the scenario's times)",
            args.compute_scale
        )));
    }
    scenario.compute.scale(args.compute_scale);
    let mut layout = scenario.layout();
    if let Some(n) = args.ranks {
        layout = layout.rescaled(n).map_err(|e| input(e.to_string()))?;
    }
    let hosts = args.hosts.unwrap_or(scenario.layout.hosts);
    check_hosts(layout.world(), hosts).map_err(|e| input(e.to_string()))?;
    let steps = args.steps.unwrap_or(scenario.workload.steps);
    let seed = args.seed.unwrap_or(scenario.workload.seed);
    let mut faults = scenario.parsed_faults().map_err(|e| input(e.to_string()))?;
    faults.extend(args.faults.iter().cloned());
    let plans =
        plan::build(&scenario, &layout, steps, &faults).map_err(|e| input(e.to_string()))?;
    let job = args.job.clone().unwrap_or_else(|| scenario.name.clone());
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if args.synthetic {
        let cfg = SyntheticConfig {
            layout,
            hosts,
            steps,
            seed,
            faults,
            out: args.out.clone(),
            job,
            scenario: scenario.name.clone(),
            overdue_ms: overdue_ms(),
            named_comms: scenario.workload.named_comms
                && scenario.workload.frontend != crate::scenario::Frontend::Torch,
        };
        let out = synthetic::run(&cfg, &plans)?;
        let mut s = Summary::new(&out.truth, steps, &args.out, out.wall);
        s.records_written = Some(out.records);
        return Ok(s);
    }
    if layout.world() > 512 {
        bail!(InputError(format!(
            "{} rank processes on one machine is too many; use --synthetic for scale runs",
            layout.world()
        )));
    }
    let lib_dir = resolve_lib_dir(args.lib_dir.as_deref())?;
    let plugin_wanted = !args.no_plugin
        && std::env::var("NCCL_PROFILER_PLUGIN").map_or(true, |v| v == "comminsight");
    if plugin_wanted && !lib_dir.join("libnccl-profiler-comminsight.so").exists() {
        bail!(InputError(format!(
            "libnccl-profiler-comminsight.so not found in {}: run `cargo xtask build`",
            lib_dir.display()
        )));
    }
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var("COMMINSIGHT_PYTHON").ok())
        .unwrap_or_else(|| "python3".into());
    let cfg = RunConfig {
        scenario,
        layout,
        hosts,
        steps,
        seed,
        faults,
        out: args.out.clone(),
        timeout: Duration::from_secs(args.timeout),
        lib_dir,
        no_plugin: args.no_plugin,
        job,
        python,
        netns: args.netns,
        keep_rings: args.keep_rings,
    };
    let out = runner::run(&cfg, &plans)?;
    let mut s = Summary::new(&out.truth, steps, &args.out, out.wall);
    s.timed_out = out.timed_out;
    s.unexpected_failures = out.unexpected.clone();
    let blocking = cfg.faults.iter().any(|f| {
        matches!(
            f,
            Fault::Hang { .. } | Fault::Pyhang { .. } | Fault::Kill { .. } | Fault::Mismatch { .. }
        )
    });
    s.interrupted = out.interrupted;
    s.ok = out.unexpected.is_empty() && !out.interrupted && (blocking || !out.timed_out);
    Ok(s)
}

/// `COMMINSIGHT_OVERDUE_MS` as the plugin reads it (default 30000).
fn overdue_ms() -> u64 {
    std::env::var("COMMINSIGHT_OVERDUE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_fault_specs_are_one_line_usage_errors() {
        let e = Cli::try_parse_from([
            "comminsight-testbed",
            "run",
            "--scenario",
            "s.toml",
            "--out",
            "o",
            "--fault",
            "hang:rank=1",
        ])
        .unwrap_err();
        let text = e.to_string();
        assert_eq!(e.exit_code(), 2);
        let first = text.lines().next().unwrap();
        assert!(
            first.contains("bad fault spec `hang:rank=1`: missing `step=`"),
            "{text}"
        );
        assert!(first.contains("slowlink:a=R1,b=R2,rate=10mbit"), "{text}");
    }

    #[test]
    fn the_documented_command_line_parses() {
        let cli = Cli::try_parse_from([
            "comminsight-testbed",
            "run",
            "--scenario",
            "tests/scenarios/megatron.toml",
            "--out",
            "/tmp/o",
            "--ranks",
            "16",
            "--hosts",
            "2",
            "--steps",
            "5",
            "--seed",
            "3",
            "--synthetic",
            "--timeout",
            "9",
            "--fault",
            "slow:rank=1,ms=5",
            "--fault",
            "loss:pct=2",
        ])
        .unwrap();
        let Command::Run(a) = cli.command else {
            panic!("`run` parses as Run")
        };
        assert_eq!(a.ranks, Some(16));
        assert_eq!(a.faults.len(), 2);
        assert!(a.synthetic);
        assert_eq!(a.timeout, 9);
    }

    #[test]
    fn missing_libraries_say_how_to_build_them() {
        let e = resolve_lib_dir(Some(Path::new("/nonexistent-lib-dir"))).unwrap_err();
        assert!(e.downcast_ref::<InputError>().is_some());
        assert!(e.to_string().contains("run `cargo xtask build`"), "{e}");
    }
}

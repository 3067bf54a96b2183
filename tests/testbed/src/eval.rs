//! `comminsight-testbed eval hang` (what `cargo xtask eval hang` runs): the randomised evaluation
//! of the hang analysis (issue 6 acceptance). [`gen`] draws seeded cases (a fault kind of
//! `hang`, `pyhang`, `kill`, `mismatch`, `pp-chain`, a shipped layout rescaled up to `max_ranks`,
//! hosts >= 2, a culprit rank and a step that is not the last), plus healthy jittered runs
//! (`stall:` longer than the overdue threshold, some repeating, `slow:` jitter). Each case is a
//! test-bed run (this executable's `run`, `--synthetic` or real, with `COMMINSIGHT_OVERDUE_MS`),
//! then `comminsight-agent hang DIR --json`, scored by [`score`]: top-1 = the first verdict's
//! first source rank is a truth culprit; healthy runs must give no verdict (`resolved` entries
//! are counted apart as transient alarms). Synthetic cases run in parallel, real ones one at a
//! time. Every case is written to `OUT/eval-hang.json` (seed, faults, expected, got, a replay
//! command); run directories are deleted unless `--keep` or the case missed.
//!
//! `eval straggler` ([`straggler`], issue 7) reuses the generator's pieces ([`gen::Rng`], the
//! layouts), the runner of processes with a time limit and the clean-up.

mod exec;
pub mod gen;
pub mod score;
pub mod straggler;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use gen::{generate, load_scenarios};
pub use gen::{Case, CaseKind, GenOptions};
pub use score::{Answer, Score};

/// Top-1 source-rank accuracy the evaluation must reach.
pub const TARGET_TOP1: f64 = 0.995;

/// Why the evaluation could not run (a case that fails is a scored miss, not an error).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("eval: scenario: {0}")]
    Scenario(String),
    #[error("eval: no valid {kind} case with --max-ranks {max_ranks}; raise --max-ranks")]
    NoCase {
        kind: &'static str,
        max_ranks: usize,
    },
    #[error("eval: analysis binary {0} not found: build it (cargo build -p comminsight-agent) or pass --agent PATH")]
    NoAgent(PathBuf),
    #[error("eval: {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("eval: --only {0} is past the last case; use an index below --scenarios + --healthy")]
    Only(usize),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
    move |source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `comminsight-testbed eval <WHAT>`.
#[derive(Debug, clap::Subcommand)]
pub enum EvalCommand {
    /// Randomised evaluation of `comminsight-agent hang`: top-1 source-rank accuracy over faulty
    /// runs (target >= 99.5 %) and false alarms over healthy jittered runs (target 0); exit 1
    /// when a target is missed.
    Hang(EvalHangArgs),
    /// Randomised evaluation of `comminsight-agent straggler`: a slow rank (5..50 % of the step,
    /// with and without a slow link) must have the highest index in >= 97 % of the steps (100 %
    /// at 50 %), healthy jittered runs must not alarm; exit 1 when a target is missed.
    Straggler(straggler::EvalStragglerArgs),
}

/// Options of `eval hang`.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalHangArgs {
    /// Faulty scenarios (kinds hang, pyhang, kill, mismatch, pp-chain in turn).
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub scenarios: usize,
    /// Run the test bed with --synthetic (no processes; up to thousands of ranks).
    #[arg(long)]
    pub synthetic: bool,
    /// Largest world size drawn. [default: 1024 with --synthetic, 16 otherwise]
    #[arg(long, value_name = "R")]
    pub max_ranks: Option<usize>,
    /// Healthy jittered runs (stalls longer than the overdue threshold, slow ranks).
    #[arg(long, value_name = "H", default_value_t = 50)]
    pub healthy: usize,
    /// Seed of the case generator. [default: drawn from the clock, printed]
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Output directory: eval-hang.json, runs/ (missed or --keep runs).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Keep every run's directory (default: only the missed ones).
    #[arg(long)]
    pub keep: bool,
    /// Overdue threshold of the runs (COMMINSIGHT_OVERDUE_MS). [default: $COMMINSIGHT_OVERDUE_MS,
    /// else 1500]
    #[arg(long, value_name = "MS")]
    pub overdue_ms: Option<u64>,
    /// Real runs with a blocking fault end at the overdue threshold + this + the fault's step, s.
    #[arg(long, value_name = "SECS", default_value_t = 6)]
    pub margin: u64,
    /// Cases run at once with --synthetic. [default: the CPU count]
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Run only case I of this seed (replay a miss).
    #[arg(long, value_name = "I")]
    pub only: Option<usize>,
    /// The analysis binary. [default: comminsight-agent next to this executable]
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Where the shipped scenarios are. [default: the repository's tests/scenarios]
    #[arg(long, value_name = "DIR")]
    pub scenario_dir: Option<PathBuf>,
}

/// One scored case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// The case as generated.
    #[serde(flatten)]
    pub case: Case,
    /// The truth's `culprit_ranks` (the generator's when the run wrote no truth).
    pub truth_culprits: Vec<usize>,
    /// What the analysis answered (`None`: the run or the analysis failed).
    pub got: Option<Answer>,
    /// The score of `got`.
    pub score: Score,
    /// The run or the analysis failed (scored as a miss / alarm).
    pub error: Option<String>,
    /// Where the run is kept (`None`: deleted).
    pub dir: Option<PathBuf>,
    /// Shell line that redoes the case.
    pub replay: String,
    /// Seconds the case took (run + analysis).
    pub wall_s: f64,
}

impl CaseResult {
    /// The case went as it should (faulty: top-1 hit; healthy: no verdict), without error.
    pub fn ok(&self) -> bool {
        self.error.is_none()
            && if self.case.kind == CaseKind::Healthy {
                !self.score.false_alarm
            } else {
                self.score.hit
            }
    }
}

/// Counts of one kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindStats {
    /// Cases of the kind.
    pub scenarios: usize,
    /// Faulty kinds: cases whose top-1 source rank is a culprit.
    pub top1_hits: usize,
    /// Faulty kinds: cases whose first verdict has an expected kind.
    pub kind_ok: usize,
    /// Cases whose run or analysis failed.
    pub errors: usize,
}

/// The evaluation's outcome.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The generator's seed (`--seed`).
    pub seed: u64,
    /// `--synthetic` runs.
    pub synthetic: bool,
    /// Largest world size drawn.
    pub max_ranks: usize,
    /// The runs' overdue threshold.
    pub overdue_ms: u64,
    /// Counts per case kind.
    pub by_kind: BTreeMap<CaseKind, KindStats>,
    /// Top-1 accuracy over the faulty cases (`None`: there were none).
    pub top1_accuracy: Option<f64>,
    /// Healthy runs.
    pub healthy_runs: usize,
    /// Healthy runs with at least one verdict (errors included).
    pub false_alarms: usize,
    /// `resolved` entries over all healthy runs.
    pub transient_alarms: usize,
    /// Seconds the whole evaluation took.
    pub wall_s: f64,
    /// Every case, in index order.
    pub cases: Vec<CaseResult>,
}

impl Report {
    /// Both targets met: top-1 >= 99.5 % and no false alarm.
    pub fn passed(&self) -> bool {
        self.top1_accuracy.is_none_or(|a| a >= TARGET_TOP1) && self.false_alarms == 0
    }

    /// The tables and totals.
    pub fn render(&self, out: &Path) -> String {
        let pct = |n: usize, d: usize| 100.0 * n as f64 / d.max(1) as f64;
        let mut s = format!(
            "eval hang: {} run(s), {}, max {} ranks, overdue threshold {} ms, seed {}\n\n",
            self.cases.len(),
            if self.synthetic {
                "synthetic"
            } else {
                "real processes"
            },
            self.max_ranks,
            self.overdue_ms,
            self.seed
        );
        s += &format!(
            "{:<10} {:>9} {:>11} {:>7} {:>8} {:>7}\n",
            "kind", "scenarios", "top-1 hits", "%", "kind ok", "errors"
        );
        let (mut n, mut hits) = (0, 0);
        for (k, st) in self
            .by_kind
            .iter()
            .filter(|(k, _)| **k != CaseKind::Healthy)
        {
            s += &format!(
                "{:<10} {:>9} {:>11} {:>7.1} {:>8} {:>7}\n",
                k.name(),
                st.scenarios,
                st.top1_hits,
                pct(st.top1_hits, st.scenarios),
                st.kind_ok,
                st.errors
            );
            n += st.scenarios;
            hits += st.top1_hits;
        }
        let verdict = |ok: bool| if ok { "PASS" } else { "MISSED" };
        match self.top1_accuracy {
            Some(a) => {
                s += &format!(
                    "{:<10} {:>9} {:>11} {:>7.1}   top-1 accuracy (target >= {:.1} %): {}\n",
                    "overall",
                    n,
                    hits,
                    100.0 * a,
                    100.0 * TARGET_TOP1,
                    verdict(a >= TARGET_TOP1)
                );
            }
            None => s += "overall: no faulty scenario run\n",
        }
        let herr = self.by_kind.get(&CaseKind::Healthy).map_or(0, |h| h.errors);
        s += &format!(
            "\nhealthy runs: {}   false alarms: {} (target 0): {}   transient alarms (resolved entries): {}{}\n",
            self.healthy_runs,
            self.false_alarms,
            verdict(self.false_alarms == 0),
            self.transient_alarms,
            if herr > 0 {
                format!("   ({herr} failed to run, counted as false alarms)")
            } else {
                String::new()
            }
        );
        let misses: Vec<&CaseResult> = self.cases.iter().filter(|c| !c.ok()).collect();
        if !misses.is_empty() {
            s += &format!(
                "\nmissed ({}; replay with --seed {} --only I):\n",
                misses.len(),
                self.seed
            );
            for c in misses.iter().take(20) {
                s += &format!(
                    "  #{} {} {} {} ranks [{}]: {}\n",
                    c.case.index,
                    c.case.kind.name(),
                    c.case.scenario,
                    c.case.ranks,
                    c.case.faults.join(" "),
                    match (&c.error, c.score.top1) {
                        (Some(e), _) => format!("error: {e}"),
                        (None, _) if c.case.kind == CaseKind::Healthy => format!(
                            "{} verdict(s)",
                            c.got.as_ref().map_or(0, |g| g.verdict_count)
                        ),
                        (None, Some(r)) =>
                            format!("top-1 source rank {r}, truth {:?}", c.truth_culprits),
                        (None, None) => "no verdict".into(),
                    }
                );
            }
        }
        s += &format!(
            "\nwall time: {:.1} s\nresults: {}\n{}\n",
            self.wall_s,
            out.join("eval-hang.json").display(),
            if self.passed() {
                "targets met"
            } else {
                "TARGET MISSED"
            }
        );
        s
    }
}

/// Resolved settings of a run.
pub(crate) struct Ctx {
    pub(crate) exe: PathBuf,
    pub(crate) agent: PathBuf,
    pub(crate) scenario_dir: PathBuf,
    pub(crate) runs: PathBuf,
    pub(crate) overdue_ms: u64,
    pub(crate) synthetic: bool,
    pub(crate) keep: bool,
}

/// Run the evaluation; `progress(done, total, result)` is called as each case ends (from worker
/// threads). Writes `OUT/eval-hang.json`.
pub fn run_hang(
    args: &EvalHangArgs,
    progress: &(dyn Fn(usize, usize, &CaseResult) + Sync),
) -> Result<Report, EvalError> {
    let t0 = Instant::now();
    let synthetic = args.synthetic;
    let max_ranks = args.max_ranks.unwrap_or(if synthetic { 1024 } else { 16 });
    let overdue_ms = args.overdue_ms.unwrap_or_else(|| {
        std::env::var("COMMINSIGHT_OVERDUE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500)
    });
    let seed = args.seed.unwrap_or_else(clock_seed);
    let scenario_dir = args
        .scenario_dir
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios"));
    let set = load_scenarios(&scenario_dir)?;
    let opts = GenOptions {
        synthetic,
        max_ranks,
        overdue_ms,
        margin_s: args.margin,
    };
    let mut cases = generate(&set, seed, args.scenarios, args.healthy, &opts)?;
    if let Some(i) = args.only {
        cases = vec![cases.get(i).cloned().ok_or(EvalError::Only(i))?];
    }
    let exe = std::env::current_exe().map_err(io(Path::new("/proc/self/exe")))?;
    let agent = args.agent.clone().unwrap_or_else(|| {
        exe.parent()
            .unwrap_or(Path::new("."))
            .join("comminsight-agent")
    });
    if !agent.is_file() {
        return Err(EvalError::NoAgent(agent));
    }
    let runs = args.out.join("runs");
    std::fs::create_dir_all(&runs).map_err(io(&runs))?;
    let ctx = Ctx {
        exe,
        agent,
        scenario_dir,
        runs,
        overdue_ms,
        synthetic,
        keep: args.keep,
    };
    let jobs = if synthetic {
        args.jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    } else {
        1
    };
    let total = cases.len();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<CaseResult>>> = Mutex::new(vec![None; total]);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(total) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let r = exec::run_case(&ctx, case);
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress(n, total, &r);
                results
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)[i] = Some(r);
            });
        }
    });
    let cases: Vec<CaseResult> = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .flatten()
        .collect();
    let report = summarize(seed, &opts, cases, t0.elapsed());
    let path = args.out.join("eval-hang.json");
    let f = File::create(&path).map_err(io(&path))?;
    serde_json::to_writer_pretty(std::io::BufWriter::new(f), &report).map_err(|e| {
        EvalError::Io {
            path: path.clone(),
            source: e.into(),
        }
    })?;
    Ok(report)
}

/// Counts per kind, accuracy, alarms.
pub fn summarize(seed: u64, opts: &GenOptions, cases: Vec<CaseResult>, wall: Duration) -> Report {
    let mut by_kind: BTreeMap<CaseKind, KindStats> = BTreeMap::new();
    let (mut faulty, mut hits, mut healthy, mut false_alarms, mut transient) = (0, 0, 0, 0, 0);
    for c in &cases {
        let st = by_kind.entry(c.case.kind).or_default();
        st.scenarios += 1;
        st.errors += usize::from(c.error.is_some());
        if c.case.kind == CaseKind::Healthy {
            healthy += 1;
            false_alarms += usize::from(c.score.false_alarm || c.error.is_some());
            transient += c.score.transient_alarms;
        } else {
            faulty += 1;
            hits += usize::from(c.score.hit);
            st.top1_hits += usize::from(c.score.hit);
            st.kind_ok += usize::from(c.score.kind_ok);
        }
    }
    Report {
        seed,
        synthetic: opts.synthetic,
        max_ranks: opts.max_ranks,
        overdue_ms: opts.overdue_ms,
        by_kind,
        top1_accuracy: (faulty > 0).then(|| hits as f64 / faulty as f64),
        healthy_runs: healthy,
        false_alarms,
        transient_alarms: transient,
        wall_s: wall.as_secs_f64(),
        cases,
    }
}

fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    gen::case_seed(t, std::process::id() as usize) % 1_000_000_007
}

#[cfg(test)]
mod tests;

//! Running one straggler case: the layout's step time (a healthy calibration run per scenario,
//! world size and host count, measured once and shared by the cases), the test bed with the
//! case's faults in milliseconds, then `comminsight-agent straggler DIR --json`; scoring;
//! clean-up.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::gen::StragglerCase;
use super::score::{parse, score, StragglerScore};
use crate::eval::exec::{log_path, run_to_file, tail};

/// Missed runs kept without `--keep` (the first ones; a 1024-rank run takes ~100 MB).
pub const KEPT_MISSES: usize = 5;
/// Agent runs longer than this are ended and scored as errors.
const AGENT_LIMIT: Duration = Duration::from_secs(600);
/// Steps of a calibration run (the first is left out of the median: start-up).
pub const CALIBRATION_STEPS: u32 = 8;
/// Seed of every calibration run.
const CALIBRATION_SEED: u64 = 7;

/// The measured step time of one layout.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// Scenario name.
    pub scenario: String,
    /// World size.
    pub ranks: usize,
    /// Hosts.
    pub hosts: usize,
    /// Median step duration over every rank and step but the first (truth `step_times_ns`), ms.
    pub step_ms: f64,
    /// Seconds the calibration run took.
    pub wall_s: f64,
}

type Slot = Arc<Mutex<Option<Result<Calibration, String>>>>;

/// Resolved settings of a run, and the calibrations measured so far.
pub(crate) struct StragglerCtx {
    pub(crate) exe: PathBuf,
    pub(crate) agent: PathBuf,
    pub(crate) agent_args: Vec<String>,
    pub(crate) scenario_dir: PathBuf,
    pub(crate) runs: PathBuf,
    pub(crate) synthetic: bool,
    pub(crate) keep: bool,
    pub(crate) calib: Mutex<HashMap<(String, usize, usize), Slot>>,
    /// Missed runs kept so far.
    pub(crate) kept_misses: std::sync::atomic::AtomicUsize,
}

/// One scored case.
#[derive(Clone, Debug, Serialize)]
pub struct StragglerResult {
    /// The case as generated.
    #[serde(flatten)]
    pub case: StragglerCase,
    /// The layout's measured step time, ms (`None`: calibration failed).
    pub step_ms: Option<f64>,
    /// The `--fault` SPECs run (ms from `step_ms`).
    pub faults: Vec<String>,
    /// The score.
    pub score: StragglerScore,
    /// The analysis' exit code.
    pub agent_exit: Option<i32>,
    /// The run or the analysis failed (a faulty case's steps then all count as missed; a
    /// healthy one as a false positive).
    pub error: Option<String>,
    /// Where the run is kept (`None`: deleted).
    pub dir: Option<PathBuf>,
    /// Shell line that redoes the case.
    pub replay: String,
    /// Seconds the case took (run + analysis; the calibration not counted).
    pub wall_s: f64,
}

impl StragglerResult {
    /// Faulty: top-1 hit and every step a hit; healthy: no alarm; no error.
    pub fn ok(&self) -> bool {
        self.error.is_none()
            && match self.case.slow_rank {
                None => !self.score.false_positive,
                Some(_) => self.score.hit && self.score.step_hits == self.score.steps,
            }
    }

    /// One progress line.
    pub fn line(&self) -> String {
        let c = &self.case;
        let s = &self.score;
        let what = match (&self.error, c.slow_rank) {
            (Some(e), _) => format!("ERROR {e}"),
            (None, None) if s.false_positive => {
                format!("FALSE POSITIVE ({})", s.alarm.as_deref().unwrap_or(""))
            }
            (None, None) => format!("quiet (max step index {:.2})", s.max_step_index),
            (None, Some(r)) => {
                format!(
                    "top-1 {:?}{} index {:.2}, steps {}/{}",
                    s.top1,
                    if s.hit { "" } else { " MISS" },
                    s.injected_index.unwrap_or(0.0),
                    s.step_hits,
                    s.steps
                ) + &if s.step_hits < s.steps {
                    format!(" (missed {:?}, injected {r})", s.missed_steps)
                } else {
                    String::new()
                }
            }
        };
        format!(
            "#{} {} {}% {} {} ranks/{} hosts [{}] ({:.1} s): {what}",
            c.index,
            c.variant.name(),
            c.slow_pct.unwrap_or(0),
            c.scenario,
            c.ranks,
            c.hosts,
            self.faults.join(" "),
            self.wall_s
        )
    }
}

impl StragglerCtx {
    fn testbed_args(&self, scenario: &str, dir: &Path, run: RunShape<'_>) -> Vec<String> {
        let mut a: Vec<String> = [
            "run",
            "--scenario",
            &self
                .scenario_dir
                .join(format!("{scenario}.toml"))
                .display()
                .to_string(),
            "--out",
            &dir.display().to_string(),
            "--ranks",
            &run.ranks.to_string(),
            "--hosts",
            &run.hosts.to_string(),
            "--steps",
            &run.steps.to_string(),
            "--seed",
            &run.seed.to_string(),
            "--job",
            run.job,
            "--timeout",
            &run.timeout_s.to_string(),
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.synthetic {
            a.push("--synthetic".into());
        }
        for f in run.faults {
            a.push("--fault".into());
            a.push(f.clone());
        }
        a
    }

    /// The test bed run to completion; its truth.
    fn testbed(&self, dir: &Path, args: &[String], limit: Duration) -> Result<Value, String> {
        let log = log_path(dir, "testbed.log");
        let mut tb = Command::new(&self.exe);
        tb.args(args);
        let code = run_to_file(&mut tb, &log, &log, limit)?;
        if code != Some(0) {
            return Err(format!(
                "test bed exited {code:?}: {}",
                tail(&std::fs::read_to_string(&log).unwrap_or_default(), 300)
            ));
        }
        std::fs::read_to_string(dir.join("truth.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .ok_or_else(|| format!("{}: no readable truth.json", dir.display()))
    }

    /// The layout's step time, measured once (other cases of the layout wait for it).
    pub(crate) fn calibration(&self, c: &StragglerCase) -> Result<Calibration, String> {
        let key = (c.scenario.clone(), c.ranks, c.hosts);
        let slot = Arc::clone(
            self.calib
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(key)
                .or_default(),
        );
        let mut g = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = g.as_ref() {
            return r.clone();
        }
        let r = self.calibrate(c);
        *g = Some(r.clone());
        r
    }

    fn calibrate(&self, c: &StragglerCase) -> Result<Calibration, String> {
        let t0 = Instant::now();
        let dir = self
            .runs
            .join(format!("calib-{}-{}-{}", c.scenario, c.ranks, c.hosts));
        let shape = RunShape {
            ranks: c.ranks,
            hosts: c.hosts,
            steps: CALIBRATION_STEPS,
            seed: CALIBRATION_SEED,
            job: "calibration",
            timeout_s: c.timeout_s,
            faults: &[],
        };
        let args = self.testbed_args(&c.scenario, &dir, shape);
        let truth = self.testbed(&dir, &args, Duration::from_secs(c.timeout_s + 120));
        if !self.keep {
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_file(log_path(&dir, "testbed.log"));
        }
        let step_ms = median_step_ms(&truth?).ok_or_else(|| {
            format!(
                "calibration run of {} ({} ranks) has no step times",
                c.scenario, c.ranks
            )
        })?;
        Ok(Calibration {
            scenario: c.scenario.clone(),
            ranks: c.ranks,
            hosts: c.hosts,
            step_ms,
            wall_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// Run, analyse and score `case`.
    pub(crate) fn run_case(&self, case: &StragglerCase) -> StragglerResult {
        let name = format!(
            "{:04}-{}-{}-{}",
            case.index,
            case.variant.name(),
            case.scenario,
            case.ranks
        );
        let dir = self.runs.join(&name);
        let mut r = StragglerResult {
            case: case.clone(),
            step_ms: None,
            faults: Vec::new(),
            score: StragglerScore::default(),
            agent_exit: None,
            error: None,
            dir: Some(dir.clone()),
            replay: String::new(),
            wall_s: 0.0,
        };
        let cal = match self.calibration(case) {
            Ok(c) => c,
            Err(e) => {
                r.error = Some(format!("calibration: {e}"));
                return r;
            }
        };
        let t0 = Instant::now();
        r.step_ms = Some(cal.step_ms);
        r.faults = case
            .faults(cal.step_ms)
            .iter()
            .map(ToString::to_string)
            .collect();
        let job = format!("eval-{}", case.index);
        let shape = RunShape {
            ranks: case.ranks,
            hosts: case.hosts,
            steps: case.steps,
            seed: case.seed,
            job: &job,
            timeout_s: case.timeout_s,
            faults: &r.faults,
        };
        let args = self.testbed_args(&case.scenario, &dir, shape);
        r.replay = format!(
            "{} {} && {} straggler {} --json{}",
            self.exe.display(),
            args.join(" "),
            self.agent.display(),
            dir.display(),
            self.agent_args
                .iter()
                .fold(String::new(), |acc, a| acc + " " + a)
        );
        match self.analyse(case, &dir, &args) {
            Ok((code, s)) => {
                r.agent_exit = code;
                r.score = s;
            }
            Err(e) => r.error = Some(e),
        }
        let keep_miss = !r.ok()
            && self
                .kept_misses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                < KEPT_MISSES;
        if !self.keep && !keep_miss {
            for p in ["testbed.log", "agent.json", "agent.err"] {
                let _ = std::fs::remove_file(log_path(&dir, p));
            }
            let _ = std::fs::remove_dir_all(&dir);
            r.dir = None;
        }
        r.wall_s = t0.elapsed().as_secs_f64();
        r
    }

    fn analyse(
        &self,
        case: &StragglerCase,
        dir: &Path,
        args: &[String],
    ) -> Result<(Option<i32>, StragglerScore), String> {
        self.testbed(dir, args, Duration::from_secs(case.timeout_s + 120))?;
        let (out, err) = (log_path(dir, "agent.json"), log_path(dir, "agent.err"));
        let mut ag = Command::new(&self.agent);
        ag.arg("straggler")
            .arg(dir)
            .arg("--json")
            .args(&self.agent_args);
        let code = run_to_file(&mut ag, &out, &err, AGENT_LIMIT)?;
        if !matches!(code, Some(0 | 1)) {
            return Err(format!(
                "`straggler --json` exited {code:?}: {}",
                tail(&std::fs::read_to_string(&err).unwrap_or_default(), 300)
            ));
        }
        let parsed = parse(&std::fs::read_to_string(&out).unwrap_or_default())?;
        if (code == Some(1)) != parsed.finding() {
            return Err(format!(
                "`straggler --json` exited {code:?} but {} rank is above the threshold (exit 1 iff one is)",
                if parsed.finding() { "a" } else { "no" }
            ));
        }
        Ok((code, score(case, &parsed)))
    }
}

/// What a test-bed run looks like.
struct RunShape<'a> {
    ranks: usize,
    hosts: usize,
    steps: u32,
    seed: u64,
    job: &'a str,
    timeout_s: u64,
    faults: &'a [String],
}

/// Median of every rank's step durations (`truth.json` `step_times_ns`), the first step left
/// out; ms.
pub fn median_step_ms(truth: &Value) -> Option<f64> {
    let mut d: Vec<f64> = truth
        .get("step_times_ns")?
        .as_object()?
        .values()
        .filter_map(Value::as_array)
        .flat_map(|steps| steps.iter().skip(1))
        .filter_map(|p| {
            let p = p.as_array()?;
            Some((p.get(1)?.as_u64()?.saturating_sub(p.first()?.as_u64()?)) as f64 / 1e6)
        })
        .collect();
    if d.is_empty() {
        return None;
    }
    d.sort_by(f64::total_cmp);
    Some(d[d.len() / 2])
}

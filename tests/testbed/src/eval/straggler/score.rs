//! Scoring `comminsight-agent straggler DIR --json` (a `StragglerReport`, interfaces7.md) against
//! a case: top-1 = `ranks[0].rank` is the injected rank; a step is a hit when the injected rank's
//! index in it is above every other rank's (ties are misses; a step the report lacks is a miss). A healthy run is a false positive
//! when some rank's multi-step `index` is above the report's `threshold`, or when some rank's
//! per-step index is above it in at least [`M_OVER`] of [`N_WINDOW`] consecutive steps (the
//! live agent's default alarm rule).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::gen::StragglerCase;

/// Steps over the threshold inside a window that make an alarm.
pub const M_OVER: usize = 3;
/// The window of consecutive steps.
pub const N_WINDOW: usize = 5;
/// Steps at the start of a run the analysis leaves out as the warm-up (the agent's default
/// `[straggler] warmup_steps`): not scored, since issue 16 excluded them by design.
pub const WARMUP_STEPS: usize = 1;
/// Missed steps listed per case.
const KEPT_MISSES: usize = 10;

/// The report reduced to what is scored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// The report's threshold (percent of the step).
    pub threshold: f64,
    /// `ranks[]` in report order: (rank, multi-step index).
    pub ranks: Vec<(i64, f64)>,
    /// `steps[]` by step: every listed rank's index.
    pub steps: BTreeMap<u64, BTreeMap<i64, f64>>,
    /// Root scoring: the own excess a straggler must also have (`root_min_delay`), each rank's
    /// mean `root_delay` and its per-step ones; empty when the seed index is scored.
    pub min_delay: f64,
    pub delays: BTreeMap<i64, f64>,
    pub step_delays: BTreeMap<u64, BTreeMap<i64, f64>>,
    /// The top rank's `saves_pct` (root scoring).
    pub top_saves_pct: Option<f64>,
}

/// A healthy run whose top rank would save this much of the step (%) by being fixed is a false
/// positive (issue 17: < 2 %).
pub const MAX_HEALTHY_SAVES_PCT: f64 = 2.0;

fn num(v: &Value, key: &str, what: &str) -> Result<f64, String> {
    v.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("`straggler --json`: {what} has no number `{key}`"))
}

fn int(v: &Value, key: &str, what: &str) -> Result<i64, String> {
    v.get(key)
        .and_then(Value::as_i64)
        .ok_or_else(|| format!("`straggler --json`: {what} has no integer `{key}`"))
}

/// Which of the report's indices is scored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scored {
    /// `root_index` / `root_threshold` (issue 17) when the report has them, else the seed's.
    #[default]
    Root,
    /// The seed's `index` / `threshold`.
    Seed,
}

/// Parse the analysis' output (the root-cause index when present): one report, or
/// `{"jobs": [one report]}`.
pub fn parse(stdout: &str) -> Result<Parsed, String> {
    parse_scored(stdout, Scored::Root)
}

/// Parse the analysis' output, scoring `which` index.
pub fn parse_scored(stdout: &str, which: Scored) -> Result<Parsed, String> {
    let v: Value = serde_json::from_str(stdout.trim()).map_err(|e| {
        let head: String = stdout.chars().take(200).collect();
        format!("`straggler --json` printed no JSON object ({e}): {head}")
    })?;
    let rep = match v.get("jobs").and_then(Value::as_array) {
        Some(jobs) if jobs.len() == 1 => &jobs[0],
        Some(jobs) => {
            return Err(format!(
                "`straggler --json` reported {} jobs; one run is one job",
                jobs.len()
            ))
        }
        None => &v,
    };
    let root = which == Scored::Root && rep.get("root_threshold").is_some();
    let (index_key, threshold_key) = if root {
        ("root_index", "root_threshold")
    } else {
        ("index", "threshold")
    };
    let threshold = num(rep, threshold_key, "the report")?;
    let list = |key: &str| {
        rep.get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("`straggler --json`: no `{key}` list"))
    };
    let ranks = list("ranks")?
        .iter()
        .map(|r| Ok((int(r, "rank", "a rank")?, num(r, index_key, "a rank")?)))
        .collect::<Result<Vec<_>, String>>()?;
    let delay_of = |r: &Value| r.get("root_delay").and_then(Value::as_f64).unwrap_or(0.0);
    let mut delays = BTreeMap::new();
    let mut step_delays = BTreeMap::new();
    let mut top_saves_pct = None;
    if root {
        for r in list("ranks")? {
            delays.insert(int(r, "rank", "a rank")?, delay_of(r));
        }
        top_saves_pct = list("ranks")?
            .first()
            .and_then(|r| r.get("saves_pct"))
            .and_then(Value::as_f64);
    }
    let mut steps = BTreeMap::new();
    for s in list("steps")? {
        let step = int(s, "step", "a step")? as u64;
        let idx = s
            .get("ranks")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("`straggler --json`: step {step} has no `ranks` list"))?
            .iter()
            .map(|r| {
                let what = format!("step {step}'s rank");
                Ok((int(r, "rank", &what)?, num(r, index_key, &what)?))
            })
            .collect::<Result<BTreeMap<i64, f64>, String>>()?;
        steps.insert(step, idx);
        if root {
            let mut d = BTreeMap::new();
            for r in s
                .get("ranks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                d.insert(int(r, "rank", "a rank")?, delay_of(r));
            }
            step_delays.insert(step, d);
        }
    }
    Ok(Parsed {
        threshold,
        ranks,
        steps,
        min_delay: if root {
            rep.get("root_min_delay")
                .and_then(Value::as_f64)
                .unwrap_or(0.0)
        } else {
            f64::NEG_INFINITY
        },
        delays,
        step_delays,
        top_saves_pct,
    })
}

impl Parsed {
    /// Rank `r` with index `i` is over the rule (root scoring: its own excess too).
    fn over(&self, r: i64, i: f64, step: Option<u64>) -> bool {
        let delays = match step {
            Some(s) => self.step_delays.get(&s),
            None => Some(&self.delays),
        };
        let d = delays
            .and_then(|d| d.get(&r))
            .copied()
            .unwrap_or(f64::INFINITY);
        i > self.threshold && d > self.min_delay
    }

    /// Some rank's multi-step index is above the threshold (the CLI then exits 1).
    pub fn finding(&self) -> bool {
        self.ranks.iter().any(|(r, i)| self.over(*r, *i, None))
    }

    /// Why this report is an alarm under the eval's rule, if it is.
    pub fn alarm(&self) -> Option<String> {
        if let Some((r, i)) = self.ranks.iter().find(|(r, i)| self.over(*r, *i, None)) {
            return Some(format!(
                "rank {r}: multi-step index {i:.2} > threshold {}",
                self.threshold
            ));
        }
        if let Some(sv) = self.top_saves_pct.filter(|s| *s >= MAX_HEALTHY_SAVES_PCT) {
            return Some(format!(
                "top rank's saves_pct {sv:.2} >= {MAX_HEALTHY_SAVES_PCT}"
            ));
        }
        let mut over: BTreeMap<i64, Vec<bool>> = BTreeMap::new();
        for (n, (step, idx)) in self.steps.iter().enumerate() {
            for (r, i) in idx {
                let v = over
                    .entry(*r)
                    .or_insert_with(|| vec![false; self.steps.len()]);
                v[n] = self.over(*r, *i, Some(*step));
            }
        }
        let steps: Vec<u64> = self.steps.keys().copied().collect();
        for (r, v) in &over {
            for start in 0..v.len() {
                let end = (start + N_WINDOW).min(v.len());
                if v[start..end].iter().filter(|x| **x).count() >= M_OVER {
                    return Some(format!(
                        "rank {r}: per-step index above threshold {} in >= {M_OVER} of steps {}..={}",
                        self.threshold,
                        steps[start],
                        steps[end - 1]
                    ));
                }
            }
        }
        None
    }

    /// The largest per-step index of any rank (0 when none).
    pub fn max_step_index(&self) -> f64 {
        self.steps
            .values()
            .flat_map(|s| s.values())
            .fold(0.0, |a, b| a.max(*b))
    }
}

/// The score of one case (kept in `eval-straggler.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StragglerScore {
    /// `ranks[0].rank` (the analysis' top straggler).
    pub top1: Option<i64>,
    /// Faulty: `top1` is the injected rank.
    pub hit: bool,
    /// Faulty: the injected rank's multi-step index is above the threshold.
    pub detected: bool,
    /// The injected rank's multi-step index.
    pub injected_index: Option<f64>,
    /// The report's threshold.
    pub threshold: f64,
    /// Steps scored: the run's `--steps`, or more when the report has more (a step the report
    /// lacks is a missed step).
    pub steps: usize,
    /// Faulty: steps where the injected rank's index is above every other rank's.
    pub step_hits: usize,
    /// Faulty: the first missed steps, with the rank that had the highest index.
    pub missed_steps: Vec<(u64, Option<i64>)>,
    /// Healthy: an alarm under the eval's rule.
    pub false_positive: bool,
    /// Why (healthy) / the largest per-step index seen.
    pub alarm: Option<String>,
    /// The largest per-step index of any rank.
    pub max_step_index: f64,
}

/// Score `p` for `case`.
pub fn score(case: &StragglerCase, p: &Parsed) -> StragglerScore {
    let top1 = p.ranks.first().map(|(r, _)| *r);
    let mut s = StragglerScore {
        top1,
        threshold: p.threshold,
        // A step the report lacks is a missed step (the warm-up is not the report's to give).
        steps: p
            .steps
            .len()
            .max((case.steps as usize).saturating_sub(WARMUP_STEPS)),
        max_step_index: p.max_step_index(),
        ..StragglerScore::default()
    };
    let Some(inj) = case.slow_rank.map(|r| r as i64) else {
        s.alarm = p.alarm();
        s.false_positive = s.alarm.is_some();
        return s;
    };
    s.hit = top1 == Some(inj);
    s.injected_index = p.ranks.iter().find(|(r, _)| *r == inj).map(|(_, i)| *i);
    s.detected = s.injected_index.is_some_and(|i| p.over(inj, i, None));
    for (step, idx) in &p.steps {
        let mine = idx.get(&inj).copied().unwrap_or(0.0);
        let best_other = idx
            .iter()
            .filter(|(r, _)| **r != inj)
            .max_by(|a, b| a.1.total_cmp(b.1));
        if mine > 0.0 && best_other.is_none_or(|(_, i)| mine > *i) {
            s.step_hits += 1;
        } else if s.missed_steps.len() < KEPT_MISSES {
            let top = idx
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(r, _)| *r);
            s.missed_steps.push((*step, top));
        }
    }
    s
}

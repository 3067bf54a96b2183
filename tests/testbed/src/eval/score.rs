//! Scoring `comminsight-agent hang DIR --json` against a case: the top-1 source rank, the kind of
//! the first verdict, and for healthy runs false alarms (`verdicts`) and transient alarms
//! (`resolved`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::gen::{Case, CaseKind};

/// What the analysis answered, reduced to what is scored (and kept in `eval-hang.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The verdicts, each without its `evidence` (at most [`KEPT_VERDICTS`]).
    pub verdicts: Vec<Value>,
    /// How many verdicts there were.
    pub verdict_count: usize,
    /// How many `resolved` entries there were (stalls that finished later).
    pub resolved: usize,
    /// The first few `resolved` entries, without `evidence`.
    pub resolved_sample: Vec<Value>,
}

/// Verdicts (and resolved entries) kept per case in `eval-hang.json`.
pub const KEPT_VERDICTS: usize = 3;
/// Longest list kept inside a kept verdict (`entered_ranks` of 1024 ranks...); the full length
/// is kept as `<key>_total`.
pub const KEPT_LIST: usize = 32;

/// Parse the analysis' `--json` output. `verdicts` must be a list; `resolved` may be absent.
pub fn parse_answer(stdout: &str) -> Result<Answer, String> {
    let v: Value = serde_json::from_str(stdout.trim()).map_err(|e| {
        format!(
            "`hang --json` printed no JSON object ({e}): {}",
            first_chars(stdout, 200)
        )
    })?;
    let verdicts = v
        .get("verdicts")
        .and_then(Value::as_array)
        .ok_or_else(|| "`hang --json` output has no `verdicts` list".to_string())?;
    let resolved = match v.get("resolved") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) => &a[..],
        Some(_) => return Err("`hang --json` output: `resolved` is not a list".into()),
    };
    let brief = |xs: &[Value]| -> Vec<Value> {
        xs.iter()
            .take(KEPT_VERDICTS)
            .map(|x| {
                let mut x = x.clone();
                if let Some(o) = x.as_object_mut() {
                    o.remove("evidence");
                    let long: Vec<(String, usize)> = o
                        .iter()
                        .filter_map(|(k, v)| v.as_array().map(|a| (k.clone(), a.len())))
                        .filter(|(_, n)| *n > KEPT_LIST)
                        .collect();
                    for (k, n) in long {
                        if let Some(Value::Array(a)) = o.get_mut(&k) {
                            a.truncate(KEPT_LIST);
                        }
                        o.insert(format!("{k}_total"), Value::from(n));
                    }
                }
                x
            })
            .collect()
    };
    Ok(Answer {
        verdicts: brief(verdicts),
        verdict_count: verdicts.len(),
        resolved: resolved.len(),
        resolved_sample: brief(resolved),
    })
}

fn first_chars(s: &str, n: usize) -> String {
    let t: String = s.chars().take(n).collect();
    t.replace('\n', " ")
}

/// The score of one case.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Score {
    /// Faulty case: the first verdict's first source rank is a culprit.
    pub hit: bool,
    /// Faulty case: the first verdict's kind is one of the expected ones.
    pub kind_ok: bool,
    /// Healthy case: at least one verdict.
    pub false_alarm: bool,
    /// Healthy case: `resolved` entries.
    pub transient_alarms: usize,
    /// The top-1 source rank, if any.
    pub top1: Option<i64>,
}

/// Score `answer` for `case`; `culprits` are the truth's `culprit_ranks` of the run.
pub fn score(case: &Case, culprits: &[usize], answer: &Answer) -> Score {
    let first = answer.verdicts.first();
    let top1 = first
        .and_then(|v| v.get("source_ranks"))
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_i64);
    if case.kind == CaseKind::Healthy {
        return Score {
            false_alarm: answer.verdict_count > 0,
            transient_alarms: answer.resolved,
            top1,
            ..Score::default()
        };
    }
    let hit = top1.is_some_and(|r| culprits.iter().any(|c| *c as i64 == r));
    let kind = first.and_then(|v| v.get("kind")).and_then(Value::as_str);
    Score {
        hit,
        kind_ok: kind.is_some_and(|k| case.expected_verdicts.iter().any(|e| e == k)),
        top1,
        ..Score::default()
    }
}

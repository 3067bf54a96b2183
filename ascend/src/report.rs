//! What a window gave (spec §5.5): an [`EpEvent`] per window and phase (a JSON line), and
//! DeepXTrace's own log lines ([`deepxtrace_lines`]), so its heatmap script and the people who
//! read its `diagnose_rank0.log` keep working.

use serde::{Deserialize, Serialize};

use super::decode::Phase;
use super::detect::Detection;
use super::matrix::WaitMatrix;
use super::window::WindowKey;

/// One finding of a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// An abnormal column: every rank waited on `rank`.
    SenderSlow { rank: usize, value: f64, ratio: f64 },
    /// An abnormal row: `rank` waited on everybody.
    ReceiverSlow { rank: usize, value: f64, ratio: f64 },
    /// An abnormal cell: the path from `peer` to `waiter`.
    PathSlow {
        waiter: usize,
        peer: usize,
        value: f64,
        ratio: f64,
    },
}

/// One window of one phase: its findings, or the rows it misses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpEvent {
    /// End of the window (ns since the epoch).
    pub ts_ns: u64,
    pub ep_group_id: u64,
    pub instance_id: String,
    pub phase: Phase,
    pub window_seq: u64,
    #[serde(rename = "N")]
    pub n: usize,
    pub mu: f64,
    pub findings: Vec<Finding>,
    /// Set when the window was not whole: the ranks whose rows never came (no detection ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete_window: Option<Incomplete>,
}

/// The rows a window misses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incomplete {
    pub missing_rows: Vec<u32>,
}

impl EpEvent {
    /// The event of a whole window.
    pub fn of(key: &WindowKey, ts_ns: u64, n: usize, d: &Detection) -> EpEvent {
        let mut findings: Vec<Finding> = d
            .senders
            .iter()
            .map(|s| Finding::SenderSlow {
                rank: s.rank,
                value: s.mean,
                ratio: s.ratio,
            })
            .collect();
        findings.extend(d.receivers.iter().map(|r| Finding::ReceiverSlow {
            rank: r.rank,
            value: r.mean,
            ratio: r.ratio,
        }));
        findings.extend(d.paths.iter().map(|p| Finding::PathSlow {
            waiter: p.waiter,
            peer: p.peer,
            value: p.value,
            ratio: p.ratio,
        }));
        EpEvent {
            ts_ns,
            ep_group_id: key.ep_group_id,
            instance_id: key.instance_id.clone(),
            phase: key.phase,
            window_seq: key.window_seq,
            n,
            mu: d.mu,
            findings,
            incomplete_window: None,
        }
    }

    /// The event of a window that misses rows (no detection ran).
    pub fn incomplete(key: &WindowKey, ts_ns: u64, n: usize, missing_rows: Vec<u32>) -> EpEvent {
        EpEvent {
            incomplete_window: Some(Incomplete { missing_rows }),
            ..EpEvent::of(key, ts_ns, n, &Detection::default())
        }
    }

    /// One line for people: `dispatch window 12 of EP group 0x…: rank 2 is a slow sender (…)`.
    pub fn summary(&self) -> String {
        let head = format!(
            "{} window {} of EP group {:#x} (EP {})",
            match self.phase {
                Phase::Dispatch => "dispatch",
                Phase::Combine => "combine",
            },
            self.window_seq,
            self.ep_group_id,
            self.n
        );
        if let Some(i) = &self.incomplete_window {
            let r: Vec<String> = i.missing_rows.iter().map(u32::to_string).collect();
            return format!(
                "{head}: incomplete, no report from rank(s) {}",
                r.join(", ")
            );
        }
        if self.findings.is_empty() {
            return format!("{head}: no slow rank");
        }
        let f: Vec<String> = self
            .findings
            .iter()
            .map(|f| match f {
                Finding::SenderSlow { rank, ratio, .. } => {
                    format!("rank {rank} is a slow sender (everyone waited on it, {ratio:.1}x the mean)")
                }
                Finding::ReceiverSlow { rank, ratio, .. } => {
                    format!("rank {rank} is a slow receiver (it waited on everyone, {ratio:.1}x)")
                }
                Finding::PathSlow {
                    waiter,
                    peer,
                    ratio,
                    ..
                } => format!("the path {peer} -> {waiter} is slow ({ratio:.1}x)"),
            })
            .collect();
        format!("{head}: {}", f.join("; "))
    }
}

/// A float as Python's `repr` writes it (shortest round trip; exponent form below 1e-4 and
/// from 1e16).
pub fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let a = v.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{v:e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        return format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    let s = format!("{v}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// DeepXTrace's log lines for one window of one phase (its `_gather_diagnose_stats_internal`):
/// `[time] [Diagnose] InstanceID: … EPSize: N, diagnose: {…}, Dispatch Wait Recv Cost Per Token
/// Matrix[src_rank, dst_rank]`, then with `details` one `rank=i [v v …]` line per row (`%8d`),
/// what `deepxtrace_heatmap.py` reads. The result dict is written as Python prints it (numbers
/// as numpy 1.x does). `time` is the window end as DeepXTrace's logger writes it
/// (`[%Y-%m-%dT%H:%M:%S.mmm]`), formatted by the caller.
pub fn deepxtrace_lines(
    time: &str,
    instance_id: &str,
    phase: Phase,
    d: &Detection,
    n: usize,
    details: Option<&WaitMatrix>,
) -> Vec<String> {
    let cols: Vec<String> = d
        .senders
        .iter()
        .map(|s| format!("[{}, {}, {}]", s.rank, py_float(s.mean), py_float(s.ratio)))
        .collect();
    let rows: Vec<String> = d
        .receivers
        .iter()
        .map(|r| format!("[{}, {}, {}]", r.rank, py_float(r.mean), py_float(r.ratio)))
        .collect();
    let points: Vec<String> = d
        .paths
        .iter()
        .map(|p| {
            format!(
                "[{}, {}, {}, {}]",
                p.waiter,
                p.peer,
                py_float(p.value),
                py_float(p.ratio)
            )
        })
        .collect();
    let t = time;
    let mut out = vec![format!(
        "{t} [Diagnose] InstanceID: {instance_id} EPSize: {n}, diagnose: {{'abnormal_cols': [{}], \
         'abnormal_rows': [{}], 'abnormal_points': [{}]}}, {} Wait Recv Cost Per Token \
         Matrix[src_rank, dst_rank]",
        cols.join(", "),
        rows.join(", "),
        points.join(", "),
        phase.title()
    )];
    if let Some(m) = details {
        for i in 0..m.n() {
            let v: Vec<String> = m
                .row(i)
                .iter()
                .map(|x| format!("{:8}", *x as i64))
                .collect();
            out.push(format!("{t} rank={i} [{}]", v.join(" ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{detect, DetectConfig};

    #[test]
    fn deepxtrace_log_lines_read_like_its_own() {
        let m = WaitMatrix::from_fn(4, |i, j| if j == 2 && i != 2 { 1e7 } else { 100.0 });
        let d = detect(&m, &DetectConfig::default(), 1);
        assert_eq!(d.senders.len(), 1);
        let ts = "[2025-12-05T02:00:00.123]";
        let lines = deepxtrace_lines(ts, "6a1e", Phase::Combine, &d, 4, Some(&m));
        assert_eq!(
            lines[0],
            format!(
                "[2025-12-05T02:00:00.123] [Diagnose] InstanceID: 6a1e EPSize: 4, diagnose: \
                 {{'abnormal_cols': [[2, 7500025.0, {}]], 'abnormal_rows': [], \
                 'abnormal_points': []}}, Combine Wait Recv Cost Per Token Matrix[src_rank, dst_rank]",
                py_float(d.senders[0].ratio)
            )
        );
        assert_eq!(
            lines[1],
            "[2025-12-05T02:00:00.123] rank=0 [     100      100 10000000      100]"
        );
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn python_float_repr() {
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(15.736), "15.736");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(2.5e-5), "2.5e-05");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(0.0), "0.0");
    }

    #[test]
    fn events_say_what_and_whom_in_json_and_words() {
        let key = WindowKey {
            ep_group_id: 0xab,
            instance_id: "u".into(),
            phase: Phase::Dispatch,
            window_seq: 4,
        };
        let e = EpEvent::incomplete(&key, 9, 16, vec![7]);
        let j = serde_json::to_value(&e).unwrap();
        assert_eq!(
            j["incomplete_window"]["missing_rows"],
            serde_json::json!([7])
        );
        assert_eq!(j["N"], 16);
        assert_eq!(
            e.summary(),
            "dispatch window 4 of EP group 0xab (EP 16): incomplete, no report from rank(s) 7"
        );
        let m = WaitMatrix::from_fn(8, |i, j| if j == 3 && i != 3 { 1e6 } else { 10.0 });
        let e = EpEvent::of(&key, 9, 8, &detect(&m, &DetectConfig::default(), 1));
        let j = serde_json::to_value(&e).unwrap();
        assert_eq!(j["findings"][0]["kind"], "sender_slow");
        assert_eq!(j["findings"][0]["rank"], 3);
        assert!(
            e.summary().contains("rank 3 is a slow sender"),
            "{}",
            e.summary()
        );
    }
}

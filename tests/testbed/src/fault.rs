//! Injectable faults: the `--fault SPEC` syntax (also used by a scenario's `faults = [...]`).
//!
//! ```text
//! slow:rank=R,ms=X[,steps=A..B] | hang:rank=R,step=S | pyhang:rank=R,step=S | kill:rank=R,step=S
//! | mismatch:rank=R,step=S | stall:rank=R,step=S,ms=X[,every=N] | slowlink:a=R1,b=R2,rate=10mbit
//! | droplink:a=R1,b=R2,pct=P | loss:pct=P | early:rank=R,ms=X[,steps=A..B] | mute:rank=R,step=S
//! ```
//! Steps are 0-based; `steps=A..B` includes both ends. `stall` is a healthy event (a checkpoint or
//! evaluation pass): no culprit, the run completes.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The accepted forms, quoted in every parse error.
pub const FAULT_FORMS: &str =
    "slow:rank=R,ms=X[,steps=A..B] | hang:rank=R,step=S | pyhang:rank=R,step=S \
| kill:rank=R,step=S | mismatch:rank=R,step=S | stall:rank=R,step=S,ms=X[,every=N] \
| slowlink:a=R1,b=R2,rate=10mbit | droplink:a=R1,b=R2,pct=P | loss:pct=P \
| early:rank=R,ms=X[,steps=A..B] | mute:rank=R,step=S";

/// One injected fault, as parsed (and as written to `truth.json`, tagged by `kind`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Fault {
    /// `rank` computes `ms` longer in each step of `steps` (all steps when absent).
    Slow {
        rank: usize,
        ms: f64,
        #[serde(skip_serializing_if = "Option::is_none")]
        steps: Option<(u32, u32)>,
    },
    /// `rank` blocks forever in native code (libc `pause()`) during compute of `step`.
    Hang { rank: usize, step: u32 },
    /// `rank` spins forever in a pure-Python function during compute of `step`.
    Pyhang { rank: usize, step: u32 },
    /// `rank` kills itself with SIGKILL during compute of `step`.
    Kill { rank: usize, step: u32 },
    /// `rank` issues a different collective (doubled count) at the end of `step`.
    Mismatch { rank: usize, step: u32 },
    /// A finite, healthy stall (checkpoint, evaluation): `rank` computes `ms` longer at the start
    /// of `step`, and again every `every` steps after it when given. Not a culprit.
    Stall {
        rank: usize,
        step: u32,
        ms: f64,
        #[serde(skip_serializing_if = "Option::is_none")]
        every: Option<u32>,
    },
    /// Traffic from the host of rank `a` to the host of rank `b` is shaped to `rate` (tc tbf).
    Slowlink { a: usize, b: usize, rate: String },
    /// `pct` percent of the packets from the host of rank `a` to the host of rank `b` are lost
    /// on the way (dropped as they arrive at `b`'s host: a lossy link; TCP retransmits them).
    Droplink { a: usize, b: usize, pct: f64 },
    /// `pct` percent of the Coll/P2p operations are not delivered to the profiler.
    Loss { pct: f64 },
    /// Every rank but `rank` computes `ms` longer at the start of each step of `steps`: `rank`
    /// enters its first receive early (less compute), a MoE slow receiver.
    Early {
        rank: usize,
        ms: f64,
        #[serde(skip_serializing_if = "Option::is_none")]
        steps: Option<(u32, u32)>,
    },
    /// `rank`'s MoE EP reporter (`[moe] reporter`) writes nothing from `step` on; the rank keeps
    /// training.
    Mute { rank: usize, step: u32 },
}

/// A bad `--fault` SPEC; the message names the SPEC and the accepted forms.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("bad fault spec `{spec}`: {reason} (accepted: {FAULT_FORMS})")]
pub struct FaultSpecError {
    pub spec: String,
    pub reason: String,
}

impl Fault {
    /// The ranks this fault makes a culprit (slow link: both ends; stall, loss: none).
    pub fn culprits(&self) -> Vec<usize> {
        match self {
            Fault::Stall { .. } => vec![],
            Fault::Slow { rank, .. }
            | Fault::Hang { rank, .. }
            | Fault::Pyhang { rank, .. }
            | Fault::Kill { rank, .. }
            | Fault::Mismatch { rank, .. }
            | Fault::Early { rank, .. }
            | Fault::Mute { rank, .. } => vec![*rank],
            Fault::Slowlink { a, b, .. } | Fault::Droplink { a, b, .. } => vec![*a, *b],
            Fault::Loss { .. } => vec![],
        }
    }

    /// Every rank the fault names (for range checks).
    pub fn ranks(&self) -> Vec<usize> {
        match self {
            Fault::Stall { rank, .. } => vec![*rank],
            _ => self.culprits(),
        }
    }

    /// The kind word of the SPEC.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Slow { .. } => "slow",
            Fault::Hang { .. } => "hang",
            Fault::Pyhang { .. } => "pyhang",
            Fault::Kill { .. } => "kill",
            Fault::Mismatch { .. } => "mismatch",
            Fault::Stall { .. } => "stall",
            Fault::Slowlink { .. } => "slowlink",
            Fault::Droplink { .. } => "droplink",
            Fault::Loss { .. } => "loss",
            Fault::Early { .. } => "early",
            Fault::Mute { .. } => "mute",
        }
    }

    /// Extra compute (ms) this fault adds to `rank` in `step`.
    pub fn slow_ms(&self, rank: usize, step: u32) -> f64 {
        match self {
            Fault::Slow { rank: r, ms, steps } if *r == rank => in_steps(*ms, steps, step),
            Fault::Early { rank: r, ms, steps } if *r != rank => in_steps(*ms, steps, step),
            _ => 0.0,
        }
    }

    /// Extra compute (ms) a `stall` adds to `rank` at the start of `step`.
    pub fn stall_ms(&self, rank: usize, step: u32) -> f64 {
        match self {
            Fault::Stall {
                rank: r,
                step: s,
                ms,
                every,
            } if *r == rank && step >= *s => match every {
                None if step == *s => *ms,
                Some(n) if (step - s).is_multiple_of(*n) => *ms,
                _ => 0.0,
            },
            _ => 0.0,
        }
    }
}

/// `ms` when `step` is in `steps` (all steps when absent), else 0.
fn in_steps(ms: f64, steps: &Option<(u32, u32)>, step: u32) -> f64 {
    match steps {
        Some((a, b)) if step < *a || step > *b => 0.0,
        _ => ms,
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Slow { rank, ms, steps } | Fault::Early { rank, ms, steps } => {
                write!(f, "{}:rank={rank},ms={ms}", self.kind())?;
                if let Some((a, b)) = steps {
                    write!(f, ",steps={a}..{b}")?;
                }
                Ok(())
            }
            Fault::Hang { rank, step }
            | Fault::Pyhang { rank, step }
            | Fault::Kill { rank, step }
            | Fault::Mismatch { rank, step }
            | Fault::Mute { rank, step } => {
                write!(f, "{}:rank={rank},step={step}", self.kind())
            }
            Fault::Stall {
                rank,
                step,
                ms,
                every,
            } => {
                write!(f, "stall:rank={rank},step={step},ms={ms}")?;
                if let Some(n) = every {
                    write!(f, ",every={n}")?;
                }
                Ok(())
            }
            Fault::Slowlink { a, b, rate } => write!(f, "slowlink:a={a},b={b},rate={rate}"),
            Fault::Droplink { a, b, pct } => write!(f, "droplink:a={a},b={b},pct={pct}"),
            Fault::Loss { pct } => write!(f, "loss:pct={pct}"),
        }
    }
}

impl FromStr for Fault {
    type Err = FaultSpecError;

    fn from_str(spec: &str) -> Result<Fault, FaultSpecError> {
        parse(spec).map_err(|reason| FaultSpecError {
            spec: spec.to_string(),
            reason,
        })
    }
}

/// Key/value arguments of one SPEC, each taken at most once.
struct Args(BTreeMap<String, String>);

impl Args {
    fn take(&mut self, key: &str) -> Result<String, String> {
        self.0
            .remove(key)
            .ok_or_else(|| format!("missing `{key}=`"))
    }

    fn num<T: FromStr>(&mut self, key: &str) -> Result<T, String> {
        let v = self.take(key)?;
        v.parse()
            .map_err(|_| format!("`{key}={v}` is not a valid number"))
    }

    fn finish(self) -> Result<(), String> {
        match self.0.keys().next() {
            Some(k) => Err(format!("unknown key `{k}`")),
            None => Ok(()),
        }
    }
}

fn parse(spec: &str) -> Result<Fault, String> {
    let (kind, rest) = spec
        .split_once(':')
        .ok_or_else(|| "expected `KIND:key=value,...`".to_string())?;
    let mut map = BTreeMap::new();
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("`{kv}` is not key=value"))?;
        if map
            .insert(k.trim().to_string(), v.trim().to_string())
            .is_some()
        {
            return Err(format!("key `{k}` given twice"));
        }
    }
    let mut a = Args(map);
    let fault = match kind.trim() {
        "slow" | "early" => {
            let rank = a.num("rank")?;
            let ms: f64 = a.num("ms")?;
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(format!("`ms={ms}` must be >= 0"));
            }
            let steps = match a.0.remove("steps") {
                None => None,
                Some(r) => Some(parse_range(&r)?),
            };
            if kind.trim() == "slow" {
                Fault::Slow { rank, ms, steps }
            } else {
                Fault::Early { rank, ms, steps }
            }
        }
        "mute" => Fault::Mute {
            rank: a.num("rank")?,
            step: a.num("step")?,
        },
        "hang" => Fault::Hang {
            rank: a.num("rank")?,
            step: a.num("step")?,
        },
        "pyhang" => Fault::Pyhang {
            rank: a.num("rank")?,
            step: a.num("step")?,
        },
        "kill" => Fault::Kill {
            rank: a.num("rank")?,
            step: a.num("step")?,
        },
        "mismatch" => Fault::Mismatch {
            rank: a.num("rank")?,
            step: a.num("step")?,
        },
        "stall" => {
            let rank = a.num("rank")?;
            let step = a.num("step")?;
            let ms: f64 = a.num("ms")?;
            if !(ms.is_finite() && ms > 0.0) {
                return Err(format!("`ms={ms}` must be > 0"));
            }
            let every = match a.0.remove("every") {
                None => None,
                Some(v) => match v.parse::<u32>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => return Err(format!("`every={v}` must be a whole number >= 1")),
                },
            };
            Fault::Stall {
                rank,
                step,
                ms,
                every,
            }
        }
        "slowlink" => {
            let a_rank = a.num("a")?;
            let b_rank = a.num("b")?;
            let rate = a.take("rate")?;
            parse_rate(&rate)?;
            if a_rank == b_rank {
                return Err("`a` and `b` must differ".into());
            }
            Fault::Slowlink {
                a: a_rank,
                b: b_rank,
                rate,
            }
        }
        "droplink" => {
            let (a_rank, b_rank): (usize, usize) = (a.num("a")?, a.num("b")?);
            let pct: f64 = a.num("pct")?;
            if a_rank == b_rank {
                return Err("`a` and `b` must differ".into());
            }
            if !(pct > 0.0 && pct < 100.0) {
                return Err(format!("`pct={pct}` must be within 0..100 (exclusive)"));
            }
            Fault::Droplink {
                a: a_rank,
                b: b_rank,
                pct,
            }
        }
        "loss" => {
            let pct: f64 = a.num("pct")?;
            if !(0.0..=100.0).contains(&pct) {
                return Err(format!("`pct={pct}` must be within 0..100"));
            }
            Fault::Loss { pct }
        }
        other => return Err(format!("unknown fault kind `{other}`")),
    };
    a.finish()?;
    Ok(fault)
}

fn parse_range(r: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`steps={r}` is not A..B");
    let (a, b) = r.split_once("..").ok_or_else(bad)?;
    let a: u32 = a.trim().parse().map_err(|_| bad())?;
    let b: u32 = b
        .trim()
        .trim_start_matches('=')
        .parse()
        .map_err(|_| bad())?;
    if b < a {
        return Err(format!("`steps={r}`: end before start"));
    }
    Ok((a, b))
}

/// A tc rate (`10mbit`, `500kbit`, `1gbit`, `8000bit`) in bits per second.
pub fn parse_rate(rate: &str) -> Result<u64, String> {
    let r = rate.to_ascii_lowercase();
    let (num, mult) = [
        ("gbit", 1_000_000_000u64),
        ("mbit", 1_000_000),
        ("kbit", 1_000),
        ("bit", 1),
    ]
    .iter()
    .find_map(|(suf, m)| r.strip_suffix(suf).map(|n| (n.to_string(), *m)))
    .ok_or_else(|| format!("`rate={rate}` needs a unit: bit, kbit, mbit or gbit"))?;
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`rate={rate}` is not a number with a unit"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("`rate={rate}` must be > 0"));
    }
    Ok((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Fault {
        s.parse().unwrap()
    }

    fn err(s: &str) -> String {
        s.parse::<Fault>().unwrap_err().to_string()
    }

    #[test]
    fn every_accepted_form_parses_and_prints_back() {
        let cases = [
            "slow:rank=3,ms=50",
            "slow:rank=3,ms=12.5,steps=5..10",
            "hang:rank=2,step=5",
            "pyhang:rank=1,step=0",
            "kill:rank=7,step=3",
            "mismatch:rank=0,step=2",
            "stall:rank=3,step=2,ms=2500",
            "stall:rank=0,step=1,ms=1500.5,every=3",
            "slowlink:a=0,b=4,rate=10mbit",
            "droplink:a=0,b=4,pct=2.5",
            "loss:pct=5",
            "early:rank=4,ms=30",
            "early:rank=4,ms=30,steps=2..9",
            "mute:rank=7,step=12",
        ];
        for c in cases {
            assert_eq!(p(c).to_string(), c);
        }
        assert_eq!(
            p("slow:rank=3,ms=50,steps=5..10"),
            Fault::Slow {
                rank: 3,
                ms: 50.0,
                steps: Some((5, 10))
            }
        );
    }

    #[test]
    fn errors_name_the_spec_the_problem_and_the_forms() {
        let e = err("hang:rank=2");
        assert!(
            e.starts_with("bad fault spec `hang:rank=2`: missing `step=`"),
            "{e}"
        );
        assert!(e.contains("pyhang:rank=R,step=S"), "{e}");
        assert!(!e.contains('\n'));
        assert!(err("frobnicate:rank=1").contains("unknown fault kind `frobnicate`"));
        assert!(err("kill:rank=x,step=1").contains("`rank=x` is not a valid number"));
        assert!(err("kill:rank=1,step=1,color=red").contains("unknown key `color`"));
        assert!(err("slow:rank=1,ms=5,steps=9..2").contains("end before start"));
        assert!(err("slowlink:a=1,b=1,rate=1mbit").contains("must differ"));
        assert!(err("slowlink:a=1,b=2,rate=fast").contains("needs a unit"));
        assert!(err("droplink:a=1,b=1,pct=5").contains("must differ"));
        assert!(err("droplink:a=1,b=2,pct=100").contains("within 0..100"));
        assert!(err("droplink:a=1,b=2").contains("missing `pct=`"));
        assert!(err("stall:rank=1,step=2,ms=0").contains("must be > 0"));
        assert!(err("stall:rank=1,step=2,ms=5,every=0").contains("`every=0` must be"));
        assert!(err("stall:rank=1,ms=5").contains("missing `step=`"));
        assert!(err("loss:pct=150").contains("within 0..100"));
        assert!(err("nocolon").contains("expected `KIND:key=value"));
    }

    #[test]
    fn slow_applies_only_to_its_rank_and_steps() {
        let f = p("slow:rank=1,ms=20,steps=2..3");
        assert_eq!(f.slow_ms(1, 2), 20.0);
        assert_eq!(f.slow_ms(1, 3), 20.0);
        assert_eq!(f.slow_ms(1, 4), 0.0);
        assert_eq!(f.slow_ms(0, 2), 0.0);
        assert_eq!(p("slow:rank=1,ms=5").slow_ms(1, 999), 5.0);
    }

    #[test]
    fn early_slows_every_other_rank_and_names_its_own() {
        let f = p("early:rank=1,ms=20,steps=2..3");
        assert_eq!(f.slow_ms(1, 2), 0.0);
        assert_eq!(f.slow_ms(0, 2), 20.0);
        assert_eq!(f.slow_ms(5, 3), 20.0);
        assert_eq!(f.slow_ms(5, 4), 0.0);
        assert_eq!(f.culprits(), vec![1]);
        let m = p("mute:rank=3,step=4");
        assert_eq!(
            (m.culprits(), m.slow_ms(3, 4), m.kind()),
            (vec![3], 0.0, "mute")
        );
    }

    #[test]
    fn stall_hits_its_step_and_every_nth_after_and_is_no_culprit() {
        let once = p("stall:rank=2,step=3,ms=1500");
        assert_eq!(once.stall_ms(2, 3), 1500.0);
        assert_eq!(once.stall_ms(2, 4), 0.0);
        assert_eq!(once.stall_ms(2, 2), 0.0);
        assert_eq!(once.stall_ms(1, 3), 0.0);
        assert_eq!(once.slow_ms(2, 3), 0.0);
        let every = p("stall:rank=2,step=1,ms=100,every=3");
        let hits: Vec<u32> = (0..12).filter(|s| every.stall_ms(2, *s) > 0.0).collect();
        assert_eq!(hits, vec![1, 4, 7, 10]);
        assert!(every.culprits().is_empty());
        assert_eq!(every.ranks(), vec![2]);
        assert_eq!(
            serde_json::to_value(&every).unwrap(),
            serde_json::json!({"kind": "stall", "rank": 2, "step": 1, "ms": 100.0, "every": 3})
        );
    }

    #[test]
    fn rates_and_culprits() {
        assert_eq!(parse_rate("10mbit"), Ok(10_000_000));
        assert_eq!(parse_rate("1.5gbit"), Ok(1_500_000_000));
        assert_eq!(p("slowlink:a=0,b=4,rate=1mbit").culprits(), vec![0, 4]);
        assert_eq!(p("droplink:a=1,b=6,pct=3").culprits(), vec![1, 6]);
        assert!(p("loss:pct=1").culprits().is_empty());
        let json = serde_json::to_value(p("hang:rank=2,step=5")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "hang", "rank": 2, "step": 5})
        );
    }
}

//! The scenario generator of `eval hang`: seeded and deterministic (case `i` of seed `S` is the
//! same on every machine), every case a valid test-bed run (layout rescaled within `max_ranks`,
//! at least two hosts, the workload fits the layout, the faults fit the ranks and steps).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::fault::Fault;
use crate::layout::{check_hosts, Layout};
use crate::plan::check_faults;
use crate::scenario::{check_workload, Scenario};

use super::EvalError;

/// What a case injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaseKind {
    /// `hang:` (native compute hang) on a random rank.
    Hang,
    /// `pyhang:` (pure-Python spin) on a random rank.
    Pyhang,
    /// `kill:` (SIGKILL) on a random rank.
    Kill,
    /// `mismatch:` (doubled count of the step anchor) on a random rank.
    Mismatch,
    /// `hang:` on a middle pipeline stage of a pp >= 4 layout (the wait propagates up and down).
    PpChain,
    /// No culprit: `stall:` faults longer than the overdue threshold and `slow:` jitter.
    Healthy,
}

impl CaseKind {
    /// The kinds with a culprit, in the order cases cycle through them.
    pub const FAULTY: [CaseKind; 5] = [
        CaseKind::Hang,
        CaseKind::Pyhang,
        CaseKind::Kill,
        CaseKind::Mismatch,
        CaseKind::PpChain,
    ];

    /// The word used in tables and `eval-hang.json`.
    pub fn name(self) -> &'static str {
        match self {
            CaseKind::Hang => "hang",
            CaseKind::Pyhang => "pyhang",
            CaseKind::Kill => "kill",
            CaseKind::Mismatch => "mismatch",
            CaseKind::PpChain => "pp-chain",
            CaseKind::Healthy => "healthy",
        }
    }

    /// Verdict kinds that count as correct for the first verdict (`kill`: `failure` when the
    /// analysis can see processes; an offline synthetic run has none, so `hang` is fine there).
    pub fn expected_verdicts(self, synthetic: bool) -> Vec<String> {
        let v: &[&str] = match self {
            CaseKind::Hang | CaseKind::Pyhang | CaseKind::PpChain => &["hang"],
            CaseKind::Kill if synthetic => &["failure", "hang"],
            CaseKind::Kill => &["failure"],
            CaseKind::Mismatch => &["mismatch"],
            CaseKind::Healthy => &[],
        };
        v.iter().map(|s| s.to_string()).collect()
    }
}

/// The shipped scenarios the evaluation draws layouts from.
pub const LAYOUTS: [&str; 7] = ["megatron", "pipeline", "moe", "cp", "ddp", "fsdp", "decode"];

/// Scenario files by name (stem), loaded once.
pub type ScenarioSet = BTreeMap<String, Scenario>;

/// Load [`LAYOUTS`] from `dir` (the repository's `tests/scenarios`).
pub fn load_scenarios(dir: &Path) -> Result<ScenarioSet, EvalError> {
    LAYOUTS
        .iter()
        .map(|name| {
            let path = dir.join(format!("{name}.toml"));
            Scenario::load(&path)
                .map(|s| (name.to_string(), s))
                .map_err(|e| EvalError::Scenario(e.to_string()))
        })
        .collect()
}

/// How cases are drawn.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// `--synthetic` runs (longer runs and stalls cost no wall time there).
    pub synthetic: bool,
    /// Largest world size drawn.
    pub max_ranks: usize,
    /// The overdue threshold the runs use (`COMMINSIGHT_OVERDUE_MS`); stalls are longer.
    pub overdue_ms: u64,
    /// Real runs with a blocking fault end at overdue threshold + this + the fault's step (s).
    pub margin_s: u64,
}

/// One generated run and what the analysis should find.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// Position in the generated list (`--only`).
    pub index: usize,
    /// The case's own seed (also the test bed's `--seed`).
    pub seed: u64,
    /// What is injected.
    pub kind: CaseKind,
    /// Scenario name (`tests/scenarios/<name>.toml`).
    pub scenario: String,
    /// World size (`--ranks`).
    pub ranks: usize,
    /// Simulated hosts (`--hosts`).
    pub hosts: usize,
    /// Steps (`--steps`).
    pub steps: u32,
    /// `--fault` SPECs.
    pub faults: Vec<String>,
    /// Ranks a top-1 source rank must be one of (the faults' culprits).
    pub culprit_ranks: Vec<usize>,
    /// Verdict kinds accepted for the first verdict (empty: no verdict expected).
    pub expected_verdicts: Vec<String>,
    /// The test bed's `--timeout` (s).
    pub timeout_s: u64,
}

/// SplitMix64: small, seeded, good enough to draw test cases.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// The seed of case `index` of a run seeded `seed`.
pub fn case_seed(seed: u64, index: usize) -> u64 {
    let mut r = Rng::new(seed ^ (index as u64).wrapping_mul(0xd134_2543_de82_ef95));
    r.next_u64()
}

/// `faulty` cases cycling through [`CaseKind::FAULTY`], then `healthy` healthy ones.
pub fn generate(
    set: &ScenarioSet,
    seed: u64,
    faulty: usize,
    healthy: usize,
    opts: &GenOptions,
) -> Result<Vec<Case>, EvalError> {
    (0..faulty + healthy)
        .map(|i| {
            let kind = if i < faulty {
                CaseKind::FAULTY[i % CaseKind::FAULTY.len()]
            } else {
                CaseKind::Healthy
            };
            gen_case(set, i, kind, case_seed(seed, i), opts)
        })
        .collect()
}

/// Draw one valid case of `kind` (up to 200 attempts).
pub fn gen_case(
    set: &ScenarioSet,
    index: usize,
    kind: CaseKind,
    seed: u64,
    opts: &GenOptions,
) -> Result<Case, EvalError> {
    let mut rng = Rng::new(seed);
    let names: Vec<&String> = set
        .iter()
        .filter(|(_, s)| kind != CaseKind::PpChain || s.layout.pp >= 4)
        .map(|(n, _)| n)
        .collect();
    if names.is_empty() {
        return Err(EvalError::NoCase {
            kind: kind.name(),
            max_ranks: opts.max_ranks,
        });
    }
    for _ in 0..200 {
        let name = *rng.pick(&names);
        let s = &set[name];
        let Some(layout) = pick_layout(&mut rng, s, opts.max_ranks) else {
            continue;
        };
        let world = layout.world();
        let per_host: Vec<usize> = [1, 2, 4, 8]
            .into_iter()
            .filter(|p| world % p == 0 && world / p >= 2)
            .collect();
        if per_host.is_empty() {
            continue;
        }
        let hosts = world / *rng.pick(&per_host);
        let (steps, faults) = if kind == CaseKind::Healthy {
            healthy_faults(&mut rng, world, opts)
        } else {
            let steps = if opts.synthetic {
                rng.range(4, 10)
            } else {
                rng.range(3, 5)
            } as u32;
            let step = rng.below(u64::from(steps) - 1) as u32;
            let Some(rank) = pick_culprit(&mut rng, &layout, kind) else {
                continue;
            };
            let f = match kind {
                CaseKind::Pyhang => Fault::Pyhang { rank, step },
                CaseKind::Kill => Fault::Kill { rank, step },
                CaseKind::Mismatch => Fault::Mismatch { rank, step },
                _ => Fault::Hang { rank, step },
            };
            (steps, vec![f])
        };
        if check_workload(&s.workload, &layout).is_err()
            || check_hosts(world, hosts).is_err()
            || check_faults(&faults, world, steps).is_err()
        {
            continue;
        }
        let mut culprits: Vec<usize> = faults.iter().flat_map(Fault::culprits).collect();
        culprits.sort_unstable();
        culprits.dedup();
        let timeout_s = match (&faults[..], opts.synthetic) {
            (_, true) => 600,
            (_, false) if kind == CaseKind::Healthy => 300,
            (
                [Fault::Hang { step, .. }
                | Fault::Pyhang { step, .. }
                | Fault::Kill { step, .. }
                | Fault::Mismatch { step, .. }],
                false,
            ) => opts.overdue_ms.div_ceil(1000) + opts.margin_s + u64::from(*step),
            _ => 300,
        };
        return Ok(Case {
            index,
            seed,
            kind,
            scenario: name.clone(),
            ranks: world,
            hosts,
            steps,
            faults: faults.iter().map(ToString::to_string).collect(),
            culprit_ranks: culprits,
            expected_verdicts: kind.expected_verdicts(opts.synthetic),
            timeout_s,
        });
    }
    Err(EvalError::NoCase {
        kind: kind.name(),
        max_ranks: opts.max_ranks,
    })
}

/// The scenario's layout with dp rescaled to a random valid size (world <= `max_ranks`, >= 2):
/// a power-of-two multiple of the smallest dp two times in three, any multiple otherwise.
pub(crate) fn pick_layout(rng: &mut Rng, s: &Scenario, max_ranks: usize) -> Option<Layout> {
    let base = s.layout();
    let unit = base.tp * base.cp * base.pp * base.ep;
    let sizes: Vec<Layout> = (1..=max_ranks / unit.max(1))
        .filter_map(|k| base.rescaled(unit * k).ok())
        .filter(|l| l.world() >= 2 && check_workload(&s.workload, l).is_ok())
        .collect();
    if sizes.is_empty() {
        return None;
    }
    let pow2: Vec<&Layout> = sizes
        .iter()
        .filter(|l| (l.dp / base.ep).is_power_of_two())
        .collect();
    if !pow2.is_empty() && rng.below(3) < 2 {
        Some(**rng.pick(&pow2))
    } else {
        Some(*rng.pick(&sizes))
    }
}

/// A rank to break: any, or for a PP chain one on a middle stage.
fn pick_culprit(rng: &mut Rng, l: &Layout, kind: CaseKind) -> Option<usize> {
    if kind != CaseKind::PpChain {
        return Some(rng.below(l.world() as u64) as usize);
    }
    let middle: Vec<usize> = (0..l.world())
        .filter(|r| {
            let pp = l.coords(*r).pp;
            pp > 0 && pp + 1 < l.pp
        })
        .collect();
    (!middle.is_empty()).then(|| *rng.pick(&middle))
}

/// A healthy run: 1..=3 (real: 1..=2) stalls on distinct ranks, longer than the overdue
/// threshold (x1.3..x3, real x1.3..x2), one in three repeating `every` 2 or 3 steps, and half the
/// time a `slow:` rank (1..20 ms over a step range).
fn healthy_faults(rng: &mut Rng, world: usize, opts: &GenOptions) -> (u32, Vec<Fault>) {
    let steps = if opts.synthetic {
        rng.range(4, 10)
    } else {
        rng.range(4, 6)
    } as u32;
    let (max_stalls, max_factor) = if opts.synthetic { (3, 3.0) } else { (2, 2.0) };
    let n = rng.range(1, max_stalls.min(world as u64));
    let mut ranks: Vec<usize> = Vec::new();
    while (ranks.len() as u64) < n {
        let r = rng.below(world as u64) as usize;
        if !ranks.contains(&r) {
            ranks.push(r);
        }
    }
    let mut faults: Vec<Fault> = ranks
        .into_iter()
        .map(|rank| {
            let factor = 1.3 + rng.unit() * (max_factor - 1.3);
            Fault::Stall {
                rank,
                step: rng.below(u64::from(steps)) as u32,
                ms: (opts.overdue_ms as f64 * factor).round(),
                every: (rng.below(3) == 0).then(|| rng.range(2, 3) as u32),
            }
        })
        .collect();
    if rng.below(2) == 0 {
        let a = rng.below(u64::from(steps)) as u32;
        let b = rng.range(u64::from(a), u64::from(steps) - 1) as u32;
        faults.push(Fault::Slow {
            rank: rng.below(world as u64) as usize,
            ms: rng.range(1, 20) as f64,
            steps: Some((a, b)),
        });
    }
    (steps, faults)
}

//! Classification hint of the culprits (ranks whose multi-step index is above the threshold;
//! every other rank is [`StragglerClass::None`]). The rule, in order:
//!
//! 1. **structural**: the culprits over the threshold in at least 80% of their complete steps
//!    ("persistent") are at least 2, at least 80% of all culprits, their indices within a factor
//!    of 2 of each other (min ≥ max / 2: a group equally late, not one slow rank and the peers it
//!    delays), and connected through communicators they share (collective communicators that
//!    are not job-wide: a stage's TP and DP groups join that stage's ranks, a PP pair or the
//!    world group does not). Those persistent culprits are structural.
//! 2. Otherwise, with `lateness` = mean over the rank's instances of (its arrival − the
//!    instance's median arrival) and `dur_ratio` = mean of (its duration / the instance's
//!    median duration): `dur_ratio > 1.5` → **comm-slow** (its operations are long);
//!    else `lateness > 0` → **compute-slow** (it arrives late, its operations are normal);
//!    else **comm-slow** (it does not arrive late, yet the others wait for it).
//!
//! The class never changes the index.

use std::collections::{BTreeMap, BTreeSet};

use super::model::StragglerClass;

/// Fraction of the steps / culprits that makes a group persistent (rule 1).
const PERSISTENT: f64 = 0.8;
/// Mean duration ratio above which a culprit is comm-slow.
const COMM_SLOW_DUR_RATIO: f64 = 1.5;

/// Per rank and step: how its arrivals and durations compare with the other members of its
/// instances (for the classification).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Shape {
    /// Σ (own arrival − the instance's median arrival), µs.
    pub late_sum: f64,
    /// Instances counted in `late_sum`.
    pub late_n: u64,
    /// Σ (own duration / the instance's median duration), over instances with a median > 0.
    pub dur_sum: f64,
    pub dur_n: u64,
}

/// What the classification knows of a rank.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankShape {
    pub rank: i64,
    pub index: f64,
    pub complete_steps: u64,
    pub steps_over: u64,
    pub shape: Shape,
    /// Collective communicators the rank was seen in, job-wide ones left out.
    pub comms: Vec<u64>,
}

impl RankShape {
    fn lateness(&self) -> f64 {
        if self.shape.late_n == 0 {
            0.0
        } else {
            self.shape.late_sum / self.shape.late_n as f64
        }
    }

    fn dur_ratio(&self) -> f64 {
        if self.shape.dur_n == 0 {
            1.0
        } else {
            self.shape.dur_sum / self.shape.dur_n as f64
        }
    }

    fn persistent(&self) -> bool {
        self.complete_steps > 0 && self.steps_over as f64 >= PERSISTENT * self.complete_steps as f64
    }
}

/// Union-find root.
fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// The structural group among the culprits (rule 1), empty when there is none.
fn structural(culprits: &[&RankShape]) -> BTreeSet<i64> {
    let p: Vec<&RankShape> = culprits
        .iter()
        .copied()
        .filter(|r| r.persistent())
        .collect();
    if p.len() < 2 || (p.len() as f64) < PERSISTENT * culprits.len() as f64 {
        return BTreeSet::new();
    }
    let max = p.iter().map(|r| r.index).fold(0.0, f64::max);
    let min = p.iter().map(|r| r.index).fold(f64::INFINITY, f64::min);
    if min < max / 2.0 {
        return BTreeSet::new();
    }
    let mut parent: Vec<usize> = (0..p.len()).collect();
    let mut first_of: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, r) in p.iter().enumerate() {
        for c in &r.comms {
            match first_of.get(c) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a] = b;
                }
                None => {
                    first_of.insert(*c, i);
                }
            }
        }
    }
    let r0 = root(&mut parent, 0);
    if (0..p.len()).all(|i| root(&mut parent, i) == r0) {
        p.iter().map(|r| r.rank).collect()
    } else {
        BTreeSet::new()
    }
}

/// Each rank's class and the one line behind it, in the order of `ranks`.
pub(crate) fn classify(ranks: &[RankShape], threshold: f64) -> Vec<(StragglerClass, String)> {
    let culprits: Vec<&RankShape> = ranks.iter().filter(|r| r.index > threshold).collect();
    let group = structural(&culprits);
    ranks
        .iter()
        .map(|r| {
            if r.index <= threshold {
                return (
                    StragglerClass::None,
                    format!("index {:.1} <= threshold {threshold:.1}", r.index),
                );
            }
            let (late, ratio) = (r.lateness(), r.dur_ratio());
            let nums = format!(
                "arrives {late:.0} us after the median on average, ops {ratio:.2}x the median duration"
            );
            if group.contains(&r.rank) {
                (
                    StragglerClass::Structural,
                    format!(
                        "{} ranks sharing communicators are over the threshold in >= 80% of steps ({}/{} here); {nums}",
                        group.len(),
                        r.steps_over,
                        r.complete_steps
                    ),
                )
            } else if ratio > COMM_SLOW_DUR_RATIO {
                (StragglerClass::CommSlow, format!("long ops: {nums}"))
            } else if late > 0.0 {
                (StragglerClass::ComputeSlow, format!("late arrival: {nums}"))
            } else {
                (
                    StragglerClass::CommSlow,
                    format!("not late yet waited for: {nums}"),
                )
            }
        })
        .collect()
}

//! Classification hint of the culprits. Every other rank is [`StragglerClass::None`].
//!
//! **On the root cause** ([`classify_root`], whenever the ranks' step starts were known, so that
//! own excess could be measured): the culprits are the ranks over the root rule
//! ([`super::root_over`]). In order:
//!
//! 1. **structural** (a whole stage or role is slower than the rest: data or schedule
//!    imbalance, reported as such and not as a straggler rank): ranks that are no root culprits
//!    (as fast as their role peers), whose role group is slower than the median rank over the
//!    whole step (`role_excess` above `root_min_delay`, the candidates' steps over:
//!    `role_steps_over`) and most of whose delay of others (`structural_share` >= 50%) neither
//!    their own excess nor waits they inherited explain, form a *group* on their role excess: a
//!    stage slower than the others in every replica. (Self time, not the waits they cause,
//!    tells an imbalance from a pipeline's bubbles: a balanced stage causes bubbles too, it is
//!    not slower.) Root culprits are never structural: a group of them (a first version called
//!    one structural) was, in the synthetic eval, a slow rank and the far end of a slow link.
//! 2. Otherwise a root culprit is **comm-slow** or **compute-slow** by the seed's rule 2 below.
//! 3. Any other rank is **none**; one that made others wait says the delay passed through it.
//!
//! **On the seed index** ([`classify`], the fallback when no step start was known, e.g. data
//! without the previous step's end): the culprits are the ranks whose multi-step index is above
//! the threshold. The rule, in order:
//!
//! 1. **structural**: the culprits form one *group*.
//! 2. Otherwise, with `lateness` = mean over the rank's instances of (its arrival − the
//!    instance's median arrival) and `dur_ratio` = mean of (its duration / the instance's
//!    median duration): `dur_ratio > 1.5` → **comm-slow** (its operations are long);
//!    else `lateness > 0` → **compute-slow** (it arrives late, its operations are normal);
//!    else **comm-slow** (it does not arrive late, yet the others wait for it).
//!
//! A *group*: the candidates over the threshold in at least 80% of their complete steps
//! ("persistent") are at least 2, at least 80% of all candidates, their values within a factor
//! of 2 of each other (min ≥ max / 2: a group equally late, not one slow rank and the peers it
//! delays), and connected through communicators they share (collective communicators that are
//! not job-wide: a stage's TP and DP groups join that stage's ranks, a PP pair or the world
//! group does not).
//!
//! The class never changes an index.

use std::collections::{BTreeMap, BTreeSet};

use super::model::StragglerClass;

/// Fraction of the steps / culprits that makes a group persistent (rule 1).
const PERSISTENT: f64 = 0.8;
/// Mean duration ratio above which a culprit is comm-slow.
const COMM_SLOW_DUR_RATIO: f64 = 1.5;
/// Share of a rank's delay (%) charged to no rank above which it can be structural (1b).
const STRUCTURAL_SHARE: f64 = 50.0;

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
    /// Root cause: the root index, and over the root rule on its multi-step values.
    pub root_index: f64,
    pub root_culprit: bool,
    /// [`super::model::RankSummary::structural_share`], `role_excess`, `role_steps_over`.
    pub structural_share: f64,
    pub role_excess: f64,
    pub role_steps_over: u64,
}

/// A candidate of a group: rank, value, persistent, communicators.
struct Cand<'a> {
    rank: i64,
    value: f64,
    persistent: bool,
    comms: &'a [u64],
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

    fn nums(&self) -> String {
        format!(
            "arrives {:.0} us after the median on average, ops {:.2}x the median duration",
            self.lateness(),
            self.dur_ratio()
        )
    }

    /// The seed's rule 2.
    fn late_or_long(&self) -> (StragglerClass, String) {
        let nums = self.nums();
        if self.dur_ratio() > COMM_SLOW_DUR_RATIO {
            (StragglerClass::CommSlow, format!("long ops: {nums}"))
        } else if self.lateness() > 0.0 {
            (StragglerClass::ComputeSlow, format!("late arrival: {nums}"))
        } else {
            (
                StragglerClass::CommSlow,
                format!("not late yet waited for: {nums}"),
            )
        }
    }

    fn cand(&self, value: f64, steps_over: u64) -> Cand<'_> {
        Cand {
            rank: self.rank,
            value,
            persistent: persistent(steps_over, self.complete_steps),
            comms: &self.comms,
        }
    }
}

fn persistent(over: u64, complete: u64) -> bool {
    complete > 0 && over as f64 >= PERSISTENT * complete as f64
}

/// Union-find root.
fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// The group among the candidates (module doc), empty when there is none.
fn group(cands: &[Cand]) -> BTreeSet<i64> {
    let p: Vec<&Cand> = cands.iter().filter(|r| r.persistent).collect();
    if p.len() < 2 || (p.len() as f64) < PERSISTENT * cands.len() as f64 {
        return BTreeSet::new();
    }
    let max = p.iter().map(|r| r.value).fold(0.0, f64::max);
    let min = p.iter().map(|r| r.value).fold(f64::INFINITY, f64::min);
    if min < max / 2.0 {
        return BTreeSet::new();
    }
    let mut parent: Vec<usize> = (0..p.len()).collect();
    let mut first_of: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, r) in p.iter().enumerate() {
        for c in r.comms {
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

/// Each rank's class and the one line behind it, in the order of `ranks`, on the seed index
/// (`threshold`: the seed's).
pub(crate) fn classify(ranks: &[RankShape], threshold: f64) -> Vec<(StragglerClass, String)> {
    let cands: Vec<Cand> = ranks
        .iter()
        .filter(|r| r.index > threshold)
        .map(|r| r.cand(r.index, r.steps_over))
        .collect();
    let group = group(&cands);
    ranks
        .iter()
        .map(|r| {
            if r.index <= threshold {
                (
                    StragglerClass::None,
                    format!("index {:.1} <= threshold {threshold:.1}", r.index),
                )
            } else if group.contains(&r.rank) {
                (
                    StragglerClass::Structural,
                    format!(
                        "{} ranks sharing communicators are over the threshold in >= 80% of steps ({}/{} here); {}",
                        group.len(),
                        r.steps_over,
                        r.complete_steps,
                        r.nums()
                    ),
                )
            } else {
                r.late_or_long()
            }
        })
        .collect()
}

/// Each rank's class and the one line behind it, in the order of `ranks`, on the root cause
/// (`threshold`: the seed's, for rule 1b).
pub(crate) fn classify_root(ranks: &[RankShape], threshold: f64) -> Vec<(StragglerClass, String)> {
    let unexplained: Vec<Cand> = ranks
        .iter()
        .filter(|r| {
            !r.root_culprit && r.role_steps_over > 0 && r.structural_share >= STRUCTURAL_SHARE
        })
        .map(|r| r.cand(r.role_excess, r.role_steps_over))
        .collect();
    let slow_stage = group(&unexplained);
    ranks
        .iter()
        .map(|r| {
            if slow_stage.contains(&r.rank) {
                (
                    StragglerClass::Structural,
                    format!(
                        "a role of {} ranks sharing communicators is {:.1} % of the step slower than the median rank in >= 80% of steps ({}/{} here), as fast as its peers; {:.0}% of the waits it caused are explained by no rank's excess: a stage or role imbalance, not one slow rank",
                        slow_stage.len(),
                        r.role_excess,
                        r.role_steps_over,
                        r.complete_steps,
                        r.structural_share
                    ),
                )
            } else if r.root_culprit {
                r.late_or_long()
            } else if r.index > threshold {
                (
                    StragglerClass::None,
                    format!(
                        "made others wait (index {:.1}) but its own time matches its role peers (root index {:.2}): the delay passed through it",
                        r.index, r.root_index
                    ),
                )
            } else {
                (
                    StragglerClass::None,
                    format!(
                        "root index {:.2}, index {:.1} <= threshold {threshold:.1}",
                        r.root_index, r.index
                    ),
                )
            }
        })
        .collect()
}

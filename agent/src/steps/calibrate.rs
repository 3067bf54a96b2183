//! Calibration (DESIGN.md §5.6): each rank's local step numbers aligned across ranks by the
//! identity of the step's anchor.
//!
//! The primary anchor is one instance of a communicator's operation (e.g. the step's tiny
//! `global` all-reduce): its NCCL sequence number `coll_sn` is the same on every member and
//! advances by the same amount every step. Per anchor communicator, `base` = the smallest
//! `coll_sn` seen on any rank and `stride` = the most common advance between consecutive steps;
//! a step anchored there is step `(coll_sn - base) / stride` of the job. A step without its
//! primary anchor (lost) takes the number after its predecessor's. A rank that lost events and
//! merged two steps is thereby realigned: the steps after the merge get their true numbers back.
//!
//! Raw summaries never change: calibration is a mapping `(rank, raw step) -> step`, previewed,
//! applied (saved with the job) or cleared.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fsm::StepSummary;

/// `(rank, raw step) -> calibrated step` for one job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calibration {
    /// Per rank: calibrated number of each raw step, in raw order.
    pub ranks: BTreeMap<i64, Vec<u64>>,
    /// Raw steps whose number moved.
    pub moved: u64,
    /// `(rank, raw step)` of steps that absorbed others: their number jumps by more than one
    /// from the previous step's (events lost, the steps in between merged into this one). Readers
    /// show them with `coverage_complete = false`.
    pub merged: Vec<(i64, u64)>,
}

impl Calibration {
    /// Whether `raw` on `rank` absorbed other steps.
    pub fn is_merged(&self, rank: i64, raw: u64) -> bool {
        self.merged.binary_search(&(rank, raw)).is_ok()
    }

    /// The calibrated number of `raw` on `rank` (itself when unknown).
    pub fn step(&self, rank: i64, raw: u64) -> u64 {
        self.ranks
            .get(&rank)
            .and_then(|v| v.get(raw as usize))
            .copied()
            .unwrap_or(raw)
    }
}

/// Compute the calibration of one job's steps (any order).
pub fn calibrate(steps: &[StepSummary]) -> Calibration {
    // Per anchor communicator: (rank, raw step, coll_sn) of primary anchors.
    let mut by_comm: BTreeMap<u64, Vec<(i64, u64, u64)>> = BTreeMap::new();
    for s in steps {
        if let (Some(a), Some(0)) = (s.anchor, s.anchor_alt) {
            by_comm
                .entry(a.comm_hash)
                .or_default()
                .push((s.rank, s.step, a.coll_sn));
        }
    }
    let mut scale: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (comm, v) in &mut by_comm {
        v.sort_unstable();
        let base = v.iter().map(|x| x.2).min().unwrap_or(0);
        let mut diffs: BTreeMap<u64, usize> = BTreeMap::new();
        for w in v.windows(2) {
            if w[0].0 == w[1].0 && w[1].1 == w[0].1 + 1 && w[1].2 > w[0].2 {
                *diffs.entry(w[1].2 - w[0].2).or_default() += 1;
            }
        }
        let stride = diffs
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map_or(1, |(d, _)| d);
        scale.insert(*comm, (base, stride));
    }
    let mut per_rank: BTreeMap<i64, Vec<&StepSummary>> = BTreeMap::new();
    for s in steps {
        per_rank.entry(s.rank).or_default().push(s);
    }
    let mut out = Calibration::default();
    for (rank, mut v) in per_rank {
        v.sort_by_key(|s| s.step);
        // Anchored numbers where the primary anchor is known.
        let anchored: Vec<Option<u64>> = v
            .iter()
            .map(|s| match (s.anchor, s.anchor_alt) {
                (Some(a), Some(0)) => {
                    let (base, stride) = scale.get(&a.comm_hash).copied()?;
                    let d = a.coll_sn.checked_sub(base)?;
                    d.is_multiple_of(stride).then(|| d / stride)
                }
                _ => None,
            })
            .collect();
        // Fill the gaps from the neighbours: forward from the last known, and before the first
        // known one backwards from it. Numbers only increase.
        let first_known = anchored.iter().position(Option::is_some);
        let mut ids = vec![0u64; v.len()];
        if let Some(k) = first_known {
            let known = anchored[k].expect("known");
            for (i, id) in ids.iter_mut().enumerate().take(k) {
                *id = known.saturating_sub((k - i) as u64);
            }
            let mut prev: Option<u64> = None;
            for i in k..v.len() {
                let next = prev.map_or(known, |p| p + 1);
                ids[i] = match anchored[i] {
                    Some(a) if prev.is_none_or(|p| a > p) => a,
                    _ => next,
                };
                prev = Some(ids[i]);
            }
        } else {
            for (i, s) in v.iter().enumerate() {
                ids[i] = s.step;
            }
        }
        // A rank's first step numbered above the job's first, although its stream starts with
        // it (operation 0), absorbed the steps before it.
        if ids.first().is_some_and(|id| *id > 0) && v[0].first.coll_local_sn == 0 {
            out.merged.push((rank, v[0].step));
        }
        for i in 1..ids.len() {
            if ids[i] > ids[i - 1] + 1 {
                out.merged.push((rank, v[i].step));
            }
        }
        out.moved += v.iter().zip(&ids).filter(|(s, id)| s.step != **id).count() as u64;
        out.ranks.insert(rank, ids);
    }
    out
}

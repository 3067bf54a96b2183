//! The second half of the root-cause pass over one step: the backward replay (Scalasca's
//! delay-cost analysis with peer-baselined delays, research note §3.2). Every wait is routed to
//! its delayer: the part its own excess self time since the previous synchronisation explains is
//! that rank's **root cost**; the part its own excess waits explain is passed back onto those
//! waits (and routed again when they are processed); the rest is **structural** (bubbles,
//! schedule), charged to no rank. Costs a wait inherited from later waits are split the same way.
//!
//! Order: an instance is processed once every instance after it in the program of each of its
//! members is (reverse topological order of the program-order graph, clock-free); a cycle (data
//! that contradicts itself) is broken at the latest-ending instance left.

use std::collections::{BTreeMap, VecDeque};

use super::super::model::InstanceKey;
use super::units::StepUnits;

/// What the replay charged, per dense rank.
#[derive(Clone, Debug, Default)]
pub(crate) struct Charged {
    /// Root cost per dense rank, µs.
    pub root: Vec<f64>,
    /// Of it, short-term (direct) cost per victim: rank -> (victim -> µs).
    pub direct: Vec<BTreeMap<u32, f64>>,
    /// Of it, long-term cost that came through a waiting rank: rank -> (intermediary -> µs).
    pub via: Vec<BTreeMap<u32, f64>>,
    /// The communicator over which each of a rank's waiting ranks (direct or via) waited for
    /// it (the first seen): rank -> (waiting rank -> communicator hash).
    pub hop: Vec<BTreeMap<u32, u64>>,
    /// Waiting charged to no rank, µs.
    pub structural: f64,
    /// Per dense rank: the waits it made others wait (its share as a delayer), µs, and of them
    /// the part charged to no rank (its own excess and inherited waits explain none of it).
    pub delayed: Vec<f64>,
    pub structural_by: Vec<f64>,
    /// All waiting, µs.
    pub total_wait: f64,
}

/// A Fenwick tree over one rank's units: range add, point query.
struct Fenwick(Vec<f64>);

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick(vec![0.0; n + 1])
    }
    fn add_from(&mut self, mut i: usize, v: f64) {
        i += 1;
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }
    /// Add `v` to every unit in `lo..hi`.
    fn range_add(&mut self, lo: usize, hi: usize, v: f64) {
        if lo < hi {
            self.add_from(lo, v);
            self.add_from(hi, -v);
        }
    }
    fn point(&self, i: usize) -> f64 {
        let (mut i, mut s) = (i + 1, 0.0);
        while i > 0 {
            s += self.0[i];
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// The instances in processing order (latest first).
pub(crate) fn order(su: &StepUnits) -> Vec<u32> {
    let n = su.instances.len();
    // succ -> pred edges along each rank's program: B after A means B is processed first.
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut indeg = vec![0u32; n];
    for r in &su.ranks {
        for w in r.units.windows(2) {
            for &b in r.insts(&w[1]) {
                for &a in r.insts(&w[0]) {
                    if a != b {
                        preds[b as usize].push(a);
                        indeg[a as usize] += 1;
                    }
                }
            }
        }
    }
    // Cycle breaking: the latest-ending instance not processed yet (ids by end, latest first,
    // and a cursor past the processed ones: linear over all breaks).
    let mut by_end: Vec<(u64, u32)> = su
        .instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let end = inst.members.iter().map(|m| m.2 + m.3).max().unwrap_or(0);
            (end, i as u32)
        })
        .collect();
    by_end.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut cursor = 0;
    let mut ready: VecDeque<u32> = (0..n as u32).filter(|i| indeg[*i as usize] == 0).collect();
    let mut done = vec![false; n];
    let mut out = Vec::with_capacity(n);
    loop {
        while let Some(i) = ready.pop_front() {
            if std::mem::replace(&mut done[i as usize], true) {
                continue;
            }
            out.push(i);
            for &p in &preds[i as usize] {
                indeg[p as usize] -= 1;
                if indeg[p as usize] == 0 {
                    ready.push_back(p);
                }
            }
        }
        if out.len() == n {
            return out;
        }
        // A cycle: break it at the latest-ending instance not processed.
        while done[by_end[cursor].1 as usize] {
            cursor += 1;
        }
        ready.push_back(by_end[cursor].1);
    }
}

/// Replay the waits of `su` backward (`order`: [`order`]).
pub(crate) fn replay(su: &StepUnits, order: &[u32]) -> Charged {
    let n = su.ranks.len();
    let mut c = Charged {
        root: vec![0.0; n],
        direct: vec![BTreeMap::new(); n],
        via: vec![BTreeMap::new(); n],
        hop: vec![BTreeMap::new(); n],
        delayed: vec![0.0; n],
        structural_by: vec![0.0; n],
        ..Charged::default()
    };
    // Inherited cost of a unit = its EW × the rate range-added over it.
    let mut rate: Vec<Fenwick> = su
        .ranks
        .iter()
        .map(|r| Fenwick::new(r.units.len()))
        .collect();
    // Prefix sums of EW per rank.
    let prefix: Vec<Vec<f64>> = su
        .ranks
        .iter()
        .map(|r| {
            let mut p = Vec::with_capacity(r.units.len() + 1);
            p.push(0.0);
            for u in &r.units {
                p.push(p.last().copied().unwrap_or(0.0) + u.ew);
            }
            p
        })
        .collect();
    for &id in order {
        for &(j, uj, _, _) in &su.instances[id as usize].members {
            let unit = &su.ranks[j as usize].units[uj as usize];
            if unit.wait_inst != Some(id) || unit.wait <= 0.0 {
                continue;
            }
            let nd = su.delayers(id).len();
            if nd == 0 {
                continue;
            }
            let inherited = unit.ew * rate[j as usize].point(uj as usize);
            let comm = match su.instances[id as usize].key {
                InstanceKey::Coll { comm, .. } | InstanceKey::P2p { comm, .. } => comm,
            };
            c.total_wait += unit.wait;
            let sigma = 1.0 / nd as f64;
            for &(l, v) in su.delayers(id) {
                let (l, v) = (l as usize, v as usize);
                let w = sigma * unit.wait;
                let cost = sigma * inherited;
                let lu = &su.ranks[l].units;
                let p = lu[v].prev_sync.map(|p| p as usize);
                let d = (lu[v].x - p.map_or(0.0, |p| lu[p].x)).max(0.0);
                let lo = p.unwrap_or(0);
                let ex = (prefix[l][v] - prefix[l][lo]).max(0.0);
                let big_d = w.max(d + ex);
                let (short_root, short_prop) = if big_d > 0.0 {
                    (w * d / big_d, w * ex / big_d)
                } else {
                    (0.0, 0.0)
                };
                let (long_root, long_prop) = if d + ex > 0.0 {
                    (cost * d / (d + ex), cost * ex / (d + ex))
                } else {
                    (0.0, 0.0)
                };
                c.root[l] += short_root + long_root;
                if short_root > 0.0 {
                    *c.direct[l].entry(j).or_default() += short_root;
                }
                if long_root > 0.0 {
                    *c.via[l].entry(j).or_default() += long_root;
                }
                if short_root > 0.0 || long_root > 0.0 {
                    c.hop[l].entry(j).or_insert(comm);
                }
                let prop = short_prop + long_prop;
                if prop > 0.0 && ex > 0.0 {
                    rate[l].range_add(lo, v, prop / ex);
                }
                let unexplained = if big_d > 0.0 {
                    w * (big_d - d - ex).max(0.0) / big_d
                } else {
                    w
                };
                c.structural += unexplained;
                c.delayed[l] += w;
                c.structural_by[l] += unexplained;
            }
        }
    }
    c
}

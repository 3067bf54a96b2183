//! Root-cause results over the steps of a job: per rank the median root index, root delay and
//! what-if saving over its complete steps (medians: a rank preempted, paused by a collector or
//! a checkpoint in a few steps is not a straggler; one slower in most steps is), the steps over the root threshold, and the chain
//! (who waited for it directly, through whom the rest reached others).

use std::collections::BTreeMap;

use comminsight_wire::roles::Role;

use super::super::model::{PeerWait, RankIndex, RankSummary};
use super::RootStep;

/// One rank's totals.
#[derive(Default)]
struct Acc {
    /// Per complete step: root index, root delay, what-if saving (for the medians).
    index: Vec<f64>,
    delay: Vec<f64>,
    saves: Vec<f64>,
    max: f64,
    over: u64,
    complete: u64,
    /// Waits it made others wait, µs; of them charged to no rank, µs.
    delayed: f64,
    structural_by: f64,
    /// Σ role excess (% of the step); steps in which it was over the minimum delay.
    role_sum: f64,
    role_over: u64,
    /// Victim / intermediary rank -> (µs, steps).
    direct: BTreeMap<i64, (f64, u64)>,
    via: BTreeMap<i64, (f64, u64)>,
    /// Waiting rank -> the communicator it waited on (the first seen).
    hop: BTreeMap<i64, u64>,
}

/// The job's root-cause totals.
#[derive(Default)]
pub(crate) struct RootTotals {
    accs: BTreeMap<i64, Acc>,
    /// Some rank's step start was known in some complete step (else no self time before a
    /// rank's first operation was measured, and the classification falls back to the seed's).
    starts_known: bool,
}

impl RootTotals {
    /// Add one step: `ranks` dense -> rank, `index` the step's ranks (any order) with their
    /// coverage, `root` the step's pass, the rule's (threshold, minimum delay).
    pub fn add(
        &mut self,
        ranks: &[i64],
        index: &[RankIndex],
        root: &RootStep,
        (threshold, min_delay): (f64, f64),
    ) {
        let complete: BTreeMap<i64, bool> = index
            .iter()
            .map(|r| (r.rank, r.coverage_complete))
            .collect();
        for (i, rr) in root.ranks.iter().enumerate() {
            let rank = ranks[i];
            if !complete.get(&rank).copied().unwrap_or(false) {
                continue;
            }
            let a = self.accs.entry(rank).or_default();
            a.index.push(rr.root_index);
            a.max = a.max.max(rr.root_index);
            a.over += u64::from(super::super::root_over(
                rr.root_index,
                rr.root_delay,
                threshold,
                min_delay,
            ));
            a.complete += 1;
            a.delay.push(rr.root_delay);
            a.saves.push(rr.saves_pct.unwrap_or(0.0));
            a.delayed += rr.delayed_us;
            a.structural_by += rr.structural_by_us;
            a.role_sum += rr.role_excess;
            a.role_over += u64::from(rr.role_excess > min_delay);
            self.starts_known |= rr.start_known;
            for (v, comm) in &rr.hop {
                a.hop.entry(ranks[*v as usize]).or_insert(*comm);
            }
            for (map, from) in [(&mut a.direct, &rr.direct), (&mut a.via, &rr.via)] {
                for (v, us) in from {
                    let e = map.entry(ranks[*v as usize]).or_default();
                    e.0 += us;
                    e.1 += 1;
                }
            }
        }
    }

    /// Whether any rank's step start was known (see the field).
    pub fn starts_known(&self) -> bool {
        self.starts_known
    }

    /// Fill the root fields of `s` (its rank's totals; `top`: peers listed; `roles`: names of
    /// the chain's hops).
    pub fn fill(&self, s: &mut RankSummary, top: usize, roles: &BTreeMap<u64, Role>) {
        let Some(a) = self.accs.get(&s.rank) else {
            return;
        };
        let n = a.complete.max(1) as f64;
        s.root_index = median(&a.index);
        s.root_max_index = a.max;
        s.root_steps_over = a.over;
        s.root_delay = median(&a.delay);
        s.saves_pct = median(&a.saves);
        s.role_excess = a.role_sum / n;
        s.role_steps_over = a.role_over;
        s.structural_share = if a.delayed > 0.0 {
            100.0 * a.structural_by / a.delayed
        } else {
            0.0
        };
        let list = |m: &BTreeMap<i64, (f64, u64)>| {
            let mut v: Vec<PeerWait> = m
                .iter()
                .map(|(r, (us, steps))| PeerWait {
                    rank: *r,
                    wait_us: us.round() as u64,
                    steps: *steps,
                })
                .filter(|p| p.wait_us > 0)
                .collect();
            v.sort_by(|a, b| b.wait_us.cmp(&a.wait_us).then(a.rank.cmp(&b.rank)));
            v
        };
        let direct = list(&a.direct);
        let via = list(&a.via);
        s.chain = chain(s.rank, a, n, (&direct, &via), roles);
        s.root_direct = direct.into_iter().take(top).collect();
        s.root_via = via.into_iter().take(top).collect();
    }
}

/// The median of `v` (the mean of the middle two when even; 0 when empty).
fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let k = s.len() / 2;
    if s.len() % 2 == 1 {
        s[k]
    } else {
        (s[k - 1] + s[k]) / 2.0
    }
}

/// "rank 5: own excess 6.1 % of the step; made 3 rank(s) wait directly (0.80 ms a step: 4 (tp),
/// 1 (dp), 9 (dp)) and others through 2 rank(s) (1.20 ms a step: 4 (tp), 8 (pp))" (empty when
/// it caused nothing; a hop's role when `roles` knows its communicator).
fn chain(
    rank: i64,
    a: &Acc,
    n: f64,
    (direct, via): (&[PeerWait], &[PeerWait]),
    roles: &BTreeMap<u64, Role>,
) -> String {
    if direct.is_empty() && via.is_empty() {
        return String::new();
    }
    let ms = |p: &[PeerWait]| p.iter().map(|x| x.wait_us).sum::<u64>() as f64 / 1000.0 / n;
    let name = |r: i64| match a.hop.get(&r).and_then(|c| roles.get(c)) {
        Some(role) => format!("{r} ({role})"),
        None => r.to_string(),
    };
    let names = |p: &[PeerWait]| {
        let mut s: Vec<String> = p.iter().take(4).map(|x| name(x.rank)).collect();
        if p.len() > 4 {
            s.push(format!("+{}", p.len() - 4));
        }
        s.join(", ")
    };
    let mut out = format!(
        "rank {rank}: own excess {:.1} % of the step; made {} rank(s) wait directly \
         ({:.2} ms a step: {})",
        median(&a.delay),
        direct.len(),
        ms(direct),
        names(direct)
    );
    if !via.is_empty() {
        out.push_str(&format!(
            " and others through {} rank(s) ({:.2} ms a step: {})",
            via.len(),
            ms(via),
            names(via)
        ));
    }
    out
}

//! Root-cause results over the steps of a job: per rank the mean root index, root delay and
//! what-if saving over its complete steps, the steps over the root threshold, and the chain
//! (who waited for it directly, through whom the rest reached others).

use std::collections::BTreeMap;

use super::super::model::{PeerWait, RankIndex, RankSummary};
use super::RootStep;

/// One rank's totals.
#[derive(Default)]
struct Acc {
    sum: f64,
    max: f64,
    over: u64,
    complete: u64,
    delay_sum: f64,
    saves_sum: f64,
    /// Victim / intermediary rank -> (µs, steps).
    direct: BTreeMap<i64, (f64, u64)>,
    via: BTreeMap<i64, (f64, u64)>,
}

/// The job's root-cause totals.
#[derive(Default)]
pub(crate) struct RootTotals {
    accs: BTreeMap<i64, Acc>,
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
            a.sum += rr.root_index;
            a.max = a.max.max(rr.root_index);
            a.over += u64::from(super::super::root_over(
                rr.root_index,
                rr.root_delay,
                threshold,
                min_delay,
            ));
            a.complete += 1;
            a.delay_sum += rr.root_delay;
            a.saves_sum += rr.saves_pct.unwrap_or(0.0);
            for (map, from) in [(&mut a.direct, &rr.direct), (&mut a.via, &rr.via)] {
                for (v, us) in from {
                    let e = map.entry(ranks[*v as usize]).or_default();
                    e.0 += us;
                    e.1 += 1;
                }
            }
        }
    }

    /// Fill the root fields of `s` (its rank's totals; `top`: peers listed).
    pub fn fill(&self, s: &mut RankSummary, top: usize) {
        let Some(a) = self.accs.get(&s.rank) else {
            return;
        };
        let n = a.complete.max(1) as f64;
        s.root_index = a.sum / n;
        s.root_max_index = a.max;
        s.root_steps_over = a.over;
        s.root_delay = a.delay_sum / n;
        s.saves_pct = a.saves_sum / n;
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
        s.chain = chain(s.rank, a, n, &direct, &via);
        s.root_direct = direct.into_iter().take(top).collect();
        s.root_via = via.into_iter().take(top).collect();
    }
}

/// "rank 5: +6.1 % of the step of its own excess; made 3 ranks wait directly (…) and others
/// through ranks 4, 8" (empty when it caused nothing).
fn chain(rank: i64, a: &Acc, n: f64, direct: &[PeerWait], via: &[PeerWait]) -> String {
    if direct.is_empty() && via.is_empty() {
        return String::new();
    }
    let ms = |p: &[PeerWait]| p.iter().map(|x| x.wait_us).sum::<u64>() as f64 / 1000.0 / n;
    let names = |p: &[PeerWait]| {
        let mut s: Vec<String> = p.iter().take(4).map(|x| x.rank.to_string()).collect();
        if p.len() > 4 {
            s.push(format!("+{}", p.len() - 4));
        }
        s.join(", ")
    };
    let mut out = format!(
        "rank {rank}: own excess {:.1} % of the step; made {} rank(s) wait directly \
         ({:.2} ms a step: {})",
        a.delay_sum / n,
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

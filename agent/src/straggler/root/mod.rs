//! Root-cause attribution (issue 17; research note `straggler-root-cause.md`, PB-DCA): whose
//! own slowness started the waiting, beside the seed index's "who made others wait".
//!
//! Per step, one pass over the matched instances ([`units`]: clock-free waits, self time,
//! excess over role peers; [`replay`]: backward delay-cost routing to root, propagated and
//! structural) and a what-if replay forward ([`whatif`]: the step time without a rank's excess).
//!
//! * `root_index(r, s) = min(100, 100 · RootCost(r, s) / ((N − 1) · AvgStep(s)))`: the same
//!   scale as the seed's (a rank that made every other rank wait its whole step is 100).
//! * `root_delay(r, s)`: the rank's own excess self time at its last unit, % of AvgStep.
//! * `structural(s)`: the share of the step's waits charged to no rank (bubbles), %.
//! * `saves_pct(r, s)`: `100 · (T − T_without(r)) / T`, for the step's top ranks by root cost.

mod replay;
mod totals;
mod units;
mod whatif;

pub(crate) use totals::RootTotals;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::model::RankStep;

/// Ranks of a step (highest root cost first) whose what-if is computed.
pub const WHATIF_TOP: usize = 1;

/// One rank in one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RootRank {
    pub root_cost_us: f64,
    pub root_index: f64,
    pub root_delay: f64,
    /// `None`: not among the step's top [`WHATIF_TOP`] by root cost.
    pub saves_pct: Option<f64>,
    /// Root cost by victim that waited for this rank directly (dense ranks), µs.
    pub direct: BTreeMap<u32, f64>,
    /// Root cost that reached this rank through a waiting rank (dense ranks), µs.
    pub via: BTreeMap<u32, f64>,
    /// The communicator over which each rank of `direct` and `via` waited for this one.
    pub hop: BTreeMap<u32, u64>,
    /// The waits this rank made others wait as their delayer, µs, and of them the part its own
    /// excess and inherited waits explain none of (structural), µs.
    pub delayed_us: f64,
    pub structural_by_us: f64,
    /// How much the rank's role group (its peers) is slower than every rank's median over the
    /// whole step, % of the step ([`units::role_excess`]).
    pub role_excess: f64,
    /// The rank's step start was known (the end of its previous step): its self time before
    /// its first operation counts.
    pub start_known: bool,
}

/// One step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RootStep {
    /// Per dense rank (the order of the step's ranks).
    pub ranks: Vec<RootRank>,
    /// Share of the step's waits charged to no rank, %.
    pub structural: f64,
    /// All waiting of the step, µs; of it structural, µs.
    pub wait_us: f64,
    pub structural_us: f64,
    /// The simulated step time (µs) the what-ifs compare with.
    pub step_us: f64,
    /// Peer groups found (ranks with the same program).
    pub peer_groups: usize,
}

impl RootStep {
    /// No root-cause pass: `n` ranks with nothing charged.
    pub fn none(n: usize) -> RootStep {
        RootStep {
            ranks: vec![RootRank::default(); n],
            ..RootStep::default()
        }
    }
}

/// The root-cause pass over one step's ranks (`rs`: one each, the step's dense order;
/// `avg_step_us`: AvgStep of the seed's formula).
pub fn step_root(rs: &[&RankStep], avg_step_us: f64) -> RootStep {
    let n = rs.len();
    if n == 0 {
        return RootStep::default();
    }
    let su = units::build(rs);
    let backward = replay::order(&su);
    let mut charged = replay::replay(&su, &backward);
    let denom = (n.saturating_sub(1)) as f64 * avg_step_us;
    let role_x = units::role_excess(&su);
    let mut ranks: Vec<RootRank> = (0..n)
        .map(|i| {
            let last_x = su.ranks[i].units.last().map_or(0.0, |u| u.x);
            RootRank {
                root_cost_us: charged.root[i],
                root_index: if denom > 0.0 {
                    (100.0 * charged.root[i] / denom).min(100.0)
                } else {
                    0.0
                },
                root_delay: if avg_step_us > 0.0 {
                    100.0 * last_x / avg_step_us
                } else {
                    0.0
                },
                saves_pct: None,
                direct: charged.direct[i].clone(),
                via: charged.via[i].clone(),
                hop: std::mem::take(&mut charged.hop[i]),
                delayed_us: charged.delayed[i],
                structural_by_us: charged.structural_by[i],
                role_excess: if avg_step_us > 0.0 {
                    100.0 * role_x[i] / avg_step_us
                } else {
                    0.0
                },
                start_known: rs[i].prev_end_us.is_some(),
            }
        })
        .collect();
    let mut top: Vec<usize> = (0..n).filter(|i| charged.root[*i] > 0.0).collect();
    top.sort_by(|a, b| charged.root[*b].total_cmp(&charged.root[*a]).then(a.cmp(b)));
    top.truncate(WHATIF_TOP);
    let (base, outs) = whatif::without(&su, &backward, &top);
    for (i, t) in top.iter().zip(outs) {
        ranks[*i].saves_pct = Some(if base > 0.0 {
            (100.0 * (base - t) / base).max(0.0)
        } else {
            0.0
        });
    }
    RootStep {
        ranks,
        structural: if charged.total_wait > 0.0 {
            100.0 * charged.structural / charged.total_wait
        } else {
            0.0
        },
        wait_us: charged.total_wait,
        structural_us: charged.structural,
        step_us: base,
        peer_groups: su.groups.len(),
    }
}

//! The first half of the root-cause pass over one step: each rank's operations as *units*
//! (operations issued together, a grouped send / recv exchange), the instances they meet in, the
//! clock-free waits of every unit, each rank's self time and its excess over its role peers.
//!
//! * **Waits.** A collective's members leave it together, so the last arriver has the shortest
//!   duration: `W = dur − min dur − η`, its delayers the members within `η` of that minimum. A
//!   point-to-point transfer's two sides need not leave together (a grouped exchange ends with
//!   its slowest part), so there the later arrival on the aligned clock makes the earlier side
//!   wait, beyond both ranks' clock bounds; the delayer is the later side. A unit waits as long
//!   as its longest-waiting operation.
//! * **Exposed** waits block the rank: nothing else was issued before the unit ended.
//! * **Self time** at a unit: time since the rank's step start (the end of its previous step's
//!   last operation, else its first arrival) minus the exposed waits before it. One rank's clock
//!   only: offsets cancel.
//! * **Peers**: ranks whose units have the same signature (operation kinds per unit) run the
//!   same program (same pipeline stage and chunk), any TP / CP / DP index; units align by
//!   position. Excess self time `X = max(0, S − b − τ)`, `b` the peers' lower median,
//!   `τ = max(τ_abs, τ_rel·b, 3·1.4826·MAD)`; excess wait `EW = max(0, W − min peer W)`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use super::super::model::{InstanceKey, RankStep};
use super::super::pair_waits::Fx;

/// Point-to-point operations of one rank starting within this many µs of the unit's first are
/// one unit (a grouped exchange); a collective is always a unit of its own.
const GROUP_US: u64 = 2;
/// Exit-skew tolerance of a collective's durations, µs (and a floor for every wait).
pub(crate) const ETA_US: f64 = 10.0;
/// Relative exit-skew tolerance (of the shortest duration).
const ETA_REL: f64 = 0.02;
/// Excess tolerance: absolute (µs), relative to the peers' baseline, and in MADs.
const TAU_ABS_US: f64 = 20.0;
const TAU_REL: f64 = 0.01;
const TAU_MADS: f64 = 3.0 * 1.4826;

/// One unit of one rank.
#[derive(Clone, Debug, Default)]
pub(crate) struct Unit {
    pub start: u64,
    pub end: u64,
    /// Its operations: `RankUnits::op_inst[op0..op0 + nops]`.
    pub op0: u32,
    pub nops: u32,
    /// Wait (µs).
    pub wait: f64,
    /// The instance of the longest-waiting operation (where the wait is processed; its
    /// delayers: [`StepUnits::delayers`]).
    pub wait_inst: Option<u32>,
    /// The wait blocked the rank.
    pub exposed: bool,
    /// Self time at its start, µs; excess self time and excess wait over the peers.
    pub self_us: f64,
    pub x: f64,
    pub ew: f64,
    /// The previous unit of this rank on the same communicator as `wait_inst` (the last
    /// synchronisation with the same partners), for the delay interval.
    pub prev_sync: Option<u32>,
}

/// One rank's step.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankUnits {
    pub t0: u64,
    pub units: Vec<Unit>,
    /// The instance of each of the rank's operations, in order.
    pub op_inst: Vec<u32>,
    /// Role peer group (index into [`StepUnits::groups`]).
    pub group: usize,
}

/// One instance: its communicator and its members (dense rank, unit, arrival, duration).
#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub key: InstanceKey,
    pub members: Vec<(u32, u32, u64, u64)>,
    /// Who made its waiting members wait (dense rank, unit): a collective's last arrivers, a
    /// transfer's later side (several: equal shares).
    pub late: Vec<(u32, u32)>,
}

/// One step's units over the step's dense ranks.
pub(crate) struct StepUnits {
    pub ranks: Vec<RankUnits>,
    pub instances: Vec<Instance>,
    /// Peer groups: dense ranks of each.
    pub groups: Vec<Vec<u32>>,
}

impl RankUnits {
    /// The instances of unit `u`.
    pub fn insts(&self, u: &Unit) -> &[u32] {
        &self.op_inst[u.op0 as usize..(u.op0 + u.nops) as usize]
    }
}

impl StepUnits {
    /// Who made the waiting members of instance `id` wait.
    pub fn delayers(&self, id: u32) -> &[(u32, u32)] {
        &self.instances[id as usize].late
    }
}

fn comm_of(k: &InstanceKey) -> u64 {
    match *k {
        InstanceKey::Coll { comm, .. } | InstanceKey::P2p { comm, .. } => comm,
    }
}

/// Build the step's units, waits, self times and excesses (`rs`: the step's ranks, one entry
/// each, in dense order).
pub(crate) fn build(rs: &[&RankStep]) -> StepUnits {
    let mut ranks: Vec<RankUnits> = Vec::with_capacity(rs.len());
    let mut inst_of: HashMap<InstanceKey, u32, BuildHasherDefault<Fx>> = HashMap::default();
    let mut instances: Vec<Instance> = Vec::new();
    for (i, r) in rs.iter().enumerate() {
        let mut units: Vec<Unit> = Vec::new();
        let mut op_inst: Vec<u32> = Vec::with_capacity(r.arrivals.len());
        let mut open_p2p = false;
        for a in &r.arrivals {
            let p2p = matches!(a.key, InstanceKey::P2p { .. });
            let new_unit =
                !(p2p && open_p2p) || units.last().is_none_or(|u| a.start_us > u.start + GROUP_US);
            open_p2p = p2p;
            if new_unit {
                units.push(Unit {
                    start: a.start_us,
                    end: a.start_us,
                    op0: op_inst.len() as u32,
                    ..Unit::default()
                });
            }
            let ui = units.len() - 1;
            let u = &mut units[ui];
            u.end = u.end.max(a.start_us + a.dur_us);
            let id = *inst_of.entry(a.key).or_insert_with(|| {
                instances.push(Instance {
                    key: a.key,
                    members: Vec::new(),
                    late: Vec::new(),
                });
                (instances.len() - 1) as u32
            });
            u.nops += 1;
            op_inst.push(id);
            instances[id as usize]
                .members
                .push((i as u32, ui as u32, a.start_us, a.dur_us));
        }
        let first = units.first().map_or(0, |u| u.start);
        let t0 = r.prev_end_us.filter(|p| *p <= first).unwrap_or(first);
        ranks.push(RankUnits {
            t0,
            units,
            op_inst,
            group: 0,
        });
    }
    let err: Vec<u64> = rs.iter().map(|r| r.err_us).collect();
    for (id, inst) in instances.iter_mut().enumerate() {
        waits_of(id as u32, inst, &err, &mut ranks);
    }
    for r in &mut ranks {
        exposure_and_self(r, &instances);
    }
    let groups = peer_groups(&mut ranks, &instances);
    for g in &groups {
        excess(g, &mut ranks);
    }
    let alone: Vec<u32> = groups
        .iter()
        .filter(|g| g.len() == 1)
        .map(|g| g[0])
        .collect();
    excess_alone(&alone, &mut ranks);
    StepUnits {
        ranks,
        instances,
        groups,
    }
}

/// Record the waits of instance `id` on its members' units.
fn waits_of(id: u32, inst: &mut Instance, err: &[u64], ranks: &mut [RankUnits]) {
    let m = &inst.members;
    if m.len() < 2 {
        return;
    }
    let mut put = |i: u32, u: u32, w: f64| {
        let unit = &mut ranks[i as usize].units[u as usize];
        if w > unit.wait {
            unit.wait = w;
            unit.wait_inst = Some(id);
        }
    };
    match inst.key {
        InstanceKey::Coll { .. } => {
            let dmin = m.iter().map(|x| x.3).min().unwrap_or(0) as f64;
            let eta = ETA_US.max(ETA_REL * dmin);
            for x in m {
                let w = x.3 as f64 - dmin - eta;
                if w > 0.0 {
                    put(x.0, x.1, w);
                }
            }
            inst.late = m
                .iter()
                .filter(|x| x.3 as f64 <= dmin + eta)
                .map(|x| (x.0, x.1))
                .collect();
        }
        InstanceKey::P2p { .. } => {
            // Two sides (a repeated key beyond two: the first two).
            let (a, b) = (m[0], m[1]);
            let (early, late) = if a.2 <= b.2 { (a, b) } else { (b, a) };
            let bound = (err[early.0 as usize] + err[late.0 as usize]) as f64 + ETA_US;
            let w = ((late.2 - early.2) as f64).min(early.3 as f64) - bound;
            if w > 0.0 && early.0 != late.0 {
                put(early.0, early.1, w);
                inst.late = vec![(late.0, late.1)];
            }
        }
    }
}

/// Which waits blocked the rank, its self time at each unit, and each unit's previous
/// synchronisation on the same communicator.
fn exposure_and_self(r: &mut RankUnits, instances: &[Instance]) {
    let n = r.units.len();
    let op_inst = std::mem::take(&mut r.op_inst);
    let mut blocked = 0.0;
    let mut last_on: HashMap<u64, u32, BuildHasherDefault<Fx>> = HashMap::default();
    for k in 0..n {
        let next_start = r.units.get(k + 1).map(|u| u.start);
        let u = &mut r.units[k];
        u.exposed = u.wait > 0.0 && next_start.is_none_or(|s| s as f64 + ETA_US >= u.end as f64);
        u.self_us = (u.start.saturating_sub(r.t0)) as f64 - blocked;
        if u.exposed {
            blocked += u.wait;
        }
        let comm = u.wait_inst.map(|i| comm_of(&instances[i as usize].key));
        u.prev_sync = comm.and_then(|c| last_on.get(&c).copied());
        for i in &op_inst[u.op0 as usize..(u.op0 + u.nops) as usize] {
            last_on.insert(comm_of(&instances[*i as usize].key), k as u32);
        }
    }
    r.op_inst = op_inst;
}

/// A rank's signature: per unit, its operations' kinds (collective function, or p2p).
fn signature(r: &RankUnits, instances: &[Instance]) -> u64 {
    let mut h = Fx::default();
    r.units.len().hash(&mut h);
    let mut kinds: Vec<u16> = Vec::new();
    for u in &r.units {
        kinds.clear();
        kinds.extend(r.insts(u).iter().map(|i| match instances[*i as usize].key {
            InstanceKey::Coll { func, .. } => u16::from(func),
            InstanceKey::P2p { .. } => 0x100,
        }));
        kinds.sort_unstable();
        kinds.hash(&mut h);
    }
    h.finish()
}

/// Group the ranks by signature (groups in order of their lowest rank).
fn peer_groups(ranks: &mut [RankUnits], instances: &[Instance]) -> Vec<Vec<u32>> {
    let mut by_sig: HashMap<u64, usize> = HashMap::new();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for (i, r) in ranks.iter_mut().enumerate() {
        let s = signature(r, instances);
        let g = *by_sig.entry(s).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i as u32);
        r.group = g;
    }
    groups
}

/// The lower median of `v` (reordered in place; 0 when empty).
fn lower_median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let k = (v.len() - 1) / 2;
    *v.select_nth_unstable_by(k, f64::total_cmp).1
}

/// Ranks without a role peer (a pipeline stage of one rank: pp 4 × dp 1) are compared with each
/// other on their whole step's self time (their programs differ, their compute per step is the
/// stage's: a stage slower than the others is named, a whole-stage imbalance included); the
/// excess counts from the step start. No excess wait (no peer to compare the wait with).
fn excess_alone(alone: &[u32], ranks: &mut [RankUnits]) {
    if alone.len() < 2 {
        return;
    }
    let total = |r: &RankUnits| r.units.last().map_or(0.0, |u| u.self_us);
    let mut vals: Vec<f64> = alone.iter().map(|&i| total(&ranks[i as usize])).collect();
    let b = lower_median(&mut vals);
    let mut devs: Vec<f64> = vals.iter().map(|v| (v - b).abs()).collect();
    let mad = lower_median(&mut devs);
    let tau = TAU_ABS_US.max(TAU_REL * b).max(TAU_MADS * mad);
    for &i in alone {
        let r = &mut ranks[i as usize];
        let x = (total(r) - b - tau).max(0.0);
        for u in &mut r.units {
            u.x = x;
        }
    }
}

/// Excess self time and excess wait of every unit of group `g` (one member: none).
fn excess(g: &[u32], ranks: &mut [RankUnits]) {
    if g.len() < 2 {
        return;
    }
    let n_units = ranks[g[0] as usize].units.len();
    let mut vals: Vec<f64> = Vec::with_capacity(g.len());
    let mut devs: Vec<f64> = Vec::with_capacity(g.len());
    for u in 0..n_units {
        vals.clear();
        vals.extend(g.iter().map(|&i| ranks[i as usize].units[u].self_us));
        let b = lower_median(&mut vals);
        devs.clear();
        devs.extend(vals.iter().map(|v| (v - b).abs()));
        let mad = lower_median(&mut devs);
        let tau = TAU_ABS_US.max(TAU_REL * b).max(TAU_MADS * mad);
        let wmin = g
            .iter()
            .map(|&i| ranks[i as usize].units[u].wait)
            .fold(f64::INFINITY, f64::min);
        for &i in g {
            let unit = &mut ranks[i as usize].units[u];
            unit.x = (unit.self_us - b - tau).max(0.0);
            unit.ew = if unit.exposed {
                (unit.wait - wmin).max(0.0)
            } else {
                0.0
            };
        }
    }
}

/// Per dense rank: how much its peer group's median self time over the whole step exceeds every
/// rank's lower median, beyond the tolerance (`τ_abs`, `τ_rel` of that median), µs: a whole role
/// or stage slower than the rest (0 for the others; a rank without peers is its own group).
pub(crate) fn role_excess(su: &StepUnits) -> Vec<f64> {
    let total = |r: &RankUnits| r.units.last().map_or(0.0, |u| u.self_us);
    let mut all: Vec<f64> = su.ranks.iter().map(total).collect();
    let b = lower_median(&mut all);
    let tau = TAU_ABS_US.max(TAU_REL * b);
    let mut out = vec![0.0; su.ranks.len()];
    let mut vals: Vec<f64> = Vec::new();
    for g in &su.groups {
        vals.clear();
        vals.extend(g.iter().map(|&i| total(&su.ranks[i as usize])));
        let x = (lower_median(&mut vals) - b - tau).max(0.0);
        for &i in g {
            out[i as usize] = x;
        }
    }
    out
}

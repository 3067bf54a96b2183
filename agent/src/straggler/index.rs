//! The straggler index formula (DESIGN.md §5), pure: no I/O.
//!
//! Inside one step, the arrivals of every rank are grouped by [`InstanceKey`] (an instance with
//! at least two members counts). For each member pair with arrivals `a_i < a_j`, `j` makes `i`
//! wait over `[a_i, a_j]`, attributed only when `a_j − a_i > err_i + err_j` (the two ranks'
//! clock bounds). Per unordered rank pair the intervals of each direction are merged (their
//! union is measured: concurrent operations count once) and the two directions cancel: the
//! larger one keeps the positive difference. Pairs never cancel each other.
//!
//! `AvgCause(r, s)` = mean net wait over the ranks `r` made wait (0 when none), `AvgStep(s)` =
//! mean step duration over the ranks with a summary of `s`, and the index is
//! `min(100, AvgCause / AvgStep × 100)` (0 when `AvgStep` is 0). Over several steps a rank's
//! index is the mean over its `coverage_complete` steps. Top causes / victims and the class
//! ([`super::classify`]) explain it; they never change it.
//!
//! Cost per step: sorting the arrivals, then one interval per attributed member pair (a
//! world-size collective of 1024 ranks is 523k pairs), sorted by (pair, start) and swept once.
//! Memory is bounded by one step's intervals.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::classify::{classify, classify_root, RankShape, Shape};
use super::model::{
    InstanceKey, PeerWait, RankIndex, RankStep, RankSummary, StepIndex, StragglerClass,
    StragglerReport,
};
use super::pair_waits::{sort_intervals, Interval, PairSums};
use super::StragglerSettings;

/// The per-step part of the analysis (what the live master runs once per step).
#[derive(Clone, Debug, PartialEq)]
pub struct StepAnalysis {
    /// AvgStep and every rank's index in the step.
    pub index: StepIndex,
    /// Net waits of the step: `(cause rank, victim rank, µs)`, each unordered pair at most once,
    /// ordered by the pair (lower rank, higher rank).
    pub net: Vec<(i64, i64, u64)>,
}

/// The step's ranks: one [`RankStep`] per rank (the first one of a rank when it repeats),
/// ordered by rank.
fn step_ranks(ranks: &[RankStep]) -> Vec<&RankStep> {
    let mut v: Vec<&RankStep> = ranks.iter().collect();
    v.sort_by_key(|r| r.rank);
    v.dedup_by_key(|r| r.rank);
    v
}

/// Median of a sorted, non-empty slice (the mean of the two middle values when even).
fn median(sorted: &[u64]) -> f64 {
    let m = sorted.len();
    if m % 2 == 1 {
        sorted[m / 2] as f64
    } else {
        (sorted[m / 2 - 1] as f64 + sorted[m / 2] as f64) / 2.0
    }
}

/// One step's results over the step's dense rank indices.
pub(crate) struct Core {
    pub index: StepIndex,
    /// Dense index -> rank (ascending).
    pub ranks: Vec<i64>,
    /// `(cause, victim, µs)` over dense indices, ordered by the pair.
    pub net: Vec<(u32, u32, u64)>,
    pub shapes: Vec<Shape>,
    /// The root-cause pass (dense order).
    pub root: super::root::RootStep,
}

/// One arrival of a step: (instance, start, dense rank index, duration).
type Entry = (InstanceKey, u64, u32, u64);

/// The step's analysis; `counts` is scratch reused across steps.
pub(crate) fn step_core(
    step: u64,
    ranks: &[RankStep],
    counts: &mut Vec<u32>,
    root_cause: bool,
) -> Core {
    let rs = step_ranks(ranks);
    let n = rs.len();
    let avg_step_us = if n == 0 {
        0.0
    } else {
        rs.iter().map(|r| r.duration_us as f64).sum::<f64>() / n as f64
    };
    let arr = sorted_entries(&rs);
    let err: Vec<u64> = rs.iter().map(|r| r.err_us).collect();
    let (shapes, mut iv) = scan_instances(&arr, &err, n);
    drop(arr);
    sort_intervals(&mut iv, n, counts);
    let (net, cause_sum, cause_n) = net_waits(&iv, n);
    drop(iv);
    let root = if root_cause {
        super::root::step_root(&rs, avg_step_us)
    } else {
        super::root::RootStep::none(n)
    };
    let out = rank_indices(&rs, &cause_sum, &cause_n, avg_step_us, &root);
    Core {
        index: StepIndex {
            step,
            avg_step_us,
            ranks: out,
            structural: root.structural,
        },
        ranks: rs.iter().map(|r| r.rank).collect(),
        net,
        shapes,
        root,
    }
}

/// Every arrival of the step's ranks, sorted by (instance, start, rank index).
fn sorted_entries(rs: &[&RankStep]) -> Vec<Entry> {
    let mut arr: Vec<Entry> = Vec::with_capacity(rs.iter().map(|r| r.arrivals.len()).sum());
    for (i, r) in rs.iter().enumerate() {
        arr.extend(
            r.arrivals
                .iter()
                .map(|a| (a.key, a.start_us, i as u32, a.dur_us)),
        );
    }
    arr.sort_unstable_by_key(|a| (a.0, a.1, a.2));
    arr
}

/// Over the instances of the sorted `arr` with at least two members: every rank's shape, and
/// the wait interval of every attributed member pair (`err`: each rank's clock bound).
fn scan_instances(arr: &[Entry], err: &[u64], n: usize) -> (Vec<Shape>, Vec<Interval>) {
    let mut shapes = vec![Shape::default(); n];
    let mut iv: Vec<Interval> = Vec::new();
    let mut durs: Vec<u64> = Vec::new();
    let mut starts: Vec<u64> = Vec::new();
    let nn = n as u64;
    let mut g = 0;
    while g < arr.len() {
        let mut h = g + 1;
        while h < arr.len() && arr[h].0 == arr[g].0 {
            h += 1;
        }
        let inst = &arr[g..h];
        g = h;
        if inst.len() < 2 {
            continue;
        }
        add_shapes(inst, &mut shapes, &mut starts, &mut durs);
        push_waits(inst, err, nn, &mut iv);
    }
    (shapes, iv)
}

/// Adds one instance (sorted by start) to its members' shapes: arrival minus the median
/// arrival, duration over the median duration (`starts`, `durs`: scratch).
fn add_shapes(inst: &[Entry], shapes: &mut [Shape], starts: &mut Vec<u64>, durs: &mut Vec<u64>) {
    starts.clear();
    starts.extend(inst.iter().map(|a| a.1));
    let med_a = median(starts);
    durs.clear();
    durs.extend(inst.iter().map(|a| a.3));
    durs.sort_unstable();
    let med_d = median(durs);
    for a in inst {
        let s = &mut shapes[a.2 as usize];
        s.late_sum += a.1 as f64 - med_a;
        s.late_n += 1;
        if med_d > 0.0 {
            s.dur_sum += a.3 as f64 / med_d;
            s.dur_n += 1;
        }
    }
}

/// The wait intervals of one instance (sorted by start): every later member `j` makes every
/// earlier member `i` wait, when the gap exceeds their two clock bounds (`nn`: the step's ranks).
fn push_waits(inst: &[Entry], err: &[u64], nn: u64, iv: &mut Vec<Interval>) {
    for (x, ai) in inst.iter().enumerate() {
        let (i, ei) = (ai.2 as u64, err[ai.2 as usize]);
        for aj in &inst[x + 1..] {
            let j = aj.2 as u64;
            if i == j || aj.1 - ai.1 <= ei + err[aj.2 as usize] {
                continue;
            }
            // j causes, i waits.
            let key = if i < j {
                (i * nn + j) << 1
            } else {
                ((j * nn + i) << 1) | 1
            };
            iv.push(Interval {
                key,
                start: ai.1,
                end: aj.1,
            });
        }
    }
}

/// Net waits of the step and, per dense rank, their sum and count as the cause.
type NetWaits = (Vec<(u32, u32, u64)>, Vec<u64>, Vec<u64>);

/// The sweep over the sorted intervals: union length per direction, then the net per
/// unordered pair (`n`: the step's ranks).
fn net_waits(iv: &[Interval], n: usize) -> NetWaits {
    let nn = n as u64;
    let mut net: Vec<(u32, u32, u64)> = Vec::new();
    let mut cause_sum = vec![0u64; n];
    let mut cause_n = vec![0u64; n];
    let mut k = 0;
    while k < iv.len() {
        let pair = iv[k].key >> 1;
        let mut len = [0u64; 2];
        while k < iv.len() && iv[k].key >> 1 == pair {
            let d = (iv[k].key & 1) as usize;
            let (mut s, mut e) = (iv[k].start, iv[k].end);
            k += 1;
            while k < iv.len() && iv[k].key == (pair << 1 | d as u64) {
                if iv[k].start > e {
                    len[d] += e - s;
                    (s, e) = (iv[k].start, iv[k].end);
                } else {
                    e = e.max(iv[k].end);
                }
                k += 1;
            }
            len[d] += e - s;
        }
        let (lo, hi) = ((pair / nn) as usize, (pair % nn) as usize);
        let (cause, victim, w) = match len[0].cmp(&len[1]) {
            std::cmp::Ordering::Greater => (hi, lo, len[0] - len[1]),
            std::cmp::Ordering::Less => (lo, hi, len[1] - len[0]),
            std::cmp::Ordering::Equal => continue,
        };
        cause_sum[cause] += w;
        cause_n[cause] += 1;
        net.push((cause as u32, victim as u32, w));
    }
    (net, cause_sum, cause_n)
}

/// Every rank's index in the step, highest root index first, then highest index (then by rank).
fn rank_indices(
    rs: &[&RankStep],
    cause_sum: &[u64],
    cause_n: &[u64],
    avg_step_us: f64,
    root: &super::root::RootStep,
) -> Vec<RankIndex> {
    let mut out: Vec<RankIndex> = rs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let avg_cause_us = if cause_n[i] == 0 {
                0.0
            } else {
                cause_sum[i] as f64 / cause_n[i] as f64
            };
            let index = if avg_step_us > 0.0 {
                (avg_cause_us / avg_step_us * 100.0).min(100.0)
            } else {
                0.0
            };
            let rr = &root.ranks[i];
            RankIndex {
                rank: r.rank,
                index,
                avg_cause_us,
                coverage_complete: r.coverage_complete,
                root_index: rr.root_index,
                root_delay: rr.root_delay,
                saves_pct: rr.saves_pct,
            }
        })
        .collect();
    out.sort_by(by_root);
    out
}

/// Highest root index first, then highest index, then lower rank.
fn by_root(a: &RankIndex, b: &RankIndex) -> std::cmp::Ordering {
    b.root_index
        .total_cmp(&a.root_index)
        .then(b.index.total_cmp(&a.index))
        .then(a.rank.cmp(&b.rank))
}

/// The per-step analysis of `ranks` (every rank's [`RankStep`] of step `step`; a rank given
/// twice counts once, its first entry).
pub fn analyze_step(step: u64, ranks: &[RankStep]) -> StepAnalysis {
    let c = step_core(step, ranks, &mut Vec::new(), true);
    let net = c
        .net
        .iter()
        .map(|&(a, b, w)| (c.ranks[a as usize], c.ranks[b as usize], w))
        .collect();
    StepAnalysis {
        index: c.index,
        net,
    }
}

/// One rank's totals over the steps.
#[derive(Default)]
struct Acc {
    host: String,
    sum: f64,
    complete: u64,
    max: f64,
    over: u64,
    shape: Shape,
}

/// The top `n` of a rank's peers by wait (desc), then rank (asc).
fn top(mut v: Vec<PeerWait>, n: usize) -> Vec<PeerWait> {
    v.sort_by(|a, b| b.wait_us.cmp(&a.wait_us).then(a.rank.cmp(&b.rank)));
    v.truncate(n);
    v
}

/// What [`analyze`] gathers over the steps of a job.
struct JobTotals {
    /// Every rank of the job, ascending (the job's dense index).
    all: Vec<i64>,
    accs: BTreeMap<i64, Acc>,
    pairs: PairSums,
    /// Members of each communicator (collectives only).
    comm_members: HashMap<u64, BTreeSet<i64>>,
    /// Scratch: one rank-step's communicators.
    seen: Vec<u64>,
    root: super::root::RootTotals,
}

impl JobTotals {
    /// Empty totals over the ranks `all` (ascending, unique).
    fn new(all: Vec<i64>) -> JobTotals {
        JobTotals {
            pairs: PairSums::new(all.len()),
            all,
            accs: BTreeMap::new(),
            comm_members: HashMap::new(),
            seen: Vec::new(),
            root: Default::default(),
        }
    }

    /// Notes each rank-step's host and communicators, then frees its arrivals.
    fn note_ranks(&mut self, cur: &mut [RankStep]) {
        for r in cur.iter_mut() {
            let acc = self.accs.entry(r.rank).or_default();
            if acc.host.is_empty() {
                acc.host.clone_from(&r.host);
            }
            self.seen.clear();
            self.seen
                .extend(r.arrivals.iter().filter_map(|a| match a.key {
                    InstanceKey::Coll { comm, .. } => Some(comm),
                    InstanceKey::P2p { .. } => None,
                }));
            self.seen.sort_unstable();
            self.seen.dedup();
            for comm in &self.seen {
                self.comm_members.entry(*comm).or_default().insert(r.rank);
            }
            // Free the step's arrivals as soon as they are counted.
            r.arrivals.clear();
            r.arrivals.shrink_to_fit();
        }
    }

    /// Adds one step's shapes, indices (`threshold`: the straggler threshold) and net waits.
    fn add_step(&mut self, an: &Core, settings: &StragglerSettings) {
        let threshold = settings.threshold;
        self.root.add(
            &an.ranks,
            &an.index.ranks,
            &an.root,
            (settings.root_threshold, settings.root_min_delay),
        );
        for (rank, sh) in an.ranks.iter().zip(&an.shapes) {
            let a = &mut self.accs.get_mut(rank).expect("ranks of the step").shape;
            a.late_sum += sh.late_sum;
            a.late_n += sh.late_n;
            a.dur_sum += sh.dur_sum;
            a.dur_n += sh.dur_n;
        }
        for ri in &an.index.ranks {
            if !ri.coverage_complete {
                continue;
            }
            let acc = self.accs.get_mut(&ri.rank).expect("ranks of the step");
            acc.sum += ri.index;
            acc.complete += 1;
            acc.max = acc.max.max(ri.index);
            acc.over += u64::from(ri.index > threshold);
        }
        // Step index -> job index (both ascending by rank).
        let global: Vec<usize> = an
            .ranks
            .iter()
            .map(|r| self.all.binary_search(r).expect("every rank listed"))
            .collect();
        for &(c, v, w) in &an.net {
            self.pairs.add(global[c as usize], global[v as usize], w);
        }
    }
}

/// Each rank's peers over the job: (causes it waited for, victims it made wait).
type PeerLists = (BTreeMap<i64, Vec<PeerWait>>, BTreeMap<i64, Vec<PeerWait>>);

/// The job's net waits per rank pair, as each rank's causes and victims (`all`: dense -> rank).
fn peer_lists(pairs: &PairSums, all: &[i64]) -> PeerLists {
    let mut causes: BTreeMap<i64, Vec<PeerWait>> = BTreeMap::new();
    let mut victims: BTreeMap<i64, Vec<PeerWait>> = BTreeMap::new();
    pairs.for_each(|c, v, w, n| {
        let (c, v) = (all[c], all[v]);
        causes.entry(v).or_default().push(PeerWait {
            rank: c,
            wait_us: w,
            steps: n,
        });
        victims.entry(c).or_default().push(PeerWait {
            rank: v,
            wait_us: w,
            steps: n,
        });
    });
    (causes, victims)
}

/// Every rank's summary (by rank, not classified yet) with its top `top` causes and victims.
fn summaries(accs: &BTreeMap<i64, Acc>, peers: PeerLists, top_n: usize) -> Vec<RankSummary> {
    let (mut causes, mut victims) = peers;
    accs.iter()
        .map(|(&rank, a)| RankSummary {
            rank,
            host: a.host.clone(),
            index: if a.complete == 0 {
                0.0
            } else {
                a.sum / a.complete as f64
            },
            complete_steps: a.complete,
            max_index: a.max,
            steps_over_threshold: a.over,
            top_causes: top(causes.remove(&rank).unwrap_or_default(), top_n),
            top_victims: top(victims.remove(&rank).unwrap_or_default(), top_n),
            class: StragglerClass::None,
            class_reason: String::new(),
            ..RankSummary::default()
        })
        .collect()
}

/// What the classification needs of each rank of `ranks`; its communicators leave out the
/// job-wide ones.
fn rank_shapes(
    ranks: &[RankSummary],
    root_rule: impl Fn(&RankSummary) -> bool,
    accs: &BTreeMap<i64, Acc>,
    comm_members: &HashMap<u64, BTreeSet<i64>>,
) -> Vec<RankShape> {
    // Communicators (collectives only) each rank was seen in, and their sizes.
    let mut comms: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for (comm, members) in comm_members {
        for r in members {
            comms.entry(*r).or_default().push(*comm);
        }
    }
    let world = accs.len();
    let comm_size: HashMap<u64, usize> = comm_members.iter().map(|(c, m)| (*c, m.len())).collect();
    ranks
        .iter()
        .map(|r| {
            let a = &accs[&r.rank];
            RankShape {
                rank: r.rank,
                index: r.index,
                complete_steps: a.complete,
                steps_over: a.over,
                shape: a.shape,
                root_index: r.root_index,
                root_culprit: root_rule(r),
                structural_share: r.structural_share,
                role_excess: r.role_excess,
                role_steps_over: r.role_steps_over,
                comms: comms
                    .get(&r.rank)
                    .map(|cs| {
                        cs.iter()
                            .copied()
                            .filter(|c| comm_size.get(c).is_some_and(|&m| m < world))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// The whole analysis over the rank-steps of one job (any order): per-step indices (the
/// warm-up steps, below `settings.warmup_steps`, and steps no rank completed left out), then
/// each rank's mean over its `coverage_complete` steps, its top causes / victims and its class.
/// Deterministic.
pub fn analyze(
    job: &str,
    mut steps: Vec<RankStep>,
    settings: &StragglerSettings,
) -> StragglerReport {
    steps.sort_by_key(|r| (r.step, r.rank));
    let mut all: Vec<i64> = steps.iter().map(|r| r.rank).collect();
    all.sort_unstable();
    all.dedup();
    let mut totals = JobTotals::new(all);
    let mut counts = Vec::new();
    let mut out_steps = Vec::new();
    let mut rest: &mut [RankStep] = &mut steps;
    while !rest.is_empty() {
        let s = rest[0].step;
        let n = rest.iter().take_while(|r| r.step == s).count();
        let (cur, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        // A warm-up step (set-up, staggered start) or one no rank completed (cut by a hang for
        // all of them) is left out: its durations and waits say nothing of anyone's speed.
        if s < settings.warmup_steps || cur.iter().all(|r| !r.coverage_complete) {
            totals.note_ranks(cur);
            continue;
        }
        let an = step_core(s, cur, &mut counts, settings.root_cause);
        totals.note_ranks(cur);
        totals.add_step(&an, settings);
        out_steps.push(an.index);
    }
    let JobTotals {
        all,
        accs,
        pairs,
        comm_members,
        root,
        ..
    } = totals;
    let peers = peer_lists(&pairs, &all);
    drop(pairs);
    let mut ranks = summaries(&accs, peers, settings.top);
    for r in &mut ranks {
        root.fill(r, settings.top, &settings.comm_roles);
    }
    let rule = |r: &RankSummary| {
        super::root_over(
            r.root_index,
            r.root_delay,
            settings.root_threshold,
            settings.root_min_delay,
        )
    };
    let shapes = rank_shapes(&ranks, rule, &accs, &comm_members);
    // Own excess is measured from a rank's step start: without any, classify on the seed.
    let classes = if root.starts_known() {
        classify_root(&shapes, settings.threshold)
    } else {
        classify(&shapes, settings.threshold)
    };
    for (r, (class, reason)) in ranks.iter_mut().zip(classes) {
        r.class = class;
        r.class_reason = reason;
    }
    ranks.sort_by(|a, b| {
        b.root_index
            .total_cmp(&a.root_index)
            .then(b.index.total_cmp(&a.index))
            .then(a.rank.cmp(&b.rank))
    });
    StragglerReport {
        job: job.to_string(),
        threshold: settings.threshold,
        root_threshold: settings.root_threshold,
        root_min_delay: settings.root_min_delay,
        steps: out_steps,
        ranks,
    }
}

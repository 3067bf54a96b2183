//! Discrete-event simulation of the plans with strict rendezvous semantics: a collective completes
//! when the last member arrives (+ transfer time), a send/recv when both sides have posted it, a
//! grouped exchange when all its parts have. Used to prove plans deadlock-free and by `--synthetic`.

use std::collections::HashMap;

use crate::layout::{Layout, Role};
use crate::plan::{CollFunc, Op, RankPlan};

/// What an operation event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvFunc {
    Coll(CollFunc),
    Send,
    Recv,
}

/// One Coll or P2p operation as the profiler would see it (a grouped exchange gives one per part).
#[derive(Clone, Debug, PartialEq)]
pub struct OpEvent {
    pub step: u32,
    pub role: Role,
    pub func: EvFunc,
    /// P2p peer (global rank).
    pub peer: Option<usize>,
    pub count: u64,
    pub bytes: u64,
    /// Coll: per (comm, func) sequence number; P2p: per (comm, peer, direction) ordinal.
    pub coll_sn: u64,
    pub start_ns: u64,
    /// None: never completed.
    pub end_ns: Option<u64>,
}

/// How a rank's simulation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    Done,
    /// Stuck in compute (`hang`, `pyhang`) at this step.
    Hung {
        step: u32,
    },
    Killed {
        step: u32,
    },
    /// Waiting for peers in an operation of this step that never completes.
    Blocked {
        step: u32,
    },
}

/// One rank's simulated timeline.
#[derive(Clone, Debug)]
pub struct RankTimeline {
    pub rank: usize,
    pub events: Vec<OpEvent>,
    /// Host time each step started.
    pub step_start_ns: Vec<u64>,
    /// Host time each completed step ended.
    pub step_end_ns: Vec<u64>,
    pub state: RankState,
    /// Where the rank stopped: (step, op index) of the op it never finished.
    pub stopped_at: Option<(u32, usize)>,
}

/// Timing model.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub start_ns: u64,
    /// Bytes per second of every link.
    pub bandwidth: f64,
    pub latency_ns: u64,
    /// Host of each rank (empty: all on one host).
    pub rank_host: Vec<usize>,
    /// Shaped host pairs: (from host, to host, bits per second).
    pub slow_links: Vec<(usize, usize, u64)>,
    /// Each compute phase lasts its planned time x (1 ± jitter/2), drawn from `seed`.
    pub jitter: f64,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            start_ns: 1_800_000_000_000_000_000,
            bandwidth: 10e9,
            latency_ns: 20_000,
            rank_host: Vec::new(),
            slow_links: Vec::new(),
            jitter: 0.0,
            seed: 0,
        }
    }
}

const F32: u64 = 4;

impl SimConfig {
    fn host(&self, r: usize) -> usize {
        self.rank_host.get(r).copied().unwrap_or(0)
    }

    /// Bandwidth (bytes/s) between the hosts of two ranks in direction a -> b.
    fn bw(&self, a: usize, b: usize) -> f64 {
        let (ha, hb) = (self.host(a), self.host(b));
        self.slow_links
            .iter()
            .filter(|(x, y, _)| *x == ha && *y == hb)
            .map(|(_, _, bps)| *bps as f64 / 8.0)
            .fold(self.bandwidth, f64::min)
    }

    fn xfer(&self, bytes: f64, bw: f64) -> u64 {
        self.latency_ns + (bytes / bw * 1e9) as u64
    }

    fn coll_time(&self, func: CollFunc, count: u64, members: &[usize]) -> u64 {
        let n = members.len().max(1) as f64;
        let bytes = (count * F32) as f64;
        let wire = match func {
            CollFunc::AllReduce => bytes * 2.0 * (n - 1.0) / n,
            CollFunc::AllGather | CollFunc::ReduceScatter | CollFunc::AllToAll => bytes * (n - 1.0),
        };
        let mut bw = self.bandwidth;
        if !self.slow_links.is_empty() {
            for (i, a) in members.iter().enumerate() {
                let b = members[(i + 1) % members.len()];
                bw = bw.min(self.bw(*a, b));
            }
        }
        self.xfer(wire, bw)
    }
}

/// SplitMix64: a uniform value in [0, 1) for (seed, rank, index).
pub fn uniform(seed: u64, rank: usize, idx: u64) -> f64 {
    let mut z = seed
        ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ idx.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The events an operation gives, in the order the profiler receives them (times unset).
pub fn op_events(op: &Op, step: u32, layout: &Layout) -> Vec<OpEvent> {
    let ev = |role, func, peer, count: u64, bytes| OpEvent {
        step,
        role,
        func,
        peer,
        count,
        bytes,
        coll_sn: 0,
        start_ns: 0,
        end_ns: None,
    };
    match op {
        Op::Coll {
            comm, func, count, ..
        } => {
            let n = layout.size(*comm) as u64;
            let bytes = match func {
                CollFunc::AllReduce => count * F32,
                _ => count * n * F32,
            };
            vec![ev(*comm, EvFunc::Coll(*func), None, *count, bytes)]
        }
        Op::P2p { comm, parts } => parts
            .iter()
            .map(|p| {
                let f = if p.send { EvFunc::Send } else { EvFunc::Recv };
                ev(*comm, f, Some(p.peer), p.count, p.count * F32)
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[derive(Default)]
struct CollSlot {
    arrived: Vec<usize>,
    max_t: u64,
    mismatch: bool,
}

struct Rank {
    step: usize,
    idx: usize,
    t: u64,
    registered: bool,
    /// Indices (in `events`) of the current op's events.
    pending: Vec<usize>,
    state: Option<RankState>,
    tl: RankTimeline,
    /// Per (role, func) collective counters and per (role, peer, send) p2p ordinals.
    coll_sn: HashMap<(Role, EvFunc), u64>,
    p2p_sn: HashMap<(Role, usize, bool), u64>,
    /// Per role: index of the next collective on that comm (matching key).
    coll_k: HashMap<Role, u64>,
}

/// Simulate every plan to completion or until nothing can move.
pub fn simulate(plans: &[RankPlan], layout: &Layout, cfg: &SimConfig) -> Vec<RankTimeline> {
    let mut ranks: Vec<Rank> = plans
        .iter()
        .map(|p| Rank {
            step: 0,
            idx: 0,
            t: cfg.start_ns,
            registered: false,
            pending: Vec::new(),
            state: None,
            tl: RankTimeline {
                rank: p.rank,
                events: Vec::new(),
                step_start_ns: Vec::new(),
                step_end_ns: Vec::new(),
                state: RankState::Done,
                stopped_at: None,
            },
            coll_sn: HashMap::new(),
            p2p_sn: HashMap::new(),
            coll_k: HashMap::new(),
        })
        .collect();
    // Collective slots keyed by (role, first member, k); p2p arrivals by (role, src, dst, ordinal).
    let mut colls: HashMap<(Role, usize, u64), CollSlot> = HashMap::new();
    let mut sends: HashMap<(Role, usize, usize, u64), u64> = HashMap::new();
    let mut recvs: HashMap<(Role, usize, usize, u64), u64> = HashMap::new();
    let index = GroupIndex::new(layout);
    let mut queue: Vec<usize> = (0..plans.len()).rev().collect();
    while let Some(r) = queue.pop() {
        loop {
            if ranks[r].state.is_some() {
                break;
            }
            let (s, i) = (ranks[r].step, ranks[r].idx);
            if i == 0 && ranks[r].tl.step_start_ns.len() == s && s < plans[r].steps.len() {
                let t = ranks[r].t;
                ranks[r].tl.step_start_ns.push(t);
            }
            let Some(steps_ops) = plans[r].steps.get(s) else {
                ranks[r].state = Some(RankState::Done);
                break;
            };
            let Some(op) = steps_ops.get(i) else {
                let t = ranks[r].t;
                ranks[r].tl.step_end_ns.push(t);
                ranks[r].step += 1;
                ranks[r].idx = 0;
                continue;
            };
            let step = s as u32;
            match op {
                Op::Compute { us, .. } => {
                    let ns = (us * 1000) as f64;
                    let f = if cfg.jitter > 0.0 {
                        let u = uniform(cfg.seed, r, (s as u64) << 32 | i as u64);
                        1.0 + cfg.jitter * (u - 0.5)
                    } else {
                        1.0
                    };
                    ranks[r].t += (ns * f) as u64;
                    ranks[r].idx += 1;
                }
                Op::Hang | Op::Pyhang => {
                    ranks[r].state = Some(RankState::Hung { step });
                    ranks[r].tl.stopped_at = Some((step, i));
                }
                Op::Kill => {
                    ranks[r].state = Some(RankState::Killed { step });
                    ranks[r].tl.stopped_at = Some((step, i));
                }
                Op::Coll {
                    comm,
                    func,
                    count,
                    mismatch,
                } => {
                    let members = index.members(r, *comm);
                    let k = *ranks[r].coll_k.get(comm).unwrap_or(&0);
                    let key = (*comm, members[0], k);
                    if !ranks[r].registered {
                        register(&mut ranks[r], op, step, layout);
                        let t = ranks[r].t;
                        let slot = colls.entry(key).or_default();
                        slot.arrived.push(r);
                        slot.max_t = slot.max_t.max(t);
                        slot.mismatch |= *mismatch;
                    }
                    let slot = &colls[&key];
                    if slot.arrived.len() < members.len() || slot.mismatch {
                        break;
                    }
                    let end = slot.max_t + cfg.coll_time(*func, *count, members);
                    colls.remove(&key);
                    for &m in members {
                        let rk = &mut ranks[m];
                        *rk.coll_k.entry(*comm).or_insert(0) += 1;
                        complete(rk, end);
                        if m != r {
                            queue.push(m);
                        }
                    }
                }
                Op::P2p { comm, parts } => {
                    if !ranks[r].registered {
                        register(&mut ranks[r], op, step, layout);
                        let t = ranks[r].t;
                        for (j, p) in parts.iter().enumerate() {
                            let ev = ranks[r].pending[j];
                            let ord = ranks[r].tl.events[ev].coll_sn;
                            if p.send {
                                sends.insert((*comm, r, p.peer, ord), t);
                            } else {
                                recvs.insert((*comm, p.peer, r, ord), t);
                            }
                            queue.push(p.peer);
                        }
                    }
                    let mut end = ranks[r].t;
                    let mut ready = true;
                    for (j, p) in parts.iter().enumerate() {
                        let ord = ranks[r].tl.events[ranks[r].pending[j]].coll_sn;
                        let other = if p.send {
                            recvs.get(&(*comm, r, p.peer, ord))
                        } else {
                            sends.get(&(*comm, p.peer, r, ord))
                        };
                        match other {
                            Some(t) => {
                                let (a, b) = if p.send { (r, p.peer) } else { (p.peer, r) };
                                let x = cfg.xfer((p.count * F32) as f64, cfg.bw(a, b));
                                end = end.max(*t.max(&ranks[r].t) + x);
                            }
                            None => ready = false,
                        }
                    }
                    if !ready {
                        break;
                    }
                    complete(&mut ranks[r], end);
                }
            }
        }
    }
    ranks
        .into_iter()
        .map(|mut rk| {
            rk.tl.state = rk.state.unwrap_or(RankState::Blocked {
                step: rk.step as u32,
            });
            if rk.state.is_none() {
                rk.tl.stopped_at = Some((rk.step as u32, rk.idx));
            }
            rk.tl
        })
        .collect()
}

/// Members of every rank's group of every role, computed once.
struct GroupIndex {
    groups: Vec<Vec<usize>>,
    /// `of[rank][role index]` = index into `groups`.
    of: Vec<[usize; 6]>,
}

impl GroupIndex {
    fn new(layout: &Layout) -> GroupIndex {
        let mut groups = Vec::new();
        let mut of = vec![[usize::MAX; 6]; layout.world()];
        for (ri, role) in Role::ALL.into_iter().enumerate() {
            for r in 0..layout.world() {
                if of[r][ri] != usize::MAX {
                    continue;
                }
                let g = if role == Role::Global {
                    (0..layout.world()).collect()
                } else {
                    layout.group_of(r, role).ranks
                };
                for &m in &g {
                    of[m][ri] = groups.len();
                }
                groups.push(g);
            }
        }
        GroupIndex { groups, of }
    }

    fn members(&self, rank: usize, role: Role) -> &[usize] {
        let ri = Role::ALL.iter().position(|x| *x == role).unwrap_or(0);
        &self.groups[self.of[rank][ri]]
    }
}

/// The rank arrives at a Coll/P2p op: record its events (start = now, unfinished).
fn register(rk: &mut Rank, op: &Op, step: u32, layout: &Layout) {
    rk.pending.clear();
    for mut ev in op_events(op, step, layout) {
        ev.start_ns = rk.t;
        ev.coll_sn = match ev.func {
            EvFunc::Coll(_) => bump(&mut rk.coll_sn, (ev.role, ev.func)),
            EvFunc::Send | EvFunc::Recv => bump(
                &mut rk.p2p_sn,
                (ev.role, ev.peer.unwrap_or(0), ev.func == EvFunc::Send),
            ),
        };
        rk.pending.push(rk.tl.events.len());
        rk.tl.events.push(ev);
    }
    rk.registered = true;
}

fn bump<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u64>, k: K) -> u64 {
    let v = m.entry(k).or_insert(0);
    *v += 1;
    *v - 1
}

fn complete(rk: &mut Rank, end: u64) {
    for &e in &rk.pending {
        rk.tl.events[e].end_ns = Some(end);
    }
    rk.pending.clear();
    rk.registered = false;
    rk.t = end;
    rk.idx += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::Fault;
    use crate::plan::build;

    fn scen() -> crate::scenario::Scenario {
        crate::plan::tests_support::scenario("megatron")
    }

    fn run(faults: &[&str]) -> Vec<RankTimeline> {
        let s = scen();
        let f: Vec<Fault> = faults.iter().map(|f| f.parse().unwrap()).collect();
        let plans = build(&s, &s.layout(), 4, &f).unwrap();
        simulate(&plans, &s.layout(), &SimConfig::default())
    }

    #[test]
    fn a_slow_rank_delays_its_peers_but_not_the_other_way_round() {
        let base = run(&[]);
        let slow = run(&["slow:rank=5,ms=30,steps=2..2"]);
        let d =
            |tl: &[RankTimeline], r: usize, s: usize| tl[r].step_end_ns[s] - tl[r].step_start_ns[s];
        for r in 0..8 {
            assert!(d(&slow, r, 2) >= d(&base, r, 2) + 25_000_000, "rank {r}");
            assert_eq!(d(&slow, r, 1), d(&base, r, 1));
        }
        // Rank 5's TP peer (rank 4) arrives ~30 ms before it at their first all-reduce of step 2.
        let first_tp = |tl: &RankTimeline| {
            tl.events
                .iter()
                .find(|e| e.step == 2 && e.role == Role::Tp)
                .unwrap()
                .start_ns
        };
        assert!(first_tp(&slow[4]) + 25_000_000 < first_tp(&slow[5]));
    }

    #[test]
    fn a_hang_blocks_everyone_and_leaves_open_ops() {
        let tl = run(&["hang:rank=2,step=1"]);
        assert_eq!(tl[2].state, RankState::Hung { step: 1 });
        for t in &tl {
            assert_eq!(t.step_end_ns.len(), 1, "rank {}", t.rank);
            if t.rank != 2 {
                assert_eq!(t.state, RankState::Blocked { step: 1 }, "rank {}", t.rank);
                assert!(t.events.last().unwrap().end_ns.is_none());
            }
        }
    }

    #[test]
    fn a_mismatch_never_completes() {
        let tl = run(&["mismatch:rank=3,step=2"]);
        for t in &tl {
            assert_eq!(t.state, RankState::Blocked { step: 2 });
            let last = t.events.last().unwrap();
            assert_eq!(last.role, Role::Global);
            assert!(last.end_ns.is_none());
        }
    }

    #[test]
    fn jitter_is_bounded_and_reproducible() {
        let s = scen();
        let plans = build(&s, &s.layout(), 2, &[]).unwrap();
        let cfg = SimConfig {
            jitter: 0.1,
            seed: 5,
            ..SimConfig::default()
        };
        let a = simulate(&plans, &s.layout(), &cfg);
        let b = simulate(&plans, &s.layout(), &cfg);
        let base = simulate(&plans, &s.layout(), &SimConfig::default());
        for r in 0..8 {
            assert_eq!(a[r].step_end_ns, b[r].step_end_ns);
            let (x, y) = (
                a[r].step_end_ns[1] - a[r].step_start_ns[0],
                base[r].step_end_ns[1] - base[r].step_start_ns[0],
            );
            assert!(
                (x as f64 - y as f64).abs() < 0.1 * y as f64,
                "rank {r}: {x} vs {y}"
            );
        }
        let u: Vec<f64> = (0..1000).map(|i| uniform(1, 2, i)).collect();
        assert!(u.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = u.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05);
    }

    #[test]
    fn sequence_numbers_count_per_comm_and_func() {
        let tl = run(&[]);
        let globals: Vec<u64> = tl[0]
            .events
            .iter()
            .filter(|e| e.role == Role::Global)
            .map(|e| e.coll_sn)
            .collect();
        assert_eq!(globals, vec![0, 1, 2, 3]);
    }
}

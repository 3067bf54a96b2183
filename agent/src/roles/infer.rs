//! Role inference: from a job's observations to a role per communicator and the parallel grid.
//!
//! 1. **Names** first: a name that carries a role (`parse_comm_name`: CommInsight's
//!    `"<role>:..."`, or a framework description such as `TENSOR_MODEL_PARALLEL_GROUP:3`) gives
//!    `source = "named"`, confidence 1.
//! 2. **Families**: the other communicators are grouped by shape — size, member offsets from the
//!    lowest member (every group of one parallel dimension is a translate of the others), and the
//!    kind of traffic that dominates (P2P, all-to-all, all-reduce, all-gather / reduce-scatter).
//!    A family shares one role; an unnamed communicator in the same family as named ones takes
//!    their role (`source = "inferred"`).
//! 3. **Scores** per family and role from what the roles do: PP = P2P between neighbour
//!    communicator ranks (no wrap-around); EP = all-to-all (or P2P to every peer); TP = frequent
//!    collectives, mostly all-reduce, on the smallest stride, inside a node; CP = frequent
//!    all-gather / reduce-scatter (or a P2P ring); DP = the least frequent, largest collectives
//!    (gradient buckets); global = the whole world with the smallest messages. Greedy assignment,
//!    best score first, one family per role (a second family gets a role only on a clear score).
//!    Confidence = score scaled by the margin over the family's next-best role.
//! 4. **Grid**: each role's group size (1 when absent); `dp` defaults to world / (tp·cp·pp).

use std::collections::{BTreeMap, BTreeSet};

use comminsight_wire::roles::{parse_comm_name, Role};
use comminsight_wire::Func;

use super::collect::{JobObs, OpMix};
use super::{CommRole, Grid, JobRoles, Source};

/// Score below which a family stays without a role.
const MIN_SCORE: f64 = 0.25;
/// Score above which a second family may take a role already given.
const SHARE_SCORE: f64 = 0.8;

/// What dominates a communicator's traffic (part of the family key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Traffic {
    None,
    P2p,
    AllToAll,
    AllReduce,
    GatherScatter,
    Other,
}

fn traffic(m: Option<&OpMix>) -> Traffic {
    let Some(m) = m else { return Traffic::None };
    let total = m.total();
    if total == 0 {
        return Traffic::None;
    }
    let classes = [
        (
            Traffic::P2p,
            m.count(&[Func::SEND, Func::RECV, Func::SEND_RECV]),
        ),
        (Traffic::AllToAll, m.count(&[Func::ALL_TO_ALL])),
        (Traffic::AllReduce, m.count(&[Func::ALL_REDUCE])),
        (
            Traffic::GatherScatter,
            m.count(&[Func::ALL_GATHER, Func::REDUCE_SCATTER]),
        ),
    ];
    let (best, n) = classes
        .iter()
        .copied()
        .max_by_key(|(t, n)| (*n, std::cmp::Reverse(*t)))
        .expect("non-empty");
    if n * 2 >= total {
        best
    } else {
        Traffic::Other
    }
}

/// One communicator before roles.
struct CommView {
    hash: u64,
    name: String,
    nranks: u32,
    /// Global rank by communicator rank, of the members seen only: a recorded `nranks` never
    /// sizes a table (a crafted `comm_init` may claim 2^20 members and bring one).
    members: BTreeMap<u32, i64>,
    /// Nodes as the library reported them; 0 = not reported (HCCL): the members' hosts count.
    nnodes: u32,
    /// The hosts of the members seen (up to [`MAX_HOSTS_COUNTED`]).
    hosts: BTreeSet<String>,
    named: Option<Role>,
}

/// Member hosts counted per communicator (more only matters as "more than one").
const MAX_HOSTS_COUNTED: usize = 64;

/// A family: communicators of one shape and traffic, with their summed features.
struct Family {
    members: Vec<usize>,
    size: u32,
    complete: bool,
    stride: u64,
    intra_node: bool,
    mix: OpMix,
    named: Option<Role>,
}

/// Build the comm views of a job.
fn views(job: &JobObs) -> (Vec<CommView>, u32) {
    let mut world = 0i64;
    let mut by_hash: BTreeMap<u64, CommView> = BTreeMap::new();
    let mut names: BTreeMap<u64, BTreeMap<String, usize>> = BTreeMap::new();
    // Global rank of each process: RANK, else its rank in the largest communicator.
    let largest = job
        .procs
        .values()
        .flat_map(|p| p.comms.values().map(|m| m.nranks))
        .max()
        .unwrap_or(0);
    for p in job.procs.values() {
        world = world.max(i64::from(p.world_size));
        let g = if p.global_rank >= 0 {
            i64::from(p.global_rank)
        } else {
            p.comms
                .values()
                .find(|m| m.nranks == largest)
                .map_or(-1, |m| i64::from(m.rank))
        };
        for (hash, m) in &p.comms {
            let v = by_hash.entry(*hash).or_insert_with(|| CommView {
                hash: *hash,
                name: String::new(),
                nranks: m.nranks,
                members: BTreeMap::new(),
                nnodes: m.nnodes,
                hosts: BTreeSet::new(),
                named: None,
            });
            if v.hosts.len() < MAX_HOSTS_COUNTED {
                v.hosts.insert(p.host.clone());
            }
            if let Ok(r) = u32::try_from(m.rank) {
                if r < v.nranks {
                    v.members.insert(r, g);
                }
            }
            v.nnodes = v.nnodes.max(m.nnodes);
            if !m.name.is_empty() {
                *names
                    .entry(*hash)
                    .or_default()
                    .entry(m.name.clone())
                    .or_default() += 1;
            }
        }
    }
    for (hash, counts) in names {
        if let Some(v) = by_hash.get_mut(&hash) {
            // The most common name; ties to the smallest (order-independent).
            let best = counts
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(n, _)| n.clone())
                .unwrap_or_default();
            v.named = parse_comm_name(&best);
            v.name = best;
        }
    }
    for v in by_hash.values_mut().filter(|v| v.nnodes == 0) {
        v.nnodes = v.hosts.len() as u32;
    }
    let seen = job.procs.values().filter(|p| p.global_rank >= 0).count() as i64;
    let world = world.max(i64::from(largest)).max(seen).max(0) as u32;
    (by_hash.into_values().collect(), world)
}

fn families(comms: &[CommView], job: &JobObs) -> Vec<Family> {
    type Key = (u32, Option<Vec<i64>>, Traffic, u32);
    let mut fams: BTreeMap<Key, Family> = BTreeMap::new();
    for (i, c) in comms.iter().enumerate() {
        // A communicator of unknown size (`nranks` 0) has no members to be complete.
        let complete = c.nranks > 0
            && c.members.len() == c.nranks as usize
            && c.members.values().all(|r| *r >= 0);
        let sorted = complete.then(|| {
            let mut s: Vec<i64> = c.members.values().copied().collect();
            s.sort_unstable();
            s
        });
        let offsets = sorted.as_ref().map(|s| {
            let lo = s[0];
            s.iter().map(|r| r - lo).collect::<Vec<_>>()
        });
        let stride = sorted
            .as_ref()
            .and_then(|s| s.windows(2).map(|w| (w[1] - w[0]) as u64).min())
            .unwrap_or(0);
        let mix = job.ops.get(&c.hash);
        // Message size class (factors of 16): the world's 8-byte loss all-reduce is not the
        // world-sized DP group's gradient all-reduce.
        let size_class = mix.map_or(0, |m| {
            let mean = m.bytes() / m.total().max(1);
            (64 - mean.leading_zeros()) / 4
        });
        let key = (c.nranks, offsets, traffic(mix), size_class);
        let f = fams.entry(key).or_insert_with(|| Family {
            members: Vec::new(),
            size: c.nranks,
            complete,
            stride,
            intra_node: true,
            mix: OpMix::default(),
            named: None,
        });
        f.members.push(i);
        f.intra_node &= c.nnodes <= 1;
        if let Some(m) = mix {
            for (func, (n, b)) in &m.funcs {
                let e = f.mix.funcs.entry(*func).or_default();
                e.0 += n;
                e.1 = e.1.saturating_add(*b);
            }
            for (d, n) in &m.p2p_deltas {
                *f.mix.p2p_deltas.entry(*d).or_default() += n;
            }
            f.mix.p2p_far += m.p2p_far;
        }
    }
    let mut out: Vec<Family> = fams.into_values().collect();
    for f in &mut out {
        // The family's name role: the most common among its named members.
        let mut votes: BTreeMap<Role, usize> = BTreeMap::new();
        for i in &f.members {
            if let Some(r) = comms[*i].named {
                *votes.entry(r).or_default() += 1;
            }
        }
        f.named = votes
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(r, _)| r);
    }
    out
}

/// Features of one family relative to the others.
struct Features {
    is_world: bool,
    p2p: f64,
    neighbour: f64,
    ring: f64,
    a2a: f64,
    ar: f64,
    agrs: f64,
    freq_rel: f64,
    bytes_rel: f64,
    smallest_stride: bool,
    smallest_world_bytes: bool,
    intra_node: bool,
    has_ops: bool,
    /// Mean message size, bytes.
    mean_bytes: f64,
}

/// Mean message size below which a collective is a scalar (loss, grad norm, found-inf), never
/// a gradient sync: such a family is not DP (a 4-rank pipeline without DP has only the world's
/// 8-byte all-reduce besides its sends).
const SCALAR_BYTES: f64 = 1024.0;

fn features(fams: &[Family], world: u32) -> Vec<Features> {
    let per_member = |f: &Family| {
        let members = (f.members.len() as f64 * f64::from(f.size)).max(1.0);
        f.mix.total() as f64 / members
    };
    let mean_bytes = |f: &Family| f.mix.bytes() as f64 / (f.mix.total().max(1) as f64);
    let coll = |f: &Family| f.mix.total() > 0 && traffic(Some(&f.mix)) != Traffic::P2p;
    // Frequency is relative to the busiest family of any kind (P2P included): without a TP
    // group, the gradient all-reduce is still rare next to the pipeline's sends.
    let max_freq = fams.iter().map(per_member).fold(0.0, f64::max);
    let max_bytes = fams
        .iter()
        .filter(|f| coll(f))
        .map(mean_bytes)
        .fold(0.0, f64::max);
    let min_stride = |with_ops: bool| {
        fams.iter()
            .filter(|f| f.complete && f.size > 1 && f.size < world && (!with_ops || coll(f)))
            .map(|f| f.stride)
            .min()
    };
    let (min_stride_coll, min_stride_any) = (min_stride(true), min_stride(false));
    let min_world_bytes = fams
        .iter()
        .filter(|f| f.size == world && f.mix.total() > 0)
        .map(mean_bytes)
        .fold(f64::INFINITY, f64::min);
    fams.iter()
        .map(|f| {
            let total = f.mix.total().max(1) as f64;
            let p2p_n = f.mix.count(&[Func::SEND, Func::RECV, Func::SEND_RECV]) as f64;
            let deltas: u64 = f.mix.p2p_deltas.values().sum::<u64>() + f.mix.p2p_far;
            let by = |pred: &dyn Fn(i32) -> bool| {
                f.mix
                    .p2p_deltas
                    .iter()
                    .filter(|(d, _)| pred(**d))
                    .map(|(_, n)| *n)
                    .sum::<u64>() as f64
                    / deltas.max(1) as f64
            };
            let n = f.size as i32;
            let neighbour = by(&|d| d.abs() == 1);
            let ring = if n > 2 {
                by(&|d| d.abs() == n - 1)
            } else {
                0.0
            };
            Features {
                is_world: f.size == world,
                p2p: p2p_n / total,
                neighbour,
                ring,
                a2a: f.mix.count(&[Func::ALL_TO_ALL]) as f64 / total,
                ar: f.mix.count(&[Func::ALL_REDUCE]) as f64 / total,
                agrs: f.mix.count(&[Func::ALL_GATHER, Func::REDUCE_SCATTER]) as f64 / total,
                freq_rel: if max_freq > 0.0 {
                    per_member(f) / max_freq
                } else {
                    0.0
                },
                bytes_rel: if max_bytes > 0.0 {
                    mean_bytes(f) / max_bytes
                } else {
                    0.0
                },
                smallest_stride: f.complete
                    && Some(f.stride)
                        == if f.mix.total() > 0 {
                            min_stride_coll
                        } else {
                            min_stride_any
                        },
                smallest_world_bytes: f.size == world
                    && f.mix.total() > 0
                    && mean_bytes(f) <= min_world_bytes,
                intra_node: f.intra_node,
                has_ops: f.mix.total() > 0,
                mean_bytes: mean_bytes(f),
            }
        })
        .collect()
}

/// Score of `role` for a family with features `x` (0..=1).
fn score(x: &Features, role: Role) -> f64 {
    if !x.has_ops {
        // Structure only: the world, or the smallest stride inside a node (usually TP).
        return match role {
            Role::Global if x.is_world => 0.6,
            Role::Tp if x.smallest_stride && x.intra_node && !x.is_world => 0.3,
            _ => 0.0,
        };
    }
    let coll = x.ar + x.agrs;
    let s = match role {
        Role::Global => {
            if !x.is_world {
                0.0
            } else if x.smallest_world_bytes {
                0.7 + 0.3 * (1.0 - x.bytes_rel)
            } else {
                0.2
            }
        }
        Role::Pp => x.p2p * x.neighbour * (1.0 - x.ring),
        Role::Ep => (x.a2a + x.p2p * (1.0 - x.neighbour - x.ring).max(0.0)).min(1.0),
        Role::Tp => {
            let ar_share = if coll > 0.0 { x.ar / coll } else { 0.0 };
            coll * (0.4 * ar_share
                + 0.3 * x.freq_rel
                + 0.2 * f64::from(u8::from(x.smallest_stride))
                + 0.1 * f64::from(u8::from(x.intra_node)))
        }
        Role::Cp => {
            let gs_share = if coll > 0.0 { x.agrs / coll } else { 0.0 };
            let ring = x.p2p * x.ring;
            (coll * gs_share * (0.6 * x.freq_rel + 0.4 * (1.0 - x.bytes_rel))
                - 0.2 * f64::from(u8::from(x.smallest_stride)))
            .max(ring)
        }
        Role::Dp if x.mean_bytes < SCALAR_BYTES => 0.0,
        Role::Dp => coll * (0.5 * x.bytes_rel + 0.5 * (1.0 - x.freq_rel)),
    };
    if x.is_world && role != Role::Global && role != Role::Dp {
        s * 0.5
    } else {
        s
    }
}

/// Infer the roles and grid of one job.
pub fn infer(job_id: &str, job: &JobObs) -> JobRoles {
    let (comms, world) = views(job);
    let fams = families(&comms, job);
    let feats = features(&fams, world);
    // Family -> (role, confidence, named?)
    let mut chosen: Vec<Option<(Role, f64, bool)>> = vec![None; fams.len()];
    let mut taken: BTreeSet<Role> = BTreeSet::new();
    for (i, f) in fams.iter().enumerate() {
        if let Some(r) = f.named {
            chosen[i] = Some((r, 1.0, true));
            taken.insert(r);
        }
    }
    let mut cands: Vec<(f64, usize, Role, f64)> = Vec::new();
    for (i, x) in feats.iter().enumerate() {
        if chosen[i].is_some() {
            continue;
        }
        let mut scores: Vec<(Role, f64)> = Role::ALL.iter().map(|r| (*r, score(x, *r))).collect();
        scores.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (k, (r, s)) in scores.iter().enumerate() {
            let next = scores
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != k)
                .map(|(_, (_, s2))| *s2)
                .fold(0.0, f64::max);
            let margin = (s - next).max(0.0);
            let conf = s * (0.5 + 0.5 * (margin / 0.4).min(1.0));
            cands.push((*s, i, *r, conf));
        }
    }
    cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    for (s, i, r, conf) in cands {
        if chosen[i].is_some() || s < MIN_SCORE {
            continue;
        }
        if taken.contains(&r) && s < SHARE_SCORE {
            continue;
        }
        chosen[i] = Some((r, conf, false));
        taken.insert(r);
    }
    let mut out: Vec<CommRole> = Vec::with_capacity(comms.len());
    for (fi, f) in fams.iter().enumerate() {
        for ci in &f.members {
            let c = &comms[*ci];
            let (role, confidence, source) = match (c.named, chosen[fi]) {
                (Some(r), _) => (Some(r), 1.0, Source::Named),
                (None, Some((r, conf, named_family))) => (
                    Some(r),
                    if named_family { 0.9 } else { conf },
                    Source::Inferred,
                ),
                (None, None) => (None, 0.0, Source::Inferred),
            };
            out.push(CommRole {
                hash: c.hash,
                name: c.name.clone(),
                role,
                ranks: dense(c.nranks, &c.members),
                members: c.members.iter().map(|(r, g)| (*r, *g)).collect(),
                nranks: c.nranks,
                confidence: (confidence * 100.0).round() / 100.0,
                source,
            });
        }
    }
    out.sort_by_key(|c| (c.role.map_or(99, |r| r as u8), c.first_member(), c.hash));
    let grid = grid(&out, world);
    let grid_confidence = grid_confidence(&out, &grid, world);
    JobRoles {
        job: job_id.to_string(),
        world,
        comms: out,
        grid,
        grid_confidence,
    }
}

/// Most table slots per member seen (plus [`DENSE_SLACK`]) for which `ranks` is written dense.
const DENSE_PER_MEMBER: u64 = 4;
/// Slots a dense `ranks` may always have, whoever was seen.
const DENSE_SLACK: u64 = 4096;

/// `ranks` in communicator-rank order (-1: not seen), when that table is bounded by the members
/// seen; empty otherwise (then [`CommRole::members`] alone says who was seen).
fn dense(nranks: u32, members: &BTreeMap<u32, i64>) -> Vec<i64> {
    if u64::from(nranks) > DENSE_PER_MEMBER * members.len() as u64 + DENSE_SLACK {
        return Vec::new();
    }
    let mut v = vec![-1; nranks as usize];
    for (r, g) in members {
        v[*r as usize] = *g;
    }
    v
}

fn grid(comms: &[CommRole], world: u32) -> Grid {
    // The most common size among the communicators of a role.
    let size = |role: Role| -> Option<u32> {
        let mut n: BTreeMap<u32, usize> = BTreeMap::new();
        for c in comms.iter().filter(|c| c.role == Some(role)) {
            *n.entry(c.nranks).or_default() += 1;
        }
        n.into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|(s, _)| s)
    };
    let tp = size(Role::Tp).unwrap_or(1);
    let cp = size(Role::Cp).unwrap_or(1);
    let pp = size(Role::Pp).unwrap_or(1);
    let ep = size(Role::Ep).unwrap_or(1);
    let unit = (tp * cp * pp).max(1);
    let dp = size(Role::Dp).unwrap_or(if world.is_multiple_of(unit) {
        world / unit
    } else {
        1
    });
    Grid { tp, cp, pp, dp, ep }
}

fn grid_confidence(comms: &[CommRole], g: &Grid, world: u32) -> f64 {
    let consistent = g.tp * g.cp * g.pp * g.dp == world && g.dp.is_multiple_of(g.ep.max(1));
    let min_conf = comms
        .iter()
        .filter(|c| c.role.is_some_and(|r| r != Role::Global))
        .map(|c| c.confidence)
        .fold(1.0, f64::min);
    let c = if consistent { min_conf } else { min_conf * 0.5 };
    (c * 100.0).round() / 100.0
}

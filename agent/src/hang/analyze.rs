//! The analysis: from a [`JobSnapshot`] (one agent's, or all agents' merged), per comm instance
//! who entered and who is absent; the wait-for graph (a rank waits on the absent members of the
//! instances it is in); its terminal nodes are the source ranks. Mismatches (same instance,
//! different size; or members of one comm blocked in different functions) are named apart.
//!
//! Deterministic: the same snapshot and settings give the same verdicts, online and offline.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Value};

use super::graph::terminal_components;
use super::model::{
    ChainLink, CommView, JobSnapshot, OpenOp, RankView, Verdict, VerdictComm, VerdictKind,
};

/// Wait-for edges shown in a verdict's chain at most (the evidence says when it was cut).
const MAX_CHAIN: usize = 64;
/// Open ops listed in a verdict's evidence at most.
const MAX_EVIDENCE_OPS: usize = 64;

/// When a wait is long enough to be a hang.
#[derive(Clone, Debug, PartialEq)]
pub struct HangSettings {
    /// Never call a wait shorter than this a hang (µs), whatever the plugin's threshold.
    pub min_wait_us: u64,
    /// A wait must also exceed this many times the job's longest normal quiet interval
    /// (learned: longest finished op, longest gap between ops).
    pub gap_factor: f64,
}

impl Default for HangSettings {
    /// The defaults of `[hang]` ([`super::config`]).
    fn default() -> Self {
        (&super::config::HangConfig::default()).into()
    }
}

/// What the analysis found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    /// Confirmed verdicts (empty while waiting for the threshold or for pending ranks).
    pub verdicts: Vec<Verdict>,
    /// Ranks that are waited on but not silent long enough yet to be called stuck.
    pub pending: Vec<i64>,
    /// The wait a hang needs now (µs).
    pub threshold_us: u64,
    /// Age of the oldest open operation (µs; 0 when none).
    pub oldest_open_us: u64,
}

/// The wait a hang needs given the job's learned gaps (µs).
pub fn threshold_us(s: &JobSnapshot, settings: &HangSettings) -> u64 {
    let plugin = u64::from(s.gaps.plugin_threshold_ms) * 1000;
    let learned = s.gaps.max_op_us.max(s.gaps.max_idle_us) as f64 * settings.gap_factor;
    plugin.max(settings.min_wait_us).max(learned as u64)
}

/// One comm instance: a collective `(comm, func, seq)` or the `ord`-th P2P op of a pair.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Instance {
    comm: u64,
    func: String,
    seq: u64,
}

/// Why a terminal node waits on nobody.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SinkKind {
    Dead,
    Compute,
    StuckInOp,
    NoData,
    Cycle,
}

impl SinkKind {
    fn as_str(self) -> &'static str {
        match self {
            SinkKind::Dead => "dead",
            SinkKind::Compute => "compute",
            SinkKind::StuckInOp => "stuck_in_op",
            SinkKind::NoData => "no_data",
            SinkKind::Cycle => "cycle",
        }
    }
}

struct Ctx<'a> {
    s: &'a JobSnapshot,
    views: BTreeMap<i64, &'a RankView>,
    comms: BTreeMap<u64, &'a CommView>,
}

fn counterpart(func: &str) -> &'static str {
    if func == "Send" {
        "Recv"
    } else {
        "Send"
    }
}

impl<'a> Ctx<'a> {
    fn new(s: &'a JobSnapshot) -> Ctx<'a> {
        let mut views = BTreeMap::new();
        for r in &s.ranks {
            if r.rank >= 0 {
                views.insert(r.rank, r);
            }
        }
        Ctx {
            s,
            views,
            comms: s.comms.iter().map(|c| (c.hash, c)).collect(),
        }
    }

    fn comm_rank(&self, comm: u64, global: i64) -> Option<i32> {
        self.comms
            .get(&comm)?
            .members
            .iter()
            .find(|(_, g)| *g == global)
            .map(|(c, _)| *c)
    }

    fn global(&self, comm: u64, comm_rank: i32) -> Option<i64> {
        self.comms
            .get(&comm)?
            .members
            .iter()
            .find(|(c, _)| *c == comm_rank)
            .map(|(_, g)| *g)
    }

    /// The instance `op` of `rank` is in, and the members absent from it.
    fn absent(&self, rank: i64, op: &OpenOp) -> (Instance, Vec<i64>) {
        if op.peer >= 0 {
            let inst = Instance {
                comm: op.comm,
                func: op.func.clone(),
                seq: op.p2p_ord,
            };
            let (Some(me), Some(peer)) =
                (self.comm_rank(op.comm, rank), self.global(op.comm, op.peer))
            else {
                return (inst, Vec::new());
            };
            let want = counterpart(&op.func);
            let entered = self.views.get(&peer).is_some_and(|v| {
                v.open.iter().any(|o| {
                    o.comm == op.comm && o.peer == me && o.func == want && o.p2p_ord == op.p2p_ord
                }) || v.p2p.iter().any(|p| {
                    p.comm == op.comm && p.peer == me && p.func == want && p.done > op.p2p_ord
                })
            });
            return (inst, if entered { Vec::new() } else { vec![peer] });
        }
        let inst = Instance {
            comm: op.comm,
            func: op.func.clone(),
            seq: op.seq,
        };
        let Some(c) = self.comms.get(&op.comm) else {
            return (inst, Vec::new());
        };
        let absent = c
            .members
            .iter()
            .map(|(_, g)| *g)
            .filter(|g| *g != rank && !self.entered(*g, &inst))
            .collect();
        (inst, absent)
    }

    fn entered(&self, rank: i64, inst: &Instance) -> bool {
        let Some(v) = self.views.get(&rank) else {
            return false;
        };
        v.open
            .iter()
            .any(|o| o.peer < 0 && o.comm == inst.comm && o.func == inst.func && o.seq == inst.seq)
            || v.colls
                .iter()
                .any(|c| c.comm == inst.comm && c.func == inst.func && c.last_seq >= inst.seq)
    }

    /// The ranks of a comm instance that entered it (collectives: members; P2P: the pair).
    fn instance_ranks(&self, inst: &Instance, waiter: i64, op: &OpenOp) -> (Vec<i64>, Vec<i64>) {
        let members: Vec<i64> = if op.peer >= 0 {
            let mut v = vec![waiter];
            v.extend(self.global(op.comm, op.peer));
            v
        } else {
            self.comms
                .get(&inst.comm)
                .map(|c| c.members.iter().map(|(_, g)| *g).collect())
                .unwrap_or_default()
        };
        let (_, absent) = self.absent(waiter, op);
        let entered = members
            .iter()
            .copied()
            .filter(|g| !absent.contains(g))
            .collect();
        (entered, absent)
    }

    fn last_active(&self, v: &RankView) -> u64 {
        v.open
            .iter()
            .map(|o| o.enqueue_us)
            .max()
            .unwrap_or(0)
            .max(v.last_end_us)
    }
}

/// The analysis of one job's snapshot (`missing_hosts`: hosts the master expected but did not
/// hear from; they go into the evidence).
pub fn analyze(s: &JobSnapshot, settings: &HangSettings, missing_hosts: &[String]) -> Analysis {
    let ctx = Ctx::new(s);
    let threshold = threshold_us(s, settings);
    let mut out = Analysis {
        threshold_us: threshold,
        ..Analysis::default()
    };
    // Every waiting rank's edges (union over its open ops) and its oldest open op.
    let mut edges: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
    let mut blocked_in: BTreeMap<i64, &OpenOp> = BTreeMap::new();
    for v in ctx.views.values() {
        if v.open.is_empty() {
            continue;
        }
        let oldest = v
            .open
            .iter()
            .min_by_key(|o| (o.enqueue_us, o.coll_local_sn))
            .expect("not empty");
        out.oldest_open_us = out
            .oldest_open_us
            .max(s.taken_us.saturating_sub(oldest.enqueue_us));
        blocked_in.insert(v.rank, oldest);
        let e = edges.entry(v.rank).or_default();
        for op in &v.open {
            e.extend(ctx.absent(v.rank, op).1);
        }
    }
    if blocked_in.is_empty() || out.oldest_open_us < threshold {
        return out;
    }

    let mismatches = find_mismatches(&ctx, &blocked_in);
    let in_mismatch: BTreeSet<i64> = mismatches
        .iter()
        .flat_map(|m| {
            ctx.comms
                .get(&m.comm.hash)
                .map(|c| c.members.iter().map(|(_, g)| *g).collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect();

    // Terminal nodes of the graph reachable from the waiters.
    let terminals = terminal_components(&edges);
    let mut sinks: Vec<(SinkKind, u64, i64)> = Vec::new();
    for comp in &terminals {
        for &r in comp {
            let kind = match ctx.views.get(&r) {
                None => SinkKind::NoData,
                Some(v) if v.ended || v.proc_state.as_ref().is_some_and(|p| p.status.is_dead()) => {
                    SinkKind::Dead
                }
                Some(_) if comp.len() > 1 => SinkKind::Cycle,
                Some(v) if !v.open.is_empty() => SinkKind::StuckInOp,
                Some(_) => SinkKind::Compute,
            };
            let last = ctx.views.get(&r).map_or(0, |v| ctx.last_active(v));
            if kind == SinkKind::Compute && s.taken_us.saturating_sub(last) < threshold {
                out.pending.push(r);
            }
            sinks.push((kind, last, r));
        }
    }
    if !out.pending.is_empty() {
        // A rank others wait on may still be in a normal compute phase: decide later.
        return out;
    }
    sinks.sort();
    let sources: Vec<(SinkKind, u64, i64)> = sinks
        .into_iter()
        .filter(|(_, _, r)| !in_mismatch.contains(r))
        .collect();
    out.verdicts.extend(mismatches);
    if !sources.is_empty() {
        out.verdicts.push(graph_verdict(
            &ctx,
            &edges,
            &blocked_in,
            &sources,
            threshold,
            missing_hosts,
        ));
    }
    for v in &mut out.verdicts {
        v.job = s.job.clone();
        if let Value::Object(m) = &mut v.evidence {
            m.insert("threshold_us".into(), json!(threshold));
            m.insert("taken_us".into(), json!(s.taken_us));
            m.insert("hosts".into(), json!(s.hosts));
            m.insert("missing_hosts".into(), json!(missing_hosts));
        }
    }
    out
}

fn comm_of(ctx: &Ctx<'_>, hash: u64) -> VerdictComm {
    let c = ctx.comms.get(&hash);
    VerdictComm {
        hash,
        name: c.map(|c| c.name.clone()).unwrap_or_default(),
        role: c.map(|c| c.role.clone()).unwrap_or_default(),
    }
}

fn graph_verdict(
    ctx: &Ctx<'_>,
    edges: &BTreeMap<i64, BTreeSet<i64>>,
    blocked_in: &BTreeMap<i64, &OpenOp>,
    sources: &[(SinkKind, u64, i64)],
    threshold: u64,
    _missing_hosts: &[String],
) -> Verdict {
    let source_set: BTreeSet<i64> = sources.iter().map(|s| s.2).collect();
    // The first non-progressing instance: the earliest entered op that waits on a source.
    let first = blocked_in
        .keys()
        .flat_map(|r| {
            ctx.views[r]
                .open
                .iter()
                .filter(|op| ctx.absent(*r, op).1.iter().any(|a| source_set.contains(a)))
                .map(move |op| (op.enqueue_us, *r, op))
        })
        .min_by_key(|(t, r, op)| (*t, *r, op.coll_local_sn))
        .or_else(|| {
            // Sources stuck inside an op everyone entered: that op.
            sources
                .iter()
                .find_map(|s| blocked_in.get(&s.2).map(|op| (op.enqueue_us, s.2, *op)))
        });
    let kind = if sources[0].0 == SinkKind::Dead {
        VerdictKind::Failure
    } else {
        VerdictKind::Hang
    };
    let (comm, func, seq, entered, absent, since, first_ops) = match first {
        Some((t, r, op)) => {
            let (inst, _) = ctx.absent(r, op);
            let (entered, absent) = ctx.instance_ranks(&inst, r, op);
            let ops: Vec<Value> = entered
                .iter()
                .filter_map(|g| ctx.views.get(g))
                .flat_map(|v| {
                    v.open
                        .iter()
                        .filter(|o| o.comm == inst.comm && o.func == inst.func)
                        .map(move |o| open_json(v.rank, o))
                })
                .take(MAX_EVIDENCE_OPS)
                .collect();
            (
                comm_of(ctx, inst.comm),
                inst.func,
                inst.seq,
                entered,
                absent,
                t,
                ops,
            )
        }
        None => (
            VerdictComm::default(),
            String::new(),
            0,
            vec![],
            vec![],
            0,
            vec![],
        ),
    };
    let (chain, truncated) = chain(ctx, edges, blocked_in, &source_set);
    let source_info: Vec<Value> = sources
        .iter()
        .map(|(k, last, r)| {
            let v = ctx.views.get(r);
            json!({
                "rank": r,
                "state": k.as_str(),
                "host": v.map(|v| v.host.clone()),
                "pid": v.map(|v| v.pid),
                "last_active_us": last,
                "silent_us": ctx.s.taken_us.saturating_sub(*last),
                "proc_state": v.and_then(|v| v.proc_state.clone()),
                "stacks": v.and_then(|v| v.stacks.clone()),
            })
        })
        .collect();
    let procs: BTreeMap<String, Value> = ctx
        .views
        .values()
        .filter_map(|v| {
            v.proc_state
                .as_ref()
                .map(|p| (v.rank.to_string(), json!(p)))
        })
        .collect();
    let stacks: BTreeMap<String, Value> = ctx
        .views
        .values()
        .filter(|v| !source_set.contains(&v.rank))
        .filter_map(|v| v.stacks.as_ref().map(|st| (v.rank.to_string(), json!(st))))
        .collect();
    let membership = ctx.comms.get(&comm.hash).map(|c| json!(c));
    Verdict {
        job: String::new(),
        kind,
        source_ranks: sources.iter().map(|s| s.2).collect(),
        comm,
        func,
        seq,
        entered_ranks: entered,
        absent_ranks: absent,
        chain,
        since_us: since,
        evidence: json!({
            "sources": source_info,
            "overdue": first_ops,
            "membership": membership,
            "graph": {"waiting_ranks": edges.len(), "edges": edges.values().map(BTreeSet::len).sum::<usize>()},
            "chain_truncated": truncated,
            "procs": procs,
            "stacks": stacks,
            "wait_threshold_us": threshold,
        }),
    }
}

fn open_json(rank: i64, o: &OpenOp) -> Value {
    json!({
        "rank": rank, "comm": format!("0x{:016x}", o.comm), "func": o.func, "seq": o.seq,
        "peer": o.peer, "count": o.count, "bytes": o.bytes, "enqueue_us": o.enqueue_us,
        "start_us": o.start_us, "phase": o.phase,
    })
}

/// Wait-for links from the sources outwards (breadth first), farthest waiters first.
fn chain(
    ctx: &Ctx<'_>,
    edges: &BTreeMap<i64, BTreeSet<i64>>,
    blocked_in: &BTreeMap<i64, &OpenOp>,
    sources: &BTreeSet<i64>,
) -> (Vec<ChainLink>, bool) {
    let mut rev: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (from, tos) in edges {
        for to in tos {
            rev.entry(*to).or_default().push(*from);
        }
    }
    let mut depth: BTreeMap<i64, usize> = sources.iter().map(|r| (*r, 0)).collect();
    let mut q: VecDeque<i64> = sources.iter().copied().collect();
    while let Some(r) = q.pop_front() {
        let d = depth[&r];
        for w in rev.get(&r).into_iter().flatten() {
            if !depth.contains_key(w) {
                depth.insert(*w, d + 1);
                q.push_back(*w);
            }
        }
    }
    let mut links: Vec<(usize, ChainLink)> = depth
        .iter()
        .filter(|(_, d)| **d > 0)
        .filter_map(|(r, d)| {
            let op = blocked_in.get(r)?;
            let waits_for: Vec<i64> = edges[r]
                .iter()
                .copied()
                .filter(|t| depth.get(t).is_some_and(|td| td < d))
                .collect();
            let (inst, _) = ctx.absent(*r, op);
            Some((
                *d,
                ChainLink {
                    rank: *r,
                    comm: inst.comm,
                    func: inst.func,
                    seq: inst.seq,
                    waits_for,
                },
            ))
        })
        .collect();
    links.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.rank.cmp(&b.1.rank)));
    let truncated = links.len() > MAX_CHAIN;
    (
        links.into_iter().take(MAX_CHAIN).map(|(_, l)| l).collect(),
        truncated,
    )
}

/// Mismatches: members of one collective instance with different counts or sizes, or members
/// of one comm all blocked in it but in different functions.
fn find_mismatches(ctx: &Ctx<'_>, blocked_in: &BTreeMap<i64, &OpenOp>) -> Vec<Verdict> {
    let mut out = Vec::new();
    // (a) Same instance, different count / bytes.
    type Entered<'o> = Vec<(i64, &'o OpenOp)>;
    let mut by_inst: BTreeMap<(u64, String, u64), Entered<'_>> = BTreeMap::new();
    for v in ctx.views.values() {
        for o in v.open.iter().filter(|o| o.peer < 0) {
            by_inst
                .entry((o.comm, o.func.clone(), o.seq))
                .or_default()
                .push((v.rank, o));
        }
    }
    for ((comm, func, seq), ops) in &by_inst {
        let mut groups: BTreeMap<(u64, u64), Vec<i64>> = BTreeMap::new();
        for (r, o) in ops {
            groups.entry((o.count, o.bytes)).or_default().push(*r);
        }
        if groups.len() < 2 {
            continue;
        }
        // The usual size on this comm: what its members finished last.
        let mut usual: BTreeMap<u64, usize> = BTreeMap::new();
        for (r, _) in ops {
            if let Some(c) = ctx.views[r]
                .colls
                .iter()
                .find(|c| c.comm == *comm && c.func == *func)
            {
                *usual.entry(c.last_count).or_default() += 1;
            }
        }
        let usual = usual
            .into_iter()
            .max_by_key(|(c, n)| (*n, *c))
            .map(|(c, _)| c);
        let odd = minority(&groups, |k| Some(k.0) == usual);
        let evidence_ops: Vec<Value> = ops
            .iter()
            .take(MAX_EVIDENCE_OPS)
            .map(|(r, o)| open_json(*r, o))
            .collect();
        out.push(mismatch_verdict(
            ctx,
            *comm,
            func.clone(),
            *seq,
            odd,
            ops.iter().map(|(r, _)| *r).collect(),
            vec![],
            ops.iter().map(|(_, o)| o.enqueue_us).min().unwrap_or(0),
            json!({"reason": "count", "overdue": evidence_ops}),
        ));
    }
    // (b) Members of one comm blocked in it, in different functions.
    let mut by_comm: BTreeMap<u64, BTreeMap<String, Vec<i64>>> = BTreeMap::new();
    for (r, o) in blocked_in {
        by_comm
            .entry(o.comm)
            .or_default()
            .entry(o.func.clone())
            .or_default()
            .push(*r);
    }
    for (comm, funcs) in &by_comm {
        let coll_funcs = funcs
            .keys()
            .filter(|f| *f != "Send" && *f != "Recv")
            .count();
        let Some(c) = ctx.comms.get(comm) else {
            continue;
        };
        let total: usize = funcs.values().map(Vec::len).sum();
        if coll_funcs < 2 || total < c.members.len() {
            continue;
        }
        let groups: BTreeMap<(u64, u64), Vec<i64>> = funcs
            .iter()
            .enumerate()
            .map(|(i, (_, rs))| ((i as u64, 0), rs.clone()))
            .collect();
        let odd = minority(&groups, |_| false);
        let majority_func = funcs
            .iter()
            .max_by_key(|(f, rs)| (rs.len(), std::cmp::Reverse((*f).clone())))
            .map(|(f, _)| f.clone())
            .unwrap_or_default();
        let op = blocked_in[&funcs[&majority_func][0]];
        out.push(mismatch_verdict(
            ctx,
            *comm,
            majority_func.clone(),
            op.seq,
            odd.clone(),
            funcs[&majority_func].clone(),
            odd,
            op.enqueue_us,
            json!({"reason": "func", "funcs": funcs}),
        ));
    }
    out
}

/// The ranks of the smallest group; among several of that size, those `usual` does not accept
/// (all of them when that leaves none or all).
fn minority(
    groups: &BTreeMap<(u64, u64), Vec<i64>>,
    usual: impl Fn(&(u64, u64)) -> bool,
) -> Vec<i64> {
    let min = groups.values().map(Vec::len).min().unwrap_or(0);
    let small: Vec<(&(u64, u64), &Vec<i64>)> =
        groups.iter().filter(|(_, v)| v.len() == min).collect();
    let unusual: Vec<&Vec<i64>> = small
        .iter()
        .filter(|(k, _)| !usual(k))
        .map(|(_, v)| *v)
        .collect();
    let pick: Vec<&Vec<i64>> =
        if small.len() > 1 && !unusual.is_empty() && unusual.len() < small.len() {
            unusual
        } else {
            small.iter().map(|(_, v)| *v).collect()
        };
    let mut odd: Vec<i64> = pick.into_iter().flatten().copied().collect();
    odd.sort_unstable();
    odd
}

#[allow(
    clippy::too_many_arguments,
    reason = "one private constructor, named fields at its two call sites"
)]
fn mismatch_verdict(
    ctx: &Ctx<'_>,
    comm: u64,
    func: String,
    seq: u64,
    sources: Vec<i64>,
    entered: Vec<i64>,
    absent: Vec<i64>,
    since: u64,
    mut evidence: Value,
) -> Verdict {
    if let Value::Object(m) = &mut evidence {
        m.insert("membership".into(), json!(ctx.comms.get(&comm)));
        let stacks: BTreeMap<String, Value> = sources
            .iter()
            .filter_map(|r| ctx.views.get(r))
            .filter_map(|v| v.stacks.as_ref().map(|s| (v.rank.to_string(), json!(s))))
            .collect();
        m.insert("stacks".into(), json!(stacks));
    }
    Verdict {
        job: String::new(),
        kind: VerdictKind::Mismatch,
        source_ranks: sources,
        comm: comm_of(ctx, comm),
        func,
        seq,
        entered_ranks: entered,
        absent_ranks: absent,
        chain: vec![],
        since_us: since,
        evidence,
    }
}

//! The wait-for graph's verdict: its terminal nodes (the source ranks) and why they wait on
//! nobody, the first non-progressing instance, the chain of waiters and the evidence.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Value};

use super::context::{comm_of, open_json, Ctx, MAX_EVIDENCE_OPS};
use super::model::{ChainLink, OpenOp, RankView, Verdict, VerdictComm, VerdictKind};

/// Wait-for edges shown in a verdict's chain at most (the evidence says when it was cut).
const MAX_CHAIN: usize = 64;

/// A terminal node of the wait-for graph: why it waits on nobody, when it was last active
/// (µs) and its rank.
pub(super) type Sink = (SinkKind, u64, i64);

/// Why a terminal node waits on nobody.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum SinkKind {
    Dead,
    Compute,
    StuckInOp,
    NoData,
    Cycle,
}

impl SinkKind {
    /// The state's name in the evidence (`dead`, `compute`, ...).
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

/// Every node of the terminal components `terminals` as a [`Sink`], and the ranks among them
/// still in a compute phase shorter than `threshold` (decide later). A compute phase is measured
/// up to [`Ctx::known_until`], so a host whose latest view is a few seconds older than the
/// others' does not turn its ranks' ordinary compute phases into sources.
pub(super) fn terminal_sinks(
    ctx: &Ctx<'_>,
    terminals: &[Vec<i64>],
    threshold: u64,
) -> (Vec<Sink>, Vec<i64>) {
    let mut sinks: Vec<Sink> = Vec::new();
    let mut pending = Vec::new();
    for comp in terminals {
        for &r in comp {
            let v = ctx.views.get(&r);
            let kind = match v {
                None => SinkKind::NoData,
                Some(v) if v.ended || v.proc_state.as_ref().is_some_and(|p| p.status.is_dead()) => {
                    SinkKind::Dead
                }
                Some(_) if comp.len() > 1 => SinkKind::Cycle,
                Some(v) if !v.open.is_empty() => SinkKind::StuckInOp,
                Some(_) => SinkKind::Compute,
            };
            let last = v.map_or(0, |v| ctx.last_active(v));
            let until = v.map_or(ctx.s.taken_us, |v| ctx.known_until(v));
            if kind == SinkKind::Compute && until.saturating_sub(last) < threshold {
                pending.push(r);
            }
            sinks.push((kind, last, r));
        }
    }
    (sinks, pending)
}

/// The first non-progressing instance of a verdict and who entered it (empty when none).
#[derive(Default)]
struct FirstInstance {
    comm: VerdictComm,
    func: String,
    seq: u64,
    entered: Vec<i64>,
    absent: Vec<i64>,
    /// When it was entered (µs).
    since: u64,
    /// The open ops of its entered members (evidence).
    ops: Vec<Value>,
}

/// The earliest entered op that waits on a source, else the op a source is stuck in:
/// `(enqueue µs, rank, op)`.
fn first_blocked<'a>(
    ctx: &Ctx<'a>,
    blocked_in: &BTreeMap<i64, &'a OpenOp>,
    sources: &[Sink],
    source_set: &BTreeSet<i64>,
) -> Option<(u64, i64, &'a OpenOp)> {
    blocked_in
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
        })
}

/// The instance `op` of rank `r` (entered at `t`) is in, as a [`FirstInstance`].
fn first_instance(ctx: &Ctx<'_>, t: u64, r: i64, op: &OpenOp) -> FirstInstance {
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
    FirstInstance {
        comm: comm_of(ctx, inst.comm),
        func: inst.func,
        seq: inst.seq,
        entered,
        absent,
        since: t,
        ops,
    }
}

/// One line on a rank's main thread from its host context: what it did most of the latest
/// sampling interval, its shares, and its state now: `blocked 100 % of the last interval
/// (on-cpu 0 %, runnable 0 %, blocked 100 %); now blocked (futex) for 41.2 s`. (A spinning
/// thread that naps now and then is mostly on-CPU, whatever the instant shows.)
fn main_thread(v: &RankView, now_us: u64) -> Option<String> {
    let t = v.host_context.as_ref()?.threads.first()?;
    let secs = now_us.saturating_sub(t.since_us) as f64 / 1e6;
    let now = if t.syscall.is_empty() {
        t.state.clone()
    } else {
        format!("{} ({})", t.state, t.syscall)
    };
    let l = &t.last;
    let (top, pct) = [
        ("on-cpu", l.on_cpu_pct),
        ("runnable", l.runnable_pct),
        ("blocked", l.blocked_pct),
    ]
    .into_iter()
    .fold(("", -1.0), |a, b| if b.1 > a.1 { b } else { a });
    if l.on_cpu_pct + l.runnable_pct + l.blocked_pct <= 0.0 {
        return Some(format!("now {now} for {secs:.1} s"));
    }
    Some(format!(
        "{top} {pct:.0} % of the last interval (on-cpu {:.0} %, runnable {:.0} %, blocked {:.0} %); now {now} for {secs:.1} s",
        l.on_cpu_pct, l.runnable_pct, l.blocked_pct
    ))
}

/// The latest XID of a rank's GPUs, one line: `GPU 0000:2a:00.0 (CUDA device 1) raised XID 79
/// 12.0 s before the snapshot`.
fn gpu_xid(v: &RankView, now_us: u64) -> Option<String> {
    let (g, (at, xid)) = v
        .gpus
        .iter()
        .filter_map(|g| g.xids.last().map(|x| (g, *x)))
        .max_by_key(|(_, (at, _))| *at)?;
    Some(format!(
        "GPU {} (CUDA device {}) raised XID {xid} {:.1} s before the snapshot",
        g.pci,
        g.ordinal,
        now_us.saturating_sub(at) as f64 / 1e6
    ))
}

/// The evidence of each source: its state, process, silence, stacks and host context.
fn source_info(ctx: &Ctx<'_>, sources: &[Sink]) -> Vec<Value> {
    sources
        .iter()
        .map(|(k, last, r)| {
            let v = ctx.views.get(r);
            let mut info = json!({
                "rank": r,
                "state": k.as_str(),
                "host": v.map(|v| v.host.clone()),
                "pid": v.map(|v| v.pid),
                "last_active_us": last,
                // null: nothing was ever heard from it (no op, no report).
                "silent_us": (*last > 0).then(|| ctx.s.taken_us.saturating_sub(*last)),
                "proc_state": v.and_then(|v| v.proc_state.clone()),
                "stacks": v.and_then(|v| v.stacks.clone()),
            });
            if let (Some(v), Value::Object(m)) = (v, &mut info) {
                if let Some(h) = &v.host_context {
                    m.insert("host_context".into(), json!(h));
                    if let Some(line) = crate::host::qps::errored_line(&h.qps) {
                        m.insert("queue_pairs".into(), json!(line));
                    }
                }
                if let Some(line) = main_thread(v, ctx.s.taken_us) {
                    m.insert("main_thread".into(), json!(line));
                }
                if !v.gpus.is_empty() {
                    m.insert("gpus".into(), json!(v.gpus));
                }
                if let Some(line) = gpu_xid(v, ctx.s.taken_us) {
                    m.insert("gpu_xid".into(), json!(line));
                }
            }
            info
        })
        .collect()
}

/// The verdict of the wait-for graph `edges` whose terminal nodes (sorted) are `sources`.
pub(super) fn graph_verdict(
    ctx: &Ctx<'_>,
    edges: &BTreeMap<i64, BTreeSet<i64>>,
    blocked_in: &BTreeMap<i64, &OpenOp>,
    sources: &[Sink],
    threshold: u64,
    _missing_hosts: &[String],
) -> Verdict {
    let source_set: BTreeSet<i64> = sources.iter().map(|s| s.2).collect();
    // The first non-progressing instance: the earliest entered op that waits on a source.
    let first = first_blocked(ctx, blocked_in, sources, &source_set);
    let kind = if sources[0].0 == SinkKind::Dead {
        VerdictKind::Failure
    } else {
        VerdictKind::Hang
    };
    let fi = first.map_or_else(FirstInstance::default, |(t, r, op)| {
        first_instance(ctx, t, r, op)
    });
    let (chain, truncated) = chain(ctx, edges, blocked_in, &source_set);
    let source_info = source_info(ctx, sources);
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
    let membership = ctx.comms.get(&fi.comm.hash).map(|c| json!(c));
    Verdict {
        job: String::new(),
        kind,
        source_ranks: sources.iter().map(|s| s.2).collect(),
        comm: fi.comm,
        func: fi.func,
        seq: fi.seq,
        entered_ranks: fi.entered,
        category: (!fi.absent.is_empty()).then(|| "missing".to_string()),
        absent_ranks: fi.absent,
        chain,
        since_us: fi.since,
        gpu_fault: sources.iter().find_map(|(_, _, r)| {
            let v = ctx.views.get(r)?;
            gpu_xid(v, ctx.s.taken_us).map(|l| format!("rank {r}: {l}"))
        }),
        evidence: json!({
            "sources": source_info,
            "overdue": fi.ops,
            "membership": membership,
            "graph": {"waiting_ranks": edges.len(), "edges": edges.values().map(BTreeSet::len).sum::<usize>()},
            "chain_truncated": truncated,
            "procs": procs,
            "stacks": stacks,
            "wait_threshold_us": threshold,
        }),
    }
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

//! The analysis: from a [`JobSnapshot`] (one agent's, or all agents' merged), per comm instance
//! who entered and who is absent; the wait-for graph (a rank waits on the absent members of the
//! instances it is in); its terminal nodes are the source ranks. Mismatches (same instance,
//! different size; or members of one comm blocked in different functions) are named apart.
//!
//! Deterministic: the same snapshot and settings give the same verdicts, online and offline.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::context::Ctx;
use super::graph::terminal_components;
use super::mismatch::find_mismatches;
use super::model::{JobSnapshot, OpenOp, Verdict};
pub use super::settings::{threshold_us, HangSettings, CURRENT_VIEW_US};
use super::waitfor::{graph_verdict, terminal_sinks, Sink};

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

/// Who waits on whom: the wait-for graph and every waiting rank's oldest open op.
struct Waits<'a> {
    /// Every waiting rank's edges (union over its open ops).
    edges: BTreeMap<i64, BTreeSet<i64>>,
    blocked_in: BTreeMap<i64, &'a OpenOp>,
    /// Age of the oldest open operation (µs; 0 when none).
    oldest_open_us: u64,
}

/// The wait-for graph of the snapshot `ctx` indexes.
fn waits<'a>(ctx: &Ctx<'a>) -> Waits<'a> {
    let mut w = Waits {
        edges: BTreeMap::new(),
        blocked_in: BTreeMap::new(),
        oldest_open_us: 0,
    };
    for v in ctx.views.values() {
        if v.open.is_empty() {
            continue;
        }
        let oldest = v
            .open
            .iter()
            .min_by_key(|o| (o.enqueue_us, o.coll_local_sn))
            .expect("not empty");
        w.oldest_open_us = w
            .oldest_open_us
            .max(ctx.s.taken_us.saturating_sub(oldest.enqueue_us));
        w.blocked_in.insert(v.rank, oldest);
        let e = w.edges.entry(v.rank).or_default();
        for op in &v.open {
            e.extend(ctx.absent(v.rank, op).1);
        }
    }
    // A member that entered the instance a rank is blocked in only by enqueueing it, while it
    // is itself blocked in an older op, has not reached it: the rank waits for it too.
    for (rank, op) in &w.blocked_in {
        let behind = behind_members(ctx, &w.blocked_in, *rank, op);
        if !behind.is_empty() {
            w.edges.entry(*rank).or_default().extend(behind);
        }
    }
    w
}

/// The members of `op`'s instance (other than `rank`) whose own op in it was enqueued but not
/// started while they are blocked in an older op.
fn behind_members(
    ctx: &Ctx<'_>,
    blocked_in: &BTreeMap<i64, &OpenOp>,
    rank: i64,
    op: &OpenOp,
) -> Vec<i64> {
    let (entered, _) = ctx.instance_ranks(&ctx.absent(rank, op).0, rank, op);
    entered
        .into_iter()
        .filter(|m| *m != rank)
        .filter(|m| {
            let (Some(view), Some(oldest)) = (ctx.views.get(m), blocked_in.get(m)) else {
                return false;
            };
            view.open
                .iter()
                .find(|o| ctx.same_instance(*m, o, rank, op))
                .is_some_and(|mine| {
                    mine.phase == 0
                        && mine.start_us == 0
                        && (oldest.enqueue_us, oldest.coll_local_sn)
                            < (mine.enqueue_us, mine.coll_local_sn)
                })
        })
        .collect()
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
    let Waits {
        edges,
        blocked_in,
        oldest_open_us,
    } = waits(&ctx);
    out.oldest_open_us = oldest_open_us;
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
    let (mut sinks, pending) = terminal_sinks(&ctx, &terminals, threshold);
    out.pending = pending;
    if !out.pending.is_empty() {
        // A rank others wait on may still be in a normal compute phase: decide later.
        return out;
    }
    sinks.sort();
    let sources: Vec<Sink> = sinks
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

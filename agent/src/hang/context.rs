//! The snapshot as the analysis reads it ([`Ctx`]): comm instances, who entered them and who
//! is absent, plus the evidence helpers the verdicts share.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::model::{CommView, JobSnapshot, OpenOp, RankView, VerdictComm};
use super::settings::CURRENT_VIEW_US;

/// Open ops listed in a verdict's evidence at most.
pub(super) const MAX_EVIDENCE_OPS: usize = 64;

/// One comm instance: a collective `(comm, func, seq)` or the `ord`-th P2P op of a pair.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Instance {
    pub comm: u64,
    pub func: String,
    pub seq: u64,
}

/// A snapshot indexed for the analysis: rank views by global rank, communicators by hash.
pub(super) struct Ctx<'a> {
    pub s: &'a JobSnapshot,
    pub views: BTreeMap<i64, &'a RankView>,
    pub comms: BTreeMap<u64, &'a CommView>,
}

/// The P2P function that completes `func` (`Send` <-> `Recv`).
fn counterpart(func: &str) -> &'static str {
    if func == "Send" {
        "Recv"
    } else {
        "Send"
    }
}

impl<'a> Ctx<'a> {
    /// The index of `s` (views of ranks < 0 left out).
    pub fn new(s: &'a JobSnapshot) -> Ctx<'a> {
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

    /// The rank of global rank `global` inside communicator `comm`.
    fn comm_rank(&self, comm: u64, global: i64) -> Option<i32> {
        self.comms
            .get(&comm)?
            .members
            .iter()
            .find(|(_, g)| *g == global)
            .map(|(c, _)| *c)
    }

    /// The global rank of `comm_rank` inside communicator `comm`.
    fn global(&self, comm: u64, comm_rank: i32) -> Option<i64> {
        self.comms
            .get(&comm)?
            .members
            .iter()
            .find(|(c, _)| *c == comm_rank)
            .map(|(_, g)| *g)
    }

    /// The instance `op` of `rank` is in, and the members absent from it.
    pub fn absent(&self, rank: i64, op: &OpenOp) -> (Instance, Vec<i64>) {
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

    /// Whether `o` (an open op of rank `r`) is in the same instance as `op` of rank `waiter`:
    /// the same collective `(comm, func, seq)`, or the counterpart of a P2P op (the other
    /// direction, between the two, at the same position).
    pub fn same_instance(&self, r: i64, o: &OpenOp, waiter: i64, op: &OpenOp) -> bool {
        if o.comm != op.comm {
            return false;
        }
        if op.peer < 0 {
            return o.peer < 0 && o.func == op.func && o.seq == op.seq;
        }
        o.peer >= 0
            && o.func == counterpart(&op.func)
            && o.p2p_ord == op.p2p_ord
            && self.comm_rank(op.comm, waiter) == Some(o.peer)
            && self.global(op.comm, op.peer) == Some(r)
    }

    /// Whether `rank` entered (or finished) the collective instance `inst`.
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
    pub fn instance_ranks(
        &self,
        inst: &Instance,
        waiter: i64,
        op: &OpenOp,
    ) -> (Vec<i64>, Vec<i64>) {
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

    /// Up to when `v`'s silence is known (µs): when its view was taken if that view is current
    /// (at most [`CURRENT_VIEW_US`] before this snapshot), else this snapshot's time (its host
    /// stopped reporting; waiting for it could be forever).
    pub fn known_until(&self, v: &RankView) -> u64 {
        let taken = self.s.taken_us;
        match v.observed_us {
            t if t != 0 && t < taken && taken - t <= CURRENT_VIEW_US => t,
            _ => taken,
        }
    }

    /// When the rank was last seen doing anything (latest enqueue or op end, µs).
    pub fn last_active(&self, v: &RankView) -> u64 {
        v.open
            .iter()
            .map(|o| o.enqueue_us)
            .max()
            .unwrap_or(0)
            .max(v.last_end_us)
    }
}

/// The verdict's view of communicator `hash` (name and role empty when unknown).
pub(super) fn comm_of(ctx: &Ctx<'_>, hash: u64) -> VerdictComm {
    let c = ctx.comms.get(&hash);
    VerdictComm {
        hash,
        name: c.map(|c| c.name.clone()).unwrap_or_default(),
        role: c.map(|c| c.role.clone()).unwrap_or_default(),
    }
}

/// An open op of `rank` as verdict evidence.
pub(super) fn open_json(rank: i64, o: &OpenOp) -> Value {
    json!({
        "rank": rank, "comm": format!("0x{:016x}", o.comm), "func": o.func, "seq": o.seq,
        "peer": o.peer, "count": o.count, "bytes": o.bytes, "enqueue_us": o.enqueue_us,
        "start_us": o.start_us, "phase": o.phase,
    })
}

//! [`HangTracker`]: per process stream, how far the rank got on every communicator, which
//! operations it has entered and not finished (from `overdue` records and ops flagged
//! incomplete), and the job's normal quiet intervals. Fed record by record by the
//! engine's hang built-in ([`crate::engine::Engine`], online and offline alike); checkpointed
//! with it.
//! [`HangTracker::snapshot`] turns it into a [`JobSnapshot`] for the analysis.

use std::collections::BTreeMap;

use comminsight_wire::record::{Body, OpRecord, Overdue, Record, FLAG_INCOMPLETE};
use comminsight_wire::Func;
use serde::{Deserialize, Serialize};

use super::model::{
    CollProgress, CommView, GapStats, JobSnapshot, OpenOp, P2pProgress, RankView, SNAPSHOT_VERSION,
};
use crate::roles::{CommRole, TopologyCollector};
use crate::stream::{Alignment, StreamId};

/// Stalls kept per stream for the offline "resolved" report (oldest dropped).
const MAX_STALLS: usize = 64;

/// An operation a rank entered and has not finished.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct OpenEntry {
    comm: u64,
    func: u8,
    seq: u64,
    peer: i32,
    count: u64,
    bytes: u64,
    enqueue_us: u64,
    start_us: u64,
    seen_us: u64,
    phase: u8,
    /// Reported overdue (not only flagged incomplete).
    overdue: bool,
}

/// An op that was overdue and finished later: a stall the job survived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stall {
    pub rank: i64,
    #[serde(with = "super::model::hex_u64")]
    pub comm: u64,
    pub func: String,
    pub seq: u64,
    pub enqueue_us: u64,
    pub end_us: u64,
    /// The job's learned gaps just before it finished.
    pub gaps_before: GapStats,
}

/// One process stream's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct RankTrack {
    rank: i64,
    pid: u32,
    last_end_us: u64,
    last_heard_us: u64,
    ended: bool,
    #[serde(with = "crate::util::serde_pairs")]
    colls: BTreeMap<(u64, u8), (u64, u64)>,
    #[serde(with = "crate::util::serde_pairs")]
    p2p: BTreeMap<(u64, i32, u8), u64>,
    #[serde(with = "crate::util::serde_pairs")]
    open: BTreeMap<u64, OpenEntry>,
    gaps: GapStats,
    stalls: Vec<Stall>,
}

/// The hang tracker of every stream the agent (or an offline pass) has seen.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HangTracker {
    #[serde(with = "crate::util::serde_pairs")]
    streams: BTreeMap<StreamId, RankTrack>,
}

fn us(align: &Alignment, ns: u64) -> u64 {
    align.apply(ns) / 1000
}

impl HangTracker {
    /// Take what matters from one record of `id` (`align`: the stream's clock correction now).
    pub fn observe(&mut self, id: &StreamId, rec: &Record, align: &Alignment) {
        match &rec.body {
            Body::ProcStart(p) => {
                let t = self.track(id);
                t.rank = i64::from(p.rank);
                t.pid = p.pid;
            }
            Body::Coll(op) | Body::P2p(op) => {
                let p2p = matches!(rec.body, Body::P2p(_));
                let incomplete = rec.flags & FLAG_INCOMPLETE != 0 || op.end_ns == 0;
                let t = self.track(id);
                if incomplete {
                    t.enter(op, p2p, align);
                } else {
                    t.finish(op, p2p, align);
                }
            }
            Body::Overdue(o) => {
                let t = self.track(id);
                t.overdue(o, align);
            }
            Body::Stats(s) => {
                if let Some(t) = self.streams.get_mut(id) {
                    t.last_heard_us = t.last_heard_us.max(us(align, s.time_ns));
                }
            }
            Body::CommFini(_) => {}
            _ => {}
        }
    }

    fn track(&mut self, id: &StreamId) -> &mut RankTrack {
        if !self.streams.contains_key(id) {
            let pid = id.pid.parse().unwrap_or(0);
            self.streams.insert(
                id.clone(),
                RankTrack {
                    rank: -1,
                    pid,
                    ..RankTrack::default()
                },
            );
        }
        self.streams.get_mut(id).expect("inserted above")
    }

    /// The stream ended (its process finalised, or its ring is gone).
    pub fn end_stream(&mut self, id: &StreamId) {
        if let Some(t) = self.streams.get_mut(id) {
            t.ended = true;
        }
    }

    /// Forget a stream (finished and gone).
    pub fn forget(&mut self, id: &StreamId) {
        self.streams.remove(id);
    }

    /// Jobs with at least one open operation, and the earliest entry (aligned µs) of each.
    pub fn jobs_with_open_ops(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for (id, t) in &self.streams {
            if let Some(first) = t.open.values().map(|o| o.enqueue_us).min() {
                let e = out.entry(id.job.clone()).or_insert(u64::MAX);
                *e = (*e).min(first);
            }
        }
        out
    }

    /// Streams of `job` this tracker knows, with their pid and global rank.
    pub fn streams_of(&self, job: &str) -> Vec<(StreamId, u32, i64)> {
        self.streams
            .iter()
            .filter(|(id, _)| id.job == job)
            .map(|(id, t)| (id.clone(), t.pid, t.rank))
            .collect()
    }

    /// Stalls the job survived (ops overdue that finished later), oldest first.
    pub fn stalls(&self, job: &str) -> Vec<Stall> {
        let mut v: Vec<Stall> = self
            .streams
            .iter()
            .filter(|(id, _)| id.job == job)
            .flat_map(|(_, t)| t.stalls.iter().cloned())
            .collect();
        v.sort_by_key(|s| (s.enqueue_us, s.rank));
        v
    }

    /// The latest time anything was heard from the job (aligned µs; 0 when nothing).
    pub fn last_heard(&self, job: &str) -> u64 {
        self.streams
            .iter()
            .filter(|(id, _)| id.job == job)
            .map(|(_, t)| t.last_heard_us)
            .max()
            .unwrap_or(0)
    }

    /// What this tracker knows about `job` at `now_us`, with membership and roles from
    /// `topology`. `shift_us` moves every time onto the job timeline (this host's offset to the
    /// master); `now_us` is already on it.
    pub fn snapshot(
        &self,
        job: &str,
        topology: &TopologyCollector,
        now_us: u64,
        shift_us: i64,
    ) -> JobSnapshot {
        let mut snap = JobSnapshot {
            v: SNAPSHOT_VERSION,
            job: job.to_string(),
            taken_us: now_us,
            ..JobSnapshot::default()
        };
        if let Some(obs) = topology.jobs().get(job) {
            let roles = crate::roles::infer(job, obs);
            snap.world = roles.world;
            snap.comms = roles.comms.iter().map(comm_view).collect();
        }
        let mut hosts = std::collections::BTreeSet::new();
        for (id, t) in self.streams.iter().filter(|(id, _)| id.job == job) {
            hosts.insert(id.host.clone());
            snap.gaps.max_op_us = snap.gaps.max_op_us.max(t.gaps.max_op_us);
            snap.gaps.max_idle_us = snap.gaps.max_idle_us.max(t.gaps.max_idle_us);
            snap.gaps.plugin_threshold_ms = snap
                .gaps
                .plugin_threshold_ms
                .max(t.gaps.plugin_threshold_ms);
            snap.ranks.push(t.view(id, shift_us));
        }
        snap.hosts = hosts.into_iter().collect();
        snap.ranks.sort_by_key(|r| (r.rank, r.stream.clone()));
        snap
    }
}

/// A snapshot's view of one inferred communicator (members with a known global rank only).
fn comm_view(c: &CommRole) -> CommView {
    CommView {
        hash: c.hash,
        name: c.name.clone(),
        role: c.role.map(|r| r.as_str().to_string()).unwrap_or_default(),
        nranks: c.nranks,
        members: c
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, g)| **g >= 0)
            .map(|(i, g)| (i as i32, *g))
            .collect(),
    }
}

/// Host time `t` moved by `shift_us` onto the job timeline (0, absent, stays 0).
fn shifted(t: u64, shift_us: i64) -> u64 {
    if t == 0 {
        0
    } else {
        t.saturating_add_signed(shift_us)
    }
}

impl RankTrack {
    /// The snapshot's view of this stream `id`, its times moved by `shift_us`.
    fn view(&self, id: &StreamId, shift_us: i64) -> RankView {
        let sh = |t: u64| shifted(t, shift_us);
        RankView {
            rank: self.rank,
            host: id.host.clone(),
            pid: self.pid,
            stream: id.to_string(),
            last_end_us: sh(self.last_end_us),
            last_heard_us: sh(self.last_heard_us),
            observed_us: 0,
            ended: self.ended,
            colls: self
                .colls
                .iter()
                .map(|(&(comm, func), &(last_seq, last_count))| CollProgress {
                    comm,
                    func: Func(func).name().to_string(),
                    last_seq,
                    last_count,
                })
                .collect(),
            p2p: self
                .p2p
                .iter()
                .map(|(&(comm, peer, func), &done)| P2pProgress {
                    comm,
                    peer,
                    func: Func(func).name().to_string(),
                    done,
                })
                .collect(),
            open: self.open_ops(shift_us),
            proc_state: None,
            stacks: None,
            host_context: None,
            gpus: Vec::new(),
        }
    }

    /// The open ops as the snapshot shows them, with their P2P ordinals: finished ops of the
    /// same (comm, peer, func) plus the open ones entered before.
    fn open_ops(&self, shift_us: i64) -> Vec<OpenOp> {
        let sh = |t: u64| shifted(t, shift_us);
        let mut ord: BTreeMap<(u64, i32, u8), u64> = BTreeMap::new();
        self.open
            .iter()
            .map(|(sn, o)| {
                let p2p_ord = if o.peer >= 0 {
                    let k = (o.comm, o.peer, o.func);
                    let base = self.p2p.get(&k).copied().unwrap_or(0);
                    let n = ord.entry(k).or_insert(0);
                    *n += 1;
                    base + *n - 1
                } else {
                    0
                };
                OpenOp {
                    comm: o.comm,
                    func: Func(o.func).name().to_string(),
                    seq: o.seq,
                    coll_local_sn: *sn,
                    peer: o.peer,
                    p2p_ord,
                    count: o.count,
                    bytes: o.bytes,
                    enqueue_us: sh(o.enqueue_us),
                    start_us: sh(o.start_us),
                    seen_us: sh(o.seen_us),
                    phase: o.phase,
                    dtype: String::new(),
                }
            })
            .collect()
    }
}

impl RankTrack {
    fn heard(&mut self, t: u64) {
        self.last_heard_us = self.last_heard_us.max(t);
    }

    /// An op flagged incomplete (written at exit while still in flight).
    fn enter(&mut self, op: &OpRecord, p2p: bool, align: &Alignment) {
        let enqueue_us = us(align, op.enqueue_ns.max(op.api_ns));
        let e = self.open.entry(op.coll_local_sn).or_insert(OpenEntry {
            comm: op.comm_hash,
            func: op.func.0,
            seq: op.coll_sn,
            peer: if p2p { op.peer } else { -1 },
            count: op.count,
            bytes: op.bytes,
            enqueue_us,
            start_us: us(align, op.start_ns),
            seen_us: enqueue_us,
            phase: u8::from(op.start_ns != 0),
            overdue: false,
        });
        e.count = op.count;
        self.heard(enqueue_us);
    }

    fn finish(&mut self, op: &OpRecord, p2p: bool, align: &Alignment) {
        let enqueue_ns = if op.enqueue_ns != 0 {
            op.enqueue_ns
        } else {
            op.start_ns
        };
        let (enq, end) = (us(align, enqueue_ns), us(align, op.end_ns));
        let was_overdue = if self.open.is_empty() {
            false
        } else {
            self.open
                .remove(&op.coll_local_sn)
                .is_some_and(|o| o.overdue)
        };
        if was_overdue {
            if self.stalls.len() >= MAX_STALLS {
                self.stalls.remove(0);
            }
            self.stalls.push(Stall {
                rank: self.rank,
                comm: op.comm_hash,
                func: op.func.name().to_string(),
                seq: op.coll_sn,
                enqueue_us: enq,
                end_us: end,
                gaps_before: self.gaps,
            });
        }
        if enq > self.last_end_us && self.last_end_us != 0 {
            self.gaps.max_idle_us = self.gaps.max_idle_us.max(enq - self.last_end_us);
        }
        self.gaps.max_op_us = self.gaps.max_op_us.max(end.saturating_sub(enq));
        self.last_end_us = self.last_end_us.max(end);
        self.heard(end);
        if p2p {
            *self
                .p2p
                .entry((op.comm_hash, op.peer, op.func.0))
                .or_insert(0) += 1;
        } else {
            let e = self
                .colls
                .entry((op.comm_hash, op.func.0))
                .or_insert((op.coll_sn, op.count));
            if op.coll_sn >= e.0 {
                *e = (op.coll_sn, op.count);
            }
        }
    }

    fn overdue(&mut self, o: &Overdue, align: &Alignment) {
        let seen = us(align, o.now_ns);
        self.gaps.plugin_threshold_ms = self.gaps.plugin_threshold_ms.max(o.threshold_ms);
        let e = self.open.entry(o.coll_local_sn).or_insert(OpenEntry {
            comm: o.comm_hash,
            func: o.func.0,
            seq: o.coll_sn,
            peer: if o.is_p2p != 0 { o.peer } else { -1 },
            count: o.count,
            bytes: o.bytes,
            enqueue_us: us(align, o.enqueue_ns),
            ..OpenEntry::default()
        });
        e.start_us = us(align, o.start_ns);
        e.seen_us = e.seen_us.max(seen);
        e.phase = o.phase;
        e.overdue = true;
        self.heard(seen);
    }
}

#[cfg(test)]
mod tests {
    use comminsight_wire::record::{OpRecord, Overdue, ProcStart, Record, FLAG_INCOMPLETE};
    use comminsight_wire::Func;

    use super::*;

    const MS: u64 = 1_000_000;

    fn op(comm: u64, func: Func, sn: u64, local: u64, peer: i32, t: u64, end: u64) -> OpRecord {
        OpRecord {
            comm_hash: comm,
            coll_sn: sn,
            coll_local_sn: local,
            count: 8,
            bytes: 32,
            enqueue_ns: t,
            start_ns: t,
            end_ns: end,
            peer,
            func,
            ..OpRecord::default()
        }
    }

    fn overdue(o: &OpRecord, now: u64) -> Record {
        Record::new(Body::Overdue(Overdue {
            comm_hash: o.comm_hash,
            coll_sn: o.coll_sn,
            coll_local_sn: o.coll_local_sn,
            enqueue_ns: o.enqueue_ns,
            now_ns: now,
            count: o.count,
            bytes: o.bytes,
            threshold_ms: 1000,
            peer: o.peer,
            func: o.func,
            is_p2p: u8::from(o.peer >= 0),
            ..Overdue::default()
        }))
    }

    #[test]
    fn progress_open_ops_ordinals_and_stalls() {
        let id = StreamId::new("j", "h0", "42");
        let a = Alignment::default();
        let mut t = HangTracker::default();
        let start = Record::new(Body::ProcStart(ProcStart {
            pid: 42,
            rank: 3,
            ..ProcStart::default()
        }));
        t.observe(&id, &start, &a);
        // Two sends to peer 1 finished, an all-reduce finished after a 5 s stall.
        for (i, s) in [(0, 10), (1, 20)] {
            let o = op(0xa, Func::SEND, i, i, 1, s * MS, (s + 1) * MS);
            t.observe(&id, &Record::new(Body::P2p(o)), &a);
        }
        let ar = op(0xb, Func::ALL_REDUCE, 7, 2, -1, 30 * MS, 35 * MS);
        t.observe(&id, &overdue(&ar, 31 * MS), &a);
        t.observe(&id, &Record::new(Body::Coll(ar)), &a);
        // Now a third send is overdue, and a fourth is flagged incomplete at exit.
        let s3 = op(0xa, Func::SEND, 2, 3, 1, 40 * MS, 0);
        t.observe(&id, &overdue(&s3, 41 * MS), &a);
        let mut s4 = Record::new(Body::P2p(op(0xa, Func::SEND, 3, 4, 1, 40 * MS, 0)));
        s4.flags |= FLAG_INCOMPLETE;
        t.observe(&id, &s4, &a);

        let snap = t.snapshot("j", &TopologyCollector::default(), 50_000, 0);
        let r = &snap.ranks[0];
        assert_eq!((r.rank, r.pid, r.last_end_us), (3, 42, 35_000));
        assert_eq!(r.colls[0].last_seq, 7);
        assert_eq!(r.p2p[0].done, 2);
        let ords: Vec<u64> = r.open.iter().map(|o| o.p2p_ord).collect();
        assert_eq!(
            ords,
            vec![2, 3],
            "the open sends follow the two finished ones"
        );
        assert_eq!(snap.gaps.max_op_us, 5_000);
        assert_eq!(snap.gaps.plugin_threshold_ms, 1000);
        assert_eq!(t.jobs_with_open_ops().get("j"), Some(&40_000));
        let stalls = t.stalls("j");
        assert_eq!(stalls.len(), 1);
        assert_eq!((stalls[0].seq, stalls[0].end_us), (7, 35_000));
        // The checkpoint round trip keeps everything.
        let back: HangTracker = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}

//! Drawing one rank's slices into the trace: tracks (a process per host, a thread per rank,
//! "async" child tracks for operations that cannot nest), step -> phase -> op slices with their
//! args, flows between the matched instances of an operation, and the NIC counter track.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::ops::RangeInclusive;

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::index::IndexStats;
use super::writer::{ArgValue, TraceWriter};
use crate::steps::fsm::StepSummary;
use crate::steps::phase::{spans, PhaseRule, PhaseSpan};
use crate::steps::StepOp;

/// Which part of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Window {
    /// These step numbers (both included; calibrated when the job has a saved calibration, as
    /// `steps` shows them).
    Steps(RangeInclusive<u64>),
    /// Steps and operations that overlap `[t0, t1]`, µs on the aligned job timeline (realtime
    /// µs since the epoch).
    Time(u64, u64),
}

/// What the host context of a trace drew (`host::draw_host`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostDrawn {
    pub cpu_slices: usize,
    pub tcp_values: usize,
    pub qp_events: usize,
    pub port_values: usize,
    /// GPU counter values (SM clock, slowdown share, NVLink throughput and errors) and XIDs.
    pub gpu_values: usize,
}

/// What was written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSummary {
    pub job: String,
    pub hosts: usize,
    pub ranks: usize,
    pub packets: u64,
    pub bytes: u64,
    pub step_slices: u64,
    pub phase_slices: u64,
    pub op_slices: u64,
    /// Op slices on the "async" child tracks (they overlapped the rank's other ops).
    pub async_op_slices: u64,
    /// Counter values written (network throughput, from `net` records).
    pub counter_values: u64,
    /// Flow ids written (matched instances seen on at least two ranks).
    pub flows: u64,
    /// The window actually covered (µs, aligned).
    pub from_us: u64,
    pub to_us: u64,
    /// Segment files read for the operations, and those of the selected ranks.
    pub segments_read: usize,
    pub segments_total: usize,
    pub index: IndexStats,
    /// The host context drawn from the job's host streams.
    pub host: HostDrawn,
    /// MoE EP findings drawn as instants.
    pub ep_instants: u64,
}

impl TraceSummary {
    /// Trace bytes per op slice.
    pub fn bytes_per_op(&self) -> f64 {
        if self.op_slices == 0 {
            0.0
        } else {
            self.bytes as f64 / self.op_slices as f64
        }
    }
}

/// NCCL's bus-bandwidth factor (nccl-tests PERFORMANCE.md) of `func` on `n` ranks: busbw =
/// algbw × factor.
pub fn busbw_factor(func: Func, n: u32) -> f64 {
    let n = f64::from(n.max(1));
    match func {
        Func::ALL_REDUCE => 2.0 * (n - 1.0) / n,
        Func::ALL_GATHER | Func::REDUCE_SCATTER | Func::ALL_TO_ALL => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// FNV-1a over 64-bit words.
fn fnv(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The flow id of an operation's matched instance: collectives by `(comm, func, coll_sn)`, P2P
/// by `(comm, sender, receiver, ordinal)` (communicator ranks; `coll_sn` is the ordinal per
/// (comm, peer, func), so the n-th send to a peer meets its n-th receive from it).
pub fn flow_id(p2p: bool, comm: u64, func: Func, coll_sn: u64, rank: i32, peer: i32) -> u64 {
    if !p2p {
        return fnv(&[0, comm, u64::from(func.0), coll_sn]);
    }
    let (src, dst) = match func {
        Func::RECV => (peer, rank),
        Func::SEND => (rank, peer),
        _ => (rank.min(peer), rank.max(peer)),
    };
    fnv(&[1, comm, src as u64, dst as u64, coll_sn])
}

/// One operation of a rank, aligned (µs).
#[derive(Clone, Debug)]
pub(super) struct Op {
    pub(super) start_us: u64,
    pub(super) end_us: u64,
    pub(super) lsn: u64,
    pub(super) comm: u64,
    pub(super) func: Func,
    pub(super) coll_sn: u64,
    pub(super) bytes: u64,
    pub(super) count: u64,
    pub(super) algo: &'static str,
    pub(super) proto: &'static str,
    pub(super) p2p: bool,
    pub(super) rank: i32,
    pub(super) peer: i32,
}

impl Op {
    pub(super) fn key(&self) -> (u64, u64) {
        (self.start_us, self.lsn)
    }
    pub(super) fn flow(&self) -> u64 {
        flow_id(
            self.p2p,
            self.comm,
            self.func,
            self.coll_sn,
            self.rank,
            self.peer,
        )
    }
}

/// A rank's operations, each with the index of its selected step.
pub(super) type RankOps = Vec<(Option<usize>, Op)>;

/// A selected step of a rank.
#[derive(Clone, Debug)]
pub(super) struct Sel {
    pub(super) step: u64,
    pub(super) s: StepSummary,
    pub(super) first: (u64, u64),
    pub(super) last: (u64, u64),
    pub(super) start_us: u64,
    pub(super) end_us: u64,
    pub(super) merged: bool,
}

/// The job's per-job facts the drawing needs.
pub(super) struct JobCtx {
    /// Per communicator: role, size, name (empty when unnamed).
    pub(super) roles: HashMap<u64, (Option<Role>, u32, String)>,
    pub(super) phases: Vec<PhaseRule>,
    pub(super) window: Window,
}

// Track uuids: ranks get the small ones (every slice event names its track: 1 to 3 bytes).
const HOST_UUID: u64 = 1 << 48;
const LANE_UUID: u64 = 2 << 48;
const NET_UUID: u64 = 3 << 48;

pub(super) fn host_uuid(i: usize) -> u64 {
    HOST_UUID + i as u64
}
/// Host "process" ids: far above the rank thread ids (`rank + 1`).
pub(super) fn host_pid(i: usize) -> i32 {
    1_000_000_000 + i as i32
}
pub(super) fn rank_uuid(rank: i64) -> u64 {
    rank.rem_euclid(1 << 40) as u64 + 1
}
pub(super) fn rank_tid(rank: i64) -> i32 {
    (rank.rem_euclid(1 << 30) + 1) as i32
}
fn lane_uuid(rank: i64, k: usize) -> u64 {
    LANE_UUID + (rank.rem_euclid(1 << 32) as u64) * 4096 + k as u64
}

/// Width of the network counter's buckets, µs.
pub const NET_BUCKET_US: u64 = 1_000;

/// Network throughput from transfers `(end µs, bytes)`: per [`NET_BUCKET_US`] bucket with
/// traffic, `(bucket start µs, GB/s)`, and a 0 after each run of busy buckets (the counter
/// drops back between them). A transfer counts in the bucket where it completed.
pub fn net_rate(samples: &[(u64, u64)]) -> Vec<(u64, f64)> {
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    for (end, bytes) in samples {
        *buckets.entry(end / NET_BUCKET_US).or_default() += bytes;
    }
    let mut out = Vec::new();
    let mut prev: Option<u64> = None;
    for (b, bytes) in buckets {
        if prev.is_some_and(|p| p + 1 != b) {
            out.push(((prev.expect("checked") + 1) * NET_BUCKET_US, 0.0));
        }
        // bytes per bucket / (bucket µs × 1000 ns) = bytes/ns = GB/s.
        out.push((
            b * NET_BUCKET_US,
            bytes as f64 / (NET_BUCKET_US as f64 * 1000.0),
        ));
        prev = Some(b);
    }
    if let Some(p) = prev {
        out.push(((p + 1) * NET_BUCKET_US, 0.0));
    }
    out
}

/// Draws one rank's slices.
pub(super) struct Drawer<'a, W: Write> {
    pub(super) w: &'a mut TraceWriter<W>,
    pub(super) rank: i64,
    /// Per async lane: the end of its last op (µs).
    pub(super) lanes: Vec<u64>,
    pub(super) flows: &'a HashMap<u64, (i64, bool)>,
    pub(super) ctx: &'a JobCtx,
    pub(super) sum: &'a mut TraceSummary,
}

/// A slice on the rank's main track inside a step: a phase with its ops, or an op directly
/// under the step.
enum Item {
    Phase(usize, Vec<Op>),
    Op(Op),
}

impl<W: Write> Drawer<'_, W> {
    /// The rank's "NIC" counter track (GB/s, from its `net` records), when it has any.
    pub(super) fn net_counter(&mut self, samples: &[(u64, u64)]) -> std::io::Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        let uuid = NET_UUID + rank_uuid(self.rank);
        self.w.counter_track(
            uuid,
            rank_uuid(self.rank),
            &format!("rank {} · NIC", self.rank),
            "GB/s",
        )?;
        for (t, v) in net_rate(samples) {
            self.w.counter(uuid, t * 1000, v)?;
            self.sum.counter_values += 1;
        }
        Ok(())
    }

    /// A rank's ops (each with the index of its step in `steps`) as step slices, async ones on
    /// the lanes.
    pub(super) fn rank_slices(&mut self, steps: &[Sel], ops: RankOps) -> std::io::Result<()> {
        let mut cur: Option<(usize, Vec<Op>)> = None;
        for (step, op) in ops {
            if cur.as_ref().is_some_and(|(i, _)| Some(*i) != step) {
                let (i, v) = cur.take().expect("checked");
                self.step(&steps[i], v)?;
            }
            match step {
                Some(i) => cur.get_or_insert_with(|| (i, Vec::new())).1.push(op),
                None => self.lane_op(&op)?,
            }
        }
        if let Some((i, v)) = cur {
            self.step(&steps[i], v)?;
        }
        Ok(())
    }

    fn op_slice(&mut self, track: u64, op: &Op) -> std::io::Result<()> {
        let (role, n, name) = self
            .ctx
            .roles
            .get(&op.comm)
            .map_or((None, 0, ""), |(r, n, name)| (*r, *n, name.as_str()));
        let dur_us = op.end_us - op.start_us;
        let mut args: Vec<(&'static str, ArgValue)> = vec![
            (
                "role",
                ArgValue::Str(role.map_or("unknown", Role::as_str).to_string()),
            ),
            ("comm", ArgValue::Str(format!("0x{:016x}", op.comm))),
            ("comm_name", ArgValue::Str(name.to_string())),
            ("func", ArgValue::Str(op.func.name().to_string())),
            ("seq", ArgValue::Uint(op.coll_sn)),
            ("bytes", ArgValue::Uint(op.bytes)),
            ("count", ArgValue::Uint(op.count)),
            ("algo", ArgValue::Str(op.algo.to_string())),
            ("proto", ArgValue::Str(op.proto.to_string())),
        ];
        if op.p2p {
            args.push(("peer", ArgValue::Int(i64::from(op.peer))));
        }
        if dur_us > 0 {
            let gbps = op.bytes as f64 / (dur_us as f64 * 1000.0) * busbw_factor(op.func, n);
            args.push((
                "busbw_gbps",
                ArgValue::Double((gbps * 1000.0).round() / 1000.0),
            ));
        }
        args.push(("start_us", ArgValue::Uint(op.start_us)));
        args.push(("end_us", ArgValue::Uint(op.end_us)));
        let flow = op.flow();
        let flows: &[u64] = if self.flows.contains_key(&flow) {
            std::slice::from_ref(&flow)
        } else {
            &[]
        };
        self.w.begin(
            track,
            op.start_us * 1000,
            op.func.name(),
            true,
            &args,
            flows,
        )?;
        self.w.end(track, op.end_us * 1000)?;
        self.sum.op_slices += 1;
        self.sum.from_us = self.sum.from_us.min(op.start_us);
        self.sum.to_us = self.sum.to_us.max(op.end_us);
        Ok(())
    }

    /// An op on the first async lane where it does not overlap the lane's last op.
    fn lane_op(&mut self, op: &Op) -> std::io::Result<()> {
        let k = match self.lanes.iter().position(|e| *e <= op.start_us) {
            Some(k) => k,
            None => {
                let k = self.lanes.len();
                self.w.child_track(
                    lane_uuid(self.rank, k),
                    rank_uuid(self.rank),
                    &format!("rank {} · async {}", self.rank, k + 1),
                )?;
                self.lanes.push(0);
                k
            }
        };
        self.lanes[k] = op.end_us;
        self.sum.async_op_slices += 1;
        self.op_slice(lane_uuid(self.rank, k), op)
    }

    /// The template's phase stretches over a step's ops (roles as chosen), ending by `end`.
    fn phase_spans(&self, ops: &[Op], end: u64) -> Vec<PhaseSpan> {
        let with_end: Vec<(StepOp, u64)> = ops
            .iter()
            .map(|o| {
                (
                    StepOp {
                        comm_hash: o.comm,
                        role: self.ctx.roles.get(&o.comm).and_then(|r| r.0),
                        func: o.func,
                        bytes: o.bytes,
                        coll_sn: o.coll_sn,
                        coll_local_sn: o.lsn,
                        start_us: o.start_us,
                    },
                    o.end_us,
                )
            })
            .collect();
        spans(&self.ctx.phases, &with_end, end)
            .into_iter()
            .filter(|s| s.to_us > s.from_us)
            .collect()
    }

    fn step(&mut self, sel: &Sel, ops: Vec<Op>) -> std::io::Result<()> {
        let start = sel
            .start_us
            .min(ops.first().map_or(u64::MAX, |o| o.start_us));
        let end = ops
            .iter()
            .map(|o| o.end_us)
            .max()
            .unwrap_or(0)
            .max(sel.end_us);
        let phase_spans = self.phase_spans(&ops, end);
        let (items, lane) = place(ops, start, &phase_spans);
        let track = rank_uuid(self.rank);
        let n_ops = sel.s.ops;
        self.w.begin(
            track,
            start * 1000,
            &format!("step {}", sel.step),
            false,
            &[
                ("step", ArgValue::Uint(sel.step)),
                ("raw_step", ArgValue::Uint(sel.s.step)),
                ("duration_us", ArgValue::Uint(end - start)),
                ("ops", ArgValue::Uint(n_ops)),
                (
                    "coverage_complete",
                    ArgValue::Uint(u64::from(sel.s.coverage_complete && !sel.merged)),
                ),
            ],
            &[],
        )?;
        self.sum.step_slices += 1;
        for it in &items {
            match it {
                Item::Op(o) => self.op_slice(track, o)?,
                Item::Phase(i, v) => {
                    let s = &phase_spans[*i];
                    self.w.begin(
                        track,
                        s.from_us * 1000,
                        s.phase.as_str(),
                        true,
                        &[("ops", ArgValue::Uint(v.len() as u64))],
                        &[],
                    )?;
                    self.sum.phase_slices += 1;
                    for o in v {
                        self.op_slice(track, o)?;
                    }
                    self.w.end(track, s.to_us * 1000)?;
                }
            }
        }
        self.w.end(track, end * 1000)?;
        self.sum.from_us = self.sum.from_us.min(start);
        self.sum.to_us = self.sum.to_us.max(end);
        for op in &lane {
            self.lane_op(op)?;
        }
        Ok(())
    }
}

/// A step's ops on the rank's main track: each inside the phase that holds it, or directly under
/// the step when it crosses no phase; ops that overlap the previous one or cross a phase
/// boundary go to the async lanes (second list). Items are sorted by start (a phase before an
/// op starting with it).
fn place(ops: Vec<Op>, start: u64, phase_spans: &[PhaseSpan]) -> (Vec<Item>, Vec<Op>) {
    let mut items: Vec<Item> = (0..phase_spans.len())
        .map(|i| Item::Phase(i, Vec::new()))
        .collect();
    let mut lane = Vec::new();
    let mut main_end = start;
    for op in ops {
        if op.start_us < main_end {
            lane.push(op);
            continue;
        }
        let inside = phase_spans
            .iter()
            .position(|s| s.from_us <= op.start_us && op.end_us <= s.to_us);
        let crosses = phase_spans
            .iter()
            .any(|s| op.start_us < s.to_us && op.end_us > s.from_us);
        match inside {
            Some(i) => {
                main_end = op.end_us;
                if let Item::Phase(_, v) = &mut items[i] {
                    v.push(op);
                }
            }
            None if !crosses => {
                main_end = op.end_us;
                items.push(Item::Op(op));
            }
            None => lane.push(op),
        }
    }
    items.sort_by_key(|it| match it {
        Item::Phase(i, _) => (phase_spans[*i].from_us, 1),
        Item::Op(o) => (o.start_us, 0),
    });
    (items, lane)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busbw_factors_follow_nccl_tests() {
        assert_eq!(busbw_factor(Func::ALL_REDUCE, 4), 1.5);
        assert_eq!(busbw_factor(Func::ALL_GATHER, 4), 0.75);
        assert_eq!(busbw_factor(Func::REDUCE_SCATTER, 2), 0.5);
        assert_eq!(busbw_factor(Func::SEND, 2), 1.0);
        assert_eq!(busbw_factor(Func::BROADCAST, 8), 1.0);
    }

    #[test]
    fn network_rate_per_bucket() {
        assert!(net_rate(&[]).is_empty());
        // 2 MB completing in bucket 5 and 1 MB in bucket 6, then 4 MB in bucket 9.
        let r = net_rate(&[
            (5_100, 1_000_000),
            (5_900, 1_000_000),
            (6_000, 1_000_000),
            (9_999, 4_000_000),
        ]);
        assert_eq!(
            r,
            vec![
                (5_000, 2.0),
                (6_000, 1.0),
                (7_000, 0.0),
                (9_000, 4.0),
                (10_000, 0.0)
            ]
        );
    }

    #[test]
    fn p2p_send_and_receive_share_a_flow() {
        let send = flow_id(true, 7, Func::SEND, 3, 0, 1);
        let recv = flow_id(true, 7, Func::RECV, 3, 1, 0);
        assert_eq!(send, recv);
        // The other direction and the next ordinal are other instances.
        assert_ne!(send, flow_id(true, 7, Func::SEND, 3, 1, 0));
        assert_ne!(send, flow_id(true, 7, Func::SEND, 4, 0, 1));
        // Collectives: same (comm, func, seq) on every rank, whatever the rank.
        assert_eq!(
            flow_id(false, 7, Func::ALL_REDUCE, 5, 0, -1),
            flow_id(false, 7, Func::ALL_REDUCE, 5, 3, -1)
        );
        assert_ne!(
            flow_id(false, 7, Func::ALL_REDUCE, 5, 0, -1),
            flow_id(false, 7, Func::ALL_GATHER, 5, 0, -1)
        );
    }
}

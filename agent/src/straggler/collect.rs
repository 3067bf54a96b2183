//! Operation records of each stream -> [`RankStep`] at each step summary (offline and in the
//! live agent). Per stream the collector buffers the arrivals in the step engine's order,
//! `(start_us, coll_local_sn)`; [`StepOpCollector::take`] hands out those between the step
//! summary's first and last operation and drops everything up to the last one. A stream keeps
//! at most [`MAX_OPS`] buffered operations (the oldest are dropped and counted). The state
//! round-trips through serde (the daemon's checkpoint).

use std::collections::{BTreeMap, HashMap, VecDeque};

use comminsight_wire::record::{Body, Record};
use comminsight_wire::Func;
use serde::{Deserialize, Serialize};

use super::model::{Arrival, InstanceKey, RankStep};
use crate::steps::fsm::StepSummary;
use crate::stream::{Alignment, StreamId};
use crate::util::serde_pairs as pairs;

/// Buffered operations per stream at most: a step with more operations per rank than this
/// loses its earliest arrivals (counted in [`StepOpCollector::dropped`]). Real steps have a few
/// thousand per rank (Megatron with TP, PP and 32 micro-batches: ~1-5 k); the bound matters
/// when no step closes (no template matches the job): 2^20 per stream held 400 MiB at 8 ranks
/// and made every checkpoint a gigabyte of JSON (the soak, issue 23); 2^15 hold ~17 MiB.
pub const MAX_OPS: usize = 1 << 15;

/// One stream's buffer.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct StreamBuf {
    /// Communicator hash -> this stream's rank in it (`comm_init`).
    #[serde(with = "pairs")]
    comm_rank: BTreeMap<u64, u32>,
    /// `((start_us, coll_local_sn), arrival)` in key order.
    ops: VecDeque<((u64, u64), Arrival)>,
    /// Key of the last operation handed out: later records at or before it are dropped.
    taken: Option<(u64, u64)>,
    /// Operations dropped because the buffer was full.
    dropped: u64,
    /// Latest end (job timeline, µs) of an operation handed out or passed over: where the next
    /// step's compute begins.
    #[serde(default)]
    last_end_us: Option<u64>,
}

/// Per-stream arrivals between step summaries.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StepOpCollector {
    #[serde(with = "crate::util::serde_pairs::hash")]
    streams: HashMap<StreamId, StreamBuf>,
}

/// The instance key of an operation record seen by a stream whose ranks per communicator are
/// `comm_rank` (`None`: not a collective, send or recv, or the own rank is unknown).
fn key_of(body: &Body, comm_rank: &BTreeMap<u64, u32>) -> Option<InstanceKey> {
    match body {
        Body::Coll(op) => Some(InstanceKey::Coll {
            comm: op.comm_hash,
            func: op.func.0,
            seq: op.coll_sn,
        }),
        Body::P2p(op) => {
            let own = comm_rank
                .get(&op.comm_hash)
                .copied()
                .or_else(|| u32::try_from(op.rank).ok())?;
            let peer = u32::try_from(op.peer).ok()?;
            let (src, dst) = match op.func {
                Func::SEND => (own, peer),
                Func::RECV => (peer, own),
                _ => return None,
            };
            Some(InstanceKey::P2p {
                comm: op.comm_hash,
                src,
                dst,
                seq: op.coll_sn,
            })
        }
        _ => None,
    }
}

impl StepOpCollector {
    /// A collector with no stream.
    pub fn new() -> StepOpCollector {
        StepOpCollector::default()
    }

    /// Feed one decoded record of stream `id` (in the stream's order); `align` maps its host
    /// times onto the job timeline (as for [`crate::steps::engine::StepEngine::op_of`]).
    pub fn observe(&mut self, id: &StreamId, rec: &Record, align: Alignment) {
        if !matches!(rec.body, Body::CommInit(_) | Body::Coll(_) | Body::P2p(_)) {
            return;
        }
        let buf = match self.streams.get_mut(id) {
            Some(b) => b,
            None => self.streams.entry(id.clone()).or_default(),
        };
        let op = match &rec.body {
            Body::CommInit(c) => {
                if let Ok(r) = u32::try_from(c.rank) {
                    buf.comm_rank.insert(c.comm_hash, r);
                }
                return;
            }
            Body::Coll(op) | Body::P2p(op) => op,
            _ => return,
        };
        let Some(key) = key_of(&rec.body, &buf.comm_rank) else {
            return;
        };
        let start_us = align.apply(op.start_ns) / 1000;
        let end_us = align.apply(op.end_ns) / 1000;
        let order = (start_us, op.coll_local_sn);
        if buf.taken.is_some_and(|t| order <= t) {
            return;
        }
        let arrival = Arrival {
            key,
            start_us,
            dur_us: end_us.saturating_sub(start_us),
        };
        // Full: the oldest goes first (so the buffer never grows past MAX_OPS slots).
        if buf.ops.len() >= MAX_OPS {
            buf.ops.pop_front();
            buf.dropped += 1;
        }
        // Usually in order: appended; else inserted at its place from the back.
        let at = buf.ops.len() - buf.ops.iter().rev().take_while(|(k, _)| *k > order).count();
        buf.ops.insert(at, (order, arrival));
    }

    /// The rank-step of `summary` (emitted by the step engine for stream `id`): the buffered
    /// arrivals from its first to its last operation; everything up to the last one is dropped.
    /// `step` is the step number to report (calibrated when the job's calibration applies),
    /// `err_us` the stream's clock error bound.
    pub fn take(
        &mut self,
        id: &StreamId,
        summary: &StepSummary,
        step: u64,
        rank: i64,
        err_us: u64,
    ) -> RankStep {
        let first = (summary.first.start_us, summary.first.coll_local_sn);
        let last = (summary.last.start_us, summary.last.coll_local_sn);
        let mut arrivals: Vec<Arrival> = Vec::new();
        let mut prev_end_us = None;
        if let Some(buf) = self.streams.get_mut(id) {
            while let Some((k, a)) = buf.ops.front() {
                if *k > last {
                    break;
                }
                if *k >= first {
                    arrivals.push(*a);
                } else {
                    buf.last_end_us = buf.last_end_us.max(Some(a.start_us + a.dur_us));
                }
                buf.ops.pop_front();
            }
            prev_end_us = buf.last_end_us;
            let step_end = arrivals.iter().map(|a| a.start_us + a.dur_us).max();
            buf.last_end_us = buf.last_end_us.max(step_end);
            buf.taken = Some(buf.taken.map_or(last, |t| t.max(last)));
        }
        RankStep {
            rank,
            host: id.host.clone(),
            step,
            duration_us: summary.duration_us,
            coverage_complete: summary.coverage_complete,
            err_us,
            arrivals,
            prev_end_us,
        }
    }

    /// Forget stream `id` (its process ended).
    pub fn end_stream(&mut self, id: &StreamId) {
        self.streams.remove(id);
    }

    /// Operations dropped so far because a stream's buffer was full.
    pub fn dropped(&self) -> u64 {
        self.streams.values().map(|b| b.dropped).sum()
    }

    /// Operations buffered now, all streams.
    pub fn buffered(&self) -> usize {
        self.streams.values().map(|b| b.ops.len()).sum()
    }
}

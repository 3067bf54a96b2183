//! What a record may say: the bounds every decoded record is checked against
//! ([`Record::decode_into`](crate::record::Record::decode_into) runs [`check`], so every reader
//! — the agent's engine, its offline passes, `dump`, the archive, the plugin's own drain — sees
//! only records that pass).
//!
//! Records come from files and shared memory that job users write, so no value in one is
//! trusted to size anything: a value outside these bounds cannot come from the plugin, and the
//! record is rejected as corrupt ([`DecodeError::Implausible`]) before any analysis sees it.
//! The bounds are generous (far above any real job) and exist so that whatever passes them is
//! cheap to hold: an analysis may size a table by `nranks`, add sequence numbers and subtract
//! times without overflowing.

use crate::body::{OpRecord, Overdue};
use crate::record::{Body, DecodeError, Record, RECORD_SIZE};

/// Ranks per communicator (`comm_init.nranks`) and per job (`proc_start.world_size`), 0 meaning
/// "not known"; every rank, peer, root, local rank and device index is -1 (not known) or below
/// it, and a communicator's rank below its `nranks`. The largest NCCL jobs run ~10⁵ ranks.
pub const MAX_RANKS: u32 = 1 << 20;

/// Sequence numbers (the header's `seq`, `coll_sn`, `coll_local_sn`, `parent_local_sn`,
/// `segment_index`) are below this: 2⁴⁸ operations is nine years at a million a second, and
/// anything below it can be added to without overflowing.
pub const MAX_SEQ: u64 = 1 << 48;

/// `parent_local_sn` of a proxy or net record whose parent is not known.
pub const NO_PARENT: u64 = u64::MAX;

/// Every time (`*_ns`, host or GPU timer) is below this: 2⁶² ns after the epoch is the year
/// 2116. 0 means "not set" and is allowed.
pub const MAX_TIME_NS: u64 = 1 << 62;

/// Element counts and byte sizes of one operation, proxy or net record (256 TiB): sums over
/// millions of them stay far from overflow.
pub const MAX_BYTES: u64 = 1 << 48;

/// Timing sources the plugin writes (`Timing` codes 0 ..= this; the decoder rejects others).
pub const MAX_TIMING: u8 = 3;

/// Why a decoded record is rejected: one short phrase naming the field.
fn bad(what: &'static str) -> DecodeError {
    DecodeError::Implausible(what)
}

/// A rank-like index: -1 (not known) or 0 .. [`MAX_RANKS`].
fn rank_ok(v: i32) -> bool {
    v >= -1 && v < MAX_RANKS as i32
}

fn time_ok(v: u64) -> bool {
    v < MAX_TIME_NS
}

/// A start/end pair: both in range, and the end not before the start when both are set.
fn span_ok(start: u64, end: u64) -> bool {
    time_ok(start) && time_ok(end) && (start == 0 || end == 0 || end >= start)
}

fn parent_ok(v: u64) -> bool {
    v < MAX_SEQ || v == NO_PARENT
}

/// Check a decoded record against the bounds above.
pub fn check(rec: &Record) -> Result<(), DecodeError> {
    if rec.seq >= MAX_SEQ {
        return Err(bad("seq beyond MAX_SEQ"));
    }
    match &rec.body {
        Body::Segment(s) => {
            if s.record_size as usize != RECORD_SIZE {
                return Err(bad("segment record_size is not 128"));
            }
            if s.segment_index >= MAX_SEQ {
                return Err(bad("segment_index beyond MAX_SEQ"));
            }
            if !time_ok(s.created_real_ns) || !time_ok(s.created_mono_ns) {
                return Err(bad("segment creation time beyond MAX_TIME_NS"));
            }
        }
        Body::ProcStart(p) => {
            if !rank_ok(p.rank) || !rank_ok(p.local_rank) {
                return Err(bad("proc_start rank beyond MAX_RANKS"));
            }
            if !rank_ok(p.world_size) {
                return Err(bad("proc_start world_size beyond MAX_RANKS"));
            }
            if p.rank >= 0 && p.world_size > 0 && p.rank >= p.world_size {
                return Err(bad("proc_start rank >= world_size"));
            }
            if !time_ok(p.mono_ns) || !time_ok(p.real_ns) {
                return Err(bad("proc_start clock beyond MAX_TIME_NS"));
            }
        }
        Body::CommInit(c) => {
            if c.nranks > MAX_RANKS {
                return Err(bad("comm_init nranks beyond MAX_RANKS"));
            }
            if c.rank < -1 || (c.nranks > 0 && c.rank >= c.nranks as i32) {
                return Err(bad("comm_init rank outside 0..nranks"));
            }
            if c.nnodes > c.nranks.max(1) {
                return Err(bad("comm_init nnodes > nranks"));
            }
            if !rank_ok(c.local_rank) || !rank_ok(c.device) {
                return Err(bad("comm_init local_rank or device beyond MAX_RANKS"));
            }
            if !time_ok(c.time_ns) {
                return Err(bad("comm_init time beyond MAX_TIME_NS"));
            }
        }
        Body::CommFini(c) => {
            if !rank_ok(c.rank) {
                return Err(bad("comm_fini rank beyond MAX_RANKS"));
            }
            if !time_ok(c.time_ns) {
                return Err(bad("comm_fini time beyond MAX_TIME_NS"));
            }
            if c.ops >= MAX_SEQ || c.open_ops >= MAX_SEQ {
                return Err(bad("comm_fini ops beyond MAX_SEQ"));
            }
        }
        Body::Coll(o) | Body::P2p(o) => check_op(o)?,
        Body::Proxy(p) => {
            if !parent_ok(p.parent_local_sn) {
                return Err(bad("proxy parent_local_sn beyond MAX_SEQ"));
            }
            if !span_ok(p.start_ns, p.end_ns) {
                return Err(bad("proxy times beyond MAX_TIME_NS or end before start"));
            }
            if p.bytes >= MAX_BYTES || !time_ok(p.send_wait_ns) || !time_ok(p.recv_wait_ns) {
                return Err(bad("proxy bytes or waits beyond their bounds"));
            }
            if !rank_ok(p.rank) || !rank_ok(p.peer) {
                return Err(bad("proxy rank or peer beyond MAX_RANKS"));
            }
        }
        Body::Net(n) => {
            if !parent_ok(n.parent_local_sn) {
                return Err(bad("net parent_local_sn beyond MAX_SEQ"));
            }
            if !span_ok(n.start_ns, n.end_ns) {
                return Err(bad("net times beyond MAX_TIME_NS or end before start"));
            }
            if n.length >= MAX_BYTES || !rank_ok(n.rank) {
                return Err(bad("net length or rank beyond its bound"));
            }
        }
        Body::Overdue(o) => check_overdue(o)?,
        Body::Stats(s) => {
            if !time_ok(s.time_ns) || !time_ok(s.mono_ns) || !time_ok(s.real_ns) {
                return Err(bad("stats clock beyond MAX_TIME_NS"));
            }
        }
        Body::Thread(t) => {
            let parts = [t.on_cpu_ns, t.runnable_ns, t.blocked_ns];
            if !time_ok(t.time_ns) || !time_ok(t.state_since_ns) || !time_ok(t.interval_ns) {
                return Err(bad("thread times beyond MAX_TIME_NS"));
            }
            if parts.iter().any(|p| *p > t.interval_ns) || t.blocked_io_ns > t.blocked_ns {
                return Err(bad("thread state time beyond its interval"));
            }
        }
        Body::Qp(q) => {
            if !time_ok(q.time_ns) || !time_ok(q.created_ns) {
                return Err(bad("qp times beyond MAX_TIME_NS"));
            }
        }
        Body::Tcp(t) => {
            if !time_ok(t.time_ns) || !time_ok(t.interval_ns) {
                return Err(bad("tcp times beyond MAX_TIME_NS"));
            }
        }
        Body::Port(p) => {
            if !time_ok(p.time_ns) || !time_ok(p.interval_ns) {
                return Err(bad("port times beyond MAX_TIME_NS"));
            }
        }
        Body::CommDevice(c) => {
            if !time_ok(c.time_ns) || !rank_ok(c.rank) {
                return Err(bad(
                    "comm_device time beyond MAX_TIME_NS or rank beyond MAX_RANKS",
                ));
            }
        }
        Body::Gpu(g) => {
            let shares = [
                g.sw_power_share,
                g.hw_slowdown_share,
                g.hw_thermal_share,
                g.hw_power_brake_share,
                g.sw_thermal_share,
                g.sm_active_share,
            ];
            if !time_ok(g.time_ns) || !time_ok(g.interval_ns) {
                return Err(bad("gpu times beyond MAX_TIME_NS"));
            }
            if shares.iter().any(|s| *s > crate::gpu::SHARE_SCALE)
                || g.sm_util > 100
                || g.memory_util > 100
            {
                return Err(bad("gpu share beyond 10000 or utilisation beyond 100 %"));
            }
        }
        Body::GpuLink(l) => {
            if !time_ok(l.time_ns) || !time_ok(l.interval_ns) {
                return Err(bad("nvlink times beyond MAX_TIME_NS"));
            }
        }
        Body::Xid(x) => {
            if !time_ok(x.time_ns) {
                return Err(bad("xid time beyond MAX_TIME_NS"));
            }
        }
        Body::EpStats(e) => check_ep_stats(e)?,
    }
    Ok(())
}

fn check_ep_stats(e: &crate::moe::EpStats) -> Result<(), DecodeError> {
    use crate::moe::{ep_phase, ep_source, EP_VALUES_PER_RECORD, MAX_EP_SIZE};
    if e.ep_size == 0 || e.ep_size > MAX_EP_SIZE || e.rank >= e.ep_size {
        return Err(bad(
            "ep_stats ep_size beyond 1..=4096 or rank beyond ep_size",
        ));
    }
    if e.count == 0
        || usize::from(e.count) > EP_VALUES_PER_RECORD
        || u32::from(e.first) + u32::from(e.count) > u32::from(e.ep_size)
    {
        return Err(bad("ep_stats values beyond the EP size"));
    }
    if e.phase > ep_phase::COMBINE || !(ep_source::DEEPEP_LL..=ep_source::MC2).contains(&e.source) {
        return Err(bad("ep_stats phase or source unknown"));
    }
    if !time_ok(e.t_start_ns) || !time_ok(e.t_end_ns) || e.t_end_ns < e.t_start_ns {
        return Err(bad("ep_stats window times beyond MAX_TIME_NS or reversed"));
    }
    Ok(())
}

fn check_op(o: &OpRecord) -> Result<(), DecodeError> {
    if o.coll_sn >= MAX_SEQ || o.coll_local_sn >= MAX_SEQ {
        return Err(bad("op coll_sn or coll_local_sn beyond MAX_SEQ"));
    }
    if o.count >= MAX_BYTES || o.bytes >= MAX_BYTES {
        return Err(bad("op count or bytes beyond MAX_BYTES"));
    }
    if !time_ok(o.enqueue_ns) || !time_ok(o.api_ns) {
        return Err(bad("op enqueue or api time beyond MAX_TIME_NS"));
    }
    if !span_ok(o.start_ns, o.end_ns) || !span_ok(o.gpu_start_ns, o.gpu_end_ns) {
        return Err(bad("op times beyond MAX_TIME_NS or end before start"));
    }
    if !rank_ok(o.rank) || !rank_ok(o.root) || !rank_ok(o.peer) {
        return Err(bad("op rank, root or peer beyond MAX_RANKS"));
    }
    Ok(())
}

fn check_overdue(o: &Overdue) -> Result<(), DecodeError> {
    if o.coll_sn >= MAX_SEQ || o.coll_local_sn >= MAX_SEQ {
        return Err(bad("overdue coll_sn or coll_local_sn beyond MAX_SEQ"));
    }
    if o.count >= MAX_BYTES || o.bytes >= MAX_BYTES {
        return Err(bad("overdue count or bytes beyond MAX_BYTES"));
    }
    if !time_ok(o.enqueue_ns) || !time_ok(o.start_ns) || !time_ok(o.now_ns) {
        return Err(bad("overdue time beyond MAX_TIME_NS"));
    }
    if !rank_ok(o.rank) || !rank_ok(o.peer) {
        return Err(bad("overdue rank or peer beyond MAX_RANKS"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::samples;
    use crate::record::Kind;

    /// The sample of `kind`, changed by `f`, encoded and decoded.
    fn decode_changed(kind: Kind, f: impl FnOnce(&mut Record)) -> Result<Record, DecodeError> {
        let mut rec = samples().into_iter().find(|r| r.kind() == kind).unwrap();
        f(&mut rec);
        Record::decode(&rec.encode())
    }

    #[test]
    fn each_bound_rejects_at_its_edge_and_accepts_below() {
        type Case = (Kind, fn(&mut Record, bool));
        let cases: [Case; 8] = [
            (Kind::CommInit, |r, over| {
                if let Body::CommInit(c) = &mut r.body {
                    c.nranks = if over { MAX_RANKS + 1 } else { MAX_RANKS };
                    c.rank = 0;
                }
            }),
            (Kind::CommInit, |r, over| {
                if let Body::CommInit(c) = &mut r.body {
                    c.rank = c.nranks as i32 - i32::from(!over);
                }
            }),
            (Kind::Coll, |r, over| {
                if let Body::Coll(o) = &mut r.body {
                    o.coll_sn = MAX_SEQ - u64::from(!over);
                }
            }),
            (Kind::Coll, |r, over| {
                if let Body::Coll(o) = &mut r.body {
                    o.end_ns = o.start_ns - u64::from(over);
                }
            }),
            (Kind::P2p, |r, over| {
                if let Body::P2p(o) = &mut r.body {
                    o.peer = MAX_RANKS as i32 - i32::from(!over);
                }
            }),
            (Kind::Proxy, |r, over| {
                if let Body::Proxy(p) = &mut r.body {
                    p.parent_local_sn = if over { MAX_SEQ } else { NO_PARENT };
                }
            }),
            (Kind::Overdue, |r, over| {
                if let Body::Overdue(o) = &mut r.body {
                    o.now_ns = MAX_TIME_NS - u64::from(!over);
                }
            }),
            (Kind::Stats, |r, over| {
                r.seq = MAX_SEQ - u64::from(!over);
            }),
        ];
        for (i, (kind, f)) in cases.into_iter().enumerate() {
            assert!(
                decode_changed(kind, |r| f(r, false)).is_ok(),
                "case {i} below"
            );
            assert!(
                matches!(
                    decode_changed(kind, |r| f(r, true)),
                    Err(DecodeError::Implausible(_))
                ),
                "case {i} over"
            );
        }
    }

    #[test]
    fn raw_bytes_no_encoder_writes_are_rejected() {
        let op = samples()
            .into_iter()
            .find(|r| r.kind() == Kind::Coll)
            .unwrap();
        // The timing code is the body's byte 110 (header 16 + 11 u64 + 3 i32 + 6 u8).
        let mut raw = op.encode();
        raw.0[16 + 88 + 12 + 6] = MAX_TIMING + 1;
        assert_eq!(
            Record::decode(&raw),
            Err(DecodeError::Implausible("op timing unknown"))
        );
        // A string length byte beyond its field.
        let init = samples()
            .into_iter()
            .find(|r| r.kind() == Kind::CommInit)
            .unwrap();
        let mut raw = init.encode();
        raw.0[16 + 40] = 200;
        assert_eq!(
            Record::decode(&raw),
            Err(DecodeError::Implausible("string length beyond its field"))
        );
    }
}

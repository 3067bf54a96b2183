//! The drain's and the lifecycle's side of the op slots: snapshots for the overdue scan, sweeps
//! at finalize/exit, leak checks and parent lookups. None of it is on the event hot path.

use std::sync::atomic::Ordering;

use comminsight_wire::record::{Body, OpRecord, FLAG_INCOMPLETE};

use super::{
    complete, done_of, gen_of, read_record, refs_of, source_flags, started_count, OpSnapshot,
    COLL_STOPPED,
};
use crate::core::Shared;
use crate::handle::{Handle, TAG_COLL, TAG_P2P};

/// A consistent snapshot of slot `idx` if it is live (drain thread: overdue scan).
pub fn snapshot(sh: &Shared, idx: u32) -> Option<OpSnapshot> {
    let s = sh.ops.get(idx)?;
    let c = s.ctl.load(Ordering::Acquire);
    if refs_of(c) == 0 {
        return None;
    }
    let (op, meta, ctx_id) = read_record(s, c, 0, true);
    let started = started_count(s);
    let c2 = s.ctl.load(Ordering::Acquire);
    if gen_of(c2) != gen_of(c) || refs_of(c2) == 0 {
        return None;
    }
    Some(OpSnapshot {
        index: idx,
        gen: gen_of(c),
        ctx_id,
        op: OpRecord {
            start_ns: if started > 0 { op.start_ns } else { 0 },
            channels_done: done_of(c2).min(255) as u8,
            ..op
        },
        is_p2p: meta.p2p,
        started: started.min(255) as u8,
        done: done_of(c2).min(255) as u8,
        coll_stopped: c2 & COLL_STOPPED != 0,
        flags: source_flags(s),
    })
}

/// Retire every live op of context `ctx_id` (all contexts if `None`) with an incomplete record.
/// `free = false` leaves the slots live (process exit: other threads may still use them).
pub fn sweep(sh: &Shared, ctx_id: Option<u32>, free: bool) -> u64 {
    let mut n = 0;
    for (idx, s) in sh.ops.used() {
        let mut c = s.ctl.load(Ordering::Acquire);
        loop {
            if refs_of(c) == 0 {
                break;
            }
            let owner = (s.ctx_rank.load(Ordering::Relaxed) >> 32) as u32;
            if ctx_id.is_some_and(|id| id != owner) {
                // Re-check that the owner we read belongs to this generation.
                if s.ctl.load(Ordering::Acquire) == c {
                    break;
                }
                c = s.ctl.load(Ordering::Acquire);
                continue;
            }
            if !free {
                let (op, meta, _) = read_record(s, c, 0, true);
                if s.ctl.load(Ordering::Acquire) == c {
                    let body = if meta.p2p {
                        Body::P2p(op)
                    } else {
                        Body::Coll(op)
                    };
                    sh.push_body(body, FLAG_INCOMPLETE | source_flags(s));
                    n += 1;
                    break;
                }
                c = s.ctl.load(Ordering::Acquire);
                continue;
            }
            let retired = u64::from(gen_of(c).wrapping_add(1)) << 32;
            match s
                .ctl
                .compare_exchange(c, retired, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    complete(sh, idx, c, 0, true);
                    n += 1;
                    break;
                }
                Err(x) => c = x,
            }
        }
    }
    n
}

/// Live op slots (tests, leak checks).
pub fn live(sh: &Shared) -> usize {
    sh.ops
        .used()
        .filter(|(_, s)| refs_of(s.ctl.load(Ordering::Acquire)) != 0)
        .count()
}

/// `coll_local_sn` of a live op named by a Coll/P2p handle.
pub fn local_sn_of(sh: &Shared, h: Handle) -> Option<u64> {
    if h.tag != TAG_COLL && h.tag != TAG_P2P {
        return None;
    }
    let s = sh.ops.get(h.index)?;
    let c = s.ctl.load(Ordering::Acquire);
    if gen_of(c) != h.gen || refs_of(c) == 0 {
        return None;
    }
    let sn = s.local_sn.load(Ordering::Relaxed);
    (s.ctl.load(Ordering::Acquire) >> 32 == c >> 32).then_some(sn)
}

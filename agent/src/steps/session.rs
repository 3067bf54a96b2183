//! Per-GPU reorder (DESIGN.md §5.1): operations arrive in any order within a safe window; they
//! are released in `(start_us, coll_local_sn)` order once the watermark (largest `start_us`
//! seen) has moved a safe window past them. `coll_local_sn` (the plugin's per-process issue order)
//! breaks ties, so the order does not depend on arrival order and online and offline runs agree.
//! Only operations inside the window are held: memory is bounded by the window (plus the FSM's
//! open step).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::fsm::{StepFsm, StepSummary};
use super::StepOp;

/// Maps with non-string keys in the checkpoint (see [`crate::util::serde_pairs`]).
pub(crate) use crate::util::serde_pairs as pairs;

/// The in-order part of a reorder buffer: `((start_us, coll_local_sn), op, end_us)`.
pub type OrderedOps = VecDeque<((u64, u64), StepOp, u64)>;

/// Reorder buffer + boundary machine of one rank (its state round-trips through serde: the
/// agent's checkpoint).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankSession {
    /// Held operations that arrived in key order (the common case: appended at the back).
    buf: OrderedOps,
    /// Held operations that arrived behind `buf`'s back (out of order, inside the window).
    #[serde(with = "pairs")]
    behind: BTreeMap<(u64, u64), (StepOp, u64)>,
    watermark: u64,
    safe_window_us: u64,
    fsm: StepFsm,
    /// Operations that arrived behind already-released ones (older than the window): they are
    /// released at once, out of order, and counted.
    pub late: u64,
    released_up_to: Option<(u64, u64)>,
}

impl RankSession {
    /// A session holding operations for `safe_window_us` behind the watermark.
    pub fn new(fsm: StepFsm, safe_window_us: u64) -> RankSession {
        RankSession {
            buf: VecDeque::new(),
            behind: BTreeMap::new(),
            watermark: 0,
            safe_window_us,
            fsm,
            late: 0,
            released_up_to: None,
        }
    }

    /// Add an operation (any order) and its end time.
    pub fn push(&mut self, op: StepOp, end_us: u64, out: &mut Vec<StepSummary>) {
        let key = (op.start_us, op.coll_local_sn);
        self.watermark = self.watermark.max(op.start_us);
        if self.released_up_to.is_some_and(|r| key <= r) {
            self.late += 1;
            self.fsm.push(&op, end_us, out);
            return;
        }
        if self.buf.back().is_none_or(|b| b.0 < key) {
            self.buf.push_back((key, op, end_us));
        } else {
            self.behind.insert(key, (op, end_us));
        }
        self.release(out);
    }

    /// Release what is stable: everything at least a safe window behind the watermark.
    pub fn release(&mut self, out: &mut Vec<StepSummary>) {
        let limit = self.watermark.saturating_sub(self.safe_window_us);
        while let Some((key, op, end)) = self.pop_min(Some(limit)) {
            self.released_up_to = Some(key);
            self.fsm.push(&op, end, out);
        }
    }

    /// Release everything (explicit end of input, a sealed final segment).
    pub fn drain(&mut self, out: &mut Vec<StepSummary>) {
        while let Some((key, op, end)) = self.pop_min(None) {
            self.released_up_to = Some(key);
            self.fsm.push(&op, end, out);
        }
    }

    /// The held operation with the smallest key, if its start is at most `limit`.
    fn pop_min(&mut self, limit: Option<u64>) -> Option<((u64, u64), StepOp, u64)> {
        let a = self.buf.front().map(|f| f.0);
        let b = self.behind.first_key_value().map(|(k, _)| *k);
        let take_behind = match (a, b) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(a), Some(b)) => b < a,
        };
        let key = if take_behind { b? } else { a? };
        if limit.is_some_and(|l| key.0 > l) {
            return None;
        }
        if take_behind {
            let (k, (op, end)) = self.behind.pop_first()?;
            Some((k, op, end))
        } else {
            self.buf.pop_front()
        }
    }

    /// Take the (drained, empty) in-order buffer with its capacity, leaving an unallocated one: a
    /// stream that ended frees its memory, and the next session can reuse the allocation.
    pub fn take_buffer(&mut self) -> OrderedOps {
        let mut b = std::mem::take(&mut self.buf);
        b.clear();
        self.behind = BTreeMap::new();
        b
    }

    /// Start with this (empty) buffer's allocation.
    pub fn reuse_buffer(&mut self, mut b: OrderedOps) {
        if self.buf.is_empty() {
            b.clear();
            self.buf = b;
        }
    }

    /// Operations held in the reorder buffer.
    pub fn held(&self) -> usize {
        self.buf.len() + self.behind.len()
    }

    /// The boundary machine.
    pub fn fsm(&self) -> &StepFsm {
        &self.fsm
    }

    /// The boundary machine, to rebind it after a checkpoint was loaded.
    pub fn fsm_mut(&mut self) -> &mut StepFsm {
        &mut self.fsm
    }
}

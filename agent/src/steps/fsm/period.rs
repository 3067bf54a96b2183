//! Sequence periods: how each (communicator, function)'s NCCL `coll_sn` falls into one rank's
//! steps, learned from its complete steps; used to cut a merged step where the sequence numbers
//! say one step ends.
//!
//! NCCL numbers every communicator's operations of a function (`coll_sn`) whether or not the
//! profiler saw them, so lost events leave the numbers of the others intact. In a periodic
//! workload a key's operations of one step are the block `[phase + k·period, phase +
//! (k+1)·period)` of its numbers: `period` = the step's count of that key (its span in a complete
//! step), `phase` = where the blocks start. Both are the majority over the last complete steps
//! (a lost first or last operation shortens one sample; it does not win).
//!
//! A cut of a merged run of operations is then scored by the consecutive same-key pairs it
//! contradicts: a pair of one block split apart, or a pair of two blocks both left in the head.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::super::StepOp;

/// Complete steps remembered per key.
const KEEP: usize = 8;
/// Samples needed before a key's period is trusted.
const MIN_SAMPLES: usize = 3;
/// Keys tracked per rank (a rank uses a handful of communicators; a bound for odd streams).
const MAX_KEYS: usize = 256;

/// One key's `(min, max)` `coll_sn` in each of the last complete steps it appeared in.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct KeySpans {
    comm: u64,
    func: u8,
    spans: VecDeque<(u64, u64)>,
}

/// The learned sequence periods of one rank (checkpointed with the machine).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Periods {
    keys: Vec<KeySpans>,
}

/// The most common value and how often it occurs.
fn mode(v: impl Iterator<Item = u64>) -> Option<(u64, usize)> {
    let mut v: Vec<u64> = v.collect();
    v.sort_unstable();
    v.chunk_by(|a, b| a == b)
        .map(|c| (c[0], c.len()))
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
}

impl Periods {
    /// Learn from the operations of one complete step.
    pub(crate) fn learn<'a>(&mut self, ops: impl Iterator<Item = &'a StepOp>) {
        let mut step: Vec<(u64, u8, u64, u64)> = Vec::new();
        for op in ops {
            match step
                .iter_mut()
                .find(|s| s.0 == op.comm_hash && s.1 == op.func.0)
            {
                Some(s) => {
                    s.2 = s.2.min(op.coll_sn);
                    s.3 = s.3.max(op.coll_sn);
                }
                None => step.push((op.comm_hash, op.func.0, op.coll_sn, op.coll_sn)),
            }
        }
        for (comm, func, lo, hi) in step {
            let i = match self
                .keys
                .iter()
                .position(|k| k.comm == comm && k.func == func)
            {
                Some(i) => i,
                None if self.keys.len() < MAX_KEYS => {
                    self.keys.push(KeySpans {
                        comm,
                        func,
                        spans: VecDeque::new(),
                    });
                    self.keys.len() - 1
                }
                None => continue,
            };
            let spans = &mut self.keys[i].spans;
            if spans.len() == KEEP {
                spans.pop_front();
            }
            spans.push_back((lo, hi));
        }
    }

    /// `(period, phase)` of a key whose recent complete steps agree (a majority for both).
    fn model(k: &KeySpans) -> Option<(u64, u64)> {
        let n = k.spans.len();
        if n < MIN_SAMPLES {
            return None;
        }
        let (period, c) = mode(
            k.spans
                .iter()
                .map(|(lo, hi)| hi.saturating_sub(*lo).saturating_add(1)),
        )?;
        if 2 * c <= n {
            return None;
        }
        let (phase, c) = mode(k.spans.iter().map(|(lo, _)| lo % period))?;
        (2 * c > n).then_some((period, phase))
    }

    /// For each cut `p` in `0..=n` of a run of `n` operations (the head is the first `p`): how
    /// many consecutive same-key pairs contradict it (one block split apart, or two blocks both
    /// in the head); and how many pairs had a learned period (0: the costs say nothing).
    pub(crate) fn cut_costs<'a>(
        &self,
        ops: impl ExactSizeIterator<Item = &'a StepOp>,
    ) -> (Vec<u32>, u32) {
        let n = ops.len();
        let models: Vec<Option<(u64, u64)>> = self.keys.iter().map(Self::model).collect();
        // Per key: (position, block) of its previous operation in the run.
        let mut prev: Vec<Option<(usize, u64)>> = vec![None; self.keys.len()];
        let mut diff: Vec<i64> = vec![0; n + 2];
        let mut pairs = 0;
        for (v, op) in ops.enumerate() {
            let Some(k) = self
                .keys
                .iter()
                .position(|k| k.comm == op.comm_hash && k.func == op.func.0)
            else {
                continue;
            };
            let Some((period, phase)) = models[k] else {
                continue;
            };
            // Blocks counted from `phase` (numbers below it fall in block 0); no overflow for
            // any `coll_sn`.
            let block = match op.coll_sn.checked_sub(phase) {
                Some(d) => d / period + 1,
                None => 0,
            };
            if let Some((u, b)) = prev[k] {
                pairs += 1;
                if b == block {
                    // One block split apart by the cuts u+1..=v.
                    diff[u + 1] += 1;
                    diff[v + 1] -= 1;
                } else {
                    // Two blocks both in the head for the cuts v+1..=n.
                    diff[v + 1] += 1;
                }
            }
            prev[k] = Some((v, block));
        }
        let mut acc = 0i64;
        let costs = diff[..=n]
            .iter()
            .map(|d| {
                acc += d;
                acc as u32
            })
            .collect();
        (costs, pairs)
    }
}

//! The boundary state machine (DESIGN.md §5.3): one rank's ordered operations -> steps.
//!
//! * Strict contiguity: a sequence of the template matches only consecutive operations (the
//!   tail of the operations seen); an unrelated operation breaks a candidate, and each new
//!   operation is tested as the end of every sequence again.
//! * A **Close** match ends the step at its last operation.
//! * An **Anchor** match records the step's cross-rank identity. Anchor alternatives are in order
//!   of preference (a template may list a secondary anchor, e.g. the DP gradient sync, that still
//!   proves the tail when the primary one was lost); the evidence kept is the most preferred one
//!   seen. The same alternative matching twice means two steps merged (events were lost): the
//!   step is emitted with `coverage_complete = false`.
//! * An **Open** match splits only after an Anchor of the current step was seen (a repeated
//!   Open-like run inside a big step cannot split it): the step then ends at the operation before
//!   the Open (Close lost, Anchor proved the tail).
//! * Circuit breaker: an open step longer than [`MAX_OPEN_OPS`] operations or [`MAX_OPEN_US`]
//!   (no step for 30 minutes; `[steps] breaker_minutes`) means the template
//!   does not describe this rank (no Close, no Anchor for that long): the machine stops, frees its
//!   memory and ignores the rest ([`StepFsm::tripped`]); raw records are untouched, so the steps
//!   can be rebuilt offline after a template fix.
//! * Lost operations (a gap in `coll_local_sn`) or a stream that starts mid-step make the step
//!   `coverage_complete = false`. The open step at the end of the input is never emitted: it is
//!   state ([`StepFsm::pending_ops`]), continued by the next batch.

use std::cmp::Reverse;
use std::collections::VecDeque;

use comminsight_wire::Func;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::template::{Seq, Template};
use super::{StepOp, UNFINISHED_END};

mod period;

use super::phase::{self, PhaseRule, PhaseTimes};
use period::Periods;

/// Evidence of one operation in a step summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evidence {
    pub comm_hash: u64,
    pub func: Func,
    pub coll_sn: u64,
    pub coll_local_sn: u64,
    pub start_us: u64,
}

impl Evidence {
    fn of(op: &StepOp) -> Evidence {
        Evidence {
            comm_hash: op.comm_hash,
            func: op.func,
            coll_sn: op.coll_sn,
            coll_local_sn: op.coll_local_sn,
            start_us: op.start_us,
        }
    }
}

impl Serialize for Evidence {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Evidence", 5)?;
        st.serialize_field("comm_hash", &format!("0x{:016x}", self.comm_hash))?;
        st.serialize_field("func", self.func.name())?;
        st.serialize_field("coll_sn", &self.coll_sn)?;
        st.serialize_field("coll_local_sn", &self.coll_local_sn)?;
        st.serialize_field("start_us", &self.start_us)?;
        st.end()
    }
}

/// Evidence as written (`comm_hash` in hex, `func` by name), read back from journals and
/// checkpoints.
impl<'de> Deserialize<'de> for Evidence {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Evidence, D::Error> {
        #[derive(Deserialize)]
        struct Plain {
            comm_hash: String,
            func: String,
            coll_sn: u64,
            coll_local_sn: u64,
            start_us: u64,
        }
        let p = Plain::deserialize(d)?;
        let hex = p.comm_hash.trim_start_matches("0x");
        let comm_hash = u64::from_str_radix(hex, 16)
            .map_err(|_| serde::de::Error::custom(format!("comm_hash {:?}", p.comm_hash)))?;
        let func = Func::parse(&p.func)
            .ok_or_else(|| serde::de::Error::custom(format!("func {:?}", p.func)))?;
        Ok(Evidence {
            comm_hash,
            func,
            coll_sn: p.coll_sn,
            coll_local_sn: p.coll_local_sn,
            start_us: p.start_us,
        })
    }
}

/// Open-step length at which the circuit breaker trips: ~3x a large real step (Megatron with
/// TP, PP, 64 micro-batches, MoE: ~10 k per rank); it bounds an open step that never closes
/// (2^20 held 850 MiB at 8 ranks x 50 k ops/s, the soak of issue 23; 2^15 ~37 MiB).
pub const MAX_OPEN_OPS: usize = 1 << 15;

/// Open-step duration at which the circuit breaker trips by default: no step for 30 minutes
/// (`[steps] breaker_minutes`).
pub use super::config::DEFAULT_BREAKER_US as MAX_OPEN_US;

/// Operations by which a merged step's cut may miss the usual length (lost operations).
const SPLIT_SLACK: u64 = 1;

/// What ended a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClosedBy {
    /// Its Close sequence.
    Close,
    /// The next step's Open after this step's Anchor (its Close was not seen).
    Open,
    /// Split off a merged step: the next step's primary anchor advanced its communicator's
    /// sequence by more than one step, so this step's anchor was lost; cut at the Open nearest
    /// to the rank's usual step length.
    Split,
}

/// One rank's step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSummary {
    /// Global rank (`RANK`; -1 when unknown).
    pub rank: i64,
    /// Step index on this rank (0 = the first step of its stream).
    pub step: u64,
    pub first: Evidence,
    /// The most preferred anchor seen (`anchor_alt`: its alternative, 0 = the primary one).
    pub anchor: Option<Evidence>,
    pub anchor_alt: Option<u32>,
    pub last: Evidence,
    /// First operation's start to the latest end of any of the step's operations.
    pub duration_us: u64,
    /// Operations in the step.
    pub ops: u64,
    /// The primary anchor seen, no alternative twice, no lost operation, the stream did not
    /// start inside it.
    pub coverage_complete: bool,
    pub closed_by: ClosedBy,
    /// Time in each phase (µs, sums over the step; [`super::phase`]), when the template labels
    /// phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseTimes>,
    /// Microbatches in the step, when the template can tell (a `microbatch` phase rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatches: Option<u32>,
}

/// The step being built.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Open {
    first: Evidence,
    /// The most preferred anchor seen: (alternative index, evidence).
    anchor: Option<(usize, Evidence)>,
    /// Matches per anchor alternative.
    anchors: Vec<u32>,
    ops: u64,
    incomplete: bool,
    end_us: u64,
}

/// One rank's boundary machine for one template. Its state round-trips through serde (the
/// agent's checkpoint); the template's sequences do not: [`StepFsm::rebind`] after loading.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepFsm {
    rank: i64,
    #[serde(skip)]
    open_seqs: Vec<Seq>,
    #[serde(skip)]
    anchor_seqs: Vec<Seq>,
    #[serde(skip)]
    close_seqs: Vec<Seq>,
    #[serde(skip)]
    phase_rules: Vec<PhaseRule>,
    next_step: u64,
    cur: Option<Open>,
    /// The open step's operations with their end times (memory: the open step).
    recent: VecDeque<(StepOp, u64)>,
    last_lsn: Option<u64>,
    /// The last primary anchor: (communicator, coll_sn).
    last_anchor: Option<(u64, u64)>,
    /// How far the primary anchor's coll_sn advances per step (learned).
    stride: Option<u64>,
    /// Operations in the rank's last complete steps (learned; the largest is the usual length,
    /// since lost operations only shorten a step).
    recent_lengths: VecDeque<u64>,
    /// Steps emitted since the one with `last_anchor` (their primary anchors were lost).
    since_anchor: u64,
    /// Per (communicator, function): its `coll_sn` blocks per step (learned from complete
    /// steps; where a merged step is cut).
    #[serde(default)]
    periods: Periods,
    /// The circuit breaker tripped: operations are ignored.
    tripped: bool,
    /// A Close matched on this rank: from then on an Open after an Anchor means the Close was
    /// lost. Before (a job whose template's Close never occurs: Megatron without DP), the Open
    /// after the Anchor is the step's normal boundary.
    #[serde(default)]
    closed_once: bool,
    max_open: usize,
    /// Open-step duration (µs) at which the breaker trips ("no step for N minutes").
    #[serde(default = "default_max_open_us")]
    max_open_us: u64,
}

fn default_max_open_us() -> u64 {
    MAX_OPEN_US
}

/// The first alternative whose sequence matches the tail of `recent`: (its index, its length).
fn tail_matches(seqs: &[Seq], recent: &VecDeque<(StepOp, u64)>) -> Option<(usize, usize)> {
    seqs.iter().enumerate().find_map(|(i, s)| {
        if s.is_empty() || s.len() > recent.len() {
            return None;
        }
        let start = recent.len() - s.len();
        // The newest operation first: most alternatives fail there.
        let last = s.len() - 1;
        (s[last].matches(&recent[start + last].0)
            && s[..last]
                .iter()
                .enumerate()
                .all(|(k, m)| m.matches(&recent[start + k].0)))
        .then_some((i, s.len()))
    })
}

impl StepFsm {
    /// A machine for `rank` following `t`.
    pub fn new(t: &Template, rank: i64) -> StepFsm {
        StepFsm {
            rank,
            open_seqs: t.open.clone(),
            anchor_seqs: t.anchor.clone(),
            close_seqs: t.close.clone(),
            phase_rules: t.phases.clone(),
            next_step: 0,
            cur: None,
            recent: VecDeque::new(),
            last_lsn: None,
            last_anchor: None,
            stride: None,
            recent_lengths: VecDeque::new(),
            since_anchor: 0,
            periods: Periods::default(),
            tripped: false,
            closed_once: false,
            max_open: MAX_OPEN_OPS,
            max_open_us: MAX_OPEN_US,
        }
    }

    /// Attach the template's sequences again (after a checkpoint was loaded).
    pub fn rebind(&mut self, t: &Template) {
        self.open_seqs = t.open.clone();
        self.anchor_seqs = t.anchor.clone();
        self.close_seqs = t.close.clone();
        self.phase_rules = t.phases.clone();
    }

    /// The same machine with another breaker limit (tests).
    pub fn with_max_open(mut self, max_open: usize) -> StepFsm {
        self.max_open = max_open.max(1);
        self
    }

    /// The same machine with another time limit for an open step (µs; `[steps]
    /// breaker_minutes`).
    pub fn with_max_open_us(mut self, max_open_us: u64) -> StepFsm {
        self.max_open_us = max_open_us.max(1);
        self
    }

    /// Whether the circuit breaker tripped (the template does not fit this rank).
    pub fn tripped(&self) -> bool {
        self.tripped
    }

    /// Operations of the step still open (state, not emitted).
    pub fn pending_ops(&self) -> u64 {
        self.cur.as_ref().map_or(0, |c| c.ops)
    }

    /// Feed the rank's next operation (in order); completed steps are pushed to `out`.
    pub fn push(&mut self, op: &StepOp, end_us: u64, out: &mut Vec<StepSummary>) {
        if self.tripped {
            return;
        }
        let too_long = self
            .cur
            .as_ref()
            .is_some_and(|c| op.start_us.saturating_sub(c.first.start_us) > self.max_open_us);
        if self.recent.len() >= self.max_open || too_long {
            self.tripped = true;
            self.cur = None;
            self.recent = VecDeque::new();
            return;
        }
        // A lost operation before this one, or this one unfinished (a hang cut the step):
        // the step is not complete.
        let gap = match self.last_lsn {
            Some(l) => op.coll_local_sn != l.wrapping_add(1),
            None => op.coll_local_sn != 0,
        } || end_us == UNFINISHED_END;
        self.last_lsn = Some(op.coll_local_sn);
        match &mut self.cur {
            Some(c) => {
                c.ops += 1;
                c.incomplete |= gap;
                c.end_us = c.end_us.max(end_us);
            }
            None => {
                self.cur = Some(Open {
                    first: Evidence::of(op),
                    anchor: None,
                    anchors: vec![0; self.anchor_seqs.len()],
                    ops: 1,
                    incomplete: gap,
                    end_us: end_us.max(op.start_us),
                });
            }
        }
        self.recent.push_back((op.clone(), end_us));
        if let Some((alt, _)) = tail_matches(&self.anchor_seqs, &self.recent) {
            if alt == 0 {
                self.split_merged(op, out);
            }
            let c = self.cur.as_mut().expect("open");
            c.anchors[alt] += 1;
            if c.anchor.is_none_or(|(a, _)| alt < a) {
                c.anchor = Some((alt, Evidence::of(op)));
            }
        }
        let c = self.cur.as_mut().expect("set above");
        if tail_matches(&self.close_seqs, &self.recent).is_some() {
            self.split_by_periods(out);
            let c = self.cur.take().expect("open");
            let ph = phase::label(&self.phase_rules, self.recent.make_contiguous(), c.end_us);
            self.closed_once = true;
            self.emit(c, Evidence::of(op), ClosedBy::Close, ph, out);
            self.learn_periods(out);
            self.recent.clear();
            return;
        }
        let Some((_, len)) = tail_matches(&self.open_seqs, &self.recent) else {
            return;
        };
        if c.anchor.is_none() || c.ops <= len as u64 || self.recent.len() <= len {
            return;
        }
        // Close lost, Anchor proved the tail: the step ends before the Open.
        let cut = self.recent.len() - len;
        let last = Evidence::of(&self.recent[cut - 1].0);
        let moved: Vec<(StepOp, u64)> = self.recent.drain(cut..).collect();
        let c = self.cur.as_mut().expect("open");
        c.ops -= len as u64;
        c.end_us = self
            .recent
            .iter()
            .map(|(o, e)| (*e).max(o.start_us))
            .max()
            .unwrap_or(0);
        self.split_by_periods(out);
        let c = self.cur.take().expect("open");
        let ph = phase::label(&self.phase_rules, self.recent.make_contiguous(), c.end_us);
        self.emit(c, last, ClosedBy::Open, ph, out);
        self.learn_periods(out);
        self.recent.clear();
        let mut next = Open {
            first: Evidence::of(&moved[0].0),
            anchor: None,
            anchors: vec![0; self.anchor_seqs.len()],
            ops: 0,
            // Its start was inferred (the Open after an Anchor), not proven by a Close.
            incomplete: self.closed_once,
            end_us: 0,
        };
        for (o, e) in &moved {
            next.ops += 1;
            next.end_us = next.end_us.max(*e).max(o.start_us);
        }
        self.recent.extend(moved);
        self.cur = Some(next);
    }

    /// A primary anchor `op` that advanced its communicator by `n` > 1 steps since the last one:
    /// the open step holds `n` steps. Split off the first `n - 1` at the Open matches nearest to
    /// the usual step length (needs a learned length and stride; otherwise the step stays merged
    /// and calibration marks it). When the communicators' sequence numbers put the whole open
    /// step into one step, it is not split (the merge happened in a step already emitted).
    fn split_merged(&mut self, op: &StepOp, out: &mut Vec<StepSummary>) {
        let (Some((comm, last)), Some(stride), Some(typical)) = (
            self.last_anchor,
            self.stride,
            self.recent_lengths.iter().max().copied(),
        ) else {
            return;
        };
        if comm != op.comm_hash || op.coll_sn <= last || !(op.coll_sn - last).is_multiple_of(stride)
        {
            return;
        }
        // Steps already emitted without their primary anchor account for part of the advance.
        let Some(extra) = ((op.coll_sn - last) / stride).checked_sub(1 + self.since_anchor) else {
            return;
        };
        // The part split off lost (at least) its primary anchor: expect that much shorter.
        let lost = self.anchor_seqs.first().map_or(0, Vec::len) as u64;
        let target = typical.saturating_sub(lost);
        // Each split takes operations off `recent`: no more splits than it holds (whatever
        // the sequence numbers claim).
        for _ in 0..extra.min(self.recent.len() as u64) {
            let n = self.recent.len();
            // Where the sequence numbers put the end of a step (zero everywhere if unknown).
            let (sn_cost, pairs) = self.periods.cut_costs(self.recent.iter().map(|(o, _)| o));
            if pairs > 0 && sn_cost[n] == 0 {
                return;
            }
            // Start positions of Open matches, not at 0 and not inside the anchor itself.
            let cut = (1..n.saturating_sub(1))
                .filter(|&p| self.open_starts(p, n - 1))
                .min_by_key(|&p| self.cut_rank(p, target, &sn_cost));
            let Some(cut) = cut else { return };
            self.split_head(cut, false, out);
        }
    }

    /// The open step (all of `recent`) is about to be emitted without its primary anchor: when
    /// the communicators' sequence numbers say it holds two steps (its anchor and the next
    /// step's primary anchor were lost; a secondary anchor or the Close proved the tail), split
    /// it at the Open where they agree.
    fn split_by_periods(&mut self, out: &mut Vec<StepSummary>) {
        loop {
            let Some(c) = &self.cur else { return };
            if c.anchor.is_some_and(|(a, _)| a == 0) {
                return;
            }
            let n = self.recent.len();
            let (sn_cost, _) = self.periods.cut_costs(self.recent.iter().map(|(o, _)| o));
            if sn_cost[n] == 0 {
                return;
            }
            let target = self.recent_lengths.iter().max().copied().unwrap_or(0);
            let cut = (1..n)
                .filter(|&p| sn_cost[p] == 0 && self.open_starts(p, n))
                .min_by_key(|&p| self.cut_rank(p, target, &sn_cost));
            let Some(cut) = cut else { return };
            self.split_head(cut, true, out);
        }
    }

    /// Whether an Open sequence matches `recent` from `p` and ends at or before `end`.
    fn open_starts(&self, p: usize, end: usize) -> bool {
        self.open_seqs.iter().any(|s| {
            !s.is_empty()
                && p + s.len() <= end
                && s.iter()
                    .zip(self.recent.iter().skip(p))
                    .all(|(m, (o, _))| m.matches(o))
        })
    }

    /// How good a cut before `recent[p]` is (smaller is better): the one the communicators'
    /// sequence numbers agree with, then one right after the beginning of a Close (its lost tail
    /// was the anchor), then the length nearest to the usual one (`target`).
    fn cut_rank(
        &self,
        p: usize,
        target: u64,
        sn_cost: &[u32],
    ) -> (u32, bool, u64, Reverse<u64>, u64) {
        let after_close_prefix = self.close_seqs.iter().any(|s| {
            (1..s.len()).any(|k| {
                k <= p
                    && s[..k]
                        .iter()
                        .zip(self.recent.iter().skip(p - k))
                        .all(|(m, (o, _))| m.matches(o))
            })
        });
        // Lost operations make the length uncertain by a few: within that slack, the longest
        // idle time before the cut wins (a step boundary is where the rank computes without
        // communicating: optimizer, loss, data loading).
        let dist = (p as i64 - target as i64).unsigned_abs();
        let (prev, prev_end) = &self.recent[p - 1];
        let idle = self.recent[p]
            .0
            .start_us
            .saturating_sub((*prev_end).max(prev.start_us));
        (
            sn_cost[p],
            !after_close_prefix,
            dist.saturating_sub(SPLIT_SLACK),
            Reverse(idle),
            dist,
        )
    }

    /// Emit `recent[..cut]` as a step split off the open one (not complete); the rest stays open
    /// (`with_last`: its last operation's anchor is counted here, not by the caller).
    fn split_head(&mut self, cut: usize, with_last: bool, out: &mut Vec<StepSummary>) {
        let head: Vec<(StepOp, u64)> = self.recent.drain(..cut).collect();
        let c = self.cur.take().expect("open");
        let part = self.summarize(&head, c.incomplete, true);
        let last = Evidence::of(&head[head.len() - 1].0);
        let ph = phase::label(&self.phase_rules, &head, part.end_us);
        self.emit(part, last, ClosedBy::Split, ph, out);
        let rest: Vec<(StepOp, u64)> = self.recent.iter().cloned().collect();
        self.cur = Some(self.summarize(&rest, true, with_last));
    }

    /// The state of a step made of `ops` (anchors re-found by scanning).
    fn summarize(&self, ops: &[(StepOp, u64)], incomplete: bool, with_last: bool) -> Open {
        let mut o = Open {
            first: Evidence::of(&ops[0].0),
            anchor: None,
            anchors: vec![0; self.anchor_seqs.len()],
            ops: ops.len() as u64,
            incomplete,
            end_us: 0,
        };
        let mut window: VecDeque<(StepOp, u64)> = VecDeque::new();
        // The caller adds the last op's anchor itself when it is still being pushed.
        let scan = if with_last { ops.len() } else { ops.len() - 1 };
        for (i, (op, e)) in ops.iter().enumerate() {
            o.end_us = o.end_us.max(*e).max(op.start_us);
            window.push_back((op.clone(), *e));
            if i >= scan {
                break;
            }
            if let Some((alt, _)) = tail_matches(&self.anchor_seqs, &window) {
                o.anchors[alt] += 1;
                if o.anchor.is_none_or(|(a, _)| alt < a) {
                    o.anchor = Some((alt, Evidence::of(op)));
                }
            }
        }
        o
    }

    /// The step just emitted from `recent` was complete: learn its sequence-number blocks.
    fn learn_periods(&mut self, out: &[StepSummary]) {
        if out.last().is_some_and(|s| s.coverage_complete) {
            self.periods.learn(self.recent.iter().map(|(o, _)| o));
        }
    }

    fn emit(
        &mut self,
        c: Open,
        last: Evidence,
        by: ClosedBy,
        (phases, microbatches): (Option<PhaseTimes>, Option<u32>),
        out: &mut Vec<StepSummary>,
    ) {
        let complete = c.anchor.is_some_and(|(a, _)| a == 0)
            && c.anchors.iter().all(|n| *n <= 1)
            && !c.incomplete;
        if let Some((0, a)) = c.anchor {
            if let Some((comm, last_sn)) = self.last_anchor {
                if comm == a.comm_hash && a.coll_sn > last_sn && complete {
                    let d = a.coll_sn - last_sn;
                    self.stride = Some(self.stride.map_or(d, |s| s.min(d)));
                }
            }
            self.last_anchor = Some((a.comm_hash, a.coll_sn));
            self.since_anchor = 0;
        } else {
            self.since_anchor += 1;
        }
        if complete {
            if self.recent_lengths.len() == 8 {
                self.recent_lengths.pop_front();
            }
            self.recent_lengths.push_back(c.ops);
        }
        out.push(StepSummary {
            rank: self.rank,
            step: self.next_step,
            first: c.first,
            anchor: c.anchor.map(|(_, e)| e),
            anchor_alt: c.anchor.map(|(a, _)| a as u32),
            last,
            duration_us: c.end_us.saturating_sub(c.first.start_us),
            ops: c.ops,
            coverage_complete: complete,
            closed_by: by,
            phases,
            microbatches,
        });
        self.next_step += 1;
    }
}

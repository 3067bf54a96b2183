//! Clock alignment: every stream's host times onto the job timeline, with an error bound.
//!
//! * Per process ([`ProcessClock`]): the plugin's host times are CLOCK_MONOTONIC + an offset
//!   fixed at plugin start (`proc_start` carries the pair); `stats` records carry fresh
//!   (mono, real) pairs, so the drift between that fixed offset and today's realtime is known.
//! * Per host ([`HostOffset`], [`estimate`]): this host's realtime against the job master's,
//!   measured NTP-style over the agent link (`crate::master`), persisted in [`ClockBook`].
//! * [`align`] sums both into the stream's [`Alignment`] (offset and error bound), which the
//!   archive copies into every row.

mod book;
mod offset;

pub use book::{ClockBook, ClockError, MAX_BOOK_LINES};
pub use offset::{estimate, estimate_within, Exchange, HostOffset, CLOCK_READ_ERR_NS};

use comminsight_wire::record::{Body, Record};
use serde::{Deserialize, Serialize};

use crate::stream::Alignment;

/// Error bound when this host's offset to the master was never measured: "unknown" (about
/// 292 years; fits a signed 64-bit column). The reference host itself uses
/// [`HostOffset::reference`] (error 0) instead.
pub const UNMEASURED_ERR_NS: u64 = i64::MAX as u64;

/// Error of one (mono, real) pair read by the plugin: the two clock reads are back to back.
pub const PAIR_READ_ERR_NS: u64 = 1_000;

/// A (CLOCK_MONOTONIC, CLOCK_REALTIME) pair read together by the plugin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPair {
    pub mono_ns: u64,
    pub real_ns: u64,
}

impl ClockPair {
    /// realtime - monotonic at the time of the pair.
    fn offset(&self) -> i128 {
        self.real_ns as i128 - self.mono_ns as i128
    }
}

/// One process' calibration: the pair fixed at `proc_start` and the latest `stats` pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessClock {
    /// The pair the plugin's host times are based on (host = mono + start offset).
    pub start: Option<ClockPair>,
    /// The latest fresh pair (from a `stats` record), and the one before it.
    pub latest: Option<ClockPair>,
    pub previous: Option<ClockPair>,
}

impl ProcessClock {
    /// A clock with no calibration yet (correction 0).
    pub fn new() -> ProcessClock {
        ProcessClock::default()
    }

    /// Take the calibration pairs of `proc_start` and `stats` records; others are ignored. A
    /// `proc_start` with another pair (a restarted runtime) starts over.
    pub fn observe(&mut self, rec: &Record) {
        match &rec.body {
            Body::ProcStart(p) => {
                let pair = ClockPair {
                    mono_ns: p.mono_ns,
                    real_ns: p.real_ns,
                };
                if self.start != Some(pair) {
                    *self = ProcessClock {
                        start: Some(pair),
                        ..Default::default()
                    };
                }
            }
            Body::Stats(s) if s.mono_ns != 0 && s.real_ns != 0 => {
                let pair = ClockPair {
                    mono_ns: s.mono_ns,
                    real_ns: s.real_ns,
                };
                if self.latest.is_none_or(|l| pair.mono_ns > l.mono_ns) {
                    self.previous = self.latest.replace(pair);
                }
            }
            _ => {}
        }
    }

    /// The realtime correction of the stream's host times: `offset_ns` = today's realtime
    /// minus the plugin's fixed-offset clock at the latest pair. `err_ns` = how far that drift
    /// moved between the last two pairs (it may move as much again before the next one) plus
    /// [`PAIR_READ_ERR_NS`]. Before any `stats` pair: offset 0, error [`PAIR_READ_ERR_NS`]
    /// (the plugin's clock is exact at its start; its later drift is not known yet).
    pub fn correction(&self) -> Alignment {
        let (Some(start), Some(latest)) = (self.start, self.latest) else {
            return Alignment {
                offset_ns: 0,
                err_ns: PAIR_READ_ERR_NS,
            };
        };
        let drift = |p: ClockPair| p.offset() - start.offset();
        let now = drift(latest);
        let moved = self.previous.map_or(0, |p| (now - drift(p)).unsigned_abs());
        Alignment {
            offset_ns: clamp_i64(now),
            err_ns: (moved as u64).saturating_add(PAIR_READ_ERR_NS),
        }
    }
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// The stream's alignment onto the job timeline (the master's realtime): the process
/// correction plus the host offset, errors summed. `host = None` (not measured yet) gives
/// the error [`UNMEASURED_ERR_NS`].
pub fn align(process: &ProcessClock, host: Option<&HostOffset>) -> Alignment {
    let p = process.correction();
    match host {
        Some(h) => Alignment {
            offset_ns: p.offset_ns.saturating_add(h.offset_ns),
            err_ns: p.err_ns.saturating_add(h.err_ns),
        },
        None => Alignment {
            offset_ns: p.offset_ns,
            err_ns: UNMEASURED_ERR_NS,
        },
    }
}

#[cfg(test)]
mod tests;

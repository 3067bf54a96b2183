//! Clock alignment: every stream's host times onto the job timeline, with an error bound.
//!
//! * Per process ([`ProcessClock`]): the plugin's host times are CLOCK_MONOTONIC + an offset
//!   fixed at plugin start (`proc_start` carries the pair); `stats` records carry fresh
//!   (mono, real) pairs, so the drift between that fixed offset and today's realtime is known.
//! * Per host ([`HostOffset`], [`estimate`]): this host's realtime against the job master's,
//!   measured NTP-style over the agent link (`crate::master`), persisted in [`ClockBook`].
//! * GPU timer ↔ host ([`GpuFit`]): operations timed by NCCL's GPU timer carry both the GPU
//!   timer's kernel start/stop and the host times at which the plugin saw them; the host sees
//!   an event at or after it happened, so the smallest (host − GPU) difference is the offset.
//! * [`align`] sums both into the stream's [`Alignment`] (offset and error bound), which the
//!   archive copies into every row; [`align_gpu`] does the same for GPU timer values.

mod book;
pub mod config;
mod offset;

pub use book::{ClockBook, ClockError, MAX_BOOK_LINES};
pub use config::ClockConfig;
pub use offset::{estimate, estimate_within, Exchange, HostOffset, CLOCK_READ_ERR_NS};

use comminsight_wire::record::{Body, Record, Timing};
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
    /// GPU timer ↔ host fit from the process' GPU-timed operations.
    #[serde(default)]
    pub gpu: GpuFit,
}

/// The GPU timer's offset to the plugin's host clock (`host ≈ gpu + offset`), fitted from
/// operations that carry both: the host observes a kernel's start and stop at or after the GPU
/// timer's values, so each difference is the offset plus a non-negative observation delay, and
/// the smallest one is the best estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFit {
    /// Smallest `host start - GPU start` seen (ns).
    pub min_start_delta: Option<i64>,
    /// Smallest `host end - GPU end` seen (ns).
    pub min_end_delta: Option<i64>,
    /// Operations that contributed.
    pub samples: u64,
}

impl GpuFit {
    fn observe(&mut self, start: u64, gpu_start: u64, end: u64, gpu_end: u64) {
        let mut took = false;
        if start != 0 && gpu_start != 0 {
            let d = clamp_i64(start as i128 - gpu_start as i128);
            self.min_start_delta = Some(self.min_start_delta.map_or(d, |m| m.min(d)));
            took = true;
        }
        if end != 0 && gpu_end != 0 {
            let d = clamp_i64(end as i128 - gpu_end as i128);
            self.min_end_delta = Some(self.min_end_delta.map_or(d, |m| m.min(d)));
            took = true;
        }
        self.samples += u64::from(took);
    }

    /// GPU timer -> the plugin's host clock: `offset_ns` = the smallest observed difference;
    /// `err_ns` = how far the start- and end-based estimates disagree (the observation delay
    /// they cannot both hide) plus [`PAIR_READ_ERR_NS`]. `None` before any GPU-timed operation.
    pub fn to_host(&self) -> Option<Alignment> {
        let (offset, spread) = match (self.min_start_delta, self.min_end_delta) {
            (Some(a), Some(b)) => (a.min(b), a.abs_diff(b)),
            (Some(a), None) | (None, Some(a)) => (a, 0),
            (None, None) => return None,
        };
        Some(Alignment {
            offset_ns: offset,
            err_ns: spread.saturating_add(PAIR_READ_ERR_NS),
        })
    }
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
            Body::Coll(o) | Body::P2p(o) if o.timing == Timing::KernelGpu => {
                self.gpu
                    .observe(o.start_ns, o.gpu_start_ns, o.end_ns, o.gpu_end_ns);
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

/// The process part of a stream's clock error bound in µs, rounded up (a stream not seen yet:
/// one pair read, [`PAIR_READ_ERR_NS`]). Online and offline alike add the host's part to it.
pub fn err_us(process: Option<&ProcessClock>) -> u64 {
    process
        .map_or(PAIR_READ_ERR_NS, |c| c.correction().err_ns)
        .div_ceil(1000)
}

/// GPU timer values of the stream onto the job timeline: the GPU fit, then the same path as
/// host times ([`align`]); errors summed. `None` before any GPU-timed operation.
pub fn align_gpu(process: &ProcessClock, host: Option<&HostOffset>) -> Option<Alignment> {
    let g = process.gpu.to_host()?;
    let h = align(process, host);
    Some(Alignment {
        offset_ns: g.offset_ns.saturating_add(h.offset_ns),
        err_ns: g.err_ns.saturating_add(h.err_ns),
    })
}

#[cfg(test)]
mod tests;

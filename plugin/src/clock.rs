//! Host clock: CLOCK_REALTIME-scale nanoseconds computed as CLOCK_MONOTONIC + an offset fixed once
//! (docs/contracts.md), so times never jump.
//!
//! Where the kernel itself keeps time with an invariant TSC (x86-64, `constant_tsc` and
//! `nonstop_tsc` in /proc/cpuinfo, clocksource `tsc`), [`Clock::now`] reads the TSC (`rdtsc`,
//! about 10 ns on the dev VM against 23–27 ns for the vDSO `clock_gettime`) and converts it with a
//! line `ns = base_ns + (tsc − base_tsc) × mult / 2^40` that the drain thread fits to
//! CLOCK_MONOTONIC + offset ([`Clock::calibrate`], at most every [`CAL_PERIOD_NS`]):
//! * The line is published under a seqlock (three words + a sequence): a reader uses a line only
//!   together with a TSC value read while that line was current.
//! * Each new line starts where the previous one is at the moment of the switch (plus 1 ns), so
//!   the clock is continuous and monotonic; its slope is the measured TSC rate, corrected to
//!   absorb the remaining difference to CLOCK_MONOTONIC + offset over [`SLEW_NS`] (like NTP's
//!   slewing, at most [`MAX_SLEW`] relative): the clock follows CLOCK_MONOTONIC, never steps.
//! * Until the first calibration (one drain pass after start) and wherever the TSC is not usable,
//!   `now` is the vDSO `clock_gettime(CLOCK_MONOTONIC)` + offset, as before. If the TSC line ever
//!   ends up more than [`MAX_ERROR_NS`] away from CLOCK_MONOTONIC + offset (a TSC the kernel did
//!   not flag), the clock goes back to `clock_gettime` for good (one step, logged by no one:
//!   `stats` records carry fresh CLOCK_MONOTONIC/REALTIME pairs beside `time_ns`).

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::sys;

/// Fixed-point shift of `mult` (ns per tick × 2^40).
const SHIFT: u32 = 40;
/// Shortest interval between two calibrations.
pub const CAL_PERIOD_NS: u64 = 100_000_000;
/// The line absorbs its remaining error over this long.
const SLEW_NS: i128 = 2_000_000_000;
/// Largest relative slope correction per calibration (parts per million).
const MAX_SLEW: i128 = 500;
/// Reads of the TSC line before [`Clock::now`] falls back to `clock_gettime`.
const READ_TRIES: usize = 4;
/// Beyond this error the TSC is not trusted any more.
const MAX_ERROR_NS: i128 = 10_000_000;

/// The plugin's host clock.
#[derive(Debug)]
pub struct Clock {
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at creation (ns, wrapping arithmetic).
    offset: u64,
    /// The calibration pair taken at creation.
    pub mono0: u64,
    pub real0: u64,
    tsc: Option<Tsc>,
}

/// The published TSC line (seqlock: `seq` odd while the drain writes; `mult` 0 = not usable).
#[derive(Debug, Default)]
struct Tsc {
    seq: AtomicU64,
    base_tsc: AtomicU64,
    base_ns: AtomicU64,
    mult: AtomicU64,
    /// Drain-side state: the previous calibration point (tsc, mono).
    cal: Mutex<Option<(u64, u64)>>,
}

impl Clock {
    /// Calibrate now; uses the TSC when the kernel does (see the module doc).
    pub fn new() -> Clock {
        Clock::with_tsc(tsc_usable())
    }

    /// As `new`, with the TSC path forced on (if the CPU has one) or off (tests, benches).
    pub fn with_tsc(tsc: bool) -> Clock {
        let mono0 = sys::mono_ns();
        let real0 = sys::real_ns();
        let tsc = (tsc && cfg!(target_arch = "x86_64")).then(|| {
            let t = Tsc::default();
            *t.cal.lock().unwrap_or_else(|p| p.into_inner()) = Some(sample());
            t
        });
        Clock {
            offset: real0.wrapping_sub(mono0),
            mono0,
            real0,
            tsc,
        }
    }

    /// A clock with an explicit offset (tests).
    pub fn with_offset(offset: u64) -> Clock {
        Clock {
            offset,
            mono0: 0,
            real0: offset,
            tsc: None,
        }
    }

    /// Now, as CLOCK_REALTIME-scale nanoseconds: one `rdtsc` once calibrated, else one vDSO
    /// `clock_gettime`.
    #[inline]
    pub fn now(&self) -> u64 {
        if let Some(t) = &self.tsc {
            // A line published while we read is read again (a few times at most: the drain's
            // write is three stores; a drain preempted inside it costs `clock_gettime`, which
            // may differ from the line by its remaining error).
            for _ in 0..READ_TRIES {
                let s1 = t.seq.load(Ordering::Acquire);
                let base_tsc = t.base_tsc.load(Ordering::Relaxed);
                let base_ns = t.base_ns.load(Ordering::Relaxed);
                let mult = t.mult.load(Ordering::Relaxed);
                let tsc = rdtsc();
                fence(Ordering::Acquire);
                if t.seq.load(Ordering::Relaxed) != s1 || s1 & 1 == 1 {
                    continue;
                }
                if mult == 0 {
                    break;
                }
                return line(base_ns, base_tsc, mult, tsc);
            }
        }
        self.mono_now()
    }

    /// CLOCK_MONOTONIC + offset.
    #[inline]
    fn mono_now(&self) -> u64 {
        sys::mono_ns().wrapping_add(self.offset)
    }

    /// Convert a CLOCK_MONOTONIC reading.
    pub fn from_mono(&self, mono: u64) -> u64 {
        mono.wrapping_add(self.offset)
    }

    /// Whether `now` currently reads the TSC.
    pub fn uses_tsc(&self) -> bool {
        self.tsc
            .as_ref()
            .is_some_and(|t| t.mult.load(Ordering::Relaxed) != 0)
    }

    /// Fit the TSC line to CLOCK_MONOTONIC + offset (drain thread; cheap; rate-limited to one
    /// refit per [`CAL_PERIOD_NS`]). Returns whether a new line was published.
    pub fn calibrate(&self) -> bool {
        let Some(t) = &self.tsc else { return false };
        let mut cal = t.cal.lock().unwrap_or_else(|p| p.into_inner());
        let Some((tsc_prev, mono_prev)) = *cal else {
            return false;
        };
        let (tsc_now, mono_now) = sample();
        let dt = tsc_now.wrapping_sub(tsc_prev) as i128;
        let dm = mono_now.wrapping_sub(mono_prev) as i128;
        if dm < CAL_PERIOD_NS as i128 || dt <= 0 {
            return false;
        }
        *cal = Some((tsc_now, mono_now));
        // Measured rate over the last interval, ns per tick << SHIFT.
        let rate = (dm << SHIFT) / dt;
        let target = i128::from(mono_now.wrapping_add(self.offset));
        let mult = t.mult.load(Ordering::Relaxed);
        // Start the new line where the current one is now (continuity), or at the target.
        let start = if mult == 0 {
            // Switching from clock_gettime: a little ahead, so no reader sees time go back.
            target + 100
        } else {
            let cur = i128::from(line(
                t.base_ns.load(Ordering::Relaxed),
                t.base_tsc.load(Ordering::Relaxed),
                mult,
                tsc_now,
            ));
            let err = cur - target;
            if err.abs() > MAX_ERROR_NS {
                // Not a TSC to trust: back to clock_gettime for good.
                t.seq.fetch_add(1, Ordering::AcqRel);
                t.mult.store(0, Ordering::Relaxed);
                t.seq.fetch_add(1, Ordering::Release);
                *cal = None;
                return false;
            }
            cur + 1
        };
        // Slope that closes the remaining error over SLEW_NS, bounded.
        let err = start - target;
        let corr = (-err * 1_000_000 / SLEW_NS).clamp(-MAX_SLEW, MAX_SLEW);
        let new_mult = rate + rate * corr / 1_000_000;
        if new_mult <= 0 || new_mult > i128::from(u64::MAX) {
            return false;
        }
        t.seq.fetch_add(1, Ordering::AcqRel);
        t.base_tsc.store(tsc_now, Ordering::Relaxed);
        t.base_ns.store(start as u64, Ordering::Relaxed);
        t.mult.store(new_mult as u64, Ordering::Relaxed);
        t.seq.fetch_add(1, Ordering::Release);
        true
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// `base_ns + (tsc − base_tsc) × mult >> SHIFT` (signed: a TSC read a little before the line's
/// base, as out-of-order execution allows, gives a time a little before `base_ns`).
#[inline]
fn line(base_ns: u64, base_tsc: u64, mult: u64, tsc: u64) -> u64 {
    let d = tsc.wrapping_sub(base_tsc) as i64;
    let ns = (i128::from(d) * i128::from(mult)) >> SHIFT;
    base_ns.wrapping_add(ns as u64)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` has no memory effects; every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    0
}

/// A (tsc, CLOCK_MONOTONIC) pair: the TSC is the midpoint of two reads around `clock_gettime`.
fn sample() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..5 {
        let a = rdtsc();
        let m = sys::mono_ns();
        let b = rdtsc();
        let w = b.wrapping_sub(a);
        if w < best.0 {
            best = (w, a.wrapping_add(w / 2), m);
        }
    }
    (best.1, best.2)
}

/// The kernel keeps time with an invariant TSC (and so may we).
fn tsc_usable() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let flags_ok = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines().find(|l| l.starts_with("flags")).is_some_and(|l| {
            let has = |f: &str| l.split_whitespace().any(|w| w == f);
            has("constant_tsc") && has("nonstop_tsc")
        })
    });
    let source_ok =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc");
    flags_ok && source_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(ns: u64) {
        let t = sys::mono_ns();
        while sys::mono_ns() - t < ns {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn clock_is_monotonic_and_near_realtime() {
        for tsc in [false, true] {
            let c = Clock::with_tsc(tsc);
            let a = c.now();
            let b = c.now();
            assert!(b >= a);
            let real = sys::real_ns();
            assert!(real.abs_diff(a) < 5_000_000_000);
        }
    }

    #[test]
    fn tsc_line_follows_monotonic_and_never_goes_back_across_calibrations() {
        let c = Clock::with_tsc(true);
        if !cfg!(target_arch = "x86_64") {
            assert!(!c.uses_tsc());
            return;
        }
        assert!(!c.uses_tsc(), "clock_gettime until the first calibration");
        assert!(!c.calibrate(), "rate-limited");
        let mut last = c.now();
        for _ in 0..4 {
            let until = sys::mono_ns() + CAL_PERIOD_NS + 1_000_000;
            while sys::mono_ns() < until {
                let n = c.now();
                assert!(n >= last, "went back {last} -> {n}");
                last = n;
            }
            assert!(c.calibrate());
            assert!(c.uses_tsc());
            let n = c.now();
            assert!(n >= last, "went back at a calibration {last} -> {n}");
            last = n;
            let want = c.mono_now();
            assert!(
                n.abs_diff(want) < 200_000,
                "TSC clock {n} vs CLOCK_MONOTONIC+offset {want}"
            );
        }
        spin(1_000);
        assert!(c.now() > last);
    }

    #[test]
    fn the_line_is_signed_around_its_base() {
        let m = 1u64 << SHIFT; // 1 ns per tick
        assert_eq!(line(1_000, 500, m, 600), 1_100);
        assert_eq!(line(1_000, 500, m, 400), 900);
        assert_eq!(line(1_000, 500, m / 2, 700), 1_100);
    }
}

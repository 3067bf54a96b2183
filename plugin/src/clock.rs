//! Host clock: CLOCK_MONOTONIC plus a CLOCK_REALTIME offset fixed once, so times never jump.

use crate::sys;

/// The plugin's host clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at creation (ns, wrapping arithmetic).
    offset: u64,
    /// The calibration pair taken at creation.
    pub mono0: u64,
    pub real0: u64,
}

impl Clock {
    /// Calibrate now.
    pub fn new() -> Clock {
        let mono0 = sys::mono_ns();
        let real0 = sys::real_ns();
        Clock {
            offset: real0.wrapping_sub(mono0),
            mono0,
            real0,
        }
    }

    /// A clock with an explicit offset (tests).
    pub fn with_offset(offset: u64) -> Clock {
        Clock {
            offset,
            mono0: 0,
            real0: offset,
        }
    }

    /// Now, as CLOCK_REALTIME-scale nanoseconds (one vDSO `clock_gettime`).
    #[inline]
    pub fn now(&self) -> u64 {
        sys::mono_ns().wrapping_add(self.offset)
    }

    /// Convert a CLOCK_MONOTONIC reading.
    pub fn from_mono(&self, mono: u64) -> u64 {
        mono.wrapping_add(self.offset)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_near_realtime() {
        let c = Clock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        let real = sys::real_ns();
        assert!(real.abs_diff(a) < 5_000_000_000);
    }
}

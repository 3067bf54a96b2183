//! Pure backoff arithmetic for the OTLP log backlog: the delay doubles from `initial` up to
//! `max` after each consecutive failure and starts over after a success.

use std::time::Duration;

/// Exponential backoff state of one failure streak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    initial_ms: u64,
    max_ms: u64,
    /// Consecutive failures so far (0 = healthy).
    failures: u32,
}

impl Backoff {
    /// A backoff from `initial_ms` doubling up to `max_ms` (both at least 1 ms; max >= initial).
    pub fn new(initial_ms: u64, max_ms: u64) -> Backoff {
        let initial_ms = initial_ms.max(1);
        Backoff {
            initial_ms,
            max_ms: max_ms.max(initial_ms),
            failures: 0,
        }
    }

    /// Record a failure; returns the delay before the next attempt and whether this failure
    /// starts a new streak (the one that deserves a warning).
    pub fn fail(&mut self) -> (Duration, bool) {
        let first = self.failures == 0;
        let shift = self.failures.min(63);
        let ms = self
            .initial_ms
            .checked_shl(shift)
            .filter(|v| v >> shift == self.initial_ms)
            .unwrap_or(u64::MAX)
            .min(self.max_ms);
        self.failures = self.failures.saturating_add(1);
        (Duration::from_millis(ms), first)
    }

    /// Record a success; returns how many failures the streak that ended had (0 if none).
    pub fn succeed(&mut self) -> u32 {
        std::mem::take(&mut self.failures)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(100, 1000);
        let ms: Vec<(u128, bool)> = (0..6)
            .map(|_| {
                let (d, first) = b.fail();
                (d.as_millis(), first)
            })
            .collect();
        assert_eq!(
            ms,
            [
                (100, true),
                (200, false),
                (400, false),
                (800, false),
                (1000, false),
                (1000, false)
            ]
        );
        assert_eq!(b.succeed(), 6);
        assert_eq!(b.fail(), (Duration::from_millis(100), true));
    }

    #[test]
    fn never_overflows() {
        let mut b = Backoff::new(u64::MAX / 2, u64::MAX);
        for _ in 0..100 {
            assert!(b.fail().0 >= Duration::from_millis(u64::MAX / 2));
        }
        let mut z = Backoff::new(0, 0);
        assert_eq!(z.fail().0, Duration::from_millis(1));
        assert_eq!(z.failures(), 1);
    }
}

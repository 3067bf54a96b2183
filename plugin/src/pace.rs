//! How long the drain thread sleeps between two passes over the ring (pure arithmetic, tested).
//!
//! Producers never wake the drain (that would be extra work on the hot path), so the drain must
//! wake often enough that the ring cannot fill between two passes, yet not spin or wake often
//! when nothing happens. After each pass it knows how many records it moved and how long the
//! interval was; [`Pacer::next`] keeps a peak rate (the highest recent rate, halving per second
//! of lower activity) and sleeps until the ring would be an eighth full at that rate (the other
//! seven eighths absorb a drain thread the scheduler runs late, e.g. on a host with more busy
//! threads than cores), between
//! [`MIN_SLEEP_NS`] and the flush period. A sleep grows at most 2× per pass, so after a burst, or
//! at start-up, the drain backs off gradually (1, 2, 4 … ms up to the period) instead of
//! sleeping a whole period straight away.
//!
//! At the default ring (65536 records) a sustained 2 M records/s gives 4 ms sleeps; an idle
//! process wakes once per flush period (200 ms). What no pacer can catch: a process idle for a
//! whole period that then produces more than a ring's worth of records within one period
//! (65536 records in 200 ms ≈ 330 k records/s from a standing start).

/// Shortest sleep between two passes.
pub const MIN_SLEEP_NS: u64 = 1_000_000;

/// Drain sleep policy.
#[derive(Clone, Debug)]
pub struct Pacer {
    /// Records that may accumulate between two passes (an eighth of the ring).
    budget: f64,
    /// The flush period: the longest sleep.
    max_ns: u64,
    /// Highest recent rate, records per ns.
    peak: f64,
    last_sleep_ns: u64,
}

impl Pacer {
    pub fn new(ring_capacity: usize, period_ns: u64) -> Pacer {
        Pacer {
            budget: (ring_capacity / 8).max(1) as f64,
            max_ns: period_ns.max(MIN_SLEEP_NS),
            peak: 0.0,
            last_sleep_ns: MIN_SLEEP_NS,
        }
    }

    /// The pass just done moved `moved` records, `dt_ns` after the previous pass began: how long
    /// to sleep now.
    pub fn next(&mut self, moved: u64, dt_ns: u64) -> u64 {
        let dt = dt_ns.max(1) as f64;
        let rate = moved as f64 / dt;
        self.peak = (self.peak * 0.5f64.powf(dt / 1e9)).max(rate);
        let fill_ns = if self.peak > 0.0 {
            (self.budget / self.peak).min(self.max_ns as f64) as u64
        } else {
            self.max_ns
        };
        let s = fill_ns
            .clamp(MIN_SLEEP_NS, self.max_ns)
            .min(self.last_sleep_ns.saturating_mul(2));
        self.last_sleep_ns = s;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn idle_backs_off_to_the_period_gradually() {
        let mut p = Pacer::new(65536, 200 * MS);
        let got: Vec<u64> = (0..10).map(|_| p.next(0, MS) / MS).collect();
        assert_eq!(got, vec![2, 4, 8, 16, 32, 64, 128, 200, 200, 200]);
    }

    #[test]
    fn a_busy_ring_is_visited_before_an_eighth_fills() {
        let mut p = Pacer::new(65536, 200 * MS);
        // 2 M records/s: 8192 records take 4.096 ms.
        for _ in 0..20 {
            let s = p.next(2_000 * 8, 8 * MS);
            assert!(s <= 4_096 * 1000 + 1, "{s}");
            assert!(s >= MIN_SLEEP_NS);
        }
        // Faster than the drain can be woken: the minimum, never zero (no spinning).
        assert_eq!(p.next(1_000_000, MS), MIN_SLEEP_NS);
    }

    #[test]
    fn after_a_burst_the_peak_decays_and_sleeps_grow_back() {
        let mut p = Pacer::new(65536, 200 * MS);
        p.next(16_000, 8 * MS);
        let mut t = 0;
        let mut s = 0;
        while t < 20_000 * MS {
            s = p.next(0, s.max(MS));
            t += s;
        }
        assert_eq!(s, 200 * MS);
    }
}

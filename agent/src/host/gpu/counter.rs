//! Cumulative counters into per-interval deltas: the first reading gives 0 (nothing to compare
//! with), a reading below the previous one is a reset (a driver reload, a GPU reset) and gives 0
//! and a flag, never a negative or wrapped rate.

use serde::{Deserialize, Serialize};

/// One counter's last reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter(Option<u64>);

/// What [`Counter::delta`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub value: u64,
    /// The counter went backwards.
    pub reset: bool,
    /// There was no previous reading.
    pub first: bool,
}

impl Counter {
    /// The change since the last reading, which `now` replaces.
    pub fn delta(&mut self, now: u64) -> Delta {
        let prev = self.0.replace(now);
        match prev {
            None => Delta {
                first: true,
                ..Delta::default()
            },
            Some(p) if now < p => Delta {
                reset: true,
                ..Delta::default()
            },
            Some(p) => Delta {
                value: now - p,
                ..Delta::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reading_is_zero_a_drop_is_a_reset_not_a_negative_rate() {
        let mut c = Counter::default();
        assert_eq!(
            c.delta(100),
            Delta {
                value: 0,
                reset: false,
                first: true
            }
        );
        assert_eq!(c.delta(150).value, 50);
        let r = c.delta(20);
        assert!(r.reset && r.value == 0, "{r:?}");
        assert_eq!(
            c.delta(25).value,
            5,
            "counting resumes from the reset value"
        );
        assert_eq!(c.delta(u64::MAX).value, u64::MAX - 25);
    }
}

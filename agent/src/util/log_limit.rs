//! Bounding repeated log lines: one line per key per window, the rest counted and named in the
//! next line that is logged. A hang makes every op of every rank overdue; without this the
//! daemon's log carried one WARN per op (134 lines for one 8-rank hang).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Keys kept before the ones idle for a whole window are dropped.
const MAX_KEYS: usize = 4096;

/// One line per key per `window`.
#[derive(Debug)]
pub struct LogLimiter {
    window: Duration,
    keys: HashMap<String, (Instant, u64)>,
}

impl LogLimiter {
    pub fn new(window: Duration) -> LogLimiter {
        LogLimiter {
            window,
            keys: HashMap::new(),
        }
    }

    /// Whether a line for `key` is logged now: `Some(n)` with the `n` lines of that key
    /// suppressed since the last one logged, or `None` (suppressed and counted).
    pub fn admit(&mut self, key: &str, now: Instant) -> Option<u64> {
        if let Some((last, suppressed)) = self.keys.get_mut(key) {
            if now.saturating_duration_since(*last) < self.window {
                *suppressed += 1;
                return None;
            }
            let n = *suppressed;
            *last = now;
            *suppressed = 0;
            return Some(n);
        }
        if self.keys.len() >= MAX_KEYS {
            let window = self.window;
            self.keys
                .retain(|_, (last, _)| now.saturating_duration_since(*last) < window);
        }
        if self.keys.len() < MAX_KEYS {
            self.keys.insert(key.to_string(), (now, 0));
        }
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_window_and_the_rest_counted() {
        let mut l = LogLimiter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(l.admit("a", t0), Some(0));
        assert_eq!(l.admit("b", t0), Some(0));
        for i in 1..=5 {
            assert_eq!(l.admit("a", t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(l.admit("a", t0 + Duration::from_secs(61)), Some(5));
        assert_eq!(l.admit("a", t0 + Duration::from_secs(62)), None);
        // Never more than MAX_KEYS keys, whatever the input.
        for i in 0..(MAX_KEYS * 2) {
            l.admit(&i.to_string(), t0 + Duration::from_secs(62));
        }
        assert!(l.keys.len() <= MAX_KEYS);
    }
}

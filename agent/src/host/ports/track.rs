//! Per-counter memory between samples: deltas, saturation and driver resets.

use std::collections::{HashMap, HashSet};

/// The IBA width in bits of a saturating PortCounters error counter, by sysfs file name.
fn ib_error_width(name: &str) -> Option<u32> {
    Some(match name {
        "symbol_error"
        | "port_rcv_errors"
        | "port_rcv_remote_physical_errors"
        | "port_rcv_switch_relay_errors"
        | "port_xmit_discards"
        | "VL15_dropped" => 16,
        "link_error_recovery"
        | "link_downed"
        | "port_xmit_constraint_errors"
        | "port_rcv_constraint_errors" => 8,
        "local_link_integrity_errors" | "excessive_buffer_overrun_errors" => 4,
        _ => return None,
    })
}

/// The raw value at which an IB `counters/` file is stuck (saturated): the IBA width's maximum for
/// error counters, `u32::MAX` for the legacy 32-bit data, packet and wait counters. 64-bit
/// extended counters exceed that value and simply keep counting.
pub(super) fn ib_saturation_max(name: &str) -> u64 {
    match ib_error_width(name) {
        Some(bits) => (1u64 << bits) - 1,
        None => u64::from(u32::MAX),
    }
}

/// Whether an IB `counters/` file counts units of 4 octets (reported as bytes, x4).
pub(super) fn is_ib_data(name: &str) -> bool {
    matches!(name, "port_xmit_data" | "port_rcv_data")
}

/// What one reading of a counter means compared with the previous one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Observation {
    /// Raw increase since the previous reading; `None` on the first reading, at saturation and
    /// after a reset.
    pub delta: Option<u64>,
    /// The raw value sits at its saturation maximum.
    pub saturated: bool,
    /// The previous raw value when this reading went backwards (driver reset).
    pub reset_from: Option<u64>,
    /// Nanoseconds since the previous reading, when positive.
    pub elapsed_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Prev {
    value: u64,
    ts_ns: u64,
}

/// Previous raw values keyed by the counter's path; keys not seen in a sample are forgotten, so a
/// counter that reappears starts a new baseline.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    prev: HashMap<String, Prev>,
    seen: HashSet<String>,
}

impl Tracker {
    /// Starts a sample.
    pub fn begin(&mut self) {
        self.seen.clear();
    }

    /// Ends a sample, forgetting counters that were not read in it.
    pub fn end(&mut self) {
        let seen = &self.seen;
        self.prev.retain(|key, _| seen.contains(key));
    }

    /// Records `raw` for `key` at `now_ns`; `sat_max` is the saturation value, if any.
    pub fn observe(
        &mut self,
        key: &str,
        raw: u64,
        sat_max: Option<u64>,
        now_ns: u64,
    ) -> Observation {
        self.seen.insert(key.to_owned());
        let saturated = sat_max == Some(raw);
        let previous = self.prev.insert(
            key.to_owned(),
            Prev {
                value: raw,
                ts_ns: now_ns,
            },
        );
        let mut obs = Observation {
            delta: None,
            saturated,
            reset_from: None,
            elapsed_ns: None,
        };
        let Some(prev) = previous else {
            return obs;
        };
        obs.elapsed_ns = now_ns.checked_sub(prev.ts_ns).filter(|&ns| ns > 0);
        if raw < prev.value {
            obs.reset_from = Some(prev.value);
        } else if !saturated {
            obs.delta = Some(raw - prev.value);
        }
        obs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_follow_iba() {
        assert_eq!(ib_saturation_max("link_downed"), 255);
        assert_eq!(ib_saturation_max("symbol_error"), 65535);
        assert_eq!(ib_saturation_max("local_link_integrity_errors"), 15);
        assert_eq!(ib_saturation_max("port_xmit_packets"), 4_294_967_295);
    }

    #[test]
    fn tracker_first_delta_saturation_reset_and_forgetting() {
        let mut t = Tracker::default();
        t.begin();
        assert_eq!(t.observe("a", 10, Some(255), 0).delta, None);
        t.end();
        t.begin();
        let o = t.observe("a", 15, Some(255), 1_000);
        assert_eq!((o.delta, o.elapsed_ns), (Some(5), Some(1_000)));
        t.end();
        t.begin();
        let o = t.observe("a", 255, Some(255), 2_000);
        assert!(o.saturated && o.delta.is_none());
        t.end();
        t.begin();
        let o = t.observe("a", 3, Some(255), 3_000);
        assert_eq!((o.delta, o.reset_from), (None, Some(255)));
        t.end();
        t.begin();
        t.end();
        t.begin();
        assert_eq!(
            t.observe("a", 100, None, 5_000).delta,
            None,
            "forgotten, new baseline"
        );
    }
}

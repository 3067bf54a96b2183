//! NTP-style host offset against the job master.

use serde::{Deserialize, Serialize};

/// Granularity of one clock read (added to every error bound).
pub const CLOCK_READ_ERR_NS: u64 = 1_000;

/// One round trip: t1 client send, t2 server receive, t3 server send, t4 client receive
/// (client times on this host's realtime, server times on the master's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    pub t1: u64,
    pub t2: u64,
    pub t3: u64,
    pub t4: u64,
}

impl Exchange {
    /// Network round trip: (t4 - t1) - (t3 - t2), never negative.
    pub fn rtt_ns(&self) -> u64 {
        let total = self.t4 as i128 - self.t1 as i128;
        let server = self.t3 as i128 - self.t2 as i128;
        (total - server).max(0) as u64
    }

    /// Master minus this host: ((t2 - t1) + (t3 - t4)) / 2.
    pub fn offset_ns(&self) -> i64 {
        let o = ((self.t2 as i128 - self.t1 as i128) + (self.t3 as i128 - self.t4 as i128)) / 2;
        o.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }
}

/// This host's offset to the master: `master_time = local_time + offset_ns`, within `± err_ns`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostOffset {
    pub offset_ns: i64,
    /// rtt / 2 of the sample used, plus [`CLOCK_READ_ERR_NS`].
    pub err_ns: u64,
    pub rtt_ns: u64,
    /// This host's realtime when the sample was taken.
    pub measured_real_ns: u64,
    /// The master's address (empty: this host is the reference).
    pub master: String,
}

impl HostOffset {
    /// The reference host (the master itself, or a job without one): offset 0, error 0.
    pub fn reference(measured_real_ns: u64) -> HostOffset {
        HostOffset {
            measured_real_ns,
            ..Default::default()
        }
    }
}

/// [`estimate_within`] keeping every round trip.
pub fn estimate(samples: &[Exchange]) -> Option<HostOffset> {
    estimate_within(samples, u64::MAX)
}

/// The offset from the round trip with the smallest rtt at or below `max_rtt_ns`; `None`
/// when there is none. `master` is left empty for the caller to fill.
pub fn estimate_within(samples: &[Exchange], max_rtt_ns: u64) -> Option<HostOffset> {
    let best = samples
        .iter()
        .filter(|s| s.t4 >= s.t1 && s.t3 >= s.t2 && s.rtt_ns() <= max_rtt_ns)
        .min_by_key(|s| s.rtt_ns())?;
    let rtt = best.rtt_ns();
    Some(HostOffset {
        offset_ns: best.offset_ns(),
        err_ns: rtt.div_ceil(2).saturating_add(CLOCK_READ_ERR_NS),
        rtt_ns: rtt,
        measured_real_ns: best.t4,
        master: String::new(),
    })
}

//! `[clock]` of the agent's configuration: per-process calibration and the host offset against
//! the job master.

use serde::{Deserialize, Serialize};

/// Default of `sync_interval_s`.
pub const DEFAULT_SYNC_INTERVAL_S: u64 = 60;
/// Default of `samples`.
pub const DEFAULT_SAMPLES: u32 = 8;
/// Default of `max_rtt_ms`.
pub const DEFAULT_MAX_RTT_MS: u64 = 50;

/// `[clock]`: per-process calibration and the host offset against the job master.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockConfig {
    /// How often this host measures its offset against the master (s).
    pub sync_interval_s: u64,
    /// Round trips per measurement; the one with the smallest round trip wins.
    pub samples: u32,
    /// Round trips slower than this are discarded (ms).
    pub max_rtt_ms: u64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            sync_interval_s: DEFAULT_SYNC_INTERVAL_S,
            samples: DEFAULT_SAMPLES,
            max_rtt_ms: DEFAULT_MAX_RTT_MS,
        }
    }
}

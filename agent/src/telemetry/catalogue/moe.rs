//! The MoE EP instruments (issue 21; their points: `telemetry::moe`).

use super::{Instrument, Kind, HOST, JOB, RANK};

/// EP group id (hex, as the events write it).
pub const EP_GROUP: &str = "comminsight.moe.ep_group";
/// `dispatch` or `combine`.
pub const EP_PHASE: &str = "comminsight.moe.phase";
/// `col` (the rank as a sender) or `row` (as a receiver).
pub const EP_AXIS: &str = "comminsight.moe.axis";
/// `sender_slow`, `receiver_slow`, `path_slow`, `incomplete_window`.
pub const EP_KIND: &str = "comminsight.moe.finding";
/// The waiting rank of a matrix cell (EP-group rank).
pub const EP_WAITER: &str = "comminsight.moe.waiter";
/// The rank waited on.
pub const EP_PEER: &str = "comminsight.moe.peer";

/// Column / row ratio per rank.
pub const MOE_WAIT_RATIO: Instrument = Instrument {
    name: "comminsight.moe.ep.wait_ratio",
    kind: Kind::Gauge,
    unit: "1",
    description: "A rank's mean wait as a sender (axis col: how long its peers waited for it) or as a receiver (axis row), over the mean cell of its EP group's latest window (DeepXTrace's ratio; > 3 is a finding by default)",
    attributes: &[JOB, EP_GROUP, EP_PHASE, EP_AXIS, RANK, HOST],
};
/// Findings by kind.
pub const MOE_FINDINGS: Instrument = Instrument {
    name: "comminsight.moe.ep.findings",
    kind: Kind::Counter,
    unit: "{finding}",
    description: "EP windows' findings since the agent started: slow senders, slow receivers, slow paths, and windows a rank never reported",
    attributes: &[JOB, EP_GROUP, EP_PHASE, EP_KIND, HOST],
};
/// The matrix, cell by cell.
pub const MOE_CELL_RATIO: Instrument = Instrument {
    name: "comminsight.moe.ep.cell_ratio",
    kind: Kind::Gauge,
    unit: "1",
    description: "How long the waiter waited for the peer in its EP group's latest window, over the mean cell (groups of at most 64 ranks)",
    attributes: &[JOB, EP_GROUP, EP_PHASE, EP_WAITER, EP_PEER, HOST],
};

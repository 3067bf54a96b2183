//! The step engine (DESIGN.md §5, issue 5): each GPU's operation stream turned back into training
//! steps with templates, the same code online (agent) and offline (`steps`, `replay`).
//!
//! * [`template`]: the template format (`templates/*.toml`), validation and selection.
//! * [`session`]: per-GPU reorder by `(start_us, coll_local_sn)` behind a safe window.
//! * [`fsm`]: the boundary state machine and the step summaries.
//! * [`calibrate`]: step numbers aligned across ranks by the anchors' identity.
//! * [`offline`]: steps rebuilt from segments or an archive (`comminsight-agent steps`).

pub mod calibrate;
pub mod fsm;
pub mod offline;
pub mod session;
pub mod template;
#[cfg(test)]
mod tests;

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

/// One operation of one rank, as the step engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOp {
    pub comm_hash: u64,
    /// The communicator's role (names, else inference), if known.
    pub role: Option<Role>,
    pub func: Func,
    pub bytes: u64,
    /// NCCL's per-communicator, per-function sequence number.
    pub coll_sn: u64,
    /// The plugin's per-process operation sequence (issue order).
    pub coll_local_sn: u64,
    /// Start on the aligned job timeline, µs.
    pub start_us: u64,
}

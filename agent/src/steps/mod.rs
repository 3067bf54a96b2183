//! The step engine (DESIGN.md §5, issue 5): each GPU's operation stream turned back into training
//! steps with templates, the same code online (agent) and offline (`steps`, `replay`).
//!
//! * [`template`]: the template format (`templates/*.toml`), validation and selection.
//! * [`matcher`]: the op matchers of templates and phase rules ([`template::OpMatch`]).
//! * [`session`]: per-GPU reorder by `(start_us, coll_local_sn)` behind a safe window.
//! * [`fsm`]: the boundary state machine and the step summaries.
//! * [`calibrate`]: step numbers aligned across ranks by the anchors' identity.
//! * [`phase`]: phase labels (forward, backward, gradient sync, optimizer) inside a step.
//! * [`config`]: `[steps]` of the agent's configuration and the engine's settings from it.

pub mod calibrate;
pub mod config;
pub mod engine;
pub mod fsm;
pub mod matcher;
pub mod phase;
pub mod session;
pub mod template;
#[cfg(test)]
mod tests;

pub use config::StepsConfig;

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

/// The end time the step engine is given for an operation that had not finished (written at
/// exit with `FLAG_INCOMPLETE`, or with no end): a step holding one is never complete (a step
/// cut by a hang), and the time does not count towards its duration.
pub const UNFINISHED_END: u64 = 0;

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

/// Role codes of the checkpoint (`Role::ALL` index + 1; 0 = none).
fn role_code(r: Option<Role>) -> u8 {
    r.and_then(|r| Role::ALL.iter().position(|x| *x == r))
        .map_or(0, |i| i as u8 + 1)
}

fn role_of_code(c: u8) -> Option<Role> {
    c.checked_sub(1)
        .and_then(|i| Role::ALL.get(usize::from(i)).copied())
}

/// In the checkpoint an operation is a compact array:
/// `[comm_hash, role code, func code, bytes, coll_sn, coll_local_sn, start_us]`.
impl serde::Serialize for StepOp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (
            self.comm_hash,
            role_code(self.role),
            self.func.0,
            self.bytes,
            self.coll_sn,
            self.coll_local_sn,
            self.start_us,
        )
            .serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for StepOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StepOp, D::Error> {
        let (comm_hash, role, func, bytes, coll_sn, coll_local_sn, start_us) =
            <(u64, u8, u8, u64, u64, u64, u64)>::deserialize(d)?;
        Ok(StepOp {
            comm_hash,
            role: role_of_code(role),
            func: Func(func),
            bytes,
            coll_sn,
            coll_local_sn,
            start_us,
        })
    }
}

//! Work items: what an API call enqueues and what the stream executes.

use crate::comm::Comm;
use crate::profiler::H;
use crate::types::{DataType, Func, RedOp};
use std::sync::Arc;

/// One collective or p2p operation with its buffers (host addresses).
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// Function.
    pub func: Func,
    /// Send buffer (P2p Send: the buffer).
    pub send: usize,
    /// Receive buffer (P2p Recv: the buffer).
    pub recv: usize,
    /// NCCL's count argument.
    pub count: usize,
    /// Datatype.
    pub dt: DataType,
    /// Reduction.
    pub op: RedOp,
    /// Root (Broadcast/Reduce) or peer (Send/Recv).
    pub root: i32,
}

impl Op {
    /// Whether this is Send/Recv.
    pub fn is_p2p(&self) -> bool {
        matches!(self.func, Func::Send | Func::Recv)
    }

    /// Bytes of the per-rank message (count × element size).
    pub fn bytes(&self) -> usize {
        self.count * self.dt.size()
    }

    /// nChannels chosen like NCCL's tuner would: more channels for bigger messages.
    pub fn n_channels(&self) -> u8 {
        let b = self.bytes();
        if self.is_p2p() {
            return if b <= 32 << 10 { 1 } else { 2 };
        }
        match b {
            0..=32_768 => 1,
            32_769..=1_048_576 => 2,
            1_048_577..=16_777_216 => 3,
            _ => 4,
        }
    }
}

/// Profiler bookkeeping of one task.
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskProf {
    /// Activation mask snapshot at API time.
    pub mask: i32,
    /// Loss injection: deliver none of this op's events.
    pub lost: bool,
    /// GroupApi handle.
    pub group_api: H,
    /// CollApi/P2pApi handle.
    pub api: H,
    /// Coll/P2p handle.
    pub event: H,
}

/// One task.
#[derive(Clone, Copy, Debug)]
pub struct Task {
    /// The operation.
    pub op: Op,
    /// Profiler state.
    pub prof: TaskProf,
}

/// A launched plan for one comm (one "kernel").
pub struct Job {
    /// The comm.
    pub comm: Arc<Comm>,
    /// Tasks in order.
    pub tasks: Vec<Task>,
}

// SAFETY: buffers are addresses owned by the application, which guarantees (as with a GPU stream)
// they stay valid until the work finished; handles are opaque plugin values.
unsafe impl Send for Job {}

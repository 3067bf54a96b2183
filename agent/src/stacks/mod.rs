//! Process state (procfs) and Python + native stacks (py-spy as a library) of the local ranks
//! the plugin registered. Only PIDs from `proc_start` records of this host are ever inspected.

//!
//! * [`proc_state`] / [`proc_state_checked`] / [`start_ticks`]: `/proc/PID/stat` (+ `wchan`).
//! * [`capture`] / [`capture_with_timeout`] / [`capture_many`]: py-spy `PythonSpy` on a helper
//!   thread, bounded in time, never panicking; [`CaptureMode::Locked`] pauses the target for one
//!   consistent dump (the hang path), [`CaptureMode::NonBlocking`] never stops it (periodic use).
//! * [`ptrace_permission`]: CAP_SYS_PTRACE / Yama `ptrace_scope`; refusals are reported in
//!   [`ProcessStacks::error`] with [`ProcessStacks::permission_denied`] set, never hidden.

use serde::{Deserialize, Serialize};

mod capture;
mod perm;
mod procfs;

pub use capture::{
    capture, capture_many, capture_with_timeout, CaptureMode, DEFAULT_CAPTURE_TIMEOUT,
    MAX_PARALLEL_CAPTURES,
};
pub use perm::ptrace_permission;
pub use procfs::{proc_state, proc_state_checked, start_ticks};

/// A process's state as procfs shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcStatus {
    /// `R`: running or runnable.
    Running,
    /// `S` (also `I`, `W`, `K`, `P`): interruptible sleep; the detail names the wait channel.
    Sleeping,
    /// `D`: uninterruptible sleep (I/O, a driver); the detail names the wait channel.
    DiskSleep,
    /// `T` (signal) or `t` (tracer).
    Stopped,
    /// `Z` (exited, not reaped) or `X` (being reaped).
    Zombie,
    /// No such process (or the PID now belongs to another process).
    Gone,
    /// procfs could not be read (the detail says why).
    Unknown,
}

impl ProcStatus {
    /// The process will never make progress again.
    pub fn is_dead(self) -> bool {
        matches!(self, ProcStatus::Zombie | ProcStatus::Gone)
    }
}

/// State of one process, with a one-line detail (e.g. `wchan=futex_wait_queue`, `exit_code=137`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcState {
    pub status: ProcStatus,
    #[serde(default)]
    pub detail: String,
}

/// One frame (innermost first in [`ThreadStack::frames`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub name: String,
    #[serde(default)]
    pub file: String,
    #[serde(default)]
    pub line: i32,
    /// A native (C/C++/Rust) frame rather than a Python one.
    #[serde(default)]
    pub native: bool,
}

/// One thread's stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStack {
    pub thread_id: u64,
    #[serde(default)]
    pub os_thread_id: Option<u64>,
    #[serde(default)]
    pub name: Option<String>,
    /// Running (not idle) when sampled.
    pub active: bool,
    /// Holds the GIL.
    pub owns_gil: bool,
    /// Innermost first.
    pub frames: Vec<Frame>,
}

/// The stacks of one process, or why they could not be taken.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStacks {
    pub pid: u32,
    /// When the capture started (Unix µs).
    pub captured_us: u64,
    /// How long attach + dump took.
    pub elapsed_us: u64,
    /// `locked` (target paused for one consistent dump) or `nonblocking`.
    pub mode: String,
    #[serde(default)]
    pub python_version: Option<String>,
    pub threads: Vec<ThreadStack>,
    /// Why no (or only part of the) stacks came back, one line naming the cause and the fix
    /// (e.g. missing CAP_SYS_PTRACE, Yama ptrace_scope).
    #[serde(default)]
    pub error: Option<String>,
    /// The failure was a permission refusal.
    #[serde(default)]
    pub permission_denied: bool,
    /// Stacks came back, but with less than asked (e.g. native frames were asked in the
    /// non-blocking mode, which cannot unwind native stacks, or native unwinding failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

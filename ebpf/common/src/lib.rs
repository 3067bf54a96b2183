//! Plain-old-data types shared by the BPF programs (`ebpf/probes`, `no_std`, bpfel) and the agent
//! (`agent/src/probes`). Every type is `#[repr(C)]`, has explicit padding and no pointers, so the
//! kernel side writes it into a ring buffer and the user side reads it back byte for byte.
//!
//! Layout changes are wire changes: bump [`EVENT_ABI`] (the agent refuses an object whose
//! `ABI_VERSION` global differs from its own).
#![no_std]

/// Version of the layouts below; the BPF object exports it as the `ABI_VERSION` global.
pub const EVENT_ABI: u32 = 1;

/// Kind of an [`Event`] (its first field).
pub mod kind {
    /// An ibverbs call returned ([`super::VerbsEvent`]).
    pub const VERBS: u32 = 1;
    /// A tracked thread changed scheduler state ([`super::SchedEvent`]).
    pub const SCHED: u32 = 2;
    /// A TCP socket of a tracked process retransmitted or changed state ([`super::TcpEvent`]).
    pub const TCP: u32 = 3;
}

/// Which ibverbs entry point a [`VerbsEvent`] reports (the probe's cookie).
pub mod verbs {
    pub const GET_DEVICE_LIST: u32 = 1;
    pub const FREE_DEVICE_LIST: u32 = 2;
    pub const FORK_INIT: u32 = 3;
    pub const OPEN_DEVICE: u32 = 4;
    pub const CLOSE_DEVICE: u32 = 5;
    pub const ALLOC_PD: u32 = 6;
    pub const DEALLOC_PD: u32 = 7;
    pub const REG_MR: u32 = 8;
    pub const REG_MR_IOVA2: u32 = 9;
    pub const DEREG_MR: u32 = 10;
    pub const CREATE_CQ: u32 = 11;
    pub const DESTROY_CQ: u32 = 12;
    pub const CREATE_QP: u32 = 13;
    pub const MODIFY_QP: u32 = 14;
    pub const DESTROY_QP: u32 = 15;
    pub const GET_ASYNC_EVENT: u32 = 16;
    /// One past the largest function id.
    pub const COUNT: u32 = 17;
}

/// Scheduler transitions a [`SchedEvent`] reports.
pub mod sched {
    /// The thread got a CPU (`sched_switch`, next).
    pub const ON_CPU: u32 = 1;
    /// The thread left the CPU still runnable (preempted: `prev_state` = running).
    pub const PREEMPTED: u32 = 2;
    /// The thread left the CPU to sleep (`prev_state` != running; `state` holds it).
    pub const SLEEP: u32 = 3;
    /// The thread was woken (`sched_wakeup` / `sched_wakeup_new`): runnable, waiting for a CPU.
    pub const WAKEUP: u32 = 4;
    /// The thread exited (`sched_process_exit`).
    pub const EXIT: u32 = 5;
}

/// TCP events.
pub mod tcp {
    /// `tcp:tcp_retransmit_skb`.
    pub const RETRANSMIT: u32 = 1;
    /// `sock:inet_sock_set_state` (TCP only).
    pub const STATE: u32 = 2;
}

/// Common header of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// Thread id (kernel pid) of the thread the event is about.
    pub tid: u32,
    /// Process id (kernel tgid).
    pub pid: u32,
    /// Sub-kind: a [`verbs`] function, a [`sched`] transition or a [`tcp`] event.
    pub what: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the event happened.
    pub ts_ns: u64,
}

/// An ibverbs call, reported when it returns (entry arguments saved per thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsEvent {
    pub hdr: EventHeader,
    /// Entry time (ns, CLOCK_MONOTONIC): `hdr.ts_ns - enter_ns` is the call's duration.
    pub enter_ns: u64,
    /// Return value (a pointer or an int, sign-extended).
    pub ret: i64,
    /// The first four arguments as passed.
    pub args: [u64; 4],
    /// `ibv_qp.qp_num` (create: of the returned QP; modify/destroy: of the argument).
    pub qp_num: u32,
    /// `ibv_qp.qp_type`.
    pub qp_type: u32,
    /// `ibv_qp.state` before the call (modify) / after it (create).
    pub qp_state: u32,
    /// `ibv_qp_attr.qp_state` (modify with `IBV_QP_STATE`).
    pub new_state: u32,
    /// The `attr_mask` of a modify.
    pub attr_mask: u32,
    /// `ibv_qp_attr.dest_qp_num`.
    pub dest_qp_num: u32,
    /// `ibv_qp_attr.ah_attr.dlid`.
    pub dlid: u16,
    /// `ibv_qp_attr.port_num`.
    pub port_num: u8,
    /// `ibv_qp_attr.path_mtu`.
    pub path_mtu: u8,
    /// mr: `ibv_mr.lkey` / async event: `event_type`.
    pub lkey: u32,
    /// mr: `ibv_mr.rkey`.
    pub rkey: u32,
    pub _pad: u32,
    /// mr: `ibv_mr.length`; async event: the element (QP pointer or port number).
    pub length: u64,
    /// `ibv_qp_attr.ah_attr.grh.dgid`.
    pub dgid: [u8; 16],
    /// The device name (`ibv_context.device->name`), NUL padded.
    pub device: [u8; 32],
}

/// A scheduler transition of a tracked thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedEvent {
    pub hdr: EventHeader,
    /// CPU the event happened on.
    pub cpu: u32,
    /// `prev_state` of a switch out (TASK_* bits; 0 = running).
    pub state: u32,
}

/// A TCP event on a socket owned by a tracked process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpEvent {
    pub hdr: EventHeader,
    /// Address family (2 = IPv4, 10 = IPv6).
    pub family: u16,
    pub sport: u16,
    pub dport: u16,
    pub _pad: u16,
    /// Old and new TCP state (set_state); for retransmits the socket's state.
    pub old_state: u32,
    pub new_state: u32,
    /// Source / destination address (IPv4 in the first 4 bytes).
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// Per-process tracking entry (the `PIDS` map's value): which processes the probes report.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tracked {
    /// Bit set of [`kind`]s reported for this process (`1 << kind`).
    pub kinds: u32,
    pub _pad: u32,
}

/// Per-thread scheduler totals kept in the kernel (the `THREADS` map's value), so that lost
/// ring-buffer records never lose time: the agent samples these.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    /// Total time on a CPU (ns).
    pub on_cpu_ns: u64,
    /// Total time runnable but not running (ns).
    pub runnable_ns: u64,
    /// Total time sleeping (ns): interruptible and uninterruptible.
    pub blocked_ns: u64,
    /// Of `blocked_ns`, uninterruptible sleep (D state: I/O).
    pub blocked_io_ns: u64,
    /// When the current state began (ns, CLOCK_MONOTONIC).
    pub since_ns: u64,
    /// Current state: one of [`thread_state`].
    pub state: u32,
    /// `prev_state` bits of the last switch out.
    pub last_prev_state: u32,
    /// Context switches: voluntary (sleep) and involuntary (preempted).
    pub voluntary: u64,
    pub involuntary: u64,
    /// Thread group (pid) of the thread.
    pub pid: u32,
    pub _pad: u32,
}

/// Values of [`ThreadTimes::state`].
pub mod thread_state {
    pub const UNKNOWN: u32 = 0;
    pub const ON_CPU: u32 = 1;
    pub const RUNNABLE: u32 = 2;
    pub const BLOCKED: u32 = 3;
    pub const BLOCKED_IO: u32 = 4;
}

/// Per-function counters of the verbs probes (the `COUNTS` per-CPU array, index = function id):
/// hits, and records lost because the ring buffer was full.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    pub hits: u64,
    pub lost: u64,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type here is #[repr(C)], Copy, made only of integers and integer arrays with
    // explicit padding fields, so any bit pattern is a valid value (what aya::Pod requires).
    unsafe impl aya::Pod for super::Tracked {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ThreadTimes {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProbeCounts {}
}

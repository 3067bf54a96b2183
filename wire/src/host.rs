//! Host-context record bodies, written by the agent (not the plugin) from its host probes
//! (issue 19): a rank thread's CPU-state totals over one sampling interval (`thread`), a queue
//! pair's lifecycle event (`qp`), a TCP connection's retransmits and state changes (`tcp`) and a
//! NIC port's counters over one interval (`port`). They travel in the agent's own host stream
//! (one per job and host, docs/contracts.md "Host context records") so the archive, the offline
//! rebuild and every analysis read them exactly like the plugin's records.
//!
//! Host times (`*_ns`) are the agent's CLOCK_REALTIME derived from CLOCK_MONOTONIC at the
//! stream's `proc_start`, like the plugin's.

use crate::body::StrField;

/// Bytes of `comm` and `syscall` in a `thread` record.
pub const THREAD_NAME_LEN: usize = 15;
/// Bytes of the device name in `qp` and `port` records.
pub const DEVICE_LEN: usize = 23;

/// Codes of [`HostThread::state`] (the BPF side's `thread_state`, plus exited).
pub mod thread_state {
    pub const UNKNOWN: u8 = 0;
    pub const ON_CPU: u8 = 1;
    pub const RUNNABLE: u8 = 2;
    pub const BLOCKED: u8 = 3;
    pub const BLOCKED_IO: u8 = 4;
    pub const EXITED: u8 = 5;

    /// The state's name in reports (`on-cpu`, `runnable`, `blocked`, `blocked-io`, `exited`).
    pub fn name(code: u8) -> &'static str {
        match code {
            ON_CPU => "on-cpu",
            RUNNABLE => "runnable",
            BLOCKED => "blocked",
            BLOCKED_IO => "blocked-io",
            EXITED => "exited",
            _ => "unknown",
        }
    }

    /// The inverse of [`name`].
    pub fn from_name(s: &str) -> u8 {
        match s {
            "on-cpu" => ON_CPU,
            "runnable" => RUNNABLE,
            "blocked" => BLOCKED,
            "blocked-io" => BLOCKED_IO,
            "exited" => EXITED,
            _ => UNKNOWN,
        }
    }
}

/// Where a `thread` record's times come from ([`HostThread::source`]).
pub mod thread_source {
    /// The sched tracepoints (exact per-state times).
    pub const EBPF: u8 = 1;
    /// `/proc/<pid>/task/<tid>/schedstat` (on-CPU and run-queue time; blocked is the rest,
    /// the state the one at the sample).
    pub const SCHEDSTAT: u8 = 2;
}

/// One thread of a rank process over one sampling interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostThread {
    /// End of the interval.
    pub time_ns: u64,
    pub interval_ns: u64,
    /// Time in each state during the interval; `blocked_io_ns` is the part of `blocked_ns`
    /// spent uninterruptible (D).
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub blocked_io_ns: u64,
    /// When the current state began (host time).
    pub state_since_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// Context switches in the interval.
    pub voluntary_switches: u32,
    pub involuntary_switches: u32,
    /// Current state ([`thread_state`]).
    pub state: u8,
    /// [`thread_source`].
    pub source: u8,
    pub comm: StrField,
    /// The system call a blocked thread sleeps in (`/proc/<pid>/task/<tid>/syscall`), or empty.
    pub syscall: StrField,
}

/// Codes of [`HostQp::event`].
pub mod qp_event {
    pub const CREATE: u8 = 1;
    pub const MODIFY: u8 = 2;
    pub const DESTROY: u8 = 3;
    /// A transition to `ERR` (also a `MODIFY`, reported as its own event).
    pub const ERROR: u8 = 4;

    pub fn name(code: u8) -> &'static str {
        match code {
            CREATE => "create",
            MODIFY => "modify",
            DESTROY => "destroy",
            ERROR => "error",
            _ => "unknown",
        }
    }
}

/// `ibv_qp_state` values as libibverbs defines them (`RESET` = 0 .. `ERR` = 6); 255: unknown.
pub mod qp_state {
    pub const ERR: u8 = 6;
    pub const UNKNOWN: u8 = 255;

    pub fn name(code: u8) -> &'static str {
        match code {
            0 => "RESET",
            1 => "INIT",
            2 => "RTR",
            3 => "RTS",
            4 => "SQD",
            5 => "SQE",
            6 => "ERR",
            _ => "UNKNOWN",
        }
    }

    /// The inverse of [`name`].
    pub fn from_name(s: &str) -> u8 {
        (0..=6).find(|c| name(*c) == s).unwrap_or(UNKNOWN)
    }
}

/// One queue-pair lifecycle event of a rank process (ibverbs uprobes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostQp {
    pub time_ns: u64,
    /// When the QP was created (host time; 0 if it existed before the probes).
    pub created_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub qp_num: u32,
    pub dest_qp_num: u32,
    /// `ibv_qp_attr_mask` of a modify.
    pub attr_mask: u32,
    pub dlid: u16,
    /// [`qp_event`].
    pub event: u8,
    /// `ibv_qp_type`.
    pub qp_type: u8,
    /// [`qp_state`] before and after.
    pub old_state: u8,
    pub new_state: u8,
    pub port: u8,
    /// Destination GID (network byte order).
    pub dgid: [u8; 16],
    pub device: StrField,
}

/// Codes of [`HostTcp::event`].
pub mod tcp_event {
    /// Retransmits in the interval (`retransmits` > 0).
    pub const RETRANSMIT: u8 = 1;
    /// State changes only.
    pub const STATE: u8 = 2;
}

/// A TCP connection of a rank process over one interval: retransmits and state changes,
/// attributed by its 4-tuple.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostTcp {
    pub time_ns: u64,
    pub interval_ns: u64,
    pub pid: u32,
    pub retransmits: u32,
    pub state_changes: u32,
    pub sport: u16,
    pub dport: u16,
    /// [`tcp_event`].
    pub event: u8,
    /// 4 or 6 (v4 addresses are stored v4-mapped).
    pub family: u8,
    /// Kernel `TCP_*` state numbers of the last change (0: none seen).
    pub old_state: u8,
    pub new_state: u8,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// Codes of [`HostPort::link_layer`].
pub mod port_kind {
    pub const INFINIBAND: u8 = 1;
    pub const ETHERNET: u8 = 2;
}

/// Bits of [`HostPort::port_flags`].
pub mod port_flags {
    /// A counter went backwards (driver reset); its delta is not counted.
    pub const COUNTER_RESET: u8 = 1 << 0;
    /// A 32-bit counter is stuck at its maximum: its delta is a lower bound.
    pub const SATURATED: u8 = 1 << 1;
    /// Some counter files could not be read.
    pub const READ_ERRORS: u8 = 1 << 2;
    /// The link went down during the interval.
    pub const LINK_DOWN: u8 = 1 << 3;
    /// The link came up during the interval.
    pub const LINK_UP: u8 = 1 << 4;
}

/// One NIC port's counters over one interval (sysfs), as deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPort {
    pub time_ns: u64,
    pub interval_ns: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Sum of the error and drop counters' deltas.
    pub errors: u64,
    /// `link_downed` delta (InfiniBand) or carrier-down changes (Ethernet).
    pub link_downed: u32,
    /// IB port number (Ethernet: 0).
    pub port: u8,
    /// [`port_kind`].
    pub link_layer: u8,
    /// 1 when the port is active / up, 0 when not, 255 unknown.
    pub up: u8,
    /// [`port_flags`].
    pub port_flags: u8,
    pub device: StrField,
}

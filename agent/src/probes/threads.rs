//! Per-thread scheduler shares from the kernel's `THREADS` totals: on-CPU, runnable (waiting for
//! a CPU) and blocked time, the current state and how long it has lasted, and for a blocked
//! thread the system call it sleeps in (`/proc/<pid>/task/<tid>/syscall`: futex, epoll_wait...).

use comminsight_ebpf_common::{thread_state, ThreadTimes};
use serde::{Deserialize, Serialize};

/// One tracked thread at one instant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadSample {
    pub pid: u32,
    pub tid: u32,
    /// `/proc/<pid>/task/<tid>/comm`.
    pub comm: String,
    /// `on-cpu`, `runnable`, `blocked`, `blocked-io`, `exited` or `unknown`.
    pub state: String,
    /// How long the thread has been in `state` (ns).
    pub in_state_ns: u64,
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub blocked_io_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// For a blocked thread: the system call it waits in (`futex`, or `syscall 7`).
    pub syscall: Option<String>,
}

impl ThreadSample {
    /// Shares of on-CPU / runnable / blocked time over the tracked lifetime (0..1).
    pub fn shares(&self) -> (f64, f64, f64) {
        let total = (self.on_cpu_ns + self.runnable_ns + self.blocked_ns) as f64;
        if total <= 0.0 {
            return (0.0, 0.0, 0.0);
        }
        (
            self.on_cpu_ns as f64 / total,
            self.runnable_ns as f64 / total,
            self.blocked_ns as f64 / total,
        )
    }
}

/// The state name of a `ThreadTimes::state`.
pub fn state_name(t: &ThreadTimes) -> &'static str {
    match t.state {
        thread_state::ON_CPU => "on-cpu",
        thread_state::RUNNABLE => "runnable",
        thread_state::BLOCKED => "blocked",
        thread_state::BLOCKED_IO => "blocked-io",
        _ if t.last_prev_state == u32::MAX => "exited",
        _ => "unknown",
    }
}

/// A sample of `t` at `now_ns` (CLOCK_MONOTONIC): the time in the current state is added to its
/// bucket, so a thread blocked for 40 s shows 40 s blocked before it ever wakes.
pub fn sample(tid: u32, t: &ThreadTimes, now_ns: u64) -> ThreadSample {
    let ongoing = if t.since_ns != 0 {
        now_ns.saturating_sub(t.since_ns)
    } else {
        0
    };
    let mut s = ThreadSample {
        pid: t.pid,
        tid,
        comm: read_trim(&format!("/proc/{}/task/{tid}/comm", t.pid)).unwrap_or_default(),
        state: state_name(t).into(),
        in_state_ns: ongoing,
        on_cpu_ns: t.on_cpu_ns,
        runnable_ns: t.runnable_ns,
        blocked_ns: t.blocked_ns,
        blocked_io_ns: t.blocked_io_ns,
        voluntary_switches: t.voluntary,
        involuntary_switches: t.involuntary,
        syscall: None,
    };
    match t.state {
        thread_state::ON_CPU => s.on_cpu_ns += ongoing,
        thread_state::RUNNABLE => s.runnable_ns += ongoing,
        thread_state::BLOCKED => s.blocked_ns += ongoing,
        thread_state::BLOCKED_IO => {
            s.blocked_ns += ongoing;
            s.blocked_io_ns += ongoing;
        }
        _ => {}
    }
    if matches!(t.state, thread_state::BLOCKED | thread_state::BLOCKED_IO) {
        s.syscall = blocked_syscall(t.pid, tid);
    }
    s
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The system call a sleeping thread is in (first field of `/proc/.../syscall`; `running` or
/// an unreadable file give `None`).
pub fn blocked_syscall(pid: u32, tid: u32) -> Option<String> {
    let s = read_trim(&format!("/proc/{pid}/task/{tid}/syscall"))?;
    let nr: i64 = s.split_whitespace().next()?.parse().ok()?;
    Some(syscall_name(nr).map_or_else(|| format!("syscall {nr}"), str::to_string))
}

/// x86_64 names of the system calls a training thread typically sleeps in.
fn syscall_name(nr: i64) -> Option<&'static str> {
    Some(match nr {
        0 => "read",
        1 => "write",
        7 => "poll",
        23 => "select",
        34 => "pause",
        35 => "nanosleep",
        45 => "recvfrom",
        47 => "recvmsg",
        61 => "wait4",
        202 => "futex",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        441 => "epoll_pwait2",
        _ => return None,
    })
}

/// The scheduler state of a thread from `/proc/<pid>/task/<tid>/stat` (for threads that were
/// already running when tracking began): `R` runnable, `S` blocked, `D` blocked-io.
pub fn proc_state(pid: u32, tid: u32) -> u32 {
    let Some(stat) = read_trim(&format!("/proc/{pid}/task/{tid}/stat")) else {
        return thread_state::UNKNOWN;
    };
    // The state follows the last ')' (comm may contain spaces and parentheses).
    let st = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next());
    match st {
        Some('R') => thread_state::RUNNABLE,
        Some('D') => thread_state::BLOCKED_IO,
        Some('S') | Some('I') | Some('T') | Some('t') => thread_state::BLOCKED,
        _ => thread_state::UNKNOWN,
    }
}

/// CLOCK_MONOTONIC now (the clock of `bpf_ktime_get_ns`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ongoing_state_counts_toward_its_bucket() {
        let t = ThreadTimes {
            on_cpu_ns: 5,
            blocked_ns: 10,
            since_ns: 100,
            state: thread_state::BLOCKED,
            pid: std::process::id(),
            ..ThreadTimes::default()
        };
        let s = sample(std::process::id(), &t, 1_100);
        assert_eq!(
            (s.state.as_str(), s.blocked_ns, s.in_state_ns),
            ("blocked", 1_010, 1_000)
        );
        let (on, _, blocked) = s.shares();
        assert!(blocked > 0.99 && on < 0.01);
    }

    #[test]
    fn this_thread_reads_as_runnable() {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        assert_eq!(proc_state(std::process::id(), tid), thread_state::RUNNABLE);
    }
}

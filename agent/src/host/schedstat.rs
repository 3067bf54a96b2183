//! Per-thread scheduler times without BPF: `/proc/<pid>/task/<tid>/schedstat` (time on a CPU
//! and time waiting on a run queue, in ns, kept by the kernel's `CONFIG_SCHED_INFO`), `stat`
//! (state, start time) and `status` (context switches). It needs no privilege beyond reading
//! the rank's `/proc` entries, so it is the fallback when the sched tracepoints cannot load.
//!
//! What it cannot see, the eBPF path can: blocked time is the thread's age minus its on-CPU
//! and runnable time, the state is the one at the sample (`R` counts as on-CPU when the thread
//! ran more than it waited in the last interval, else runnable), and its start is approximate
//! (the state began at most one interval before it was first seen in it).

use std::collections::HashMap;

use crate::probes::threads::blocked_syscall;
use crate::probes::ThreadSample;

/// Threads read per process per sample.
pub const MAX_TASKS: usize = 4096;

/// The kernel's clock tick for `/proc/.../stat` start times (`sysconf(_SC_CLK_TCK)`, 100 on
/// every Linux architecture we run on).
const CLK_TCK: u64 = 100;

#[derive(Clone, Debug, Default)]
struct Seen {
    state: &'static str,
    since_ns: u64,
    on_ns: u64,
    wait_ns: u64,
}

/// The sampler: remembers each thread's previous reading (for the state heuristic and its
/// start).
#[derive(Debug, Default)]
pub struct SchedstatSampler {
    seen: HashMap<(u32, u32), Seen>,
}

/// `on_cpu_ns wait_ns timeslices` of one schedstat line.
pub fn parse_schedstat(s: &str) -> Option<(u64, u64)> {
    let mut it = s.split_whitespace();
    let on = it.next()?.parse().ok()?;
    let wait = it.next()?.parse().ok()?;
    Some((on, wait))
}

/// The state letter and the start time (clock ticks since boot) of a `stat` line.
pub fn parse_stat(s: &str) -> Option<(char, u64)> {
    // Fields after the last ')' (comm may hold spaces and parentheses): state is field 3,
    // starttime field 22, so the 20th after the state.
    let rest = s.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let start = f.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a `status` file.
pub fn parse_switches(s: &str) -> (u64, u64) {
    let mut v = (0, 0);
    for line in s.lines() {
        if let Some(x) = line.strip_prefix("voluntary_ctxt_switches:") {
            v.0 = x.trim().parse().unwrap_or(0);
        } else if let Some(x) = line.strip_prefix("nonvoluntary_ctxt_switches:") {
            v.1 = x.trim().parse().unwrap_or(0);
        }
    }
    v
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// CLOCK_BOOTTIME now (the clock of `/proc/.../stat` start times).
fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl SchedstatSampler {
    /// Every thread of `pid` now (`now_ns`: CLOCK_MONOTONIC, for the state's start); empty when
    /// the process is gone or its `/proc` is unreadable.
    pub fn sample(&mut self, pid: u32, now_ns: u64) -> Vec<ThreadSample> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            self.seen.retain(|(p, _), _| *p != pid);
            return Vec::new();
        };
        let boot = boottime_ns();
        let mut out = Vec::new();
        for e in dir.flatten().take(MAX_TASKS) {
            let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let base = format!("/proc/{pid}/task/{tid}");
            let Some((on, wait)) =
                read(&format!("{base}/schedstat")).and_then(|s| parse_schedstat(&s))
            else {
                continue;
            };
            let Some((letter, start_ticks)) =
                read(&format!("{base}/stat")).and_then(|s| parse_stat(&s))
            else {
                continue;
            };
            let (vol, invol) = read(&format!("{base}/status"))
                .map(|s| parse_switches(&s))
                .unwrap_or_default();
            let age = boot.saturating_sub(start_ticks.saturating_mul(1_000_000_000 / CLK_TCK));
            let prev = self.seen.get(&(pid, tid));
            let state = match letter {
                'R' => match prev {
                    Some(p) if wait.saturating_sub(p.wait_ns) > on.saturating_sub(p.on_ns) => {
                        "runnable"
                    }
                    _ => "on-cpu",
                },
                'D' => "blocked-io",
                'S' | 'I' | 'T' | 't' => "blocked",
                'Z' | 'X' => "exited",
                _ => "unknown",
            };
            let since_ns = match prev {
                Some(p) if p.state == state => p.since_ns,
                _ => now_ns,
            };
            self.seen.insert(
                (pid, tid),
                Seen {
                    state,
                    since_ns,
                    on_ns: on,
                    wait_ns: wait,
                },
            );
            let blocked = age.saturating_sub(on).saturating_sub(wait);
            out.push(ThreadSample {
                pid,
                tid,
                comm: read(&format!("{base}/comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                state: state.into(),
                in_state_ns: now_ns.saturating_sub(since_ns),
                on_cpu_ns: on,
                runnable_ns: wait,
                blocked_ns: blocked,
                blocked_io_ns: 0,
                voluntary_switches: vol,
                involuntary_switches: invol,
                syscall: if state.starts_with("blocked") {
                    blocked_syscall(pid, tid)
                } else {
                    None
                },
            });
        }
        out.sort_by_key(|t| t.tid);
        out
    }

    /// Forget a process.
    pub fn forget(&mut self, pid: u32) {
        self.seen.retain(|(p, _), _| *p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_take_the_kernels_formats_and_refuse_garbage() {
        assert_eq!(
            parse_schedstat("263944381 50718682 543\n"),
            Some((263_944_381, 50_718_682))
        );
        assert_eq!(parse_schedstat("x y"), None);
        let stat =
            "42 (my (odd) comm) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 12345 1000 10";
        assert_eq!(parse_stat(stat), Some(('S', 12345)));
        assert_eq!(parse_stat("42 (x"), None);
        let status =
            "Name:\tpython3\nvoluntary_ctxt_switches:\t17\nnonvoluntary_ctxt_switches:\t4\n";
        assert_eq!(parse_switches(status), (17, 4));
        assert_eq!(parse_switches("junk"), (0, 0));
    }

    #[test]
    fn a_sleeping_thread_is_blocked_and_this_one_runs() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut s = SchedstatSampler::default();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let t = s.sample(child.id(), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].state, "blocked");
        assert!(t[0].syscall.is_some(), "{:?}", t[0]);
        assert!(t[0].blocked_ns > t[0].on_cpu_ns);
        child.kill().unwrap();
        let _ = child.wait();
        assert!(s.sample(child.id(), 2).is_empty());
        let me = s.sample(std::process::id(), 3);
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        let tid: u32 = link.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let mine = me.iter().find(|t| t.tid == tid).unwrap();
        assert_eq!(mine.state, "on-cpu");
        assert!(mine.on_cpu_ns > 0);
    }
}

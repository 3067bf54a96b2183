//! Scheduler accounting of tracked threads into `THREADS` (tid -> `ThreadTimes`): each
//! transition adds the time spent in the state being left to its bucket. The agent samples the
//! map; nothing goes through the ring buffer, so no burst of context switches loses time.
//!
//! Field offsets come from the tracepoints' `format` files; the agent checks them against the
//! running kernel before it attaches (`agent/src/probes/tracefs.rs`).

use aya_ebpf::helpers::bpf_ktime_get_ns;
use aya_ebpf::macros::tracepoint;
use aya_ebpf::programs::TracePointContext;
use comminsight_ebpf_common::{kind, thread_state, ThreadTimes};

use crate::{count, current, tracked, COUNT_SCHED, THREADS};

/// `sched_switch`: `prev_pid` @24, `prev_state` @32 (long), `next_pid` @56.
#[no_mangle]
static SWITCH_PREV_PID: u32 = 24;
#[no_mangle]
static SWITCH_PREV_STATE: u32 = 32;
#[no_mangle]
static SWITCH_NEXT_PID: u32 = 56;
/// `sched_wakeup` / `sched_wakeup_new`: `pid` @24.
#[no_mangle]
static WAKEUP_PID: u32 = 24;
/// `sched_process_fork`: `child_pid` @20.
#[no_mangle]
static FORK_CHILD_PID: u32 = 20;
/// `sched_process_exit`: `pid` @24.
#[no_mangle]
static EXIT_PID: u32 = 24;

/// `TASK_UNINTERRUPTIBLE` as reported in `prev_state` (D: I/O).
const TASK_UNINTERRUPTIBLE: u32 = 0x2;
/// `TASK_REPORT_MAX`: what `prev_state` says for a preempted task (kernel >= 4.14).
const TASK_REPORT_MAX: u32 = 0x100;

#[inline(always)]
fn global(v: &u32) -> u64 {
    // SAFETY: a read of a global the loader may have rewritten (.rodata): volatile keeps the
    // compiler from folding the build-time value.
    unsafe { core::ptr::read_volatile(v) as u64 }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Close the current state of `t` at `now` and enter `state`.
#[inline(always)]
fn transition(t: &mut ThreadTimes, now: u64, state: u32) {
    if t.since_ns != 0 && now > t.since_ns {
        let d = now - t.since_ns;
        match t.state {
            thread_state::ON_CPU => t.on_cpu_ns += d,
            thread_state::RUNNABLE => t.runnable_ns += d,
            thread_state::BLOCKED => t.blocked_ns += d,
            thread_state::BLOCKED_IO => {
                t.blocked_ns += d;
                t.blocked_io_ns += d;
            }
            _ => {}
        }
    }
    t.since_ns = now;
    t.state = state;
}

#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let now = now();
    // SAFETY: offsets checked against this kernel's format file by the agent.
    let prev: i32 = unsafe { ctx.read_at(global(&SWITCH_PREV_PID) as usize) }.unwrap_or(0);
    // SAFETY: as above.
    let prev_state: i64 = unsafe { ctx.read_at(global(&SWITCH_PREV_STATE) as usize) }.unwrap_or(0);
    // SAFETY: as above.
    let next: i32 = unsafe { ctx.read_at(global(&SWITCH_NEXT_PID) as usize) }.unwrap_or(0);
    let (tgid, _) = current();
    let prev = prev as u32;
    let st = prev_state as u32;
    let state = if st == 0 || st & TASK_REPORT_MAX != 0 {
        thread_state::RUNNABLE
    } else if st & TASK_UNINTERRUPTIBLE != 0 {
        thread_state::BLOCKED_IO
    } else {
        thread_state::BLOCKED
    };
    if prev != 0 {
        match THREADS.get_ptr_mut(&prev) {
            Some(t) => {
                // SAFETY: a map value pointer, valid for this run; a concurrent update of the
                // same thread on another CPU cannot happen while it is being switched out here.
                let t = unsafe { &mut *t };
                leave_cpu(t, now, state, st, tgid);
            }
            None if tracked(tgid, kind::SCHED) => {
                let mut t = ThreadTimes {
                    pid: tgid,
                    state: thread_state::ON_CPU,
                    ..ThreadTimes::default()
                };
                leave_cpu(&mut t, now, state, st, tgid);
                let _ = THREADS.insert(&prev, &t, 0);
            }
            None => {}
        }
    }
    if next > 0 {
        if let Some(t) = THREADS.get_ptr_mut(&(next as u32)) {
            // SAFETY: as above.
            transition(unsafe { &mut *t }, now, thread_state::ON_CPU);
            count(COUNT_SCHED, false);
        }
    }
    0
}

#[inline(always)]
fn leave_cpu(t: &mut ThreadTimes, now: u64, state: u32, prev_state: u32, tgid: u32) {
    transition(t, now, state);
    t.last_prev_state = prev_state;
    t.pid = tgid;
    if state == thread_state::RUNNABLE {
        t.involuntary += 1;
    } else {
        t.voluntary += 1;
    }
    count(COUNT_SCHED, false);
}

#[inline(always)]
fn wakeup(ctx: &TracePointContext) -> u32 {
    // SAFETY: offset checked by the agent.
    let pid: i32 = unsafe { ctx.read_at(global(&WAKEUP_PID) as usize) }.unwrap_or(0);
    if pid <= 0 {
        return 0;
    }
    if let Some(t) = THREADS.get_ptr_mut(&(pid as u32)) {
        // SAFETY: a map value pointer, valid for this run.
        let t = unsafe { &mut *t };
        // A wakeup of a thread already on a CPU or runnable changes nothing.
        if t.state != thread_state::ON_CPU && t.state != thread_state::RUNNABLE {
            transition(t, now(), thread_state::RUNNABLE);
        }
        count(COUNT_SCHED, false);
    }
    0
}

#[tracepoint]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    wakeup(&ctx)
}

#[tracepoint]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    wakeup(&ctx)
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let (tgid, _) = current();
    if !tracked(tgid, kind::SCHED) {
        return 0;
    }
    // SAFETY: offset checked by the agent.
    let child: i32 = unsafe { ctx.read_at(global(&FORK_CHILD_PID) as usize) }.unwrap_or(0);
    if child > 0 {
        let t = ThreadTimes {
            pid: tgid,
            state: thread_state::RUNNABLE,
            since_ns: now(),
            ..ThreadTimes::default()
        };
        let _ = THREADS.insert(&(child as u32), &t, 0);
    }
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    // SAFETY: offset checked by the agent.
    let pid: i32 = unsafe { ctx.read_at(global(&EXIT_PID) as usize) }.unwrap_or(0);
    if pid > 0 {
        if let Some(t) = THREADS.get_ptr_mut(&(pid as u32)) {
            // The entry stays (the agent reads the final totals, then deletes it).
            // SAFETY: a map value pointer, valid for this run.
            let t = unsafe { &mut *t };
            transition(t, now(), thread_state::UNKNOWN);
            t.last_prev_state = u32::MAX;
        }
    }
    0
}

//! Python (and native) stacks of a local process with py-spy as a library, bounded in time and
//! never panicking: each capture runs on a helper thread that the caller stops waiting for after
//! a timeout.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use py_spy::config::LockingStrategy;

use super::perm::{permission_reason, target_uid, PtraceEnv};
use super::procfs::{read_stat, StatError};
use super::{Frame, ProcessStacks, ThreadStack};

/// How long [`capture`] waits for one process before giving up.
pub const DEFAULT_CAPTURE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many captures [`capture_many`] runs at once.
pub const MAX_PARALLEL_CAPTURES: usize = 8;

/// Whether the target is paused while its stacks are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// Pause every thread (ptrace seize + interrupt) for one short, consistent dump: the hang
    /// path. Needed for native frames.
    Locked,
    /// Read memory while the target runs: never stops it, may see a torn stack (periodic use).
    NonBlocking,
}

impl CaptureMode {
    /// `locked` or `nonblocking`, as in [`ProcessStacks::mode`].
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureMode::Locked => "locked",
            CaptureMode::NonBlocking => "nonblocking",
        }
    }
}

/// [`capture_with_timeout`] with [`DEFAULT_CAPTURE_TIMEOUT`].
pub fn capture(pid: u32, mode: CaptureMode, native: bool) -> ProcessStacks {
    capture_with_timeout(pid, mode, native, DEFAULT_CAPTURE_TIMEOUT)
}

/// The Python stacks of every thread of `pid` (innermost frame first, the GIL holder marked),
/// with native frames merged in when `native` (locked mode only). Failures come back in
/// [`ProcessStacks::error`] (one line, cause and fix), permission refusals also set
/// [`ProcessStacks::permission_denied`]. Gives up after `timeout`; a capture still running then
/// finishes (and releases the target) on its own helper thread.
pub fn capture_with_timeout(
    pid: u32,
    mode: CaptureMode,
    native: bool,
    timeout: Duration,
) -> ProcessStacks {
    let captured_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let start = Instant::now();
    let mut out = ProcessStacks {
        pid,
        captured_us,
        mode: mode.as_str().to_owned(),
        ..ProcessStacks::default()
    };
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name(format!("stacks-{pid}"))
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| dump(pid, mode, native)));
            // The receiver may have given up (timeout): nothing to do then.
            let _ = tx.send(r);
        });
    let outcome = match spawned {
        Err(e) => Err(format!(
            "stack capture of pid {pid}: cannot start a helper thread ({e}); raise the agent's \
             thread or memory limit"
        )),
        Ok(_) => match rx.recv_timeout(timeout) {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(panic)) => Err(format!(
                "stack capture of pid {pid} panicked in py-spy ({}); report it with the target's \
                 Python version",
                panic_text(&*panic)
            )),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(pid, "stack capture timed out");
                Err(format!(
                    "stack capture of pid {pid} timed out after {}",
                    human(timeout)
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(format!(
                "stack capture of pid {pid}: the helper thread ended without a result; retry"
            )),
        },
    };
    match outcome {
        Ok(d) => {
            out.python_version = d.python_version;
            out.threads = d.threads;
            out.error = d.error;
            out.permission_denied = d.permission_denied;
            out.warnings = d.warnings;
        }
        Err(e) => out.error = Some(e),
    }
    out.elapsed_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    out
}

/// Capture the stacks of several processes in parallel ([`MAX_PARALLEL_CAPTURES`] at a time),
/// all within `max_total`; results in the order of `pids`. A PID whose turn comes after the
/// budget ran out gets an error instead of stacks.
pub fn capture_many(
    pids: &[u32],
    mode: CaptureMode,
    native: bool,
    max_total: Duration,
) -> Vec<ProcessStacks> {
    let deadline = Instant::now() + max_total;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<ProcessStacks>>> = Mutex::new(vec![None; pids.len()]);
    let workers = pids.len().min(MAX_PARALLEL_CAPTURES);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&pid) = pids.get(i) else { break };
                let left = deadline.saturating_duration_since(Instant::now());
                let r = if left.is_zero() {
                    ProcessStacks {
                        pid,
                        mode: mode.as_str().to_owned(),
                        error: Some(format!(
                            "stack capture of pid {pid} skipped: the budget of {} for {} \
                             processes ran out; raise it",
                            human(max_total),
                            pids.len()
                        )),
                        ..ProcessStacks::default()
                    }
                } else {
                    capture_with_timeout(pid, mode, native, left.min(DEFAULT_CAPTURE_TIMEOUT))
                };
                if let Ok(mut v) = results.lock() {
                    v[i] = Some(r);
                }
            });
        }
    });
    let v = results.into_inner().unwrap_or_else(|p| p.into_inner());
    v.into_iter()
        .zip(pids)
        .map(|(r, &pid)| {
            r.unwrap_or_else(|| ProcessStacks {
                pid,
                mode: mode.as_str().to_owned(),
                error: Some(format!(
                    "stack capture of pid {pid}: no result from its worker; retry"
                )),
                ..ProcessStacks::default()
            })
        })
        .collect()
}

/// What one capture found (the helper thread's result).
#[derive(Default)]
struct Dump {
    python_version: Option<String>,
    threads: Vec<ThreadStack>,
    error: Option<String>,
    permission_denied: bool,
    warnings: Vec<String>,
}

fn dump(pid: u32, mode: CaptureMode, native: bool) -> Dump {
    let mut d = Dump::default();
    let mut config = py_spy::Config {
        blocking: match mode {
            CaptureMode::Locked => LockingStrategy::Lock,
            CaptureMode::NonBlocking => LockingStrategy::NonBlocking,
        },
        native: native && mode == CaptureMode::Locked,
        collect_thread_names: true,
        ..py_spy::Config::default()
    };
    if native && mode == CaptureMode::NonBlocking {
        d.warnings.push(
            "native frames need the locked mode (py-spy pauses the process to unwind them); \
             Python frames only"
                .to_owned(),
        );
    }
    let Ok(pypid) = py_spy::Pid::try_from(pid) else {
        d.error = Some(format!("pid {pid} is out of range for this platform"));
        return d;
    };
    let mut spy = match py_spy::PythonSpy::new(pypid, &config) {
        Ok(s) => s,
        Err(e) if config.native && permission_reason(&format!("{e:#}")).is_none() => {
            // Native unwinding could not be set up (symbols, libunwind): fall back.
            config.native = false;
            match py_spy::PythonSpy::new(pypid, &config) {
                Ok(s) => {
                    d.warnings
                        .push(format!("native frames unavailable: {}", one_line(&e)));
                    s
                }
                Err(e) => return failed(pid, &e, d),
            }
        }
        Err(e) => return failed(pid, &e, d),
    };
    d.python_version = Some(spy.version.to_string());
    let traces = match spy.get_stack_traces() {
        Ok(t) => t,
        Err(e) if spy.config.native && permission_reason(&format!("{e:#}")).is_none() => {
            // e.g. "Failed to merge native and python frames": keep the Python frames.
            spy.config.native = false;
            match spy.get_stack_traces() {
                Ok(t) => {
                    d.warnings
                        .push(format!("native frames unavailable: {}", one_line(&e)));
                    t
                }
                Err(e) => return failed(pid, &e, d),
            }
        }
        Err(e) => return failed(pid, &e, d),
    };
    d.threads = traces.into_iter().map(thread).collect();
    d
}

fn thread(t: py_spy::StackTrace) -> ThreadStack {
    ThreadStack {
        thread_id: t.thread_id,
        os_thread_id: t.os_thread_id,
        name: t.thread_name,
        active: t.active,
        owns_gil: t.owns_gil,
        // py-spy returns the innermost frame first (checked by agent/tests/stacks.rs).
        frames: t
            .frames
            .into_iter()
            .map(|f| Frame {
                // Native frames carry the shared object they come from; Python frames do not.
                native: f.module.is_some(),
                name: f.name,
                file: f.filename,
                line: f.line,
            })
            .collect(),
    }
}

/// Fill `d` with the one-line reason of a failed capture of `pid`.
fn failed(pid: u32, e: &anyhow::Error, mut d: Dump) -> Dump {
    let text = format!("{e:#}");
    tracing::debug!(pid, error = %text, "stack capture failed");
    // Decide "gone" first: a process that exited mid-capture is not a permission problem.
    match read_stat(pid) {
        Err(StatError::Gone) => {
            d.error = Some(format!(
                "pid {pid}: no such process (it exited before its stacks could be read)"
            ));
            return d;
        }
        Ok(s) if matches!(s.state, 'Z' | 'X' | 'x') => {
            d.error = Some(format!(
                "pid {pid} is a zombie (exited, not reaped by pid {}): it has no stacks",
                s.ppid
            ));
            return d;
        }
        _ => {}
    }
    if let Some(reason) = permission_reason(&text) {
        d.permission_denied = true;
        d.error = Some(format!(
            "pid {pid}: cannot read its memory ({reason}): {}",
            PtraceEnv::current().explain(pid, target_uid(pid))
        ));
        return d;
    }
    if d.python_version.is_none() && !maps_mention_python(pid) {
        d.error = Some(format!(
            "pid {pid} is not a Python process (no python binary or libpython in its memory \
             maps), so it has no Python stacks; py-spy: {}",
            one_line(e)
        ));
        return d;
    }
    d.error = Some(format!(
        "pid {pid}: py-spy could not read the Python stacks: {}; retry, or check that the \
         Python version is supported by py-spy 0.4",
        one_line(e)
    ));
    d
}

/// The process maps a python binary or libpython (`false` also when the maps are unreadable).
fn maps_mention_python(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| {
        m.lines().any(|l| {
            let path = l.rsplit('/').next().unwrap_or("");
            path.starts_with("python") || path.starts_with("libpython")
        })
    })
}

/// An error chain on one line.
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
        .replace('\n', " ")
}

fn human(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else {
        format!("{} ms", d.as_millis())
    }
}

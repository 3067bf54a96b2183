//! Process state and Python / native stacks of real processes (no mocks): a Python script
//! spinning in `stuck_in_data_loader` with an `nccl-watchdog` thread blocked in `Event.wait`, a
//! script blocked in libc `pause()`, zombies, reaped and reused PIDs, and a permission refusal
//! (the test binary re-executed as `nobody` against a root-owned target).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use comminsight_agent::stacks::{
    capture, capture_many, capture_with_timeout, proc_state, proc_state_checked, ptrace_permission,
    start_ticks, CaptureMode, ProcStatus, ProcessStacks, ThreadStack,
};

const SYSTEM_PYTHON: &str = "/usr/bin/python3";
const PYENV: &str = "/root/.pyenv/versions";
const WAIT: Duration = Duration::from_secs(20);

const SPINNING: &str = r#"
import sys, threading
ev = threading.Event()
def watchdog():
    ev.wait()
threading.Thread(target=watchdog, name="nccl-watchdog", daemon=True).start()
def stuck_in_data_loader():
    print("ready", flush=True)
    x = 0
    while True:
        x += 1
def main():
    stuck_in_data_loader()
main()
"#;

const PAUSED: &str = r#"
import ctypes
pause = ctypes.CDLL(None).pause
def blocked_in_native(fn):
    print("ready", flush=True)
    fn()
blocked_in_native(pause)
"#;

/// A temp dir removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "comminsight-stacks-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed and reaped on drop (also on panic).
struct Proc {
    child: Child,
    _dir: Option<TempDir>,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `/usr/bin/python3` and one pyenv 3.12 when installed.
fn pythons() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from(SYSTEM_PYTHON)];
    assert!(
        v[0].exists(),
        "missing test tool {SYSTEM_PYTHON}: run `cargo xtask deps`"
    );
    let extra = std::fs::read_dir(PYENV).ok().and_then(|d| {
        let mut names: Vec<PathBuf> = d
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("3.12."))
            })
            .collect();
        names.sort();
        names.pop()
    });
    match extra {
        Some(p) => v.push(p.join("bin/python3")),
        None => eprintln!("note: no {PYENV}/3.12.* on this machine; testing {SYSTEM_PYTHON} only"),
    }
    v
}

/// Run `script` under `python` and wait for its `ready` line.
fn spawn_script(python: &Path, script: &str) -> Proc {
    let dir = TempDir::new("py");
    let file = dir.0.join("script.py");
    std::fs::write(&file, script).unwrap();
    let mut child = Command::new(python)
        .arg(&file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let out = child.stdout.take().unwrap();
    let proc = Proc {
        child,
        _dir: Some(dir),
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(WAIT).expect("script never printed ready");
    assert_eq!(line.trim(), "ready", "{} did not start", python.display());
    proc
}

fn spawn(cmd: &str, args: &[&str]) -> Proc {
    Proc {
        child: Command::new(cmd).args(args).spawn().unwrap(),
        _dir: None,
    }
}

/// Poll `f` until it returns `Some`, at most [`WAIT`].
fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The main thread (its OS thread id is the PID).
fn main_thread(s: &ProcessStacks) -> &ThreadStack {
    s.threads
        .iter()
        .find(|t| t.os_thread_id == Some(u64::from(s.pid)))
        .unwrap_or_else(|| panic!("no main thread in {s:#?}"))
}

fn by_name<'a>(s: &'a ProcessStacks, name: &str) -> &'a ThreadStack {
    s.threads
        .iter()
        .find(|t| t.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no thread {name} in {s:#?}"))
}

/// Innermost Python (not native) frame name.
fn innermost_py(t: &ThreadStack) -> &str {
    t.frames
        .iter()
        .find(|f| !f.native)
        .map(|f| f.name.as_str())
        .unwrap_or("")
}

fn ok(s: &ProcessStacks) {
    assert_eq!(s.error, None, "{s:#?}");
    assert!(!s.permission_denied);
    assert!(s.python_version.is_some());
}

#[test]
fn spinning_script_both_modes_and_pythons() {
    for py in pythons() {
        let p = spawn_script(&py, SPINNING);
        let pid = p.pid();
        // `ready` comes from the main thread; wait until the watchdog has reached its wait.
        poll("the watchdog to block", || {
            let s = capture(pid, CaptureMode::Locked, false);
            let dog = s
                .threads
                .iter()
                .find(|t| t.name.as_deref() == Some("nccl-watchdog"))?;
            (!dog.active && dog.frames.first()?.name.ends_with("wait")).then_some(())
        });
        for mode in [CaptureMode::Locked, CaptureMode::NonBlocking] {
            let s = capture(pid, mode, false);
            ok(&s);
            let ctx = format!("{} {mode:?}", py.display());
            assert_eq!(s.pid, pid);
            assert_eq!(s.mode, mode.as_str());
            assert!(s.captured_us > 1_700_000_000_000_000, "{ctx}");
            assert!(s.elapsed_us > 0, "{ctx}");
            let main = main_thread(&s);
            assert_eq!(main.name.as_deref(), Some("MainThread"), "{ctx}");
            // Innermost first: the spinning function, then its callers, `<module>` last.
            let names: Vec<&str> = main.frames.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names, ["stuck_in_data_loader", "main", "<module>"], "{ctx}");
            assert!(main
                .frames
                .iter()
                .all(|f| f.file.ends_with("script.py") && f.line > 0));
            let dog = by_name(&s, "nccl-watchdog");
            assert!(
                dog.frames.iter().any(|f| f.name == "watchdog"),
                "{ctx}: {dog:#?}"
            );
            // `_bootstrap` (3.10) or `Thread._bootstrap` (3.11+: qualified names) is outermost.
            let outer = dog.frames.last().map_or("", |f| f.name.as_str());
            assert!(outer.ends_with("_bootstrap"), "{ctx}: {dog:#?}");
            // `active` is the thread's OS state (`R`) at the moment of reading: the blocked
            // watchdog may show `R` for an instant after an earlier locked capture restarted
            // its futex wait, so only its frames and GIL are asserted here; the spinning main
            // thread is always runnable.
            assert!(dog.frames[0].name.ends_with("wait"), "{ctx}: {dog:#?}");
            assert!(!dog.owns_gil, "{ctx}: {dog:#?}");
            assert!(main.active, "{ctx}: {main:#?}");
            // py-spy marks the thread the interpreter records as the GIL holder: with only the
            // main thread runnable, that is the main thread when the target is paused; a
            // non-blocking read may race a GIL hand-off and find none.
            let holders = s.threads.iter().filter(|t| t.owns_gil).count();
            match mode {
                CaptureMode::Locked => assert!(main.owns_gil && holders == 1, "{ctx}: {s:#?}"),
                CaptureMode::NonBlocking => assert!(holders <= 1, "{ctx}: {s:#?}"),
            }
            assert!(s.warnings.is_empty(), "{ctx}: {:?}", s.warnings);
        }
        // Native frames: locked mode only.
        let s = capture(pid, CaptureMode::Locked, true);
        ok(&s);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert!(
            s.threads.iter().flat_map(|t| &t.frames).any(|f| f.native),
            "{}: no native frame: {s:#?}",
            py.display()
        );
        let main = main_thread(&s);
        assert_eq!(innermost_py(main), "stuck_in_data_loader");
        let s = capture(pid, CaptureMode::NonBlocking, true);
        ok(&s);
        assert!(s.threads.iter().flat_map(|t| &t.frames).all(|f| !f.native));
        assert!(s.warnings[0].contains("locked mode"), "{:?}", s.warnings);
    }
}

#[test]
fn blocked_in_native_pause() {
    for py in pythons() {
        let p = spawn_script(&py, PAUSED);
        let pid = p.pid();
        // `ready` is printed just before the call: poll until the thread is inside pause()
        // and seen asleep. py-spy reads each thread's /proc state *before* it locks the
        // process, so the capture that first finds the pause frame can still carry the 'R'
        // read a moment earlier, on the way in (py-spy documents this race); a thread that
        // stays in pause() must read as inactive within the poll's deadline.
        let s = poll("a native pause frame on an inactive thread", || {
            let s = capture(pid, CaptureMode::Locked, true);
            ok(&s);
            let main = main_thread(&s).clone();
            let in_pause = main
                .frames
                .iter()
                .any(|f| f.native && f.name.contains("pause"));
            (in_pause && !main.active).then_some(s)
        });
        let main = main_thread(&s);
        let names: Vec<&str> = main.frames.iter().map(|f| f.name.as_str()).collect();
        eprintln!("{}: mixed main stack: {}", py.display(), names.join(" <- "));
        assert_eq!(innermost_py(main), "blocked_in_native", "{main:#?}");
        // The pause frame is innermost of all (nothing of Python's above libc).
        let first = &main.frames[0];
        assert!(first.native && first.name.contains("pause"), "{main:#?}");
        let s = capture(pid, CaptureMode::NonBlocking, false);
        ok(&s);
        let main = main_thread(&s);
        let names: Vec<&str> = main.frames.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["blocked_in_native", "<module>"], "{}", py.display());
    }
}

#[test]
fn non_python_gone_and_timeout() {
    let sleeper = spawn("sleep", &["1000"]);
    let s = capture(sleeper.pid(), CaptureMode::Locked, true);
    assert!(s.threads.is_empty() && !s.permission_denied);
    let err = s.error.unwrap();
    assert!(err.contains("not a Python process"), "{err}");

    let mut gone = spawn("true", &[]);
    gone.child.wait().unwrap();
    let s = capture(gone.pid(), CaptureMode::NonBlocking, false);
    assert!(
        s.error.as_deref().unwrap().contains("no such process"),
        "{s:?}"
    );

    let p = spawn_script(Path::new(SYSTEM_PYTHON), SPINNING);
    let s = capture_with_timeout(
        p.pid(),
        CaptureMode::Locked,
        false,
        Duration::from_micros(1),
    );
    assert_eq!(
        s.error.as_deref(),
        Some(format!("stack capture of pid {} timed out after 1 µs", p.pid()).as_str())
    );
    assert!(s.threads.is_empty());
}

#[test]
fn capture_many_keeps_order_and_budget() {
    let a = spawn_script(Path::new(SYSTEM_PYTHON), SPINNING);
    let b = spawn_script(Path::new(SYSTEM_PYTHON), PAUSED);
    let mut gone = spawn("true", &[]);
    gone.child.wait().unwrap();
    let pids = [a.pid(), gone.pid(), b.pid()];
    let t0 = Instant::now();
    let v = capture_many(&pids, CaptureMode::Locked, false, Duration::from_secs(10));
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(v.iter().map(|s| s.pid).collect::<Vec<_>>(), pids);
    ok(&v[0]);
    ok(&v[2]);
    assert!(v[1].error.is_some());
    assert_eq!(innermost_py(main_thread(&v[0])), "stuck_in_data_loader");
    assert_eq!(innermost_py(main_thread(&v[2])), "blocked_in_native");
    // A zero budget: every PID answered, none captured.
    let v = capture_many(&pids, CaptureMode::NonBlocking, false, Duration::ZERO);
    assert_eq!(v.len(), 3);
    assert!(v
        .iter()
        .all(|s| s.error.as_deref().unwrap().contains("budget")));
}

#[test]
fn proc_state_live_zombie_gone_reused() {
    let live = spawn("sleep", &["1000"]);
    // As root the kernel function it sleeps in is readable (`wchan=hrtimer_nanosleep`); it may
    // read `0` for a moment while the child is still starting.
    let root = is_root();
    let st = poll("sleep to sleep", || {
        let st = proc_state(live.pid());
        (st.status == ProcStatus::Sleeping && (!root || !st.detail.is_empty())).then_some(st)
    });
    if root {
        assert!(st.detail.starts_with("wchan="), "{st:?}");
    }
    let start = start_ticks(live.pid()).unwrap();
    assert_eq!(
        proc_state_checked(live.pid(), Some(start)).status,
        ProcStatus::Sleeping
    );
    let reused = proc_state_checked(live.pid(), Some(start + 1));
    assert_eq!(reused.status, ProcStatus::Gone);
    assert!(
        reused.detail.starts_with("pid reused by another process"),
        "{reused:?}"
    );

    // A child that exited and was not waited: a zombie until we reap it.
    let mut z = spawn("sh", &["-c", "exit 3"]);
    let st = poll("a zombie", || {
        let st = proc_state(z.pid());
        (st.status == ProcStatus::Zombie).then_some(st)
    });
    assert!(st.status.is_dead());
    let me = std::process::id();
    assert_eq!(
        st.detail,
        format!("zombie: parent (pid {me}) has not reaped it, exit_code=3")
    );
    z.child.wait().unwrap();
    let st = proc_state(z.pid());
    assert_eq!(st.status, ProcStatus::Gone, "{st:?}");
    assert_eq!(start_ticks(z.pid()), None);
    assert_eq!(proc_state(0).status, ProcStatus::Gone);

    // SIGSTOP: stopped.
    let stopped = spawn("sleep", &["1000"]);
    let r = Command::new("kill")
        .args(["-STOP", &stopped.pid().to_string()])
        .status()
        .unwrap();
    assert!(r.success());
    let st = poll("a stopped process", || {
        let st = proc_state(stopped.pid());
        (st.status == ProcStatus::Stopped).then_some(st)
    });
    assert!(st.detail.starts_with("stopped by a signal"), "{st:?}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap()
}

const CHILD_ENV: &str = "COMMINSIGHT_STACKS_PERM_TARGET";

/// Run by [`permission_refusal_is_reported`] as `nobody`: captures the target and prints the
/// result as one JSON line.
#[test]
#[ignore = "helper: run by permission_refusal_is_reported under setpriv"]
fn permission_child() {
    let pid: u32 = std::env::var(CHILD_ENV).unwrap().parse().unwrap();
    let s = capture(pid, CaptureMode::Locked, false);
    println!("STACKS_JSON {}", serde_json::to_string(&s).unwrap());
    println!("PTRACE_PERMISSION {:?}", ptrace_permission());
}

#[test]
fn permission_refusal_is_reported() {
    if !is_root() {
        // Not root: pid 1 belongs to root and we lack CAP_SYS_PTRACE.
        assert!(ptrace_permission().is_err());
        let s = capture(1, CaptureMode::Locked, false);
        assert!(s.permission_denied, "{s:?}");
        assert!(s.error.unwrap().contains("CAP_SYS_PTRACE"));
        return;
    }
    assert_eq!(ptrace_permission(), Ok(()));
    let target = spawn_script(Path::new(SYSTEM_PYTHON), SPINNING);
    let me = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&me)
        .args(["--exact", "permission_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, target.pid().to_string())
        .stdin(Stdio::null())
        .output()
        .expect("missing test tool setpriv (util-linux): run `cargo xtask deps`");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = stdout
        .lines()
        .find_map(|l| l.strip_prefix("STACKS_JSON "))
        .unwrap_or_else(|| panic!("no result from the child: {stdout}"));
    let s: ProcessStacks = serde_json::from_str(json).unwrap();
    assert!(s.permission_denied, "{s:#?}");
    assert!(s.threads.is_empty());
    let err = s.error.unwrap();
    let want = format!(
        "pid {}: cannot read its memory (Permission denied): the agent (uid 65534) lacks \
         CAP_SYS_PTRACE and pid {} belongs to uid 0; add AmbientCapabilities=CAP_SYS_PTRACE to \
         the unit or run as root",
        target.pid(),
        target.pid()
    );
    assert_eq!(err, want);
    let perm = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PTRACE_PERMISSION "))
        .unwrap();
    assert!(
        perm.starts_with("Err(") && perm.contains("CAP_SYS_PTRACE"),
        "{perm}"
    );
}

/// Attach + dump time of a fresh capture (what the hang path pays), printed for the report.
#[test]
fn attach_and_dump_time() {
    let p = spawn_script(Path::new(SYSTEM_PYTHON), SPINNING);
    for (mode, native) in [
        (CaptureMode::Locked, false),
        (CaptureMode::NonBlocking, false),
        (CaptureMode::Locked, true),
    ] {
        let mut us: Vec<u64> = (0..15)
            .map(|_| {
                let s = capture(p.pid(), mode, native);
                ok(&s);
                s.elapsed_us
            })
            .collect();
        us.sort_unstable();
        eprintln!(
            "attach+dump {mode:?} native={native}: median {} µs (min {}, max {})",
            us[us.len() / 2],
            us[0],
            us[us.len() - 1]
        );
        assert!(us[us.len() / 2] < 2_000_000, "{us:?}");
    }
}

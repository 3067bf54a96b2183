//! Process-level lifecycle: the cdylib survives NCCL's `dlclose` after the last communicator and
//! a re-`dlopen`; a process that exits without finalizing still leaves sealed segments (atexit).

use core::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use comminsight_wire::record::{Body, Kind, FLAG_INCOMPLETE};
use comminsight_wire::segment::{find_segments, read_segment};

type Init6 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    *const c_void,
) -> c_int;
type Fin = unsafe extern "C" fn(*mut c_void) -> c_int;

#[repr(C)]
struct Table {
    name: *const c_char,
    init: Init6,
    start: *const c_void,
    stop: *const c_void,
    record: *const c_void,
    finalize: Fin,
}

fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps, deps.parent().unwrap()] {
        let p = d.join("libnccl_profiler_comminsight.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libnccl_profiler_comminsight.so not found next to {} (cargo builds it with the lib)",
        exe.display()
    );
}

fn drain_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("comminsight-dra"))
        })
        .count()
}

fn kinds(dir: &Path) -> Vec<(Kind, u16)> {
    let mut v = Vec::new();
    for s in find_segments(dir).unwrap_or_default() {
        for r in read_segment(&s).unwrap().records {
            v.push((r.kind(), r.flags));
        }
    }
    v
}

fn seg_dir(root: &Path, pid: u32) -> PathBuf {
    root.join("logs/j/h").join(pid.to_string())
}

fn env(root: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("COMMINSIGHT_LOG_DIR", root.join("logs")),
        ("COMMINSIGHT_SHM_DIR", root.join("shm")),
        ("COMMINSIGHT_JOB_ID", "j".into()),
        ("COMMINSIGHT_HOSTNAME", "h".into()),
    ]
}

#[test]
fn survives_dlclose_after_the_last_communicator_and_reload() {
    let root = std::env::temp_dir().join(format!("ci-dl-{}", std::process::id()));
    for (k, v) in env(&root) {
        std::env::set_var(k, v);
    }
    let path = std::ffi::CString::new(cdylib().into_os_string().into_encoded_bytes()).unwrap();
    let mut mask: c_int = 0;
    for round in 0..3 {
        // SAFETY: our own plugin library.
        let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!lib.is_null());
        // SAFETY: a live handle, a NUL-terminated name.
        let t = unsafe { libc::dlsym(lib, c"ncclProfiler_v6".as_ptr()) } as *const Table;
        assert!(!t.is_null());
        // SAFETY: the exported static table.
        let t = unsafe { &*t };
        let mut ctx = core::ptr::null_mut();
        // SAFETY: arguments as NCCL passes them.
        let rc = unsafe {
            (t.init)(
                &mut ctx,
                7,
                &mut mask,
                c"dp".as_ptr(),
                1,
                2,
                0,
                core::ptr::null(),
            )
        };
        assert_eq!(rc, 0);
        assert!(!ctx.is_null());
        assert_eq!(mask, 0x747);
        // The thread names itself when it starts: wait for that (bounded).
        let t0 = std::time::Instant::now();
        while drain_threads() == 0 && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::yield_now();
        }
        assert_eq!(drain_threads(), 1, "round {round}: drain running");
        // SAFETY: the context from init.
        assert_eq!(unsafe { (t.finalize)(ctx) }, 0);
        assert_eq!(
            drain_threads(),
            0,
            "round {round}: drain joined before finalize returned"
        );
        let shm: Vec<_> = std::fs::read_dir(ring_dir(&root))
            .unwrap()
            .flatten()
            .collect();
        assert!(shm.is_empty(), "round {round}: ring unlinked");
        // SAFETY: NCCL does exactly this after the last communicator.
        assert_eq!(unsafe { libc::dlclose(lib) }, 0);
    }
    let k = kinds(&seg_dir(&root, std::process::id()));
    let n = |kind| k.iter().filter(|(x, _)| *x == kind).count();
    assert_eq!(
        (
            n(Kind::ProcStart),
            n(Kind::CommInit),
            n(Kind::CommFini),
            n(Kind::Stats)
        ),
        (3, 3, 3, 3),
        "{k:?}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Child half of the exit test: init, leave an op open, exit without finalize.
#[test]
fn child_exits_without_finalize() {
    if std::env::var_os("CI_LIFECYCLE_CHILD").is_none() {
        return;
    }
    use nccl_profiler_comminsight::abi::v6::DescrV6;
    use nccl_profiler_comminsight::ncclProfiler_v6 as t;
    let mut ctx = core::ptr::null_mut();
    let mut mask: c_int = 0;
    // SAFETY: arguments as NCCL passes them.
    unsafe { t.init.unwrap()(&mut ctx, 9, &mut mask, core::ptr::null(), 1, 2, 1, None) };
    let mut d = [0u64; 14];
    d[0] = 2; // Coll
    d[4] = c"AllReduce".as_ptr() as u64; // coll.func @32
    d[7] = 1024; // coll.count @56
    d[9] = c"ncclFloat32".as_ptr() as u64; // coll.datatype @72
    d[10] = 2; // coll.nChannels @80
    let mut h = core::ptr::null_mut();
    // SAFETY: a 112-byte descriptor at §2.6 offsets; strings are static.
    unsafe { t.start_event.unwrap()(ctx, &mut h, d.as_mut_ptr().cast::<DescrV6>()) };
    assert!(!h.is_null());
    std::process::exit(0);
}

#[test]
fn exit_without_finalize_still_seals_with_the_open_op_incomplete() {
    let root = std::env::temp_dir().join(format!("ci-exit-{}", std::process::id()));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_exits_without_finalize", "--nocapture"])
        .env("CI_LIFECYCLE_CHILD", "1");
    for (k, v) in env(&root) {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let dir = seg_dir(&root, pid);
    let open: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "open"))
        .collect();
    assert!(open.is_empty(), "segment left open: {open:?}");
    let k = kinds(&dir);
    assert!(
        k.iter()
            .any(|(kind, f)| *kind == Kind::Coll && f & FLAG_INCOMPLETE != 0),
        "{k:?}"
    );
    assert_eq!(k.last().map(|x| x.0), Some(Kind::Stats), "{k:?}");
    for s in find_segments(&dir).unwrap() {
        for r in read_segment(&s).unwrap().records {
            if let Body::Coll(o) = r.body {
                assert_eq!((o.comm_hash, o.rank, o.end_ns), (9, 1, 0));
            }
        }
    }
    assert!(
        std::fs::read_dir(ring_dir(&root)).unwrap().next().is_none(),
        "ring unlinked at exit"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Child half of the stuck-drain test: the drain blocks in I/O (its Inspector output is a FIFO
/// nobody reads, as a hung NFS mount would block it); the last finalize must still return.
#[test]
fn child_finalizes_with_a_stuck_drain() {
    let Some(dir) = std::env::var_os("CI_STUCK_CHILD") else {
        return;
    };
    let fifo = Path::new(&dir).join(format!("h-pid{}.log", std::process::id()));
    let cpath = std::ffi::CString::new(fifo.into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let path = std::ffi::CString::new(cdylib().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: our own plugin library, loaded the way NCCL loads it.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null());
    // SAFETY: a live handle, a NUL-terminated name; the exported static table.
    let t = unsafe { &*(libc::dlsym(lib, c"ncclProfiler_v6".as_ptr()) as *const Table) };
    type Start = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
    type Stop = unsafe extern "C" fn(*mut c_void) -> c_int;
    // SAFETY: the table's startEvent / stopEvent slots hold these signatures.
    let (start, stop) = unsafe {
        (
            core::mem::transmute::<*const c_void, Start>(t.start),
            core::mem::transmute::<*const c_void, Stop>(t.stop),
        )
    };
    let mut ctx = core::ptr::null_mut();
    let mut mask: c_int = 0;
    // SAFETY: arguments as NCCL passes them.
    unsafe {
        (t.init)(
            &mut ctx,
            5,
            &mut mask,
            c"dp".as_ptr(),
            1,
            2,
            0,
            core::ptr::null(),
        )
    };
    assert!(!ctx.is_null());
    // One collective without channels: its stop completes it and the drain writes a line.
    let mut d = [0u64; 14];
    d[0] = 2; // Coll
    d[4] = c"AllReduce".as_ptr() as u64; // coll.func @32
    d[7] = 1 << 20; // coll.count @56
    d[9] = c"ncclFloat32".as_ptr() as u64; // coll.datatype @72
    let mut h = core::ptr::null_mut();
    // SAFETY: a 112-byte descriptor at §2.6 offsets; strings are static.
    unsafe { start(ctx, &mut h, d.as_mut_ptr().cast()) };
    assert!(!h.is_null());
    // SAFETY: the handle just returned.
    unsafe { stop(h) };
    let t0 = std::time::Instant::now();
    // SAFETY: the context from init.
    assert_eq!(unsafe { (t.finalize)(ctx) }, 0);
    println!("finalize returned after {:?}", t0.elapsed());
    std::process::exit(0);
}

#[test]
fn the_last_finalize_returns_even_when_the_drain_is_stuck_in_io() {
    let root = std::env::temp_dir().join(format!("ci-stuck-{}", std::process::id()));
    let dump = root.join("inspector");
    std::fs::create_dir_all(&dump).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_finalizes_with_a_stuck_drain",
        "--nocapture",
    ])
    .env("CI_STUCK_CHILD", &dump)
    .env("COMMINSIGHT_INSPECTOR_COMPAT", "1")
    .env("NCCL_INSPECTOR_DUMP_DIR", &dump)
    .env("NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING", "0")
    .env("NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES", "0")
    .stdout(std::process::Stdio::piped());
    for (k, v) in env(&root) {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = std::fs::remove_dir_all(&root);
    let status = status.expect("finalize hung behind a drain stuck in I/O");
    assert!(status.success());
}

/// The per-user ring directory `<shm>/<euid>` the plugin creates under the test's shm dir.
fn ring_dir(root: &std::path::Path) -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    root.join("shm")
        .join(unsafe { libc::geteuid() }.to_string())
}

/// Child half of the fork test: a forked copy of an initialised process that exits with `exit()`
/// (atexit handlers run) must leave the parent's ring, records and drain alone.
#[test]
fn child_forks_and_the_fork_exits() {
    let Some(shm) = std::env::var_os("CI_FORK_CHILD") else {
        return;
    };
    let path = std::ffi::CString::new(cdylib().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: our own plugin library, loaded the way NCCL loads it.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null());
    // SAFETY: a live handle, a NUL-terminated name; the exported static table.
    let t = unsafe { &*(libc::dlsym(lib, c"ncclProfiler_v6".as_ptr()) as *const Table) };
    let mut ctx = core::ptr::null_mut();
    let mut mask: c_int = 0;
    // SAFETY: arguments as NCCL passes them.
    unsafe {
        (t.init)(
            &mut ctx,
            5,
            &mut mask,
            c"dp".as_ptr(),
            1,
            2,
            0,
            core::ptr::null(),
        )
    };
    assert!(!ctx.is_null());
    let rings = || std::fs::read_dir(&shm).unwrap().flatten().count();
    assert_eq!(rings(), 1);
    let t0 = std::time::Instant::now();
    // SAFETY: the forked copy only calls exit().
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain process exit; runs the atexit handlers as any C program's exit would.
        unsafe { libc::exit(0) };
    }
    let mut st = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    let took = t0.elapsed();
    assert_eq!(rings(), 1, "the fork's exit unlinked the parent's ring");
    assert!(
        took < std::time::Duration::from_secs(3),
        "fork's exit took {took:?}"
    );
    // SAFETY: the context from init.
    assert_eq!(unsafe { (t.finalize)(ctx) }, 0);
    std::process::exit(0);
}

#[test]
fn a_forked_copy_exiting_leaves_the_parents_ring_alone() {
    let root = std::env::temp_dir().join(format!("ci-fork-{}", std::process::id()));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_forks_and_the_fork_exits", "--nocapture"])
        .env("CI_FORK_CHILD", ring_dir(&root));
    for (k, v) in env(&root) {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

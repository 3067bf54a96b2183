//! A rank that `exec()`s without finalize: the process `dlopen`s the plugin as NCCL does, inits a
//! communicator, completes 5 collectives, waits past a drain flush, completes 3 more and then
//! `execv`s this test binary in another mode (same pid, another program). No atexit handler runs
//! at exec and the drain thread vanishes with the old image, so:
//! * the exec succeeds (the exec'd program exits 0) and nothing hangs;
//! * the plugin's fds (segment directory, open segment, per-user shm directory; the ring itself is
//!   an mmap whose fd is closed) are all `FD_CLOEXEC` before the exec, and the exec'd program holds none of
//!   them (`/proc/self/fd`): no ring or segment fd leaks into it;
//! * the `.open` segment stays, readable up to the last flush (the first 5 ops at least);
//! * the ring file stays in the shm directory (not unlinked); records pushed but not drained are
//!   still in it (header `pushed − consumed`). The agent's cursor recovers them only when the writer
//!   pid is gone (`pid_alive` = `/proc/<pid>` exists): while the exec'd program runs under the same
//!   pid the stream looks alive and waits; once that program exits and `stale_after` passes, the
//!   open segment is abandoned and the ring's undrained records recovered. Without an agent they
//!   are lost, and the ring file stays until someone removes it.

use core::ffi::{c_char, c_int, c_void};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use comminsight_wire::record::{Body, Record, FLAG_REPEAT};
use comminsight_wire::ring::RingReader;
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
type Start = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
type Stop = unsafe extern "C" fn(*mut c_void) -> c_int;

#[repr(C)]
struct Table {
    name: *const c_char,
    init: Init6,
    start: Start,
    stop: Stop,
    record: *const c_void,
    finalize: *const c_void,
}

const FLUSHED: u64 = 5;
const UNFLUSHED: u64 = 3;

fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("libnccl_profiler_comminsight.so"))
        .find(|p| p.exists())
        .expect("libnccl_profiler_comminsight.so next to the test binary")
}

/// The fds of this process whose target lies below `root`, with their `FD_CLOEXEC` bit.
fn plugin_fds(root: &Path) -> Vec<(i32, PathBuf, bool)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if target.starts_with(root) {
            // SAFETY: F_GETFD on an fd number; a closed one just returns -1.
            let fl = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            v.push((fd, target, fl >= 0 && fl & libc::FD_CLOEXEC != 0));
        }
    }
    v
}

/// One collective without channels: its stop completes it (one `coll` record, `coll_sn` = `sn`).
fn collective(t: &Table, ctx: *mut c_void, sn: u64) {
    let mut d = [0u64; 14];
    d[0] = 2; // Coll
    d[3] = sn; // coll.seqNumber @24
    d[4] = c"AllReduce".as_ptr() as u64; // coll.func @32
    d[7] = 1024; // coll.count @56
    d[9] = c"ncclFloat32".as_ptr() as u64; // coll.datatype @72
    let mut h = core::ptr::null_mut();
    // SAFETY: a 112-byte descriptor at §2.6 offsets; strings are static.
    unsafe { (t.start)(ctx, &mut h, d.as_mut_ptr().cast()) };
    assert!(!h.is_null());
    // SAFETY: the handle just returned.
    unsafe { (t.stop)(h) };
}

/// Child half, before the exec: load, init, ops, check fds, exec (never returns).
#[test]
fn child_loads_the_plugin_then_execs() {
    let Some(root) = std::env::var_os("CI_EXEC_CHILD") else {
        return;
    };
    let root = PathBuf::from(root);
    let path = std::ffi::CString::new(cdylib().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: our own plugin library, loaded the way NCCL loads it.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null());
    // SAFETY: a live handle, a NUL-terminated name; the exported static table.
    let t = unsafe { &*(libc::dlsym(lib, c"ncclProfiler_v6".as_ptr()) as *const Table) };
    let (mut ctx, mut mask) = (core::ptr::null_mut(), 0 as c_int);
    // SAFETY: arguments as NCCL passes them.
    let rc = unsafe {
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
    assert_eq!(rc, 0);
    assert!(!ctx.is_null());
    for sn in 0..FLUSHED {
        collective(t, ctx, sn);
    }
    // Past a drain pass and its flush (COMMINSIGHT_FLUSH_MS = 200 by default).
    std::thread::sleep(Duration::from_millis(700));
    for sn in FLUSHED..FLUSHED + UNFLUSHED {
        collective(t, ctx, sn);
    }
    let fds = plugin_fds(&root);
    for (fd, target, cloexec) in &fds {
        println!(
            "before exec: fd {fd} -> {} cloexec={cloexec}",
            target.display()
        );
    }
    assert!(!fds.is_empty(), "no plugin fds found (ring/segment)");
    assert!(
        fds.iter().all(|f| f.2),
        "plugin fds without FD_CLOEXEC: {fds:?}"
    );
    std::env::set_var("CI_EXEC_AFTER", &root);
    std::env::remove_var("CI_EXEC_CHILD");
    let exe = std::ffi::CString::new(
        std::env::current_exe()
            .unwrap()
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    let args = [
        c"exec".as_ptr(),
        c"--exact".as_ptr(),
        c"exec_d_program".as_ptr(),
        c"--nocapture".as_ptr(),
        core::ptr::null(),
    ];
    // SAFETY: a NUL-terminated path and a NULL-terminated argv of static strings. No finalize.
    unsafe { libc::execv(exe.as_ptr(), args.as_ptr()) };
    panic!("execv failed: {}", std::io::Error::last_os_error());
}

/// The exec'd program (same pid): it must hold none of the plugin's fds.
#[test]
fn exec_d_program() {
    let Some(root) = std::env::var_os("CI_EXEC_AFTER") else {
        return;
    };
    let leaked = plugin_fds(Path::new(&root));
    println!(
        "after exec: pid {} plugin fds {leaked:?}",
        std::process::id()
    );
    assert!(
        leaked.is_empty(),
        "fds leaked into the exec'd program: {leaked:?}"
    );
}

/// `coll_sn`s of the ring's records not yet consumed by the (vanished) drain, and the header's
/// (pushed, consumed).
fn undrained(ring: &Path) -> (BTreeSet<u64>, u64, u64) {
    let mut r = RingReader::open(ring).unwrap();
    let h = r.header();
    let mut raw = Vec::new();
    r.read_into(&mut raw, r.capacity());
    let sns = raw
        .iter()
        .filter(|x| x.seq() >= h.consumed)
        .filter_map(|x| match Record::decode(x).ok()?.body {
            Body::Coll(o) => Some(o.coll_sn),
            _ => None,
        })
        .collect();
    (sns, h.pushed, h.consumed)
}

fn run_child(root: &Path) -> (u32, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_loads_the_plugin_then_execs",
        "--nocapture",
    ])
    .env("CI_EXEC_CHILD", root)
    .env("COMMINSIGHT_LOG_DIR", root.join("logs"))
    .env("COMMINSIGHT_SHM_DIR", root.join("shm"))
    .env("COMMINSIGHT_JOB_ID", "j")
    .env("COMMINSIGHT_HOSTNAME", "h")
    .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the exec'ing rank hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "exec'd program failed: {status}\n{out}");
    (pid, out)
}

#[test]
fn a_rank_that_execs_without_finalize_leaves_readable_data_and_no_fds() {
    let root = std::env::temp_dir().join(format!("ci-exec-{}", std::process::id()));
    let (pid, out) = run_child(&root);
    print!("{out}");
    assert!(
        out.contains(&format!("after exec: pid {pid} plugin fds []")),
        "{out}"
    );
    let dir = root.join("logs/j/h").join(pid.to_string());
    let (mut on_disk, mut open_segs) = (BTreeSet::new(), 0);
    for s in find_segments(&dir).unwrap() {
        let r = read_segment(&s).unwrap();
        open_segs += usize::from(r.open);
        for rec in r.records.iter().filter(|r| r.flags & FLAG_REPEAT == 0) {
            if let Body::Coll(o) = &rec.body {
                assert!(on_disk.insert(o.coll_sn), "coll_sn {} twice", o.coll_sn);
            }
        }
    }
    assert_eq!(open_segs, 1, "the segment stays .open (no seal at exec)");
    assert!(
        (0..FLUSHED).all(|sn| on_disk.contains(&sn)),
        "flushed ops on disk: {on_disk:?}"
    );
    // SAFETY: geteuid has no preconditions.
    let ring_dir = root
        .join("shm")
        .join(unsafe { libc::geteuid() }.to_string());
    let rings: Vec<_> = std::fs::read_dir(&ring_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let ring = rings
        .iter()
        .find(|p| p.extension().is_some_and(|x| x == "ring"))
        .expect("ring file stays after exec");
    let (in_ring, pushed, consumed) = undrained(ring);
    let lost: Vec<u64> = (0..FLUSHED + UNFLUSHED)
        .filter(|sn| !on_disk.contains(sn) && !in_ring.contains(sn))
        .collect();
    println!(
        "exec: ops {}, on disk {} (.open segment), undrained in the ring file {} (pushed {pushed}, consumed {consumed}), lost {}",
        FLUSHED + UNFLUSHED,
        on_disk.len(),
        in_ring.len(),
        lost.len()
    );
    // Only the unflushed tail can be missing from both: records the drain popped but had not
    // written when the exec replaced the image.
    assert!(lost.iter().all(|sn| *sn >= FLUSHED), "lost {lost:?}");
    assert!(on_disk.is_disjoint(&in_ring), "{on_disk:?} {in_ring:?}");
    let _ = std::fs::remove_dir_all(&root);
}

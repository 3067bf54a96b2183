//! Cost of the shim per HCCL call (issue 21).
//!
//! 1. In-process (criterion, through the rlib, the release plugin loaded by the shim's recorder):
//!    the shim's work around one `HcclAllReduce` forwarded to a stub — forward only
//!    (`COMMINSIGHT_DISABLE=1`), and recorded (comm lookup, descriptor, the plugin's Coll start
//!    and stop; no AscendCL in this process, so the op closes at return).
//! 2. Child processes (this binary re-run with `HCCL_BENCH_CHILD=1`): `HcclAllReduce` of 8 bytes
//!    on a 1-rank communicator of the libhccl stand-in, host time per call (the enqueue; the
//!    stream is synchronized outside the timed batches of 1 000 calls), without the shim, with it
//!    disabled, recording without events (`COMMINSIGHT_HCCL_EVENTS=0`), and recording with the
//!    event path (an AscendCL event per call, closed by the poller); alternating runs, medians.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-rel cargo build --release -p comminsight-hccl-standin -p comminsight-plugin -p comminsight-preload`
//! then `CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-preload --bench hccl -- --noplot`.

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use comminsight_preload::hccl::{self, Func};
use comminsight_preload::hccl_ffi;
use comminsight_preload::{recorder, shim};
use criterion::Criterion;

const BATCH: usize = 1_000;
const BATCHES: usize = 10;
const RUNS: usize = 7;
const COMM: usize = 0x5eed_0000;

fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn need(p: &Path) -> &Path {
    assert!(
        p.exists(),
        "{} missing: CARGO_TARGET_DIR=<same> cargo build --release -p comminsight-hccl-standin -p comminsight-plugin -p comminsight-preload",
        p.display()
    );
    p
}

fn in_process(c: &mut Criterion, tmp: &Path) {
    let plugin = release_dir().join("libnccl_profiler_comminsight.so");
    // Single-threaded here: set before the recorder and the plugin read the environment.
    std::env::set_var("COMMINSIGHT_PLUGIN_PATH", need(&plugin));
    std::env::set_var("COMMINSIGHT_LOG_DIR", tmp.join("logs"));
    std::env::set_var("COMMINSIGHT_SHM_DIR", tmp.join("shm"));
    let rec = recorder::get().expect("the plugin loads");
    let ctx = rec.init(0x1234, &hccl::c_name("dp"), 1, 0, hccl::FLAGS);
    assert_ne!(ctx, 0, "the plugin opened the communicator");
    hccl::insert(COMM, ctx, 0, 1, 0);
    let send = [1.0f32, 2.0];
    let mut recv = [0f32; 2];
    let call = |s: &[f32; 2], r: &mut [f32; 2]| {
        let a = hccl_ffi::args(
            Func::AllReduce,
            2,
            4,
            s.as_ptr() as usize,
            r.as_mut_ptr() as usize,
        );
        hccl_ffi::op(COMM as *mut c_void, std::ptr::null_mut(), a, || {
            black_box((s, &r));
            0
        })
    };
    let mut g = c.benchmark_group("preload_hccl_call");
    g.bench_function("forward only (COMMINSIGHT_DISABLE=1)", |b| {
        shim::set_disabled(true);
        b.iter(|| call(&send, &mut recv))
    });
    g.bench_function("recorded (lookup + descriptor + plugin start/stop)", |b| {
        shim::set_disabled(false);
        b.iter(|| call(&send, &mut recv))
    });
    g.finish();
    shim::set_disabled(false);
    let counts = hccl::counts();
    assert!(counts[0] > 0, "ops were recorded: {counts:?}");
}

type Sym = *mut c_void;

fn sym(h: Sym, name: &std::ffi::CStr) -> Sym {
    // SAFETY: dlsym with a live handle (or RTLD_DEFAULT) and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?} not found");
    p
}

/// The child: a 1-rank HCCL comm made through whatever the global scope binds (the shim's when
/// preloaded), then timed batches of all-reduces. Prints `NS_PER_CALL <n>`.
fn child() {
    // SAFETY: loading the stand-in globally (as an application linked to it).
    let h = unsafe { libc::dlopen(c"libhccl.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "libhccl.so not found on LD_LIBRARY_PATH");
    type GetRoot = unsafe extern "C" fn(*mut [u8; 4108]) -> c_int;
    type Init = unsafe extern "C" fn(u32, *const [u8; 4108], u32, *mut Sym) -> c_int;
    type AllReduce =
        unsafe extern "C" fn(*const c_void, *mut c_void, u64, c_int, c_int, Sym, Sym) -> c_int;
    type OneFn = unsafe extern "C" fn(Sym) -> c_int;
    let d = libc::RTLD_DEFAULT;
    // SAFETY: the stand-in's (or the shim's) exported functions with HCCL's / AscendCL's C
    // signatures.
    let (get_root, init, all_reduce, sync, destroy) = unsafe {
        (
            std::mem::transmute::<Sym, GetRoot>(sym(h, c"HcclGetRootInfo")),
            std::mem::transmute::<Sym, Init>(sym(d, c"HcclCommInitRootInfo")),
            std::mem::transmute::<Sym, AllReduce>(sym(d, c"HcclAllReduce")),
            std::mem::transmute::<Sym, OneFn>(sym(h, c"aclrtSynchronizeStream")),
            std::mem::transmute::<Sym, OneFn>(sym(d, c"HcclCommDestroy")),
        )
    };
    let mut root = [0u8; 4108];
    let mut comm: Sym = std::ptr::null_mut();
    let send = [1.0f32, 2.0];
    let mut recv = [0f32; 2];
    // SAFETY: valid out-pointers and buffers; a 1-rank communicator; fp32 (4) sum (0).
    unsafe {
        assert_eq!(get_root(&mut root), 0);
        assert_eq!(init(1, &root, 0, &mut comm), 0);
        let batch = |recv: &mut [f32; 2]| {
            let t = Instant::now();
            for _ in 0..BATCH {
                let r = all_reduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    2,
                    4,
                    0,
                    comm,
                    std::ptr::null_mut(),
                );
                assert_eq!(r, 0);
            }
            let ns = t.elapsed().as_nanos() as f64;
            assert_eq!(sync(std::ptr::null_mut()), 0);
            ns
        };
        batch(&mut recv);
        let total: f64 = (0..BATCHES).map(|_| batch(&mut recv)).sum();
        assert_eq!(recv, send);
        assert_eq!(destroy(comm), 0);
        println!("NS_PER_CALL {:.1}", total / (BATCH * BATCHES) as f64);
    }
}

/// One arm: (label, LD_PRELOAD?, extra environment).
type Arm = (&'static str, bool, &'static [(&'static str, &'static str)]);

/// The four arms.
const ARMS: [Arm; 4] = [
    ("without the shim", false, &[]),
    (
        "shim, COMMINSIGHT_DISABLE=1",
        true,
        &[("COMMINSIGHT_DISABLE", "1")],
    ),
    (
        "shim, recorded, no events (COMMINSIGHT_HCCL_EVENTS=0)",
        true,
        &[("COMMINSIGHT_HCCL_EVENTS", "0")],
    ),
    ("shim, recorded, event path", true, &[]),
];

fn run_child(lib: &Path, logs: &Path, preload: bool, env: &[(&str, &str)]) -> f64 {
    let mut cmd = Command::new(std::env::current_exe().expect("exe"));
    cmd.env("HCCL_BENCH_CHILD", "1")
        .env("LD_LIBRARY_PATH", lib)
        .env("COMMINSIGHT_LOG_DIR", logs)
        .env("COMMINSIGHT_SHM_DIR", logs.join("shm"))
        .env("COMMINSIGHT_COMM_ROLE", "dp")
        .env("COMMINSIGHT_INJECT", "0")
        .env_remove("COMMINSIGHT_PLUGIN_PATH")
        .env_remove("COMMINSIGHT_DISABLE");
    if preload {
        cmd.env("LD_PRELOAD", lib.join("libcomminsight-preload.so"));
    } else {
        cmd.env_remove("LD_PRELOAD");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("start child");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "child failed: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .find_map(|l| l.strip_prefix("NS_PER_CALL "))
        .expect("NS_PER_CALL line")
        .parse()
        .expect("number")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn per_call(tmp: &Path) {
    let lib = tmp.join("lib");
    std::fs::create_dir_all(&lib).expect("mkdir");
    let rel = release_dir();
    for (from, to) in [
        ("libhccl.so", "libhccl.so"),
        (
            "libnccl_profiler_comminsight.so",
            "libnccl-profiler-comminsight.so",
        ),
        ("libcomminsight_preload.so", "libcomminsight-preload.so"),
    ] {
        std::os::unix::fs::symlink(need(&rel.join(from)), lib.join(to)).expect("symlink");
    }
    let logs = tmp.join("child-logs");
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); ARMS.len()];
    for _ in 0..RUNS {
        for (i, (_, preload, env)) in ARMS.iter().enumerate() {
            runs[i].push(run_child(&lib, &logs, *preload, env));
        }
    }
    let base = median(runs[0].clone());
    println!(
        "HcclAllReduce host time per call (8 bytes, 1-rank stand-in comm, {BATCHES} x {BATCH} calls per run, {RUNS} alternating runs):"
    );
    for ((label, _, _), v) in ARMS.iter().zip(&runs) {
        let m = median(v.clone());
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "  {label:<56} median {m:>7.0} ns/call  (+{:>5.0} vs without), min {min:>6.0}  runs {v:.0?}",
            m - base
        );
    }
}

fn main() {
    if std::env::var_os("HCCL_BENCH_CHILD").is_some() {
        child();
        return;
    }
    let tmp = std::env::temp_dir().join(format!("comminsight-hccl-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("mkdir");
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    in_process(&mut c, &tmp);
    per_call(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
}

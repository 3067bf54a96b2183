//! Cost of the preload shim.
//!
//! 1. In-process (criterion, through the rlib): the comm-creating wrapper's own work — read the
//!    caller's config, match an announcement, intern the name, remember the config, forget it —
//!    against the forward-only path (the same call with naming off).
//! 2. Child processes (this binary re-run with `PRELOAD_BENCH_CHILD=1`): an 8-byte all-reduce
//!    (+ `ncclTestbedSynchronize`) on a 1-rank communicator of the libnccl stand-in, with and
//!    without `LD_PRELOAD=libcomminsight-preload.so`, alternating runs; ns/op medians and ratio.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-rel cargo build --release -p comminsight-nccl-standin -p comminsight-plugin -p comminsight-preload`
//! then `CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-preload --bench overhead`.

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use comminsight_preload::config::ConfigBuf;
use comminsight_preload::shim::{self, Caller, Plan};
use comminsight_preload::state::{self, with_registry};
use criterion::Criterion;

const OPS: usize = 5_000;
const RUNS: usize = 11;

extern "C" fn real_stub(cfg: *mut c_void) -> c_int {
    black_box(cfg);
    0
}

/// One wrapped comm-creating call: plan, "forward" to a stub, record, forget.
fn wrapped_call(caller: &[u8], comm: usize) {
    let c = Caller::Config(ConfigBuf::from_caller(black_box(caller), false));
    let mut p = shim::plan_init(c, Some((8, 3)));
    let ptr = match &mut p {
        Plan::Forward | Plan::Remember(_) => caller.as_ptr().cast_mut().cast(),
        Plan::Config { cfg, .. } => cfg.as_mut_ptr().cast(),
    };
    let res = real_stub(ptr);
    shim::finish(p, res == 0, comm);
    shim::forget(comm);
    shim::flush_warnings_to_stderr();
}

fn in_process(c: &mut Criterion) {
    shim::set_nccl_version(23007);
    let ids: Vec<i32> = (0..8)
        .map(|g| {
            with_registry(|r| {
                let ranks: Vec<i32> = (0..8).map(|k| g * 8 + k).collect();
                r.announce(
                    None,
                    "TENSOR_MODEL_PARALLEL_GROUP",
                    &g.to_string(),
                    &ranks,
                    g * 8 + 3,
                )
                .expect("announce")
            })
        })
        .collect();
    state::set_current_group(ids[5]);
    let caller = ConfigBuf::defaults(23007).as_bytes().to_vec();
    assert!(matches!(
        shim::plan_init(
            Caller::Config(ConfigBuf::from_caller(&caller, false)),
            Some((8, 3))
        ),
        Plan::Config { .. }
    ));
    let mut g = c.benchmark_group("preload_comm_init_wrapper");
    g.bench_function("named (copy + match + intern + remember)", |b| {
        shim::set_disabled(false);
        b.iter(|| wrapped_call(&caller, 0x1000))
    });
    g.bench_function("forward only (naming off)", |b| {
        shim::set_disabled(true);
        b.iter(|| wrapped_call(&caller, 0x1000))
    });
    g.finish();
    shim::set_disabled(false);
}

// ---- child processes ---------------------------------------------------------------------------

type Sym = *mut c_void;

fn sym(h: Sym, name: &std::ffi::CStr) -> Sym {
    // SAFETY: dlsym with a live handle (or RTLD_DEFAULT) and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?} not found");
    p
}

/// The child: a 1-rank comm made through whatever `ncclCommInitRank` the global scope binds
/// (the shim's when preloaded), then OPS timed all-reduces. Prints `NS_PER_OP <n>`.
fn child() {
    // SAFETY: loading the stand-in by its soname, globally (as an application linked to it).
    let h = unsafe { libc::dlopen(c"libnccl.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "libnccl.so.2 not found on LD_LIBRARY_PATH");
    type GetId = unsafe extern "C" fn(*mut [u8; 128]) -> c_int;
    type Init = unsafe extern "C" fn(*mut Sym, c_int, [u8; 128], c_int) -> c_int;
    type AllReduce =
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Sym, Sym) -> c_int;
    type CommFn = unsafe extern "C" fn(Sym) -> c_int;
    let (get_id, init, all_reduce, sync, destroy) =
    // SAFETY: the stand-in's (or the shim's) exported functions with NCCL's C signatures.
    unsafe {
        (
            std::mem::transmute::<Sym, GetId>(sym(h, c"ncclGetUniqueId")),
            std::mem::transmute::<Sym, Init>(sym(libc::RTLD_DEFAULT, c"ncclCommInitRank")),
            std::mem::transmute::<Sym, AllReduce>(sym(h, c"ncclAllReduce")),
            std::mem::transmute::<Sym, CommFn>(sym(h, c"ncclTestbedSynchronize")),
            std::mem::transmute::<Sym, CommFn>(sym(libc::RTLD_DEFAULT, c"ncclCommDestroy")),
        )
    };
    let mut id = [0u8; 128];
    let mut comm: Sym = std::ptr::null_mut();
    let send = [1.0f32, 2.0];
    let mut recv = [0f32; 2];
    // SAFETY: valid out-pointers and buffers; a 1-rank communicator; float32 (7) sum (0).
    unsafe {
        assert_eq!(get_id(&mut id), 0);
        assert_eq!(init(&mut comm, 1, id, 0), 0);
        let op = |recv: &mut [f32; 2]| {
            assert_eq!(
                all_reduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    2,
                    7,
                    0,
                    comm,
                    std::ptr::null_mut()
                ),
                0
            );
            assert_eq!(sync(comm), 0);
        };
        for _ in 0..1000 {
            op(&mut recv);
        }
        let t = Instant::now();
        for _ in 0..OPS {
            op(&mut recv);
        }
        let ns = t.elapsed().as_nanos() as f64 / OPS as f64;
        assert_eq!(recv, send);
        assert_eq!(destroy(comm), 0);
        println!("NS_PER_OP {ns:.1}");
    }
}

fn lib_dir() -> (PathBuf, tempdir::Dir) {
    let exe = std::env::current_exe().expect("exe");
    let rel = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let d = tempdir::Dir::new();
    for (from, to) in [
        ("libnccl.so", "libnccl.so.2"),
        (
            "libnccl_profiler_comminsight.so",
            "libnccl-profiler-comminsight.so",
        ),
        ("libcomminsight_preload.so", "libcomminsight-preload.so"),
    ] {
        let src = rel.join(from);
        assert!(
            src.exists(),
            "{} missing: CARGO_TARGET_DIR=<same> cargo build --release -p comminsight-nccl-standin -p comminsight-plugin -p comminsight-preload",
            src.display()
        );
        std::os::unix::fs::symlink(&src, d.0.join(to)).expect("symlink");
    }
    (d.0.clone(), d)
}

mod tempdir {
    /// A temp dir removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir()
                .join(format!("comminsight-preload-bench-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("mkdir");
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn run_child(lib: &Path, logs: &Path, preload: bool) -> f64 {
    let mut cmd = Command::new(std::env::current_exe().expect("exe"));
    cmd.env("PRELOAD_BENCH_CHILD", "1")
        .env("LD_LIBRARY_PATH", lib)
        .env("NCCL_PROFILER_PLUGIN", "comminsight")
        .env("COMMINSIGHT_LOG_DIR", logs)
        .env("COMMINSIGHT_SHM_DIR", logs.join("shm"))
        .env("COMMINSIGHT_COMM_ROLE", "dp")
        .env("COMMINSIGHT_INJECT", "0");
    if preload {
        cmd.env("LD_PRELOAD", lib.join("libcomminsight-preload.so"));
    } else {
        cmd.env_remove("LD_PRELOAD");
    }
    let o = cmd.output().expect("start child");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "child failed: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .find_map(|l| l.strip_prefix("NS_PER_OP "))
        .expect("NS_PER_OP line")
        .parse()
        .expect("number")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn per_op() {
    let (lib, _keep) = lib_dir();
    let logs = lib.join("logs");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        without.push(run_child(&lib, &logs, false));
        with.push(run_child(&lib, &logs, true));
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (wm, wom) = (min(&with), min(&without));
    let (w, wo) = (median(with.clone()), median(without.clone()));
    println!(
        "preload per-op (8-byte all-reduce + synchronize, 1-rank comm, {OPS} ops x {RUNS} alternating runs):\n  \
         with LD_PRELOAD:    median {w:.0} ns/op, min {wm:.0} (runs {with:.0?})\n  \
         without LD_PRELOAD: median {wo:.0} ns/op, min {wom:.0} (runs {without:.0?})\n  \
         ratio with/without: median {:.3}, min {:.3}",
        w / wo,
        wm / wom
    );
}

fn main() {
    if std::env::var_os("PRELOAD_BENCH_CHILD").is_some() {
        child();
        return;
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    in_process(&mut c);
    per_op();
}

//! Shared helpers of the multi-process tests: the test executable re-invokes itself as rank processes
//! (env `NCCL_STANDIN_CHILD=<scenario>`), which call the stand-in's C API; kill-on-drop guards.
#![allow(dead_code, reason = "each test binary uses a subset")]

use nccl::ffi::*;
use nccl::types::{Config, UniqueId};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const FLOAT32: i32 = 7;
pub const FLOAT64: i32 = 8;
pub const INT32: i32 = 2;
pub const INT64: i32 = 4;
pub const UINT8: i32 = 1;
pub const SUM: i32 = 0;
pub const PROD: i32 = 1;
pub const MAX: i32 = 2;
pub const MIN: i32 = 3;
pub const AVG: i32 = 4;

pub use nccl::ffi::CommT;

/// A fresh unique id (this test process is the bootstrap root), hex-encoded for the children.
pub fn new_id_hex() -> String {
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
    id.internal
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect()
}

pub fn id_from_hex(h: &str) -> UniqueId {
    let mut id = UniqueId { internal: [0; 128] };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex") as std::ffi::c_char;
    }
    id
}

/// A scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("nccl-standin-{name}-{}-{t}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Rank processes, killed when dropped.
pub struct Ranks {
    pub children: Vec<Child>,
    pub dir: PathBuf,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Ranks {
    /// Starts `n` ranks of `scenario` with `env` (plus RANK, NRANKS, NCCL_STANDIN_IDS).
    pub fn spawn(
        scenario: &str,
        n: usize,
        ids: &[String],
        dir: &Path,
        env: &[(&str, String)],
        per_rank: &dyn Fn(usize) -> Vec<(String, String)>,
    ) -> Self {
        let exe = std::env::current_exe().unwrap();
        let children = (0..n)
            .map(|r| {
                let out = std::fs::File::create(dir.join(format!("rank-{r}.out"))).unwrap();
                let err = std::fs::File::create(dir.join(format!("rank-{r}.err"))).unwrap();
                let mut c = Command::new(&exe);
                c.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
                    .env("NCCL_STANDIN_CHILD", scenario)
                    .env("RANK", r.to_string())
                    .env("NRANKS", n.to_string())
                    .env("NCCL_STANDIN_IDS", ids.join(","))
                    .env("NCCL_STANDIN_DIR", dir)
                    .stdin(Stdio::null())
                    .stdout(out)
                    .stderr(err);
                for (k, v) in env {
                    c.env(k, v);
                }
                for (k, v) in per_rank(r) {
                    c.env(k, v);
                }
                c.spawn().unwrap()
            })
            .collect();
        Ranks {
            children,
            dir: dir.to_path_buf(),
        }
    }

    /// Waits for every rank (deadline), returns exit codes.
    pub fn wait(&mut self, limit: Duration) -> Vec<i32> {
        let deadline = Instant::now() + limit;
        let mut codes = vec![None; self.children.len()];
        while codes.iter().any(Option::is_none) {
            for (i, c) in self.children.iter_mut().enumerate() {
                if codes[i].is_none() {
                    if let Some(s) = c.try_wait().unwrap() {
                        codes[i] = Some(s.code().unwrap_or(-1));
                    }
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "ranks did not finish in {limit:?}; logs in {}",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        codes.into_iter().map(|c| c.unwrap()).collect()
    }

    pub fn out(&self, r: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("rank-{r}.out"))).unwrap_or_default()
    }

    pub fn err(&self, r: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("rank-{r}.err"))).unwrap_or_default()
    }

    /// Asserts all exited 0, showing their stderr otherwise.
    pub fn expect_success(&mut self, limit: Duration) {
        let codes = self.wait(limit);
        for (r, c) in codes.iter().enumerate() {
            assert_eq!(*c, 0, "rank {r} failed:\n{}\n{}", self.out(r), self.err(r));
        }
    }
}

/// Child-side context.
pub struct Me {
    pub rank: i32,
    pub nranks: i32,
    pub ids: Vec<UniqueId>,
    pub dir: PathBuf,
}

pub fn me() -> Me {
    let ids = std::env::var("NCCL_STANDIN_IDS").unwrap_or_default();
    Me {
        rank: std::env::var("RANK").unwrap().parse().unwrap(),
        nranks: std::env::var("NRANKS").unwrap().parse().unwrap(),
        ids: ids
            .split(',')
            .filter(|s| !s.is_empty())
            .map(id_from_hex)
            .collect(),
        dir: std::env::var("NCCL_STANDIN_DIR").unwrap().into(),
    }
}

pub fn check(rc: i32, what: &str) {
    assert_eq!(rc, 0, "{what} returned {rc}");
}

pub fn init(id: UniqueId, n: i32, r: i32) -> CommT {
    let mut c: CommT = std::ptr::null();
    // SAFETY: valid out-pointer; id by value.
    check(
        unsafe { ncclCommInitRank(&mut c, n, id, r) },
        "ncclCommInitRank",
    );
    c
}

pub fn init_config(id: UniqueId, n: i32, r: i32, cfg: &mut Config) -> (i32, CommT) {
    let mut c: CommT = std::ptr::null();
    // SAFETY: valid out-pointer and config.
    let rc = unsafe { ncclCommInitRankConfig(&mut c, n, id, r, cfg) };
    (rc, c)
}

pub fn sync(c: CommT) {
    // SAFETY: valid comm.
    check(unsafe { ncclTestbedSynchronize(c) }, "sync");
}

pub fn allreduce<T>(c: CommT, s: &[T], r: &mut [T], dt: i32, op: i32) {
    // SAFETY: buffers live until the sync below in every caller.
    check(
        unsafe {
            ncclAllReduce(
                s.as_ptr().cast(),
                r.as_mut_ptr().cast(),
                r.len(),
                dt,
                op,
                c,
                std::ptr::null_mut(),
            )
        },
        "allreduce",
    );
}

pub fn send<T>(c: CommT, s: &[T], dt: i32, peer: i32) {
    // SAFETY: buffer lives until sync.
    check(
        unsafe {
            ncclSend(
                s.as_ptr().cast::<c_void>(),
                s.len(),
                dt,
                peer,
                c,
                std::ptr::null_mut(),
            )
        },
        "send",
    );
}

pub fn recv<T>(c: CommT, r: &mut [T], dt: i32, peer: i32) {
    // SAFETY: buffer lives until sync.
    check(
        unsafe {
            ncclRecv(
                r.as_mut_ptr().cast::<c_void>(),
                r.len(),
                dt,
                peer,
                c,
                std::ptr::null_mut(),
            )
        },
        "recv",
    );
}

pub fn destroy(c: CommT) {
    // SAFETY: valid comm, freed once.
    check(unsafe { ncclCommDestroy(c) }, "destroy");
}

/// Runs `f` on a thread; `Some` if it finished within `d`.
pub fn finishes_within<F: FnOnce() + Send + 'static>(
    d: Duration,
    f: F,
) -> std::sync::mpsc::Receiver<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    let _ = d;
    rx
}

pub struct SendPtr(pub CommT);
// SAFETY: comm handles may be used from any thread (NCCL's contract for sync/abort).
unsafe impl Send for SendPtr {}

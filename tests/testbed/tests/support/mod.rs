//! Helpers for the end-to-end tests: the built binary, the staged libraries, a kill-on-drop
//! runner process, and reading back what the plugin wrote.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use comminsight_wire::record::{Body, Record, FLAG_REPEAT};
use comminsight_wire::segment::{find_segments, read_segment};

pub const BIN: &str = env!("CARGO_BIN_EXE_comminsight-testbed");

pub fn scenario(name: &str) -> String {
    format!("{}/../scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

/// The staged libnccl.so.2 + plugin: `COMMINSIGHT_LIB_DIR`, else `<target>/debug/lib`.
/// Missing libraries fail the test (they are part of what is tested), with how to build them.
pub fn lib_dir() -> PathBuf {
    let d = std::env::var_os("COMMINSIGHT_LIB_DIR").map_or_else(
        || Path::new(BIN).parent().expect("bin dir").join("lib"),
        PathBuf::from,
    );
    for f in ["libnccl.so.2", "libnccl-profiler-comminsight.so"] {
        assert!(
            d.join(f).exists(),
            "{} lacks {f}: run `cargo xtask build` (or set COMMINSIGHT_LIB_DIR to a directory with \
             libnccl.so.2 and libnccl-profiler-comminsight.so)",
            d.display()
        );
    }
    d
}

/// Jobs of several processes run one at a time (2-core machines).
pub fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A scratch output directory, removed on drop (kept with `COMMINSIGHT_KEEP_TEST_OUTPUT`).
pub struct Out(pub PathBuf);

impl Out {
    pub fn new(name: &str) -> Out {
        let p = std::env::temp_dir().join(format!("cit-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Out(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn truth(&self) -> serde_json::Value {
        let p = self.0.join("truth.json");
        let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&s).expect("truth.json is JSON")
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        if std::env::var_os("COMMINSIGHT_KEEP_TEST_OUTPUT").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub fn command(out: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("run").arg("--out").arg(out).args(args);
    cmd.env("COMMINSIGHT_LIB_DIR", lib_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Run to the end; returns the output and the wall time.
pub fn testbed(out: &Path, args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t0 = Instant::now();
    let o = command(out, args, env)
        .output()
        .expect("start comminsight-testbed");
    (o, t0.elapsed())
}

pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "comminsight-testbed failed ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A runner started in the background, killed on drop.
pub struct Running(pub Child);

impl Running {
    pub fn start(out: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
        let child = command(out, args, env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start comminsight-testbed");
        Running(child)
    }
    pub fn wait(mut self) -> std::process::ExitStatus {
        self.0.wait().expect("wait")
    }
}

impl Drop for Running {
    /// SIGTERM first (the runner then ends its ranks and cleans up), SIGKILL after 15 s.
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(15) {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Poll `f` until it returns Some, or panic after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stream records (repeats left out) per global rank (from each process' `proc_start`).
pub fn records_by_rank(out: &Path) -> BTreeMap<i32, Vec<Record>> {
    let mut by_dir: BTreeMap<PathBuf, Vec<Record>> = BTreeMap::new();
    for f in find_segments(&out.join("inspector_logs")).expect("segments") {
        let seg = read_segment(&f).expect("read segment");
        assert!(seg.bad.is_empty(), "{}: corrupt records", f.display());
        by_dir
            .entry(f.parent().expect("dir").to_path_buf())
            .or_default()
            .extend(seg.records);
    }
    let mut out_map = BTreeMap::new();
    for (_, recs) in by_dir {
        let rank = recs
            .iter()
            .find_map(|r| match &r.body {
                Body::ProcStart(p) => Some(p.rank),
                _ => None,
            })
            .expect("proc_start in every process directory");
        let stream: Vec<Record> = recs
            .into_iter()
            .filter(|r| r.flags & FLAG_REPEAT == 0)
            .collect();
        assert!(
            out_map.insert(rank, stream).is_none(),
            "two processes claim rank {rank}"
        );
    }
    out_map
}

/// `coll_local_sn` of every coll/p2p record, sorted.
pub fn local_sns(recs: &[Record]) -> Vec<u64> {
    let mut v: Vec<u64> = recs
        .iter()
        .filter_map(|r| match &r.body {
            Body::Coll(o) | Body::P2p(o) => Some(o.coll_local_sn),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v
}

/// Truth's step ranges of `rank` cover exactly the records written for completed steps.
pub fn assert_steps_tile_records(
    truth: &serde_json::Value,
    recs: &BTreeMap<i32, Vec<Record>>,
    rank: i32,
) {
    let sns = local_sns(&recs[&rank]);
    let mut want = Vec::new();
    for s in truth["steps"][rank.to_string()]
        .as_array()
        .expect("steps of rank")
    {
        if let Some([a, b]) = s
            .as_array()
            .map(|v| [v[0].as_u64().unwrap(), v[1].as_u64().unwrap()])
        {
            want.extend(a..=b);
        }
    }
    let done: Vec<u64> = sns
        .iter()
        .copied()
        .filter(|s| want.last().is_some_and(|l| s <= l))
        .collect();
    assert_eq!(
        done, want,
        "rank {rank}: records of completed steps == truth step ranges"
    );
}

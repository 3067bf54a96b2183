//! Helpers for the shim tests: staged libraries, temp dirs, rank processes, records.

#![allow(dead_code, reason = "each test file uses a subset")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_wire::record::Body;
use comminsight_wire::segment::{find_segments, read_segment};

/// The staged lib dir (`COMMINSIGHT_LIB_DIR`, else `target/debug/lib`), checked.
pub fn lib_dir() -> PathBuf {
    let d = std::env::var_os("COMMINSIGHT_LIB_DIR").map_or_else(
        || {
            let exe = std::env::current_exe().expect("current exe");
            // target/debug/deps/<test> -> target/debug/lib
            exe.parent()
                .and_then(Path::parent)
                .expect("target/debug")
                .join("lib")
        },
        PathBuf::from,
    );
    for f in [
        "libcomminsight-preload.so",
        "libnccl-profiler-comminsight.so",
        "libnccl.so.2",
    ] {
        assert!(
            d.join(f).exists(),
            "{} lacks {f}: run `cargo xtask build` first",
            d.display()
        );
    }
    d
}

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `<tmp>/comminsight-preload-<name>-<pid>-<n>`.
    pub fn new(name: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "comminsight-preload-{name}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("mkdir temp dir");
        TempDir(p)
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Child processes killed when dropped (a failing test leaves none behind).
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one rank printed.
#[derive(Debug)]
pub struct RankOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl RankOut {
    /// `COMM <label> <hash>` lines: label -> hash.
    pub fn comms(&self) -> HashMap<String, u64> {
        self.stdout
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("COMM")).then(|| {
                    let label = w.next().expect("label").to_string();
                    (label, w.next().expect("hash").parse().expect("hash"))
                })
            })
            .collect()
    }

    /// `RESULT <label> ...` lines.
    pub fn results(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("RESULT "))
            .collect()
    }

    /// Lines of stderr containing every one of `needles`.
    pub fn stderr_lines(&self, needles: &[&str]) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .collect()
    }
}

/// One job: `nranks` Python rank processes running `child.py` `scenario`.
pub struct Job {
    pub ranks: Vec<RankOut>,
    /// Comm names from the plugin's comm_init records: comm hash -> the names its ranks saw.
    pub names: HashMap<u64, Vec<String>>,
    _dir: TempDir,
}

impl Job {
    /// The name the plugin recorded for `label` as seen by `rank` (every rank of that
    /// communicator must have recorded the same one).
    pub fn name(&self, rank: usize, label: &str) -> &str {
        let h = self.ranks[rank].comms()[label];
        let names = self.names.get(&h).unwrap_or_else(|| {
            panic!("no comm_init record for {label} (hash {h:#x}) on rank {rank}")
        });
        assert!(
            names.iter().all(|n| n == &names[0]),
            "{label}: ranks disagree: {names:?}"
        );
        &names[0]
    }
}

/// Run a job. `preload`: with `LD_PRELOAD` (and `NCCL_PROFILER_PLUGIN` unset, so the shim must set
/// it); without, `NCCL_PROFILER_PLUGIN=comminsight` is set here.
pub fn run_job(scenario: &str, nranks: usize, preload: bool, env: &[(&str, &str)]) -> Job {
    let lib = lib_dir();
    let dir = TempDir::new(scenario);
    let logs = dir.path().join("logs");
    let rdv = dir.path().join("rdv");
    std::fs::create_dir_all(&rdv).expect("mkdir");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/child.py");
    let mut kids = Children(Vec::new());
    for r in 0..nranks {
        let mut cmd = Command::new("python3");
        cmd.arg(script)
            .env("PRE_SCENARIO", scenario)
            .env("PRE_RANK", r.to_string())
            .env("PRE_NRANKS", nranks.to_string())
            .env("PRE_DIR", &rdv)
            .env("LD_LIBRARY_PATH", &lib)
            .env("COMMINSIGHT_LOG_DIR", &logs)
            .env("COMMINSIGHT_SHM_DIR", dir.path().join("shm"))
            .env("COMMINSIGHT_JOB_ID", "preload-test")
            .env("COMMINSIGHT_INJECT", "0")
            .env("NCCL_DEBUG", "WARN")
            .env_remove("COMMINSIGHT_COMM_ROLE")
            .env_remove("COMMINSIGHT_DISABLE")
            .env_remove("PYTHONPATH")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if preload {
            cmd.env("LD_PRELOAD", lib.join("libcomminsight-preload.so"))
                .env_remove("NCCL_PROFILER_PLUGIN");
        } else {
            cmd.env_remove("LD_PRELOAD")
                .env("NCCL_PROFILER_PLUGIN", "comminsight");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        kids.0.push(cmd.spawn().expect("start python3"));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut timed_out = false;
    while kids
        .0
        .iter_mut()
        .any(|c| c.try_wait().expect("wait").is_none())
    {
        if Instant::now() > deadline {
            timed_out = true;
            for c in &mut kids.0 {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranks: Vec<RankOut> = std::mem::take(&mut kids.0)
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().expect("output");
            RankOut {
                ok: o.status.success(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            }
        })
        .collect();
    for (r, o) in ranks.iter().enumerate() {
        assert!(
            !timed_out && o.ok && o.stdout.contains("DONE"),
            "{scenario} rank {r} failed (timed out after 120 s: {timed_out}):\nstdout:\n{}\nstderr:\n{}",
            o.stdout,
            o.stderr
        );
    }
    let mut names: HashMap<u64, Vec<String>> = HashMap::new();
    if logs.exists() {
        for f in find_segments(&logs).expect("find segments") {
            for rec in read_segment(&f).expect("read segment").records {
                if let Body::CommInit(c) = rec.body {
                    names
                        .entry(c.comm_hash)
                        .or_default()
                        .push(c.comm_name.as_str_lossy().into_owned());
                }
            }
        }
    }
    Job {
        ranks,
        names,
        _dir: dir,
    }
}

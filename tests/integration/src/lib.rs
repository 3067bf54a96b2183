//! Shared helpers for the end-to-end tests: where the built artefacts are, running the test bed,
//! reading back what the plugin wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use comminsight_wire::record::{Body, Record, FLAG_REPEAT};
use comminsight_wire::segment::{find_segments, read_segment};

/// `target/debug`, where cargo put the binaries (`COMMINSIGHT_BIN_DIR` overrides).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("COMMINSIGHT_BIN_DIR") {
        return PathBuf::from(d);
    }
    // target/debug/deps/<test-exe> -> target/debug
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .to_path_buf()
}

/// `target/debug/lib`, where `cargo xtask build` stages libnccl.so.2 and the plugin.
pub fn lib_dir() -> PathBuf {
    let d = std::env::var_os("COMMINSIGHT_LIB_DIR")
        .map_or_else(|| bin_dir().join("lib"), PathBuf::from);
    let plugin = d.join("libnccl-profiler-comminsight.so");
    let nccl = d.join("libnccl.so.2");
    assert!(
        plugin.exists() && nccl.exists(),
        "{} lacks libnccl-profiler-comminsight.so / libnccl.so.2: run `cargo xtask build` (or `cargo xtask test`) first",
        d.display()
    );
    d
}

/// A fresh output directory under the target dir, removed when dropped.
pub struct OutDir(pub PathBuf);

impl OutDir {
    pub fn new(name: &str) -> OutDir {
        let p = bin_dir()
            .join("it-out")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        OutDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if std::env::var_os("COMMINSIGHT_KEEP_TEST_OUTPUT").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Result of one test-bed run.
pub struct Run {
    pub output: Output,
    pub wall: Duration,
}

impl Run {
    pub fn assert_ok(&self) -> &Self {
        assert!(
            self.output.status.success(),
            "comminsight-testbed failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.output.status,
            String::from_utf8_lossy(&self.output.stdout),
            String::from_utf8_lossy(&self.output.stderr)
        );
        self
    }
}

/// Run `comminsight-testbed run --out OUT ARGS...` with extra environment.
pub fn testbed(out: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(bin_dir().join("comminsight-testbed"));
    cmd.arg("run")
        .arg("--out")
        .arg(out)
        .args(args)
        .env("COMMINSIGHT_LIB_DIR", lib_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let output = cmd.output().expect("start comminsight-testbed");
    Run {
        output,
        wall: t0.elapsed(),
    }
}

/// Run `comminsight-agent ARGS...`.
pub fn agent(args: &[&str]) -> Output {
    Command::new(bin_dir().join("comminsight-agent"))
        .args(args)
        .output()
        .expect("start comminsight-agent")
}

/// Every record under `dir`, repeats (segment preambles) left out.
pub fn records(dir: &Path) -> Vec<Record> {
    let mut out = Vec::new();
    for f in find_segments(dir).expect("find segments") {
        let seg = read_segment(&f).expect("read segment");
        assert!(
            seg.bad.is_empty(),
            "{}: corrupt records {:?}",
            f.display(),
            seg.bad
        );
        out.extend(
            seg.records
                .into_iter()
                .filter(|r| r.flags & FLAG_REPEAT == 0),
        );
    }
    out
}

/// The test bed's truth file.
pub fn truth(dir: &Path) -> serde_json::Value {
    let p = dir.join("truth.json");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).expect("truth.json is JSON")
}

/// Records of one kind, as their bodies.
pub fn colls(recs: &[Record]) -> Vec<&comminsight_wire::record::OpRecord> {
    recs.iter()
        .filter_map(|r| {
            if let Body::Coll(o) = &r.body {
                Some(o)
            } else {
                None
            }
        })
        .collect()
}

/// Jobs of several processes are run one at a time inside a test binary (2-core machines).
pub fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The test tools `cargo xtask deps` installs (`COMMINSIGHT_TEST_TOOLS`, default
/// `<workspace>/target/test-tools`): the Python venv and VictoriaMetrics.
pub fn test_tool(rel: &str) -> PathBuf {
    let root = std::env::var_os("COMMINSIGHT_TEST_TOOLS").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/test-tools"
            ))
        },
        PathBuf::from,
    );
    let p = root.join(rel);
    assert!(
        p.exists(),
        "missing test tool {}: run `cargo xtask deps`",
        p.display()
    );
    p
}

/// Every file under `dir`, recursively (unsorted).
pub fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// `comminsight-agent run --config CONFIG`, its log appended to `log`.
pub fn start_agent(config: &Path, log: &Path) -> Child {
    start_agent_env(config, log, &[])
}

/// [`start_agent`] with these variables added to its environment.
pub fn start_agent_env(config: &Path, log: &Path, env: &[(&str, &str)]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the agent log");
    Child(
        Command::new(bin_dir().join("comminsight-agent"))
            .args(["run", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start comminsight-agent run"),
    )
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Child(pub std::process::Child);

impl Child {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Poll `cond` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every file under `dir` by path relative to it -> bytes.
pub fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// A test's shm directory, removed when dropped (the plugin unlinks its rings at exit; a
/// failed run may leave some).
pub struct ShmDir(pub PathBuf);

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The unprivileged user the hostile-user tests act as (`ci-hostile`), created once
/// (idempotent): its uid and gid. These tests need root (CI runs as root).
pub fn hostile_user() -> (u32, u32) {
    const USER: &str = "ci-hostile";
    assert_eq!(
        std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap_or(u32::MAX),
        0,
        "these tests act as a root agent against an unprivileged user: run them as root (CI does)"
    );
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, USER])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            })
    };
    if id("-u").is_none() {
        let o = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .output()
            .expect("run useradd");
        // A parallel test may have created it a moment ago.
        assert!(
            o.status.success() || id("-u").is_some(),
            "useradd {USER}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (id("-u").expect("uid"), id("-g").expect("gid"))
}
pub mod backends;
pub mod dcgm;

/// The agent tests' headless-Chromium helper (Debian's `chromium-headless-shell`).
#[path = "../../../agent/tests/support/chromium.rs"]
pub mod chromium;

/// What [`chromium`] needs of its tests' `support` module.
pub mod support {
    /// A fresh directory under the tests' output root.
    pub struct TempDir(super::OutDir);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            let n = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let d = super::OutDir::new(&format!("{tag}-{n}"));
            std::fs::create_dir_all(d.path()).unwrap();
            TempDir(d)
        }

        pub fn path(&self) -> &std::path::Path {
            self.0.path()
        }
    }
}

/// `comminsight-agent report DIR -o PAGE`, then the page's DOM after its scripts ran in
/// headless Chromium (asserting the report was written and the page raised no error).
pub fn report_dom(dir: &Path, page: &Path) -> chromium::Browser {
    let o = agent(&[
        "report",
        dir.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "report: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let b = chromium::dump_dom(page);
    assert!(
        !b.console.iter().any(|l| l.contains("Uncaught")),
        "{:#?}",
        b.console
    );
    b
}

/// `comminsight-agent trace DIR --steps STEPS -o PF` (asserting it succeeded).
pub fn write_trace(dir: &Path, steps: &str, pf: &Path) {
    let o = agent(&[
        "trace",
        dir.to_str().unwrap(),
        "--steps",
        steps,
        "-o",
        pf.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "trace: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

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
pub mod hostile;

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

/// A follower of every plugin ring that appears under a shm directory (`<shm>/<uid>/*.ring`),
/// as the agent follows them, on a thread of its own: what the plugins pushed to their live feed
/// (their `stats` records included, which reach no segment once a segment writer has stopped).
pub struct RingTap {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<std::collections::BTreeMap<u32, Vec<Record>>>>,
}

impl RingTap {
    /// Start following `shm` (polls every 20 ms).
    pub fn start(shm: &Path) -> RingTap {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let shm = shm.to_path_buf();
        let thread = std::thread::spawn(move || {
            let mut readers: std::collections::BTreeMap<PathBuf, _> = Default::default();
            let mut got: std::collections::BTreeMap<u32, Vec<Record>> = Default::default();
            loop {
                let last = flag.load(Ordering::Acquire);
                let mut files = Vec::new();
                walk(&shm, &mut files);
                files.retain(|f| f.extension().is_some_and(|e| e == "ring"));
                for f in files {
                    if readers.contains_key(&f) {
                        continue;
                    }
                    if let Ok(r) = comminsight_wire::ring::RingReader::open(&f) {
                        readers.insert(f, r);
                    }
                }
                for r in readers.values_mut() {
                    let pid = r.header().pid;
                    let mut raw = Vec::new();
                    while r.read_into(&mut raw, 4096).records > 0 {}
                    let recs = got.entry(pid).or_default();
                    recs.extend(raw.iter().filter_map(|x| Record::decode(x).ok()));
                }
                if last {
                    return got;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        RingTap {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop after one more pass: every record read, by the ring's pid.
    pub fn finish(mut self) -> std::collections::BTreeMap<u32, Vec<Record>> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("ring tap thread")
    }
}

impl Drop for RingTap {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The last `stats` record of each stream in `recs` (by pid).
pub fn last_stats(
    recs: &std::collections::BTreeMap<u32, Vec<Record>>,
) -> std::collections::BTreeMap<u32, comminsight_wire::record::Stats> {
    recs.iter()
        .filter_map(|(pid, v)| {
            v.iter()
                .rev()
                .find_map(|r| match &r.body {
                    Body::Stats(s) => Some(s.clone()),
                    _ => None,
                })
                .map(|s| (*pid, s))
        })
        .collect()
}

/// A tmpfs of `size` (mount option, e.g. `2m`) mounted on a fresh directory, unmounted and
/// removed when dropped (also when the test fails). Needs root (CI runs as root).
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mkdir mount point");
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=1777"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            o.status.success(),
            "mount -t tmpfs {}: {} (these tests need root; CI runs as root)",
            dir.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }

    /// Fill it with `name` until at most `leave` bytes stay free (64 KiB writes); the file.
    pub fn fill(&self, name: &str, leave: u64) -> PathBuf {
        use std::io::Write;
        let p = self.0.join(name);
        let mut f = std::fs::File::create(&p).expect("create the fill file");
        let block = vec![0x5au8; 64 << 10];
        while self.free() > leave + block.len() as u64 {
            if f.write_all(&block).is_err() {
                break;
            }
        }
        let rest = self.free().saturating_sub(leave) as usize;
        let _ = f.write_all(&block[..rest.min(block.len())]);
        let _ = f.sync_all();
        p
    }

    /// Bytes free (`stat -f`: available blocks × block size).
    pub fn free(&self) -> u64 {
        let o = Command::new("stat")
            .args(["-f", "-c", "%a %S"])
            .arg(&self.0)
            .output()
            .expect("run stat -f");
        let t = String::from_utf8_lossy(&o.stdout);
        let v: Vec<u64> = t
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        assert_eq!(v.len(), 2, "stat -f {}: {t}", self.0.display());
        v[0] * v[1]
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

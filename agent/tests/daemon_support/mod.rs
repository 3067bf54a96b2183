//! Real `comminsight-agent run` daemons for the operations tests: a configuration on a fresh
//! state directory, the process (killed on drop), its `status.json`, and segment streams with
//! known operation times for it to follow.

#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record, Timing};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::Func;

/// A daemon's files: its configuration, state directory, segment root and log.
pub struct Setup {
    pub conf: PathBuf,
    pub state: PathBuf,
    pub logs: PathBuf,
    pub log: PathBuf,
}

/// Write `<dir>/agent.toml` for a daemon named `host` following `<dir>/logs`, no master, no
/// archive, no OTLP, the endpoint on a free loopback port; `extra` is appended.
pub fn setup(dir: &Path, host: &str, extra: &str) -> Setup {
    let s = Setup {
        conf: dir.join("agent.toml"),
        state: dir.join("state"),
        logs: dir.join("logs"),
        log: dir.join("agent.log"),
    };
    std::fs::create_dir_all(&s.logs).unwrap();
    std::fs::write(
        &s.conf,
        format!(
            "[agent]\nstate_dir = {:?}\nhost_name = {host:?}\npoll_interval_ms = 20\n\
             [sources]\nshm_enabled = false\nsegment_dirs = [{:?}]\nscan_interval_ms = 100\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = false\n[otlp]\nenabled = false\n\
             [http]\nlisten = \"127.0.0.1:0\"\n{extra}",
            s.state, s.logs
        ),
    )
    .unwrap();
    s
}

/// A running daemon, killed (SIGKILL) and reaped on drop.
pub struct Daemon(pub Child);

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGTERM, then wait for the exit (at most `limit`).
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Ok(Some(st)) = self.0.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `comminsight-agent run --config` for `s`, with `env` added.
pub fn start(s: &Setup, env: &[(&str, &str)]) -> Daemon {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&s.log)
        .unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_comminsight-agent"));
    c.args(["run", "--config"])
        .arg(&s.conf)
        .env_remove("COMMINSIGHT_OTLP_ENABLED")
        // `cargo xtask test` sets it for every other daemon; these tests set [http] themselves.
        .env_remove("COMMINSIGHT_HTTP_LISTEN")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in env {
        c.env(k, v);
    }
    Daemon(c.spawn().expect("start comminsight-agent run"))
}

/// Poll `f` every 50 ms until it gives a value or `limit` passes (then panic naming `what`).
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon's `status.json` once it says ready (`limit` at most).
pub fn ready_status(s: &Setup, limit: Duration) -> serde_json::Value {
    wait_for(&format!("{} ready", s.state.display()), limit, || {
        let b = std::fs::read(s.state.join("status.json")).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
        (v["ready"] == true).then_some(v)
    })
}

/// The daemon's endpoint address, from its ready `status.json`.
pub fn http_addr(s: &Setup) -> String {
    ready_status(s, Duration::from_secs(60))["http"]
        .as_str()
        .expect("the endpoint serves")
        .to_string()
}

/// A sealed segment stream `<logs>/<job>/<host>/<pid>/` of rank `rank`: a ProcStart, one
/// communicator and one AllReduce per entry of `durations_us` (that long on the CPU and on the
/// GPU, 1 MiB each).
pub fn write_stream(logs: &Path, job: &str, host: &str, pid: u32, rank: i32, durations_us: &[u64]) {
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: logs.join(job).join(host).join(pid.to_string()),
            ..SegmentConfig::default()
        },
        pid,
    );
    let mut seq = 0;
    let mut put = |w: &mut SegmentWriter, body: Body| {
        let mut r = Record::new(body).encode();
        r.set_seq(seq);
        seq += 1;
        w.write(&[r]);
    };
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    put(
        &mut w,
        Body::ProcStart(ProcStart {
            pid,
            rank,
            mono_ns: now_ns,
            real_ns: now_ns,
            ..Default::default()
        }),
    );
    put(
        &mut w,
        Body::CommInit(CommInit {
            comm_hash: 5,
            nranks: 2,
            rank,
            comm_name: "dp".into(),
            ..Default::default()
        }),
    );
    // Operation times are on the realtime clock (as the plugin's are), ending now.
    let total: u64 = durations_us.iter().map(|us| us * 1000 + 1_000).sum();
    let mut t = now_ns - total;
    for (i, us) in durations_us.iter().enumerate() {
        put(
            &mut w,
            Body::Coll(OpRecord {
                comm_hash: 5,
                coll_sn: i as u64,
                count: 1 << 18,
                bytes: 1 << 20,
                start_ns: t,
                end_ns: t + us * 1000,
                gpu_start_ns: t,
                gpu_end_ns: t + us * 1000,
                timing: Timing::KernelGpu,
                func: Func::ALL_REDUCE,
                ..Default::default()
            }),
        );
        t += us * 1000 + 1_000;
    }
    w.seal();
}

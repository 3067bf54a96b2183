//! Issue 23: the hostile-user suite of issue 16, against the sources added since — the agent's
//! host streams (eBPF, port and GPU records), EP wait windows, the DCGM endpoint and the NVML
//! library path. A real unprivileged user (`ci-hostile`) does what a job user on a shared host
//! can do, against the root daemon:
//!
//! * plants a `host-*` process directory in the shared log root, claiming to be the agent's
//!   own host stream (an XID on a GPU, a thread blocked), and writes host records and EP rows
//!   at the bounds' edges into its own rank stream;
//! * binds the port `[gpu] dcgm_url` names while dcgm-exporter is down and answers with a body
//!   a byte at a time, one without end, and 105 000 sample lines;
//! * owns the file `[gpu] library` names.
//!
//! Each case asserts that the daemon keeps running and ingesting a healthy job, refuses what
//! it must (saying so in one line naming the path or URL), stays within its memory, and stops
//! promptly. The eBPF maps are not here: the BPF object is built into the agent and no map is
//! pinned, so no user can reach them (SECURITY.md rule 9).
//!
//! Needs root (CI runs as root).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comminsight_tests::hostile::{hostile, Area};
use comminsight_tests::*;
use comminsight_wire::gpu::GpuXid;
use comminsight_wire::record::{Body, EpStats, HostThread, ProcStart, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::RawRecord;

/// The daemon's peak RSS bound under a hostile exporter (KiB): a 16 MiB body parsed, with room.
const RSS_BOUND_KIB: u64 = 256 * 1024;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A synthetic DDP job (4 ranks, 2 hosts) written by the test bed under `out`; its log root.
fn healthy_job(out: &Path) -> PathBuf {
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/ddp.toml");
    testbed(
        out,
        &[
            "--scenario",
            &scenario.display().to_string(),
            "--synthetic",
            "--ranks",
            "4",
            "--steps",
            "3",
            "--job",
            "goodjob",
        ],
        &[],
    )
    .assert_ok();
    out.join("inspector_logs")
}

/// `recs` (seq from 0) as the sealed segments of the process directory `dir`.
fn write_stream(dir: &Path, pid: u32, recs: Vec<Record>) {
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: dir.to_path_buf(),
            max_segment_bytes: 1 << 20,
            max_segment_age: Duration::from_secs(3600),
            retention_bytes: 1 << 30,
        },
        pid,
    );
    let raws: Vec<RawRecord> = recs
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.seq = i as u64;
            r.encode()
        })
        .collect();
    w.write(&raws);
    w.seal();
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn proc_start(pid: u32, rank: i32) -> Record {
    Record::new(Body::ProcStart(ProcStart {
        pid,
        rank,
        local_rank: rank,
        world_size: 8,
        real_ns: now_ns(),
        ..Default::default()
    }))
}

/// What a forger puts in a host stream or its own rank stream: an XID on GPU 0, a thread
/// blocked since the epoch, and EP rows at the bounds' edges (and past them).
fn forged(pid: u32, rank: i32) -> Vec<Record> {
    let t = now_ns();
    let mut v = vec![proc_start(pid, rank)];
    v.push(Record::new(Body::Xid(GpuXid {
        time_ns: t,
        xid: 79,
        pci: 0x0000_1800,
        index: 0,
        source: 0,
    })));
    v.push(Record::new(Body::Thread(HostThread {
        pid,
        tid: pid,
        ..Default::default()
    })));
    for (i, (size, row, value)) in [(4096u16, 4095u16, u64::MAX), (4097, 0, 1), (8, 9, 0)]
        .into_iter()
        .enumerate()
    {
        v.push(Record::new(Body::EpStats(EpStats {
            ep_group_id: 0xe9,
            instance: [7; 16],
            window_seq: i as u64,
            t_start_ns: t,
            t_end_ns: t - 1,
            steps: u32::MAX,
            ep_size: size,
            rank: row,
            count: 5,
            values: [value; 5],
            ..Default::default()
        })));
    }
    v
}

/// A root daemon over `logs` (and the healthy job's root), with `extra` configuration.
struct Daemon {
    child: Child,
    log: PathBuf,
    state: PathBuf,
    archive: PathBuf,
}

impl Daemon {
    fn start(area: &Area, roots: &[&Path], extra: &str) -> Daemon {
        let state = area.private("state");
        let archive = area.private("archive");
        let config = area.0.join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\nstate_dir = {state:?}\nhost_name = \"root-host\"\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
                 [sources]\nshm_enabled = false\nsegment_dirs = {roots:?}\nscan_interval_ms = 100\n\
                 [master]\nlisten = \"\"\n[archive]\ndir = {archive:?}\n[otlp]\nenabled = false\n{extra}",
            ),
        )
        .unwrap();
        let log = area.0.join("agent.log");
        let child = start_agent(&config, &log);
        assert!(
            wait_until(Duration::from_secs(30), || read(&log)
                .contains("comminsight-agent running")),
            "the daemon did not start:\n{}",
            read(&log)
        );
        Daemon {
            child,
            log,
            state,
            archive,
        }
    }

    fn checkpoint(&self) -> String {
        read(&self.state.join("checkpoint.json"))
    }

    /// Archived raw segments whose path contains `what`.
    fn archived(&self, what: &str) -> usize {
        let mut files = Vec::new();
        walk(&self.archive.join("raw"), &mut files);
        files
            .iter()
            .filter(|p| p.to_string_lossy().contains(what))
            .count()
    }

    /// Peak RSS so far (KiB).
    fn peak_rss_kib(&self) -> u64 {
        read(Path::new(&format!("/proc/{}/status", self.child.pid())))
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    fn assert_alive(&mut self) {
        assert!(
            self.child.0.try_wait().unwrap().is_none(),
            "the daemon died:\n{}",
            read(&self.log)
        );
    }

    /// SIGTERM: the daemon stops within 20 s.
    fn stop(mut self) {
        self.assert_alive();
        let t0 = Instant::now();
        // SAFETY: our child, not yet reaped; SIGTERM asks it to stop.
        unsafe { libc::kill(self.child.pid() as libc::pid_t, libc::SIGTERM) };
        assert!(
            wait_until(Duration::from_secs(20), || self
                .child
                .0
                .try_wait()
                .unwrap()
                .is_some()),
            "the daemon did not stop on SIGTERM:\n{}",
            read(&self.log)
        );
        eprintln!("daemon stopped {:?} after SIGTERM", t0.elapsed());
        let text = read(&self.log);
        assert!(!text.contains("panicked"), "{text}");
    }
}

/// The user plants `evil/h/host-1` (a host stream: an XID on GPU 0, a blocked thread, EP rows)
/// in the shared log root and writes the same records into its own rank stream
/// `evil/h/4242`. The daemon follows the rank stream (the user's own job: what its records
/// say costs only that job), refuses the planted host stream in one line naming it — it is
/// neither ingested nor archived — and ingests a healthy job beside them.
#[test]
fn a_planted_host_stream_is_refused_and_a_users_own_host_records_and_ep_rows_cost_only_its_job() {
    let h = hostile();
    let area = Area::new("hostsrc");
    let logs = area.shared("logs");
    let staging = area.0.join("staging");
    write_stream(&staging.join("evil/h/4242"), 4242, forged(4242, 0));
    write_stream(&staging.join("evil/h/host-1"), 1, forged(1, -1));
    std::fs::set_permissions(
        &staging,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    h.chown_tree(&staging);
    h.sh(&area.0, "cp -r staging/evil logs/");
    let good = area.0.join("good");
    let d = Daemon::start(&area, &[&logs, &good.join("inspector_logs")], "");
    healthy_job(&good);
    assert!(
        wait_until(Duration::from_secs(60), || {
            let c = d.checkpoint();
            c.contains("goodjob") && c.contains("4242") && d.archived("goodjob") >= 4
        }),
        "the healthy job and the user's own stream were not both ingested:\n{}",
        read(&d.log)
    );
    std::thread::sleep(Duration::from_secs(1));
    let text = read(&d.log);
    assert!(
        text.lines()
            .any(|l| l.contains("evil/h/host-1") && l.contains("refused")),
        "the daemon does not say it refused the planted host stream:\n{text}"
    );
    assert!(
        !d.checkpoint().contains("host-1"),
        "the planted host stream was followed:\n{}",
        d.checkpoint()
    );
    assert_eq!(
        d.archived("evil/h/host-1"),
        0,
        "the planted stream was archived"
    );
    assert!(
        d.archived("evil/h/4242") >= 1,
        "the user's own stream was not archived"
    );
    d.stop();
}

/// A hostile dcgm-exporter (the user's server on the port `[gpu] dcgm_url` names), in turn:
/// a body a byte at a time, a body without end, a body of 105 000 sample lines. Each scrape
/// ends at `dcgm_timeout_ms` or at 16 MiB, the failure is one line naming the URL, the lines
/// past 100 000 are not parsed, the daemon's peak RSS stays under [`RSS_BOUND_KIB`], and it
/// ingests a healthy job and stops promptly meanwhile.
#[test]
fn a_hostile_exporter_on_the_dcgm_port_costs_only_the_dcgm_fields() {
    let h = hostile();
    let area = Area::new("dcgm");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = area.0.join("exporter.py");
    std::fs::write(&script, EXPORTER).unwrap();
    let served = area.0.join("served");
    std::fs::create_dir_all(&served).unwrap();
    h.chown_tree(&served);
    let _server = Child(
        h.command("/usr/bin/python3", &area.0)
            .arg(&script)
            .arg(port.to_string())
            .arg(&served)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3"),
    );
    // Listening before the daemon's first scrape (else that one fails first and the trickle's
    // failure is not a new line).
    assert!(
        wait_until(Duration::from_secs(20), || served.join("ready").exists()),
        "the exporter did not start"
    );
    let url = format!("http://127.0.0.1:{port}/metrics");
    let good = area.0.join("good");
    let d = Daemon::start(
        &area,
        &[&good.join("inspector_logs")],
        &format!(
            "[gpu]\nenabled = true\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\ndcgm_url = {url:?}\n\
             dcgm_interval_ms = 100\ndcgm_timeout_ms = 500\n"
        ),
    );
    healthy_job(&good);
    // Answers (and `ready`): trickle, endless, lines, endless, lines.
    let answers = || std::fs::read_dir(&served).map_or(0, |r| r.count());
    assert!(
        wait_until(Duration::from_secs(60), || answers() >= 7),
        "the exporter was not scraped through its answers ({}):\n{}",
        answers(),
        read(&d.log)
    );
    assert!(
        wait_until(Duration::from_secs(60), || d
            .checkpoint()
            .contains("goodjob")
            && d.archived("goodjob") >= 4),
        "the healthy job was not ingested:\n{}",
        read(&d.log)
    );
    let text = read(&d.log);
    let said = |what: &str| text.lines().any(|l| l.contains(&url) && l.contains(what));
    assert!(
        said("timed out"),
        "no line naming the URL and the timeout:\n{text}"
    );
    assert!(
        said(&format!("body over {} bytes", 16 << 20)),
        "no line naming the URL and the body bound:\n{text}"
    );
    assert!(
        said("answers again"),
        "the lines body was not taken:\n{text}"
    );
    let peak = d.peak_rss_kib();
    eprintln!(
        "daemon peak RSS under the hostile exporter: {} MiB",
        peak / 1024
    );
    assert!(
        peak < RSS_BOUND_KIB,
        "peak RSS {peak} KiB over {RSS_BOUND_KIB} KiB"
    );
    d.stop();
}

/// The exporter: `python3 exporter.py PORT DIR`, one connection at a time, a file in DIR per
/// answer begun.
const EXPORTER: &str = r##"
import os, socket, sys, time
port, served = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(16)
open(os.path.join(served, "ready"), "w").close()
line = 'DCGM_FI_DEV_SM_CLOCK{gpu="%d",pci_bus_id="00000000:1B:00.0"} 1980\n'
lines = "".join(line % i for i in range(105000)).encode()
n = 0
while True:
    c, _ = s.accept()
    n += 1
    mode = ["trickle", "endless", "lines", "endless"][n - 1] if n <= 4 else "lines"
    open(os.path.join(served, "%06d-%s" % (n, mode)), "w").close()
    try:
        c.recv(65536)
        if mode == "trickle":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
            while True:
                c.sendall(b"#")
                time.sleep(0.02)
        elif mode == "endless":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = lines[:65536]
            framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
            while True:
                c.sendall(framed)
        else:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(lines) + lines)
    except OSError:
        pass
    finally:
        c.close()
"##;

/// `[gpu] library` names a file the user owns (a copy of the NVML stand-in in its scratch
/// directory): the daemon refuses to load it, in one warning naming the path and the fix, and
/// runs on without NVML. `doctor` says the same; a root-owned copy that only root may write
/// loads (the stand-in's GPUs), and the same copy made group-writable is refused.
#[test]
fn an_nvml_library_a_user_owns_or_may_write_is_never_loaded() {
    let h = hostile();
    let area = Area::new("nvml");
    let standin = lib_dir().join("gpu-standin").join("libnvidia-ml.so.1");
    assert!(standin.is_file(), "{} not built", standin.display());
    let user_dir = area.shared("user");
    let theirs = user_dir.join("libnvidia-ml.so.1");
    std::fs::copy(&standin, &theirs).unwrap();
    h.chown_tree(&theirs);
    let ours = area.private("lib").join("libnvidia-ml.so.1");
    std::fs::copy(&standin, &ours).unwrap();
    let doctor = |lib: &Path| -> String {
        let cfg = area
            .0
            .join(format!("doctor-{}.toml", lib.display().to_string().len()));
        std::fs::write(
            &cfg,
            format!("[gpu]\nenabled = true\nlibrary = {lib:?}\n[master]\nlisten = \"\"\n"),
        )
        .unwrap();
        let o = Command::new(bin_dir().join("comminsight-agent"))
            .args(["doctor", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };
    let set_mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    set_mode(&ours, 0o755);
    let ok = doctor(&ours);
    assert!(
        ok.contains("NVML") && ok.contains("GPUs: 0 "),
        "root's copy did not load:\n{ok}"
    );
    set_mode(&ours, 0o775);
    let g = doctor(&ours);
    assert!(g.contains("refused") && g.contains("mode 0775"), "{g}");
    let u = doctor(&theirs);
    assert!(
        u.contains("refused") && u.contains(&format!("owned by uid {}", h.uid)),
        "{u}"
    );

    let good = area.0.join("good");
    let d = Daemon::start(
        &area,
        &[&good.join("inspector_logs")],
        &format!("[gpu]\nenabled = true\nlibrary = {theirs:?}\n"),
    );
    healthy_job(&good);
    assert!(
        wait_until(Duration::from_secs(60), || d
            .checkpoint()
            .contains("goodjob")),
        "the healthy job was not ingested:\n{}",
        read(&d.log)
    );
    let text = read(&d.log);
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains(&theirs.display().to_string())
            && l.contains("refused")
            && l.contains("[gpu] library")),
        "no warning refusing the user's library:\n{text}"
    );
    assert!(!text.contains("GPU metrics: NVML on"), "{text}");
    d.stop();
}

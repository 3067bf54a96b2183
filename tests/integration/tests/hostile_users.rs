//! Issue 16: a root agent that no job user can crash, blind, or turn against the host.
//!
//! A real unprivileged user (created here, `ci-hostile`) plants what a hostile job user can
//! plant on a shared host — symbolic links to root's files in place of a segment and a ring,
//! FIFOs named like a ring and a segment, a per-user ring directory in another user's name,
//! a state directory (`DIR/.comminsight`) pointing at a root-only directory, and an agent of
//! its own that pushes to the root master without the token — against a root daemon and the
//! root CLI. Each case asserts that the agent keeps running, keeps ingesting the other jobs,
//! reads nothing outside the job's own files, writes nothing outside its own directories, and
//! reports what it refused. The plugin-side cases (a foreign `.ctl` file, a pre-created
//! per-user directory met by a real job) run in `hostile_plugin.rs`.
//!
//! Needs root (CI runs as root): creating the user and the root daemon are the point.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use comminsight_tests::hostile::{hostile, Area};
use comminsight_tests::*;

/// A synthetic DDP job (4 ranks, 2 hosts) written by the test bed under `out`; its log root.
fn synthetic_job(out: &Path, job: &str, steps: &str) -> PathBuf {
    testbed(
        out,
        &[
            "--scenario",
            &scenario("ddp.toml"),
            "--synthetic",
            "--ranks",
            "4",
            "--steps",
            steps,
            "--job",
            job,
        ],
        &[],
    )
    .assert_ok();
    out.join("inspector_logs")
}

fn scenario(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(name)
        .display()
        .to_string()
}

/// Every file below `dir` with its bytes (symbolic links as their target), to prove nothing
/// changed there.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(p);
            } else if t.is_symlink() {
                out.push((
                    p.clone(),
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                ));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

/// Run the root CLI with a deadline: a FIFO must not stall it.
fn agent_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(bin_dir().join("comminsight-agent"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start comminsight-agent");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "comminsight-agent {args:?} still ran after {limit:?} (blocked?):\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The root's secret: a valid segment of a job the hostile user must never see, in a
/// directory only root may read, with a host name that would show in any output that read it.
fn plant_secret(area: &Area) -> PathBuf {
    let secret = area.private("secret");
    let job = synthetic_job(&secret.join("run"), "rootsecret", "2");
    let seg = comminsight_wire::segment::find_segments(&job).unwrap()[0].clone();
    let dst = secret.join("seg-000000.cis");
    std::fs::copy(&seg, &dst).unwrap();
    dst
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The root CLI over a log root where the hostile user planted a symbolic link to root's
/// segment and a FIFO named like a segment, next to a healthy job: every command finishes,
/// analyses the healthy job, names what it refused, and shows nothing of the secret.
#[test]
fn the_root_cli_reads_no_planted_link_or_fifo_and_says_so() {
    let h = hostile();
    let area = Area::new("cli");
    let secret = plant_secret(&area);
    let logs = area.shared("logs");
    // The healthy job, as root.
    let good = synthetic_job(&area.0.join("good"), "goodjob", "3");
    std::fs::rename(good.join("goodjob"), logs.join("goodjob")).unwrap();
    h.sh(
        &logs,
        &format!(
            "mkdir -p evil/h/7 evil/h/8 && ln -s {} evil/h/7/seg-000000.cis && mkfifo evil/h/8/seg-000000.cis",
            secret.display()
        ),
    );
    let l = logs.display().to_string();
    for cmd in [
        vec!["dump", l.as_str()],
        vec!["roles", l.as_str()],
        vec!["steps", l.as_str()],
        vec!["hang", l.as_str()],
        vec!["straggler", l.as_str()],
    ] {
        let o = agent_within(&cmd, Duration::from_secs(60));
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        );
        assert!(
            !err.contains("panicked") && o.status.code().is_some(),
            "{cmd:?}: {}\n{err}",
            o.status
        );
        assert!(
            !out.contains("rootsecret") && !err.contains("rootsecret"),
            "{cmd:?} read root's segment through the link:\n{out}\n{err}"
        );
        // `hang` over a healthy job names no job: it says there is no hang.
        assert!(
            out.contains("goodjob") || err.contains("goodjob") || out.contains("no hang"),
            "{cmd:?} did not analyse the healthy job:\n{out}\n{err}"
        );
        let said = format!("{out}\n{err}");
        assert!(
            said.contains("evil/h/7/seg-000000.cis") && said.contains("refused"),
            "{cmd:?} did not say it refused the link:\n{said}"
        );
    }
}

/// A state directory the hostile user points at a root-only directory, or fills with links
/// to root's files: offline commands write nothing through it (the cache is kept in memory)
/// and root's files are unchanged.
#[test]
fn offline_state_is_never_written_through_a_planted_link() {
    let h = hostile();
    let area = Area::new("state");
    let rootonly = area.private("rootonly");
    std::fs::write(rootonly.join("victim"), b"root's file\n").unwrap();
    let before = snapshot(&rootonly);
    // The user's own job directory, with `.comminsight` pointing at root's directory.
    let a = area.0.join("a");
    let logs_a = synthetic_job(&a, "userjob", "3");
    h.chown_tree(&a);
    h.sh(
        &logs_a,
        &format!("ln -s {} .comminsight", rootonly.display()),
    );
    // ... and one whose `.comminsight` is the user's, with links to root's file inside.
    let b = area.0.join("b");
    let logs_b = synthetic_job(&b, "userjob", "3");
    h.chown_tree(&b);
    let v = rootonly.join("victim").display().to_string();
    h.sh(
        &logs_b,
        &format!(
            "mkdir .comminsight && for f in time-index.json steps-calibration.json time-index.json.tmp steps-calibration.json.tmp; do ln -s {v} .comminsight/$f; done"
        ),
    );
    for logs in [&logs_a, &logs_b] {
        let l = logs.display().to_string();
        let trace_out = area.0.join("trace.json").display().to_string();
        for cmd in [
            vec!["trace", l.as_str(), "--out", trace_out.as_str()],
            vec!["steps", l.as_str(), "--calibrate", "apply"],
            vec!["report", l.as_str()],
        ] {
            let o = agent_within(&cmd, Duration::from_secs(60));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!err.contains("panicked"), "{cmd:?}:\n{err}");
            assert_eq!(
                snapshot(&rootonly),
                before,
                "{cmd:?} over {l} changed root's directory through the planted link"
            );
        }
    }
    // The link in `a` is still a link (not replaced by a root-owned directory the user can't
    // remove), and nothing of root's landed in the user's directories.
    assert!(std::fs::symlink_metadata(logs_a.join(".comminsight"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// The root daemon over a log root and shm directory where the hostile user planted links to
/// root's segment and ring, FIFOs named like a ring and a segment, and a per-user ring
/// directory in root's name; plus the user's own agent pushing to the root master without the
/// token. The daemon keeps running and ingesting a healthy job that starts later, archives
/// and ingests nothing of the planted files, says what it refused, refuses every forged push,
/// and stops promptly on SIGTERM.
#[test]
fn the_root_daemon_refuses_planted_files_and_forged_pushes_and_keeps_ingesting() {
    let h = hostile();
    let area = Area::new("daemon");
    let secret = plant_secret(&area);
    let secret_ring = area.0.join("secret").join("x.ring");
    {
        let ring = comminsight_wire::ring::ShmRing::create(&secret_ring, 64).unwrap();
        let rec = comminsight_wire::record::Record::new(comminsight_wire::record::Body::CommFini(
            Default::default(),
        ));
        assert!(ring.push(&rec.encode()));
        drop(ring); // unmapped; the file stays until unlinked
    }
    let logs = area.shared("logs");
    let shm = area.shared("shm");
    let uid = h.uid;
    h.sh(
        &area.0,
        &format!(
            "mkdir -p logs/evil/h/7 logs/evil/h/8 && ln -s {s} logs/evil/h/7/seg-000000.cis && mkfifo logs/evil/h/8/seg-000000.cis \
             && mkdir -m 700 shm/{uid} && ln -s {r} shm/{uid}/evil.h.9.ring && mkfifo shm/{uid}/evil.h.10.ring \
             && mkdir -m 700 shm/0 && ln -s {r} shm/0/evil.h.11.ring && mkfifo shm/evil.h.12.ring",
            s = secret.display(),
            r = secret_ring.display(),
        ),
    );
    let state = area.private("state");
    let archive = area.private("archive");
    let good_root = area.0.join("good");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = area.0.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\nhost_name = \"root-host\"\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_dir = {shm:?}\nsegment_dirs = [{logs:?}, {good:?}]\nscan_interval_ms = 100\n\
             [master]\nlisten = \"127.0.0.1:{port}\"\n[archive]\ndir = {archive:?}\n[otlp]\nenabled = false\n",
            good = good_root.join("inspector_logs"),
        ),
    )
    .unwrap();
    let log = area.0.join("agent.log");
    let mut daemon = start_agent(&config, &log);
    assert!(
        wait_until(Duration::from_secs(30), || read(&log)
            .contains("comminsight-agent running")),
        "the daemon did not start:\n{}",
        read(&log)
    );
    // A healthy job starts after the plants.
    synthetic_job(&good_root, "goodjob", "3");

    // The user's own agent, joining the root master with no token (the generated one is
    // root's, 0600): its clock requests and pushes are refused.
    let token = state.join("master.token");
    assert!(wait_until(Duration::from_secs(10), || token.exists()));
    let o = Command::new("cat")
        .arg(&token)
        .uid(h.uid)
        .gid(h.gid)
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "the hostile user can read the master's token"
    );
    let ua = area.0.join("user-agent");
    let ulogs = synthetic_job(&ua.join("run"), "forged", "3");
    std::fs::write(
        ua.join("agent.toml"),
        format!(
            "[agent]\nstate_dir = {st:?}\nhost_name = \"forger\"\n[sources]\nshm_enabled = false\nsegment_dirs = [{ulogs:?}]\n\
             [master]\nlisten = \"\"\naddress = \"127.0.0.1:{port}\"\n[archive]\nenabled = false\n[otlp]\nenabled = false\n[clock]\nsync_interval_s = 1\n",
            st = ua.join("state"),
        ),
    )
    .unwrap();
    h.chown_tree(&ua);
    let ulog = ua.join("agent.log");
    let agent_bin = area.0.join("comminsight-agent");
    if std::fs::hard_link(bin_dir().join("comminsight-agent"), &agent_bin).is_err() {
        std::fs::copy(bin_dir().join("comminsight-agent"), &agent_bin).unwrap();
    }
    let _forger = Child(
        Command::new(&agent_bin)
            .args(["run", "--config"])
            .arg(ua.join("agent.toml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&ulog).unwrap())
            .uid(h.uid)
            .gid(h.gid)
            .spawn()
            .unwrap(),
    );

    let ckpt = || read(&state.join("checkpoint.json"));
    assert!(
        wait_until(Duration::from_secs(60), || ckpt().contains("goodjob")
            && archived(&archive, "goodjob") >= 4),
        "the healthy job was not ingested and archived beside the plants:\n{}",
        read(&log)
    );
    assert!(
        wait_until(Duration::from_secs(30), || read(&log)
            .contains("refused Push")
            || read(&log).contains("refused Time")),
        "no refusal of the forged agent in the master's log:\n{}\nforger:\n{}",
        read(&log),
        read(&ulog)
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        daemon.0.try_wait().unwrap().is_none(),
        "the daemon died:\n{}",
        read(&log)
    );
    let text = read(&log);
    for planted in [
        "evil/h/7/seg-000000.cis",
        "evil/h/8/seg-000000.cis",
        &format!("shm/{uid}/evil.h.9.ring"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains(planted) && l.contains("refused")),
            "the daemon does not say it refused {planted}:\n{text}"
        );
    }
    assert_eq!(archived(&archive, "evil"), 0, "a planted file was archived");
    assert_eq!(archived(&archive, "rootsecret"), 0);
    assert!(!ckpt().contains("rootsecret"));
    // Nothing from the forger in the master's store.
    let store = state.join("master");
    let stored = snapshot_or_empty(&store);
    assert!(
        stored
            .iter()
            .all(|(p, _)| !p.to_string_lossy().contains("forged")),
        "the master stored a forged push: {stored:?}"
    );
    // SIGTERM: a prompt, clean stop (no FIFO holds it).
    let t0 = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &daemon.pid().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(
        wait_until(Duration::from_secs(20), || daemon
            .0
            .try_wait()
            .unwrap()
            .is_some()),
        "the daemon did not stop on SIGTERM:\n{}",
        read(&log)
    );
    eprintln!("daemon stopped {:?} after SIGTERM", t0.elapsed());
}

/// Archived raw segments whose path names `what`.
fn archived(archive: &Path, what: &str) -> usize {
    snapshot_or_empty(&archive.join("raw"))
        .iter()
        .filter(|(p, _)| p.to_string_lossy().contains(what))
        .count()
}

fn snapshot_or_empty(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    if dir.is_dir() {
        snapshot(dir)
    } else {
        Vec::new()
    }
}

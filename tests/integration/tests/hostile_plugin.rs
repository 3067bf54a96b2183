//! Issue 16, the plugin's side: real jobs on the CPU test bed meet what a hostile local user can
//! do to the shared-memory directory. A per-user ring directory pre-created in the job user's
//! name is refused (the job runs on with a private ring and says so; nothing is written there);
//! the hostile user cannot place a control file in another user's ring directory; and a control
//! file of a foreign owner (placed by root, standing in for a weakened directory) is ignored and
//! counted, while the owner's own control file is obeyed and counted.
//!
//! Needs root (CI runs as root): the job user is root, the hostile user `ci-hostile`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use comminsight_tests::*;

fn hostile() -> (u32, u32) {
    hostile_user()
}

fn as_hostile(uid: u32, gid: u32, script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap()
}

/// `/tmp/ci-hostile-plugin-<name>-<pid>` with a sticky, world-writable `shm` (like `/dev/shm`).
struct Area(PathBuf);

impl Area {
    fn new(name: &str) -> Area {
        let p = PathBuf::from(format!(
            "/tmp/ci-hostile-plugin-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("shm")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(p.join("shm"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        Area(p)
    }
    fn shm(&self) -> PathBuf {
        self.0.join("shm")
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A real 2-rank DDP job of `steps` steps (root's), its output directory.
fn job(area: &Area, name: &str, steps: u32) -> std::process::Child {
    Command::new(bin_dir().join("comminsight-testbed"))
        .arg("run")
        .arg("--out")
        .arg(area.0.join(name))
        .args(["--scenario", &scenario(), "--ranks", "2", "--hosts", "1"])
        .args(["--steps", &steps.to_string(), "--job", name])
        .env("COMMINSIGHT_LIB_DIR", lib_dir())
        .env("COMMINSIGHT_SHM_DIR", area.shm())
        .env("NCCL_DEBUG", "WARN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the test bed")
}

fn scenario() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/ddp.toml")
        .display()
        .to_string()
}

/// Collectives recorded per rank, from the job's segments.
fn colls_per_rank(out: &Path) -> Vec<usize> {
    let recs = records(&out.join("inspector_logs"));
    let mut by_pid: std::collections::BTreeMap<u32, usize> = Default::default();
    let mut pid = 0;
    for r in &recs {
        if let comminsight_wire::record::Body::ProcStart(p) = &r.body {
            pid = p.pid;
        }
        if matches!(r.body, comminsight_wire::record::Body::Coll(_)) {
            *by_pid.entry(pid).or_default() += 1;
        }
    }
    by_pid.into_values().collect()
}

/// The summary of `dump --summary --json` over a job's segments.
fn summary(out: &Path) -> serde_json::Value {
    let o = agent(&[
        "dump",
        &out.join("inspector_logs").display().to_string(),
        "--summary",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("dump --summary --json")
}

fn rank_logs(out: &Path) -> String {
    let mut s = String::new();
    for e in std::fs::read_dir(out.join("ranks")).unwrap().flatten() {
        s.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
    }
    s
}

#[test]
fn a_per_user_directory_pre_created_by_another_user_is_refused_and_the_job_runs_on() {
    let _serial = one_job_at_a_time();
    let (uid, gid) = hostile();
    let area = Area::new("precreated");
    let mine = area.shm().join("0");
    let o = as_hostile(uid, gid, &format!("mkdir -m 700 {}", mine.display()));
    assert!(o.status.success());
    let mut j = job(&area, "victim", 5);
    assert!(j.wait().unwrap().success(), "the job failed");
    let out = area.0.join("victim");
    let logs = rank_logs(&out);
    assert!(
        logs.contains("CommInsight") && logs.contains(&format!("{} refused", mine.display())),
        "the plugin does not say it refused the directory:\n{logs}"
    );
    // Nothing of the job in the hostile user's directory; the job is still recorded on disk.
    assert_eq!(std::fs::read_dir(&mine).unwrap().count(), 0);
    let colls = colls_per_rank(&out);
    assert_eq!(colls.len(), 2, "{colls:?}");
    assert!(colls.iter().all(|&c| c > 0), "{colls:?}");
}

#[test]
fn a_foreign_control_file_is_ignored_and_counted_and_the_owners_is_obeyed() {
    let _serial = one_job_at_a_time();
    let (uid, gid) = hostile();
    const STEPS: u32 = 1200;
    let mut results = Vec::new();
    for foreign in [true, false] {
        let area = Area::new(if foreign { "ctl-foreign" } else { "ctl-own" });
        let mut j = job(&area, "ctljob", STEPS);
        let dir = area.shm().join("0");
        let rings = || -> Vec<PathBuf> {
            std::fs::read_dir(&dir)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "ring"))
                        .collect()
                })
                .unwrap_or_default()
        };
        assert!(
            wait_until(Duration::from_secs(30), || rings().len() == 2),
            "no rings in {}",
            dir.display()
        );
        assert_eq!(
            std::fs::metadata(&dir).unwrap().mode() & 0o777,
            0o700,
            "the per-user directory is private"
        );
        for ring in rings() {
            let mut ctl = ring.clone().into_os_string();
            ctl.push(".ctl");
            let ctl = PathBuf::from(ctl);
            // The hostile user cannot even place one: the directory is root's, 0700.
            let o = as_hostile(uid, gid, &format!("echo event_mask=0 > {}", ctl.display()));
            assert!(
                !o.status.success(),
                "the hostile user wrote into root's ring directory"
            );
            std::fs::write(&ctl, "event_mask=0\n").unwrap();
            if foreign {
                std::os::unix::fs::chown(&ctl, Some(uid), Some(gid)).unwrap();
            }
        }
        assert!(j.wait().unwrap().success(), "the job failed");
        let out = area.0.join("ctljob");
        let s = summary(&out);
        let procs = s["processes"].as_array().expect("processes").clone();
        assert_eq!(procs.len(), 2, "{s}");
        results.push((foreign, colls_per_rank(&out), procs));
    }
    let (_, full, foreign_procs) = &results[0];
    let (_, obeyed, own_procs) = &results[1];
    for p in foreign_procs {
        assert_eq!(
            p["mask_changes"], 0,
            "a foreign control file changed the mask: {p}"
        );
        assert!(p["ctl_refused"].as_u64().unwrap() >= 1, "not counted: {p}");
    }
    for p in own_procs {
        assert!(
            p["mask_changes"].as_u64().unwrap() >= 1,
            "the owner's file was not obeyed: {p}"
        );
        assert_eq!(p["ctl_refused"], 0, "{p}");
    }
    // Ignored: every collective of every step recorded; obeyed: recording stopped early.
    assert!(full[0] >= STEPS as usize, "{full:?}");
    assert!(full.iter().all(|&c| c == full[0]), "{full:?}");
    assert!(
        obeyed.iter().all(|&c| c < full[0] * 9 / 10),
        "event_mask=0 from the owner did not stop recording: {obeyed:?} vs {full:?}"
    );
}

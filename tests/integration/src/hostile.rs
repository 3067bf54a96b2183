//! The hostile user of the hostile-user suites (`tests/hostile_users.rs`,
//! `tests/hostile_sources.rs`): a real unprivileged account and a scratch area it can reach.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::hostile_user;

/// The user's name.
pub const USER: &str = "ci-hostile";

/// The unprivileged user, created once (idempotent).
pub struct Hostile {
    pub uid: u32,
    pub gid: u32,
}

pub fn hostile() -> Hostile {
    let (uid, gid) = hostile_user();
    Hostile { uid, gid }
}

impl Hostile {
    /// `sh -c script` as the user (no supplementary groups); it must succeed.
    pub fn sh(&self, cwd: &Path, script: &str) -> Output {
        let o = self.command("sh", cwd).arg("-c").arg(script).output();
        let o = o.expect("run sh as the hostile user");
        assert!(
            o.status.success(),
            "as {USER}: {script}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }
    /// `program` run as the user in `cwd`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>, cwd: &Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(cwd).uid(self.uid).gid(self.gid);
        c
    }
    pub fn chown_tree(&self, p: &Path) {
        let s = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", self.uid, self.gid))
            .arg(p)
            .status()
            .unwrap();
        assert!(s.success());
    }
}

/// `/tmp/ci-hostile-<name>-<pid>`: reachable by the user (a clean clone's target dir may not
/// be), removed when dropped.
pub struct Area(pub PathBuf);

impl Area {
    pub fn new(name: &str) -> Area {
        let p = PathBuf::from(format!("/tmp/ci-hostile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Area(p)
    }
    /// A directory anyone may create entries in (sticky, like /tmp and a shared scratch).
    pub fn shared(&self, rel: &str) -> PathBuf {
        let d = self.0.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        d
    }
    /// A directory only root may read.
    pub fn private(&self, rel: &str) -> PathBuf {
        let d = self.0.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        if std::env::var_os("COMMINSIGHT_KEEP_TEST_OUTPUT").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

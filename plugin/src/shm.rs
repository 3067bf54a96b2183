//! This process' ring file: `<shm_dir>/<euid>/<job>.<host>.<pid>.ring` in the per-user ring
//! directory ([`comminsight_wire::ring::UserDir`]: created 0700, owner and mode checked, the
//! shared parent created 01777 if missing), created relative to the opened directory. If that
//! name is taken (a restarted runtime, a stale file of a recycled pid):
//! `<job>.<host>.<pid>.<start#>-<ns>.ring`. If the directory is refused (pre-created by another
//! user, wrong mode, a symlink) or shared memory is unusable, the process keeps a private ring
//! (segments are still written, no live feed), counts it (`shm_fallbacks`) and logs one WARN line
//! naming the path, what was found and the fix.

use std::sync::atomic::Ordering;

use comminsight_wire::ring::{ShmRing, UserDir};

use crate::abi::LOG_WARN;
use crate::core::Shared;
use crate::sys;

/// The ring for run `starts` of this runtime: shared if possible, else private (`None` only when
/// even private memory cannot be mapped).
pub fn create_ring(sh: &Shared, starts: u64, cap: usize) -> Option<ShmRing> {
    match shared_ring(sh, starts, cap) {
        Ok(r) => Some(r),
        Err(why) => {
            sh.counters.shm_fallbacks.fetch_add(1, Ordering::Relaxed);
            sh.log(
                LOG_WARN,
                &format!("CommInsight: shared-memory ring unavailable ({why}); using private memory, no live agent feed"),
            );
            ShmRing::private(cap).ok()
        }
    }
}

/// The shared ring in this user's checked ring directory, or why not (one line).
pub fn shared_ring(sh: &Shared, starts: u64, cap: usize) -> Result<ShmRing, String> {
    let dir = UserDir::open(&sh.cfg.shm_dir).map_err(|e| e.to_string())?;
    let name = sh.cfg.ring_name(sh.pid);
    match ShmRing::create_in(&dir, &name, cap) {
        Ok(r) => Ok(r),
        Err(first) => {
            let alt = format!(
                "{}.{}.{}.{starts}-{}.ring",
                sh.cfg.job,
                sh.cfg.host,
                sh.pid,
                sys::real_ns()
            );
            ShmRing::create_in(&dir, &alt, cap).map_err(|_| first.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fixture, small_cfg};
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn setup(tag: &str) -> (Dir, &'static Shared) {
        let root = std::env::temp_dir().join(format!(
            "ci-shm-{tag}-{}-{}",
            std::process::id(),
            sys::real_ns()
        ));
        let mut cfg = small_cfg();
        cfg.shm_dir = root.join("shm");
        cfg.job = "j".into();
        cfg.host = "h".into();
        let (sh, _) = fixture(cfg);
        (Dir(root), sh)
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_ring_goes_into_a_0700_directory_of_our_uid_then_an_alternative_name() {
        let (_d, sh) = setup("ok");
        let r = create_ring(sh, 1, 64).unwrap();
        let mine = sh.cfg.shm_dir.join(sys::euid().to_string());
        let want = sh.cfg.ring_path(sh.pid, sys::euid());
        assert_eq!(r.path(), Some(want.as_path()));
        assert_eq!(want.parent(), Some(mine.as_path()));
        assert_eq!(
            (mode(&sh.cfg.shm_dir), mode(&mine), mode(&want)),
            (0o1777, 0o700, 0o600)
        );
        // The name is taken: the restart name, in the same directory.
        let r2 = create_ring(sh, 2, 64).unwrap();
        let p2 = r2.path().unwrap();
        assert_eq!(p2.parent(), Some(mine.as_path()));
        let n2 = p2.file_name().unwrap().to_str().unwrap();
        assert!(
            n2.starts_with(&format!("j.h.{}.2-", sh.pid)) && n2.ends_with(".ring"),
            "{n2}"
        );
        assert_eq!(sh.counters.shm_fallbacks.load(Ordering::Relaxed), 0);
        r.unlink();
        r2.unlink();
    }

    #[test]
    fn a_pre_created_directory_is_refused_for_a_private_ring_and_said_so() {
        let (_d, sh) = setup("refused");
        comminsight_wire::ring::ensure_shared_dir(&sh.cfg.shm_dir).unwrap();
        let mine = sh.cfg.shm_dir.join(sys::euid().to_string());
        std::fs::create_dir(&mine).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = shared_ring(sh, 1, 64).unwrap_err();
        assert!(
            why.contains(&mine.display().to_string()) && why.contains("mode 0777"),
            "{why}"
        );
        let r = create_ring(sh, 1, 64).unwrap();
        assert!(r.path().is_none(), "private ring");
        assert_eq!(sh.counters.shm_fallbacks.load(Ordering::Relaxed), 1);
        // Another user's directory, even with the right mode.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&mine, Some(12345), Some(12345)).unwrap();
        let why = shared_ring(sh, 1, 64).unwrap_err();
        assert!(
            why.contains("owned by uid 12345") && why.contains("rm -rf"),
            "{why}"
        );
        assert!(create_ring(sh, 2, 64).unwrap().path().is_none());
        assert_eq!(sh.counters.shm_fallbacks.load(Ordering::Relaxed), 2);
        assert!(
            std::fs::read_dir(&mine).unwrap().next().is_none(),
            "nothing written in it"
        );
    }
}

//! Doctor checks of the directories the agent and the plugin use, and of `/dev/shm` space.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{fail, ok, warn, Check, DoctorEnv};
use crate::config::AgentConfig;

pub(super) fn nearest_existing(p: &Path) -> Option<&Path> {
    p.ancestors().find(|a| a.exists())
}

/// Free bytes of the file system holding `p` (statvfs).
fn free_bytes(p: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable memory of the right
    // type; statvfs only writes into it and we read it only after it reported success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let st = unsafe { st.assume_init() };
    #[allow(
        clippy::unnecessary_cast,
        reason = "fsblkcnt_t and c_ulong are 32-bit on some targets"
    )]
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    Some(free)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
}

pub(super) fn shm_space(cfg: &AgentConfig, env: &DoctorEnv) -> Check {
    let name = "shm_space";
    let need = env.ranks_per_host.saturating_mul(env.ring_bytes);
    let Some(at) = nearest_existing(&cfg.sources.shm_dir) else {
        return fail(
            name,
            format!("no directory of {} exists", cfg.sources.shm_dir.display()),
            "mount /dev/shm (tmpfs)",
        );
    };
    match free_bytes(at) {
        None => warn(name, format!("cannot statvfs {}", at.display()), "check the mount by hand: df -h /dev/shm"),
        Some(free) if free >= need => ok(
            name,
            format!("{} free at {} >= {} ranks x {} ring", mib(free), at.display(), env.ranks_per_host, mib(env.ring_bytes)),
        ),
        Some(free) => fail(
            name,
            format!("{} free at {} < {} ranks x {} ring = {}", mib(free), at.display(), env.ranks_per_host, mib(env.ring_bytes), mib(need)),
            format!("enlarge it (mount -o remount,size={}M /dev/shm) or lower COMMINSIGHT_RING_BYTES in the jobs", (need >> 20) * 2 + 64),
        ),
    }
}

pub(super) fn shm_dir(dir: &Path) -> Check {
    let name = "shm_dir";
    match fs::metadata(dir) {
        Err(_) => warn(
            name,
            format!(
                "{} does not exist yet (the first plugin creates it)",
                dir.display()
            ),
            format!(
                "create it now so every user's job can: install -d -m 1777 {}",
                dir.display()
            ),
        ),
        Ok(m) if !m.is_dir() => fail(
            name,
            format!("{} is not a directory", dir.display()),
            format!(
                "remove it; the plugin creates the directory: rm {}",
                dir.display()
            ),
        ),
        Ok(m) if m.permissions().mode() & 0o7777 != 0o1777 => fail(
            name,
            format!(
                "{} has mode {:04o}, not 1777: jobs of other users cannot create their rings",
                dir.display(),
                m.permissions().mode() & 0o7777
            ),
            format!("chmod 1777 {}", dir.display()),
        ),
        Ok(_) => ok(name, format!("{} exists with mode 1777", dir.display())),
    }
}

pub(super) fn segment_dir(dir: &Path) -> Check {
    let name = "segment_dir";
    match fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => warn(
            name,
            format!("{} does not exist: no sealed segments to ingest", dir.display()),
            format!("create it for the jobs (COMMINSIGHT_LOG_DIR): install -d -m 1777 {}", dir.display()),
        ),
        Err(e) => fail(name, format!("{}: cannot list: {e}", dir.display()), "give the agent read access (CAP_DAC_READ_SEARCH in the systemd unit) or fix sources.segment_dirs"),
        Ok(_) => {
            let mode = fs::metadata(dir).map(|m| m.permissions().mode()).unwrap_or(0);
            if mode & 0o002 == 0 {
                warn(
                    name,
                    format!("{} is readable but mode {:04o} lets only its owner's jobs write segments", dir.display(), mode & 0o7777),
                    format!("chmod 1777 {} if jobs of several users run here", dir.display()),
                )
            } else {
                ok(name, format!("{} readable, writable by the jobs", dir.display()))
            }
        }
    }
}

pub(super) fn writable_dir(name: &str, dir: &Path) -> Check {
    if dir.is_dir() {
        let probe = dir.join(format!(".comminsight-doctor-{}", std::process::id()));
        return match fs::write(&probe, b"") {
            Ok(()) => {
                let _ = fs::remove_file(&probe);
                ok(name, format!("{} writable", dir.display()))
            }
            Err(e) => fail(
                name,
                format!("{}: not writable: {e}", dir.display()),
                format!(
                    "run the agent as the systemd unit (it owns {0}) or chown/chmod {0}",
                    dir.display()
                ),
            ),
        };
    }
    if dir.exists() {
        return fail(
            name,
            format!("{} exists but is not a directory", dir.display()),
            format!(
                "move it away; the agent keeps its files in the directory {}",
                dir.display()
            ),
        );
    }
    let parent = nearest_existing(dir).map_or_else(|| "/".into(), |p| p.display().to_string());
    warn(
        name,
        format!("{} does not exist (nearest existing: {parent})", dir.display()),
        format!("the systemd unit creates /var/lib/comminsight (StateDirectory=); otherwise: install -d -m 0750 {}", dir.display()),
    )
}

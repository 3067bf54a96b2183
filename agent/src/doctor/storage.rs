//! Doctor checks of the directories the agent and the plugin use, and of `/dev/shm` space.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
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

/// The shared shm directory: root-owned, mode 1777 (sticky, like /tmp). The agent creates it so
/// at start; plugins refuse one owned by another user, or writable by others but not sticky.
pub(super) fn shm_dir(dir: &Path) -> Check {
    let name = "shm_dir";
    let d = dir.display();
    let m = match fs::symlink_metadata(dir) {
        Err(_) => {
            return warn(
                name,
                format!("{d} does not exist yet"),
                format!("start the agent, which creates it root-owned with mode 1777 (or as root: install -d -o root -m 1777 {d}); never create it as a job user"),
            )
        }
        Ok(m) => m,
    };
    let mode = m.permissions().mode() & 0o7777;
    if !m.file_type().is_dir() {
        return fail(
            name,
            format!("{d} is not a directory"),
            format!(
                "remove it and let the agent create the directory: rm {d}, then restart the agent"
            ),
        );
    }
    if m.uid() != 0 {
        return fail(
            name,
            format!("{d} is owned by uid {}, not root: that user could replace other users' ring directories, and plugins of other users refuse it", m.uid()),
            format!("remove it and let the agent create it: rm -rf {d}, then restart the agent"),
        );
    }
    if mode != 0o1777 {
        return fail(
            name,
            format!("{d} has mode {mode:04o}, not 1777: jobs of other users cannot create their ring directories (or, without the sticky bit, may remove each other's)"),
            format!("chmod 1777 {d}"),
        );
    }
    ok(name, format!("{d} root-owned with mode 1777"))
}

/// Entries of the shm directory that plugins and the agent refuse: anything but directories
/// `<uid>` owned by that uid with mode 0700 (see `sources::discovery`). `None` if it cannot be
/// listed (the `shm_dir` check reports that).
pub(super) fn shm_user_dirs(dir: &Path) -> Option<Check> {
    let name = "shm_user_dirs";
    let rd = fs::read_dir(dir).ok()?;
    let (mut good, mut bad) = (0usize, Vec::new());
    for e in rd.flatten() {
        let Ok(m) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        let n = e.file_name().to_string_lossy().into_owned();
        let uid = n.parse::<u32>().ok().filter(|u| u.to_string() == n);
        let problem = match uid {
            None => Some(format!(
                "not a per-user directory (mode {:04o}, uid {})",
                m.mode() & 0o7777,
                m.uid()
            )),
            Some(uid) => comminsight_wire::ring::user_dir_problem(&m, uid),
        };
        match problem {
            None => good += 1,
            Some(why) => bad.push(format!("{} ({why})", e.path().display())),
        }
    }
    if bad.is_empty() {
        return Some(ok(
            name,
            format!("{good} per-user ring directories, each owned by its uid with mode 0700"),
        ));
    }
    bad.sort();
    let n = bad.len();
    bad.truncate(5);
    Some(warn(
        name,
        format!("{n} entries the plugins and the agent refuse (their rings are not followed): {}", bad.join("; ")),
        "remove them (rm -rf PATH as root); each job user's plugin recreates its own directory <uid>/ with mode 0700",
    ))
}

/// Process directories `<root>/<job>/<host>/<pid>` open to group or others (plugins before
/// issue 16 made them 0755): at most `limit` looked at.
fn open_process_dirs(root: &Path, limit: usize) -> (usize, Vec<String>) {
    let mut seen = 0;
    let mut open = Vec::new();
    let subdirs = |d: &Path| -> Vec<std::path::PathBuf> {
        fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    for job in subdirs(root) {
        for host in subdirs(&job) {
            for pid in subdirs(&host) {
                if seen >= limit {
                    return (seen, open);
                }
                seen += 1;
                let mode = fs::symlink_metadata(&pid).map_or(0, |m| m.mode());
                if mode & 0o077 != 0 {
                    open.push(format!("{} ({:04o})", pid.display(), mode & 0o7777));
                }
            }
        }
    }
    (seen, open)
}

/// A segment root: readable by the agent; shared by several users only as 1777 (sticky); its
/// process directories private (0700: the plugin creates them so, with files 0600).
pub(super) fn segment_dir(dir: &Path) -> Check {
    let name = "segment_dir";
    let d = dir.display();
    match fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => warn(
            name,
            format!("{d} does not exist: no sealed segments to ingest"),
            format!("create it for the jobs (COMMINSIGHT_LOG_DIR): as root, install -d -m 1777 {d} if jobs of several users share it, else let the job create it (0700)"),
        ),
        Err(e) => fail(name, format!("{d}: cannot list: {e}"), "give the agent read access (CAP_DAC_READ_SEARCH in the systemd unit) or fix sources.segment_dirs"),
        Ok(_) => {
            let mode = fs::metadata(dir).map(|m| m.permissions().mode()).unwrap_or(0);
            if mode & 0o002 != 0 && mode & 0o1000 == 0 {
                return fail(
                    name,
                    format!("{d} has mode {:04o}: writable by everyone but not sticky, so users may remove or replace each other's job directories", mode & 0o7777),
                    format!("chmod 1777 {d}"),
                );
            }
            let (seen, open) = open_process_dirs(dir, 10_000);
            if !open.is_empty() {
                let n = open.len();
                return warn(
                    name,
                    format!("{n} of {seen} process directories under {d} are open to other users (communicator metadata readable): {}", open[..n.min(3)].join(", ")),
                    format!("chmod 0700 them (e.g. find {d} -mindepth 3 -maxdepth 3 -type d -exec chmod 0700 {{}} +); plugins create new ones 0700 with files 0600"),
                );
            }
            if mode & 0o002 == 0 {
                warn(
                    name,
                    format!("{d} is readable but mode {:04o} lets only its owner's jobs write segments", mode & 0o7777),
                    format!("chmod 1777 {d} if jobs of several users run here"),
                )
            } else {
                ok(name, format!("{d} readable, writable by the jobs, sticky; {seen} process directories, all private"))
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

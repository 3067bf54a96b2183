//! Finding process streams: segment directories under log roots and rings in the shm directory.
//!
//! Rings live in per-user directories `<shm_dir>/<uid>/` (docs/contracts.md "Shared-memory
//! ring"; the plugin creates them, see `comminsight_wire::ring::UserDir`). Discovery looks only
//! in entries of `shm_dir` named by a decimal uid that are real directories (`lstat`: a symlink
//! is not followed) owned by that uid with no group or other access, and in them only at names
//! ending `.ring` that are regular files by `lstat` (FIFOs, sockets, symlinks skipped). Anything
//! else in `shm_dir` (files, FIFOs, foreign-owned or wrong-mode per-user directories, rings of
//! plugins older than this layout) is skipped: one WARN per path and a count
//! ([`Discovery::refused`], [`Discovery::take_refusals`]). Each ring found carries the uid of its
//! directory ([`DiscoveredStream::ring_owner`]) so the cursor can require the ring file to match.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comminsight_wire::ring::{ensure_shared_dir, shared_dir_problem, user_dir_problem};
use comminsight_wire::segment::parse_segment_name;

use super::SourcesConfig;
use crate::host::context::HOST_STREAM_PREFIX;
use crate::stream::StreamId;

/// One process stream found by [`Discovery::scan`]: its segment directory and/or its newest ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredStream {
    pub id: StreamId,
    /// `<root>/<job>/<host>/<pid>`, when it exists.
    pub seg_dir: Option<PathBuf>,
    /// The newest ring of the process, when one exists.
    pub ring: Option<PathBuf>,
    /// The uid owning the per-user directory `<shm_dir>/<uid>/` the ring was found in: the ring
    /// file (and the process' segment directory) must belong to it.
    pub ring_owner: Option<u32>,
}

/// A ring file name, parsed: `<job>.<host>.<pid>.ring` or `<job>.<host>.<pid>.<start>-<ns>.ring`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingName {
    /// `<job>.<host>`, not yet split (both may contain dots).
    pub job_host: String,
    pub pid: String,
    /// `(start#, ns)` for a restarted runtime's ring; `None` for the plain name.
    pub restart: Option<(u64, u64)>,
}

impl RingName {
    /// Order of recency: the plain name first, then restarts by creation time.
    fn recency(&self) -> (u64, u64) {
        self.restart.map_or((0, 0), |(s, ns)| (ns, s))
    }

    /// Every `(job, host)` split of `job_host`, first dot first.
    pub fn splits(&self) -> impl Iterator<Item = (&str, &str)> {
        self.job_host
            .match_indices('.')
            .map(|(i, _)| (&self.job_host[..i], &self.job_host[i + 1..]))
            .filter(|(j, h)| !j.is_empty() && !h.is_empty())
    }
}

/// Parse a ring file name from the right: `.ring`, then an optional `<start>-<ns>`, then the pid.
pub fn parse_ring_name(name: &str) -> Option<RingName> {
    let stem = name.strip_suffix(".ring")?;
    let (rest, last) = stem.rsplit_once('.')?;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (rest, pid, restart) = if numeric(last) {
        (rest, last, None)
    } else {
        let (s, ns) = last.split_once('-')?;
        if !numeric(s) || !numeric(ns) {
            return None;
        }
        let (rest, pid) = rest.rsplit_once('.')?;
        if !numeric(pid) {
            return None;
        }
        (rest, pid, Some((s.parse().ok()?, ns.parse().ok()?)))
    };
    if !rest.contains('.') {
        return None;
    }
    Some(RingName {
        job_host: rest.to_string(),
        pid: pid.to_string(),
        restart,
    })
}

/// Finds process streams under the configured segment roots and shm directory. Missing
/// directories give empty results; unreadable ones are reported once (tracing), never fatal.
#[derive(Debug)]
pub struct Discovery {
    roots: Vec<PathBuf>,
    /// The agent's own host-stream root ([`Discovery::with_host_root`]): `host-*` process
    /// directories are taken from it only.
    host_root: Option<PathBuf>,
    shm_dir: Option<PathBuf>,
    /// Only streams of these hosts (empty: all).
    hosts: Vec<String>,
    reported: HashSet<PathBuf>,
    /// When each ring with an ambiguous name (`<job>.<host>` with more than one dot) and no
    /// segment directory yet was first seen.
    ambiguous_since: HashMap<PathBuf, Instant>,
    /// Entries skipped by the last scan, and why (with the fix).
    refused_now: HashMap<PathBuf, Refusal>,
    /// Refusals new since the last [`Discovery::take_refusals`].
    refusals: Vec<(PathBuf, String)>,
    /// Refusals counted so far (a path counts again when it reappears after having gone).
    refused: u64,
}

/// How long a ring whose `<job>.<host>` splits more than one way waits for its process'
/// segment directory before it is followed under the first split: the plugin creates the ring
/// first and the directory a moment later, and a stream taken under the wrong split would be
/// a second id for the same process (its records counted under both).
pub const AMBIGUOUS_RING_GRACE: Duration = Duration::from_secs(2);

impl Discovery {
    /// A discovery over `cfg.segment_dirs` and (when `cfg.shm_enabled`) `cfg.shm_dir`.
    pub fn new(cfg: &SourcesConfig) -> Discovery {
        Discovery {
            roots: cfg.segment_dirs.clone(),
            host_root: None,
            shm_dir: cfg.shm_enabled.then(|| cfg.shm_dir.clone()),
            hosts: cfg.hosts.clone(),
            reported: HashSet::new(),
            ambiguous_since: HashMap::new(),
            refused_now: HashMap::new(),
            refusals: Vec::new(),
            refused: 0,
        }
    }

    /// The live daemon: `root` (one of the segment roots) is the agent's own host-stream
    /// directory (`<state_dir>/host-streams`, root's). Host streams — process directories named
    /// `host-*`, whose records the engine takes as the agent's own observations of the host — are
    /// then read from it only: one under a log root a job user can write to is a forgery and is
    /// refused like a planted file. Offline commands set none (their input is the operator's
    /// choice, and an archive holds the host streams beside the ranks').
    pub fn with_host_root(mut self, root: PathBuf) -> Discovery {
        self.host_root = Some(root);
        self
    }

    /// Entries of the shm directory or the log roots refused so far (see the module doc): each path counts once
    /// while it stays, again if it goes and comes back.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The refusals new since the last call: `(path, what was found)`, in scan order.
    pub fn take_refusals(&mut self) -> Vec<(PathBuf, String)> {
        std::mem::take(&mut self.refusals)
    }

    /// Every stream present now, sorted by id.
    pub fn scan(&mut self) -> Vec<DiscoveredStream> {
        let mut found: BTreeMap<StreamId, DiscoveredStream> = BTreeMap::new();
        let mut refused = HashMap::new();
        for root in self.roots.clone() {
            let untrusted = self.host_root.as_ref().is_some_and(|h| *h != root);
            let forged_host = |id: &StreamId| untrusted && id.pid.starts_with(HOST_STREAM_PREFIX);
            for job in self.subdirs(&root) {
                for host in self.subdirs(&job) {
                    for pid in self.subdirs(&host) {
                        if let Some(id) = StreamId::from_dir(&root, &pid) {
                            if forged_host(&id) {
                                refused.insert(pid, forged_host_refusal());
                                continue;
                            }
                            found.entry(id.clone()).or_insert(DiscoveredStream {
                                id,
                                seg_dir: Some(pid),
                                ring: None,
                                ring_owner: None,
                            });
                        }
                    }
                }
            }
        }
        if let Some(shm) = self.shm_dir.clone() {
            let mut best: BTreeMap<StreamId, (RingName, PathBuf, u32)> = BTreeMap::new();
            let now = Instant::now();
            let mut ambiguous = HashMap::new();
            for (name, path, owner) in self.rings(&shm, &mut refused) {
                let Some(rn) = parse_ring_name(&name) else {
                    continue;
                };
                let (id, exact) = self.ring_stream(&rn, &found);
                if !exact && !self.roots.is_empty() && rn.splits().nth(1).is_some() {
                    let since = *self.ambiguous_since.get(&path).unwrap_or(&now);
                    ambiguous.insert(path.clone(), since);
                    if now.saturating_duration_since(since) < AMBIGUOUS_RING_GRACE {
                        continue; // its segment directory may appear in a moment
                    }
                }
                let newer = best
                    .get(&id)
                    .is_none_or(|(old, _, _)| rn.recency() > old.recency());
                if newer {
                    best.insert(id, (rn, path, owner));
                }
            }
            self.ambiguous_since = ambiguous;
            for (id, (_, path, owner)) in best {
                let s = found.entry(id.clone()).or_insert(DiscoveredStream {
                    id,
                    seg_dir: None,
                    ring: None,
                    ring_owner: None,
                });
                s.ring = Some(path);
                s.ring_owner = Some(owner);
            }
        }
        self.note_refusals(refused);
        if !self.hosts.is_empty() {
            found.retain(|id, _| self.hosts.contains(&id.host));
        }
        found.into_values().collect()
    }

    /// The stream of a ring: the `(job, host)` split whose segment directory exists (`true`),
    /// else the split at the first dot (job ids rarely contain dots; host names often do).
    fn ring_stream(
        &self,
        rn: &RingName,
        found: &BTreeMap<StreamId, DiscoveredStream>,
    ) -> (StreamId, bool) {
        let mut first = None;
        for (job, host) in rn.splits() {
            let id = StreamId::new(job, host, &rn.pid);
            if found.contains_key(&id) {
                return (id, true);
            }
            first.get_or_insert(id);
        }
        let id = first.unwrap_or_else(|| StreamId::new(&rn.job_host, "", &rn.pid));
        (id, false)
    }

    fn entries(&mut self, dir: &Path) -> Vec<(String, PathBuf, bool)> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound && self.reported.insert(dir.into()) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot list a source directory; check the agent's permissions");
                }
                return Vec::new();
            }
        };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| {
                let is_dir = e.file_type().ok()?.is_dir();
                Some((e.file_name().to_str()?.to_string(), e.path(), is_dir))
            })
            .collect()
    }

    fn subdirs(&mut self, dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .entries(dir)
            .into_iter()
            .filter(|(_, _, d)| *d)
            .map(|(_, p, _)| p)
            .collect();
        v.sort();
        v
    }

    /// Every ring candidate `(name, path, owner uid)` in the per-user directories of `shm`;
    /// everything else there is refused (see the module doc).
    fn rings(
        &mut self,
        shm: &Path,
        refused: &mut HashMap<PathBuf, Refusal>,
    ) -> Vec<(String, PathBuf, u32)> {
        let mut out = Vec::new();
        for (name, dir, _) in self.entries(shm) {
            let uid = match user_dir(&name, &dir) {
                Ok(Some(uid)) => uid,
                Ok(None) => continue, // gone meanwhile
                Err(why) => {
                    refused.insert(dir, Refusal::shm(why));
                    continue;
                }
            };
            for (name, path, _) in self.entries(&dir) {
                if !name.ends_with(".ring") {
                    continue; // control files, temporaries
                }
                match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.file_type().is_file() => out.push((name, path, uid)),
                    Ok(m) => {
                        let why = format!(
                            "a {} named like a ring",
                            comminsight_wire::ring::kind_name(&m)
                        );
                        refused.insert(path, Refusal::shm(why));
                    }
                    Err(_) => {}
                }
            }
        }
        out
    }

    /// Count and report (one WARN per path) the refusals of this scan that are new.
    fn note_refusals(&mut self, now: HashMap<PathBuf, Refusal>) {
        let mut new: Vec<(&PathBuf, &Refusal)> = now
            .iter()
            .filter(|(p, _)| !self.refused_now.contains_key(*p))
            .collect();
        new.sort_by(|a, b| a.0.cmp(b.0));
        for (path, r) in new {
            self.refused += 1;
            if self.reported.insert(path.clone()) {
                tracing::warn!(path = %path.display(), found = %r.why, "refused an entry of {} (skipped): {}", r.place, r.fix);
            }
            self.refusals.push((path.clone(), r.why.clone()));
        }
        self.refused_now = now;
    }
}

/// Why an entry was skipped, where it was and what to do.
#[derive(Clone, Debug)]
struct Refusal {
    why: String,
    place: &'static str,
    fix: &'static str,
}

impl Refusal {
    fn shm(why: String) -> Refusal {
        Refusal {
            why,
            place: "the shm directory",
            fix: "rings are read only from per-user directories <shm_dir>/<uid>/ owned by that uid with mode 0700, as regular files; remove it (the job user's plugin recreates its directory)",
        }
    }
}

/// A `host-*` process directory under a log root.
fn forged_host_refusal() -> Refusal {
    Refusal {
        why: "a process directory named like the agent's host streams (host-*) outside the agent's state directory".into(),
        place: "a log root",
        fix: "host context is read only from <state_dir>/host-streams, which the agent writes itself; no plugin writes such a directory, so remove it (a job user may have planted it to forge host observations)",
    }
}

/// The uid of the per-user ring directory `dir` (entry `name` of the shm directory), or what is
/// wrong with it; `Ok(None)` when it vanished.
fn user_dir(name: &str, dir: &Path) -> Result<Option<u32>, String> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(None);
    };
    let uid = name
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| name.parse::<u32>().ok())
        .flatten()
        .filter(|u| u.to_string() == name);
    let Some(uid) = uid else {
        return Err(format!(
            "a {} not named by a decimal uid (a ring of an older plugin, or not ours)",
            comminsight_wire::ring::kind_name(&meta)
        ));
    };
    match user_dir_problem(&meta, uid) {
        Some(why) => Err(why),
        None => Ok(Some(uid)),
    }
}

/// Create the shm directory root-owned with mode 01777 (like /tmp) if it is missing, at daemon
/// start when shm sources are enabled; say so if what is there would make plugins refuse it.
/// Never fatal: the agent still reads segments.
pub fn prepare_shm_dir(cfg: &SourcesConfig) {
    if !cfg.shm_enabled {
        return;
    }
    let dir = &cfg.shm_dir;
    match ensure_shared_dir(dir) {
        Ok(true) => tracing::info!(dir = %dir.display(), "created the shm directory, mode 1777"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the shm directory; live rings are not followed until a plugin creates it");
            return;
        }
    }
    if let Ok(m) = std::fs::symlink_metadata(dir) {
        if let Some(why) = shared_dir_problem(&m, 0) {
            tracing::warn!(dir = %dir.display(), found = %why, "plugins will refuse this shm directory; remove it and restart the agent, which creates it root-owned with mode 1777");
        }
    }
}

/// Deepest directory level searched below the given directory.
const MAX_DEPTH: usize = 8;

/// The log roots (directories holding `<job>/<host>/<pid>/seg-*.cis`) at or below `dir`: `dir`
/// may be a log root, a test-bed output directory, an archive root (its `raw/` tree, with
/// `seg-*.cis.zst` files, counts), or anything above them (searched down to 8 levels, symbolic
/// links not followed). A job, host or process directory yields the log root above it (callers
/// wanting only that job filter streams by id). Sorted, without duplicates.
pub fn find_log_roots(dir: &Path) -> Vec<PathBuf> {
    let is_segment =
        |name: &str| parse_segment_name(name.strip_suffix(".zst").unwrap_or(name)).is_some();
    let mut roots: Vec<PathBuf> = crate::util::fs::files_under(dir, MAX_DEPTH as u32, &is_segment)
        .iter()
        .filter_map(|f| Some(f.parent()?.parent()?.parent()?.parent()?.to_path_buf()))
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// `<shm>/<uid>` as the plugin of `uid` makes it: a directory owned by `uid`, mode 0700.
    fn user_dir_of(shm: &Path, uid: u32) -> PathBuf {
        let d = shm.join(uid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&d, Some(uid), None).unwrap();
        d
    }

    fn tmp(tag: &str) -> (PathBuf, impl Drop) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let t = std::env::temp_dir().join(format!("ciagent-{tag}-{}-{nanos}", std::process::id()));
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        std::fs::create_dir_all(&t).unwrap();
        (t.clone(), Rm(t))
    }

    /// Rings are read only from real per-user directories owned by the uid they are named by,
    /// mode 0700, and only as regular files; everything else is refused, counted once while it
    /// stays, and reported.
    #[test]
    fn only_rings_in_owned_private_per_user_directories_are_followed() {
        let (t, _rm) = tmp("disc-own");
        let shm = t.join("shm");
        let good = user_dir_of(&shm, 1001);
        std::fs::write(good.join("j.h.1.ring"), b"").unwrap();
        std::fs::write(good.join("j.h.1.ring.ctl"), b"").unwrap();
        let fifo = good.join("j.h.2.ring");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/etc/passwd", good.join("j.h.3.ring")).unwrap();
        // Named 1002 but owned by 1003 (pre-created by another user).
        let foreign = user_dir_of(&shm, 1002);
        std::os::unix::fs::chown(&foreign, Some(1003), None).unwrap();
        std::fs::write(foreign.join("j.h.4.ring"), b"").unwrap();
        // The right owner, open to others.
        let open = user_dir_of(&shm, 1004);
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(open.join("j.h.5.ring"), b"").unwrap();
        // A symlink named by a uid, to a directory that would pass.
        let real = user_dir_of(&t.join("elsewhere"), 1005);
        std::fs::write(real.join("j.h.6.ring"), b"").unwrap();
        std::os::unix::fs::symlink(&real, shm.join("1005")).unwrap();
        // An old-layout ring straight in shm_dir, and a directory not named by a uid.
        std::fs::write(shm.join("j.h.7.ring"), b"").unwrap();
        std::fs::create_dir(shm.join("0042")).unwrap();
        let cfg = SourcesConfig {
            shm_enabled: true,
            shm_dir: shm.clone(),
            ..Default::default()
        };
        let mut d = Discovery::new(&cfg);
        let found = d.scan();
        let got: Vec<(String, Option<u32>)> = found
            .iter()
            .map(|s| (s.id.to_string(), s.ring_owner))
            .collect();
        assert_eq!(got, [("j/h/1".to_string(), Some(1001))]);
        assert_eq!(
            found[0].ring.as_deref(),
            Some(good.join("j.h.1.ring").as_path())
        );
        let refusals = d.take_refusals();
        let why = |p: &Path| {
            refusals
                .iter()
                .find(|(q, _)| q == p)
                .map(|(_, w)| w.clone())
                .unwrap_or_else(|| panic!("{} not refused: {refusals:?}", p.display()))
        };
        assert!(why(&fifo).contains("FIFO"), "{refusals:?}");
        assert!(why(&good.join("j.h.3.ring")).contains("symbolic link"));
        assert!(why(&foreign).contains("owned by uid 1003"));
        assert!(why(&open).contains("mode 0755"));
        assert!(why(&shm.join("1005")).contains("symbolic link"));
        assert!(why(&shm.join("j.h.7.ring")).contains("not named by a decimal uid"));
        assert!(why(&shm.join("0042")).contains("not named by a decimal uid"));
        assert_eq!(refusals.len(), 7, "{refusals:?}");
        assert_eq!(d.refused(), 7);
        // Still there on the next scan: not counted again; gone and back: counted again.
        assert_eq!(d.scan().len(), 1);
        assert!(d.take_refusals().is_empty());
        assert_eq!(d.refused(), 7);
        std::fs::remove_file(&fifo).unwrap();
        d.scan();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        d.scan();
        assert_eq!(d.refused(), 8);
        assert_eq!(d.take_refusals().len(), 1);
        std::fs::remove_file(&fifo).unwrap();
        std::fs::write(&fifo, b"").unwrap(); // now a regular file: followed
        let ids: Vec<String> = d.scan().iter().map(|s| s.id.to_string()).collect();
        assert_eq!(ids, ["j/h/1", "j/h/2"]);
        assert_eq!(d.refused(), 8);
    }

    /// With the agent's host-stream root set (the daemon), a `host-*` process directory under
    /// any other root is refused and reported, the one under the host root is followed, and
    /// rank directories everywhere are; without it (offline) both are followed.
    #[test]
    fn host_streams_are_taken_from_the_agents_own_root_only() {
        let (t, _rm) = tmp("disc-host");
        let (logs, own) = (t.join("logs"), t.join("state/host-streams"));
        for d in [
            logs.join("j/h/100"),
            logs.join("j/h/host-7"),
            own.join("j/h/host-9"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        let cfg = SourcesConfig {
            shm_enabled: false,
            segment_dirs: vec![logs.clone(), own.clone()],
            ..Default::default()
        };
        let ids = |d: &mut Discovery| -> Vec<String> {
            d.scan().iter().map(|s| s.id.to_string()).collect()
        };
        let mut live = Discovery::new(&cfg).with_host_root(own.clone());
        assert_eq!(ids(&mut live), ["j/h/100", "j/h/host-9"]);
        let refusals = live.take_refusals();
        assert_eq!(refusals.len(), 1, "{refusals:?}");
        assert_eq!(refusals[0].0, logs.join("j/h/host-7"));
        assert!(refusals[0].1.contains("host streams"), "{refusals:?}");
        assert_eq!(live.refused(), 1);
        ids(&mut live);
        assert_eq!(live.refused(), 1, "counted once while it stays");
        let mut offline = Discovery::new(&cfg);
        assert_eq!(ids(&mut offline), ["j/h/100", "j/h/host-7", "j/h/host-9"]);
        assert_eq!(offline.refused(), 0);
    }

    #[test]
    fn the_daemon_creates_a_missing_shm_directory_root_style() {
        let (t, _rm) = tmp("disc-mk");
        let shm = t.join("a/shm");
        let cfg = SourcesConfig {
            shm_enabled: true,
            shm_dir: shm.clone(),
            ..Default::default()
        };
        prepare_shm_dir(&cfg);
        let m = std::fs::symlink_metadata(&shm).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.permissions().mode() & 0o7777, 0o1777);
        // Disabled: nothing created.
        let off = SourcesConfig {
            shm_enabled: false,
            shm_dir: t.join("b/shm"),
            ..Default::default()
        };
        prepare_shm_dir(&off);
        assert!(!t.join("b").exists());
    }

    #[test]
    fn ring_names_parse_from_the_right() {
        let r = parse_ring_name("j1.node.a.42.ring").unwrap();
        assert_eq!((r.job_host.as_str(), r.pid.as_str()), ("j1.node.a", "42"));
        assert_eq!(r.restart, None);
        assert_eq!(
            r.splits().collect::<Vec<_>>(),
            vec![("j1", "node.a"), ("j1.node", "a")]
        );
        let r = parse_ring_name("j.h.42.2-1700.ring").unwrap();
        assert_eq!((r.pid.as_str(), r.restart), ("42", Some((2, 1700))));
        for bad in [
            "j.h.42.ring.ctl",
            "h.42.ring",
            "j.h.x.ring",
            "j.h.42.2-x.ring",
        ] {
            assert!(parse_ring_name(bad).is_none(), "{bad}");
        }
    }

    /// A ring whose `<job>.<host>` splits two ways waits for its segment directory (the plugin
    /// creates it just after the ring): taken at once under the first split, the process would
    /// be a second stream once the directory appears, its records counted under both ids.
    #[test]
    fn a_dotted_ring_name_waits_for_its_segment_directory() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let t = std::env::temp_dir().join(format!("ciagent-disc-{}-{nanos}", std::process::id()));
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = Rm(t.clone());
        let (logs, shm) = (t.join("logs"), t.join("shm"));
        std::fs::create_dir_all(&logs).unwrap();
        let mine = user_dir_of(&shm, 4242);
        for name in ["j1.node.a.42.ring", "j2.h.7.ring"] {
            std::fs::write(mine.join(name), b"").unwrap();
        }
        let cfg = SourcesConfig {
            shm_enabled: true,
            shm_dir: shm.clone(),
            segment_dirs: vec![logs.clone()],
            ..Default::default()
        };
        let ids = |d: &mut Discovery| -> Vec<(String, bool, bool)> {
            d.scan()
                .into_iter()
                .map(|s| (s.id.to_string(), s.seg_dir.is_some(), s.ring.is_some()))
                .collect()
        };
        let mut d = Discovery::new(&cfg);
        // The unambiguous name is followed at once; the dotted one waits.
        assert_eq!(ids(&mut d), [("j2/h/7".to_string(), false, true)]);
        // Its directory appears (host `node.a`): the ring goes with it, under that id only.
        std::fs::create_dir_all(logs.join("j1/node.a/42")).unwrap();
        assert_eq!(
            ids(&mut d),
            [
                ("j1/node.a/42".to_string(), true, true),
                ("j2/h/7".to_string(), false, true)
            ]
        );
        // Without a directory after the grace (segments off in the plugin): the first split.
        std::fs::remove_dir_all(logs.join("j1")).unwrap();
        let mut d = Discovery::new(&cfg);
        assert_eq!(ids(&mut d).len(), 1);
        let seen = Instant::now() - AMBIGUOUS_RING_GRACE;
        for v in d.ambiguous_since.values_mut() {
            *v = seen;
        }
        assert_eq!(
            ids(&mut d),
            [
                ("j1/node.a/42".to_string(), false, true),
                ("j2/h/7".to_string(), false, true)
            ]
        );
        // No segment roots at all: nothing to wait for.
        let cfg = SourcesConfig {
            segment_dirs: Vec::new(),
            ..cfg
        };
        assert_eq!(Discovery::new(&cfg).scan().len(), 2);
    }
}

//! Finding process streams: segment directories under log roots and rings in the shm directory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comminsight_wire::segment::parse_segment_name;

use super::SourcesConfig;
use crate::stream::StreamId;

/// One process stream found by [`Discovery::scan`]: its segment directory and/or its newest ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredStream {
    pub id: StreamId,
    /// `<root>/<job>/<host>/<pid>`, when it exists.
    pub seg_dir: Option<PathBuf>,
    /// The newest ring of the process, when one exists.
    pub ring: Option<PathBuf>,
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
    shm_dir: Option<PathBuf>,
    /// Only streams of these hosts (empty: all).
    hosts: Vec<String>,
    reported: HashSet<PathBuf>,
    /// When each ring with an ambiguous name (`<job>.<host>` with more than one dot) and no
    /// segment directory yet was first seen.
    ambiguous_since: HashMap<PathBuf, Instant>,
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
            shm_dir: cfg.shm_enabled.then(|| cfg.shm_dir.clone()),
            hosts: cfg.hosts.clone(),
            reported: HashSet::new(),
            ambiguous_since: HashMap::new(),
        }
    }

    /// Every stream present now, sorted by id.
    pub fn scan(&mut self) -> Vec<DiscoveredStream> {
        let mut found: BTreeMap<StreamId, DiscoveredStream> = BTreeMap::new();
        for root in self.roots.clone() {
            for job in self.subdirs(&root) {
                for host in self.subdirs(&job) {
                    for pid in self.subdirs(&host) {
                        if let Some(id) = StreamId::from_dir(&root, &pid) {
                            found.entry(id.clone()).or_insert(DiscoveredStream {
                                id,
                                seg_dir: Some(pid),
                                ring: None,
                            });
                        }
                    }
                }
            }
        }
        if let Some(shm) = self.shm_dir.clone() {
            let mut best: BTreeMap<StreamId, (RingName, PathBuf)> = BTreeMap::new();
            let now = Instant::now();
            let mut ambiguous = HashMap::new();
            for (name, path) in self.files(&shm) {
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
                    .is_none_or(|(old, _)| rn.recency() > old.recency());
                if newer {
                    best.insert(id, (rn, path));
                }
            }
            self.ambiguous_since = ambiguous;
            for (id, (_, path)) in best {
                found
                    .entry(id.clone())
                    .or_insert(DiscoveredStream {
                        id,
                        seg_dir: None,
                        ring: None,
                    })
                    .ring = Some(path);
            }
        }
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

    fn files(&mut self, dir: &Path) -> Vec<(String, PathBuf)> {
        self.entries(dir)
            .into_iter()
            .filter(|(_, _, d)| !*d)
            .map(|(n, p, _)| (n, p))
            .collect()
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
        std::fs::create_dir_all(&shm).unwrap();
        for name in ["j1.node.a.42.ring", "j2.h.7.ring"] {
            std::fs::write(shm.join(name), b"").unwrap();
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

//! Identity of one plugin process stream and its place on the job's aligned timeline. Shared by
//! every stage of the pipeline (sources, clock, archive, metrics, replay).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One plugin process' record stream: the segment directory `<job>/<host>/<pid>` under a log
/// root, and the ring `<job>.<host>.<pid>[.<start>-<ns>].ring` in the per-user directory
/// `<shm_dir>/<uid>/`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamId {
    pub job: String,
    pub host: String,
    /// The process directory's name (the writer's pid, as the plugin names it).
    pub pid: String,
}

impl StreamId {
    pub fn new(job: &str, host: &str, pid: &str) -> StreamId {
        StreamId {
            job: job.into(),
            host: host.into(),
            pid: pid.into(),
        }
    }

    /// `<job>/<host>/<pid>`: the stream's relative directory in segment roots and archives.
    pub fn rel_dir(&self) -> PathBuf {
        Path::new(&self.job).join(&self.host).join(&self.pid)
    }

    /// The stream of a process directory `root/<job>/<host>/<pid>`, if `dir` is one.
    pub fn from_dir(root: &Path, dir: &Path) -> Option<StreamId> {
        let rel = dir.strip_prefix(root).ok()?;
        let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
        match parts.as_slice() {
            [job, host, pid] => Some(StreamId::new(job, host, pid)),
            _ => None,
        }
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.job, self.host, self.pid)
    }
}

/// How a stream's host times (`*_ns`, CLOCK_REALTIME as the plugin fixed it at start) map onto
/// the job's aligned timeline: `aligned = host + offset_ns`, true within `± err_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alignment {
    pub offset_ns: i64,
    pub err_ns: u64,
}

impl Alignment {
    /// `ns` on the aligned timeline; 0 stays 0 (an absent time).
    pub fn apply(&self, ns: u64) -> u64 {
        if ns == 0 {
            return 0;
        }
        ns.saturating_add_signed(self.offset_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_of_a_process_dir() {
        let root = Path::new("/logs");
        let id = StreamId::from_dir(root, Path::new("/logs/j1/h1/42")).unwrap();
        assert_eq!(id, StreamId::new("j1", "h1", "42"));
        assert_eq!(id.rel_dir(), PathBuf::from("j1/h1/42"));
        assert_eq!(id.to_string(), "j1/h1/42");
        assert!(StreamId::from_dir(root, Path::new("/logs/j1/h1")).is_none());
        assert!(StreamId::from_dir(root, Path::new("/other/j1/h1/42")).is_none());
    }

    #[test]
    fn alignment_keeps_absent_times() {
        let a = Alignment {
            offset_ns: -5,
            err_ns: 3,
        };
        assert_eq!(a.apply(0), 0);
        assert_eq!(a.apply(100), 95);
        assert_eq!(
            Alignment {
                offset_ns: 7,
                err_ns: 0
            }
            .apply(1),
            8
        );
    }
}

//! Hang evidence on disk, under the results directory and (when archiving) the archive:
//! `<dir>/<job>/<event>/<host>.snapshot.json` and `verdict-<host>.json` (each host's view), and
//! `<dir>/<job>/master-verdict.json` (the job master's merged verdict). Written atomically; a
//! failure is logged and the next write tries again.

use std::path::{Path, PathBuf};

use crate::hang::model::SNAPSHOT_SUFFIX;
use crate::util::fs::write_atomic;

/// A name (job, host) as one path component.
pub fn sanitize(s: &str) -> String {
    s.replace(['/', '\\'], "_")
}

/// Where hang evidence goes (see the module docs).
#[derive(Clone, Debug)]
pub struct EvidenceSink {
    dirs: Vec<PathBuf>,
}

impl EvidenceSink {
    /// Evidence under each of `dirs` (the results' `hang/`, the archive's `hang/`).
    pub fn new(dirs: Vec<PathBuf>) -> EvidenceSink {
        EvidenceSink { dirs }
    }

    /// One host's view of a job at an event: its snapshot, and its verdicts when it has some.
    pub fn host_view(
        &self,
        job: &str,
        event: u64,
        host: &str,
        snapshot: &[u8],
        verdicts: Option<&[u8]>,
    ) {
        let rel = Path::new(&sanitize(job)).join(event.to_string());
        let host = sanitize(host);
        self.write(
            &rel,
            &format!("{host}{SNAPSHOT_SUFFIX}"),
            snapshot,
            "hang evidence",
        );
        if let Some(v) = verdicts {
            self.write(&rel, &format!("verdict-{host}.json"), v, "hang evidence");
        }
    }

    /// The master's merged verdict of a job.
    pub fn master_verdict(&self, job: &str, doc: &[u8]) {
        self.write(
            Path::new(&sanitize(job)),
            "master-verdict.json",
            doc,
            "the verdict",
        );
    }

    fn write(&self, rel: &Path, name: &str, bytes: &[u8], what: &str) {
        for root in &self.dirs {
            let dir = root.join(rel);
            if let Err(e) = std::fs::create_dir_all(&dir) {
                tracing::warn!("{}: cannot create: {e}", dir.display());
                continue;
            }
            let path = dir.join(name);
            if let Err(e) = write_atomic(&path, bytes) {
                tracing::warn!("{}: cannot write {what}: {e}", path.display());
            }
        }
    }
}

//! The time index: per segment file, the range of its operations' start times on the aligned
//! job timeline, and the process clock as it stood where the segment begins, so that a time
//! window is read from the overlapping segments only (by the input's cursors, started at the
//! segment), with the same aligned times as a full pass (`steps`).
//!
//! Built by [`IndexBuilder`] during the trace's step pass (every batch of an offline pass comes
//! from one segment) and cached as `DIR/.comminsight/time-index.json`, keyed by the segment's
//! path relative to `DIR` (the archived `.zst` file for an archive), its size and modification
//! time; a stream with any changed, new or removed segment is indexed again. When `DIR` is
//! read-only the index lives in memory only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use comminsight_wire::record::Body;
use comminsight_wire::segment::parse_segment_name;
use serde::{Deserialize, Serialize};

use crate::clock::ProcessClock;
use crate::engine::{Analysis, Cx, Decoded, Output};
use crate::offline::Input;
use crate::stream::StreamId;
use crate::util::fs::STATE_DIR_NAME;

/// Index format version (a different one is rebuilt).
const VERSION: u32 = 1;

/// One segment file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Path relative to the indexed directory.
    pub path: String,
    /// Size (bytes) and modification time (ns since the epoch) when indexed.
    pub size: u64,
    pub mtime_ns: u64,
    /// Smallest and largest operation start (µs, aligned); `None` without operations.
    pub first_us: Option<u64>,
    pub last_us: Option<u64>,
    /// Operation records in it.
    pub ops: u64,
    /// The stream's clock where this segment begins.
    pub clock: ProcessClock,
}

impl SegmentEntry {
    /// The segment's index (from its file name).
    pub fn index(&self) -> Option<u64> {
        segment_index(Path::new(&self.path).file_name()?.to_str()?)
    }
}

/// A segment file name: `seg-N.cis`, `seg-N.cis.open` or (archives) `seg-N.cis.zst` -> N.
fn segment_index(name: &str) -> Option<u64> {
    parse_segment_name(name.strip_suffix(".zst").unwrap_or(name)).map(|(i, _)| i)
}

/// One process stream: its segments in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamEntry {
    pub job: String,
    pub host: String,
    pub pid: String,
    /// `RANK` from its `proc_start` (-1 when unknown).
    pub rank: i64,
    pub segments: Vec<SegmentEntry>,
}

impl StreamEntry {
    /// The stream's id (as the step journal names it).
    pub fn id(&self) -> StreamId {
        StreamId::new(&self.job, &self.host, &self.pid)
    }
}

/// Every stream under a directory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeIndex {
    pub version: u32,
    pub streams: Vec<StreamEntry>,
}

/// How an index was obtained (for the summary and the tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Streams indexed now (new or changed).
    pub rebuilt: usize,
    /// Streams taken from the cache.
    pub cached: usize,
    /// The cache file was written.
    pub saved: bool,
}

/// The index's file name in the state directory.
const INDEX_FILE: &str = "time-index.json";

/// Where the index of `dir` is cached.
pub fn index_path(dir: &Path) -> PathBuf {
    dir.join(STATE_DIR_NAME).join(INDEX_FILE)
}

/// `(path relative to dir, size, mtime ns)` of a file.
fn stat(dir: &Path, f: &Path) -> (String, u64, u64) {
    let (size, mtime) = std::fs::metadata(f).map_or((0, 0), |m| {
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        (m.len(), mtime)
    });
    let rel = f
        .strip_prefix(dir)
        .unwrap_or(f)
        .to_string_lossy()
        .into_owned();
    (rel, size, mtime)
}

/// The cached index of the input where its streams are unchanged; the streams to index now.
pub fn load_cached(input: &Input) -> (BTreeMap<StreamId, StreamEntry>, BTreeSet<StreamId>) {
    let dir = input.dir();
    let cached: TimeIndex = read_index(dir)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|t: &TimeIndex| t.version == VERSION)
        .unwrap_or_default();
    let by_id: BTreeMap<StreamId, StreamEntry> =
        cached.streams.into_iter().map(|s| (s.id(), s)).collect();
    let mut hits = BTreeMap::new();
    let mut todo = BTreeSet::new();
    for id in input.streams() {
        let files: Vec<(String, u64, u64)> = input
            .segment_files(id)
            .iter()
            .map(|(_, f)| stat(dir, f))
            .collect();
        let hit = by_id.get(id).filter(|s| {
            s.segments.len() == files.len()
                && s.segments
                    .iter()
                    .zip(&files)
                    .all(|(g, (path, size, mtime))| {
                        g.path == *path && g.size == *size && g.mtime_ns == *mtime
                    })
        });
        match hit {
            Some(s) => {
                hits.insert(id.clone(), s.clone());
            }
            None => {
                todo.insert(id.clone());
            }
        }
    }
    (hits, todo)
}

/// One stream's index under construction.
#[derive(Default)]
struct Building {
    rank: i64,
    /// Per segment index: `(first_us, last_us, ops, clock at its start)`.
    segments: BTreeMap<u64, (Option<u64>, Option<u64>, u64, ProcessClock)>,
    /// The stream's clock after the last batch.
    clock: ProcessClock,
}

/// Builds the index of the wanted streams from an offline pass's batches (see the module docs).
pub struct IndexBuilder {
    wanted: BTreeSet<StreamId>,
    streams: BTreeMap<StreamId, Building>,
}

impl IndexBuilder {
    pub fn new(wanted: BTreeSet<StreamId>) -> IndexBuilder {
        IndexBuilder {
            wanted,
            streams: BTreeMap::new(),
        }
    }

    /// The finished entries, one per wanted stream, with the input's files.
    pub fn finish(self, input: &Input) -> Vec<StreamEntry> {
        let mut streams = self.streams;
        self.wanted
            .into_iter()
            .map(|id| {
                let b = streams.remove(&id).unwrap_or_else(|| Building {
                    rank: -1,
                    ..Building::default()
                });
                let mut clock = ProcessClock::default();
                let segments = input
                    .segment_files(&id)
                    .iter()
                    .map(|(i, f)| {
                        let (path, size, mtime_ns) = stat(input.dir(), f);
                        let (first_us, last_us, ops, c) =
                            b.segments
                                .get(i)
                                .cloned()
                                .unwrap_or((None, None, 0, clock.clone()));
                        clock = c.clone();
                        SegmentEntry {
                            path,
                            size,
                            mtime_ns,
                            first_us,
                            last_us,
                            ops,
                            clock: c,
                        }
                    })
                    .collect();
                StreamEntry {
                    job: id.job,
                    host: id.host,
                    pid: id.pid,
                    rank: b.rank,
                    segments,
                }
            })
            .collect()
    }
}

impl Analysis for IndexBuilder {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        if !self.wanted.contains(cx.id) {
            return;
        }
        let b = self
            .streams
            .entry(cx.id.clone())
            .or_insert_with(|| Building {
                rank: -1,
                ..Building::default()
            });
        let Some(seg) = cx.segment else { return };
        let start_clock = &b.clock;
        let e = b
            .segments
            .entry(seg)
            .or_insert_with(|| (None, None, 0, start_clock.clone()));
        for d in recs {
            match &d.rec.body {
                Body::ProcStart(p) => b.rank = i64::from(p.rank),
                Body::Coll(o) | Body::P2p(o) => {
                    let us = d.align.apply(o.start_ns) / 1000;
                    e.0 = Some(e.0.map_or(us, |x| x.min(us)));
                    e.1 = Some(e.1.map_or(us, |x| x.max(us)));
                    e.2 += 1;
                }
                _ => {}
            }
        }
        b.clock = cx.clock.clone();
    }
}

/// The index of the input: the cached entries and the built ones, by stream; saved back when
/// something was built (or the cache held other streams) and `DIR` is writable.
pub fn assemble(
    input: &Input,
    cached: BTreeMap<StreamId, StreamEntry>,
    built: Vec<StreamEntry>,
) -> (TimeIndex, IndexStats) {
    let mut stats = IndexStats {
        rebuilt: built.len(),
        cached: cached.len(),
        saved: false,
    };
    let mut all = cached;
    for s in built {
        all.insert(s.id(), s);
    }
    let idx = TimeIndex {
        version: VERSION,
        streams: all.into_values().collect(),
    };
    let previous = read_index(input.dir())
        .and_then(|b| serde_json::from_slice::<TimeIndex>(&b).ok())
        .map_or(0, |t| t.streams.len());
    if stats.rebuilt > 0 || previous != idx.streams.len() {
        stats.saved = save(input.dir(), &idx);
    }
    (idx, stats)
}

/// The cached index's bytes (`None`: none, or refused with a debug line: a planted file).
fn read_index(dir: &Path) -> Option<Vec<u8>> {
    crate::util::fs::read_state(dir, INDEX_FILE)
        .map_err(|e| tracing::debug!(dir = %dir.display(), error = %e, "time index cache not read"))
        .ok()
        .flatten()
}

/// Write the cache; `false` (with a debug log) when the directory is read-only or its state
/// directory is not ours.
fn save(dir: &Path, idx: &TimeIndex) -> bool {
    let res = serde_json::to_vec(idx)
        .map_err(std::io::Error::other)
        .and_then(|bytes| crate::util::fs::write_state(dir, INDEX_FILE, &bytes));
    match res {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "time index kept in memory");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names() {
        assert_eq!(segment_index("seg-000012.cis"), Some(12));
        assert_eq!(segment_index("seg-3.cis.open"), Some(3));
        assert_eq!(segment_index("seg-7.cis.zst"), Some(7));
        assert_eq!(segment_index("seg-.cis"), None);
        assert_eq!(segment_index("seg-1.json"), None);
    }
}

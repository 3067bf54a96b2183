//! The time index: per segment file, the range of its operations' start times on the aligned
//! job timeline, and the process clock as it stood where the segment begins, so that a time
//! window is read from the overlapping segments only, with the same aligned times as a full
//! pass (`steps`).
//!
//! Cached as `DIR/.comminsight/time-index.json`, keyed by the segment's path relative to `DIR`,
//! its size and modification time; a stream with any changed, new or removed segment is indexed
//! again (the clock carries over from segment to segment). When `DIR` is read-only the index
//! lives in memory only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, Record, FLAG_REPEAT};
use comminsight_wire::segment::decode_segment_bytes;
use serde::{Deserialize, Serialize};

use crate::clock::{align, ProcessClock};
use crate::stream::StreamId;

use super::TraceError;

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

/// Where the index of `dir` is cached.
pub fn index_path(dir: &Path) -> PathBuf {
    dir.join(".comminsight").join("time-index.json")
}

/// A segment file name: `seg-N.cis`, `seg-N.cis.open` or (archives) `seg-N.cis.zst` -> N.
fn segment_index(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("seg-")?;
    let digits = rest
        .strip_suffix(".cis")
        .or_else(|| rest.strip_suffix(".cis.open"))
        .or_else(|| rest.strip_suffix(".cis.zst"))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Segment files under `dir` grouped by process directory (`<job>/<host>/<pid>`), each group in
/// segment order. The `.comminsight` state directory is skipped.
fn find_streams(dir: &Path) -> BTreeMap<PathBuf, Vec<(u64, PathBuf)>> {
    fn walk(d: &Path, depth: u32, out: &mut BTreeMap<PathBuf, Vec<(u64, PathBuf)>>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(t) = e.file_type() else { continue };
            let name = e.file_name();
            let name = name.to_string_lossy();
            if t.is_dir() && depth > 0 && name != ".comminsight" {
                walk(&p, depth - 1, out);
            } else if t.is_file() {
                if let Some(i) = segment_index(&name) {
                    out.entry(d.to_path_buf()).or_default().push((i, p));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, 8, &mut out);
    for v in out.values_mut() {
        // A sealed segment and its still-listed `.open` twin: the sealed one (sorted first).
        v.sort();
        v.dedup_by_key(|(i, _)| *i);
    }
    out
}

/// Read a segment's bytes (decompressing archived `.zst` ones).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, TraceError> {
    let io = |e: std::io::Error| TraceError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    if path.extension().is_some_and(|e| e == "zst") {
        let f = std::fs::File::open(path).map_err(io)?;
        let mut out = Vec::new();
        let mut dec = zstd::stream::read::Decoder::new(f).map_err(io)?;
        std::io::Read::read_to_end(&mut dec, &mut out).map_err(io)?;
        Ok(out)
    } else {
        std::fs::read(path).map_err(io)
    }
}

/// The records of a segment the stream delivers (preamble repeats left out), in file order.
pub fn segment_records(path: &Path) -> Result<Vec<Record>, TraceError> {
    let bytes = read_bytes(path)?;
    Ok(decode_segment_bytes(&bytes)
        .records
        .into_iter()
        .filter(|r| r.flags & FLAG_REPEAT == 0)
        .collect())
}

/// Update `clock` with `rec` exactly as the step engine's offline pass does.
pub fn observe_clock(clock: &mut ProcessClock, rec: &Record) {
    if matches!(
        rec.body,
        Body::ProcStart(_) | Body::Stats(_) | Body::Coll(_) | Body::P2p(_)
    ) {
        clock.observe(rec);
    }
}

fn stat(path: &Path) -> (u64, u64) {
    std::fs::metadata(path).map_or((0, 0), |m| {
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        (m.len(), mtime)
    })
}

/// Index one stream's segments (in order).
fn index_stream(
    dir: &Path,
    pdir: &Path,
    files: &[(u64, PathBuf)],
) -> Result<StreamEntry, TraceError> {
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    };
    let mut e = StreamEntry {
        job: name(pdir.parent().and_then(Path::parent)),
        host: name(pdir.parent()),
        pid: name(Some(pdir)),
        rank: -1,
        segments: Vec::new(),
    };
    let mut clock = ProcessClock::default();
    for (_, f) in files {
        let (size, mtime_ns) = stat(f);
        let at_start = clock.clone();
        let (mut lo, mut hi, mut ops) = (None::<u64>, None::<u64>, 0);
        for rec in segment_records(f)? {
            observe_clock(&mut clock, &rec);
            match &rec.body {
                Body::ProcStart(p) => e.rank = i64::from(p.rank),
                Body::Coll(o) | Body::P2p(o) => {
                    let us = align(&clock, None).apply(o.start_ns) / 1000;
                    lo = Some(lo.map_or(us, |x| x.min(us)));
                    hi = Some(hi.map_or(us, |x| x.max(us)));
                    ops += 1;
                }
                _ => {}
            }
        }
        e.segments.push(SegmentEntry {
            path: f
                .strip_prefix(dir)
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned(),
            size,
            mtime_ns,
            first_us: lo,
            last_us: hi,
            ops,
            clock: at_start,
        });
    }
    Ok(e)
}

/// The time index of `dir`: the cached one where its streams are unchanged, the rest indexed
/// now; saved back when something changed and `dir` is writable.
pub fn load_or_build(dir: &Path) -> Result<(TimeIndex, IndexStats), TraceError> {
    let cache_file = index_path(dir);
    let cached: TimeIndex = std::fs::read(&cache_file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|t: &TimeIndex| t.version == VERSION)
        .unwrap_or_default();
    let by_dir: BTreeMap<(String, String, String), &StreamEntry> = cached
        .streams
        .iter()
        .map(|s| ((s.job.clone(), s.host.clone(), s.pid.clone()), s))
        .collect();
    let mut stats = IndexStats::default();
    let mut out = TimeIndex {
        version: VERSION,
        streams: Vec::new(),
    };
    for (pdir, files) in find_streams(dir) {
        let rel: Vec<String> = files
            .iter()
            .map(|(_, f)| {
                f.strip_prefix(dir)
                    .unwrap_or(f)
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let name = |p: Option<&Path>| {
            p.and_then(Path::file_name)
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        };
        let key = (
            name(pdir.parent().and_then(Path::parent)),
            name(pdir.parent()),
            name(Some(&pdir)),
        );
        let hit = by_dir.get(&key).filter(|s| {
            s.segments.len() == files.len()
                && s.segments
                    .iter()
                    .zip(files.iter().zip(&rel))
                    .all(|(g, ((_, f), r))| {
                        let (size, mtime) = stat(f);
                        g.path == *r && g.size == size && g.mtime_ns == mtime
                    })
        });
        match hit {
            Some(s) => {
                out.streams.push((*s).clone());
                stats.cached += 1;
            }
            None => {
                out.streams.push(index_stream(dir, &pdir, &files)?);
                stats.rebuilt += 1;
            }
        }
    }
    if out.streams.is_empty() {
        return Err(TraceError::NoSegments {
            path: dir.to_path_buf(),
        });
    }
    if stats.rebuilt > 0 || out.streams.len() != cached.streams.len() {
        stats.saved = save(&cache_file, &out);
    }
    Ok((out, stats))
}

/// Write the cache; `false` (with a debug log) when the directory is read-only.
fn save(path: &Path, idx: &TimeIndex) -> bool {
    let Some(parent) = path.parent() else {
        return false;
    };
    let res = std::fs::create_dir_all(parent).and_then(|()| {
        let bytes = serde_json::to_vec(idx).map_err(std::io::Error::other)?;
        crate::pipeline::state::write_atomic(path, &bytes)
    });
    match res {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "time index kept in memory");
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

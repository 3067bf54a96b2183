//! [`Input`]: what an offline command reads, found and staged once. `DIR` may be a segment root,
//! a test-bed output directory, a job, host or process directory below a root, or an agent
//! archive (its `raw/**/seg-*.cis.zst` are decompressed once, into a scratch directory removed
//! with the input). Every pass reads each process stream with the daemon's own exactly-once
//! [`StreamCursor`] and hands its batches to an [`Engine`] (plus the command's extras).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use comminsight_wire::segment::{parse_segment_name, segment_file_name};
use comminsight_wire::RawRecord;

use super::skipped::{of_source_error, FileSkip, SkipLog, Skipped};
use super::staging::stage_archive;
use crate::clock::ProcessClock;
use crate::engine::{Analysis, Decoded, Engine, Output};
use crate::sources::{
    find_log_roots, CursorCheckpoint, CursorStats, Discovery, SourcesConfig, StreamCursor,
};
use crate::stream::StreamId;
use crate::util::fs::ScratchDir;

/// Records read per poll: 128 KiB, so the read buffer and the decoded batch stay in the CPU
/// caches (8 MiB batches measured ~25 % slower: page faults, zeroing).
const READ_BATCH: usize = 1024;

/// Why the input could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: no such directory (give a segment root, a test-bed output directory or an archive)")]
    Missing { path: PathBuf },
    #[error("{path}: no segment files (seg-*.cis or archived seg-*.cis.zst) under it; give a directory the CommInsight plugin wrote (COMMINSIGHT_LOG_DIR), a test-bed output directory or an agent archive")]
    NoSegments { path: PathBuf },
    #[error("{path}: no CommInsight records in its segment files (skipped {}); give a directory the CommInsight plugin wrote (COMMINSIGHT_LOG_DIR), a test-bed output directory or an agent archive", skipped.describe().unwrap_or_else(|| "nothing: every segment is empty".into()))]
    NoRecords {
        path: PathBuf,
        skipped: Box<Skipped>,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One process stream of the input.
#[derive(Clone, Debug)]
struct Source {
    /// Where its segments are read (a staged copy for an archive).
    seg_dir: PathBuf,
    /// The archive directory its segments were staged from.
    origin: Option<PathBuf>,
}

/// What one pass read.
#[derive(Clone, Debug, Default)]
pub struct PassStats {
    pub records: u64,
    pub corrupt: u64,
    pub seconds: f64,
    /// Each stream read, with its cursor's counters.
    pub per_stream: Vec<(StreamId, CursorStats)>,
}

/// The input of an offline command. See the module docs.
#[derive(Debug)]
pub struct Input {
    dir: PathBuf,
    streams: BTreeMap<StreamId, Source>,
    progress: Option<&'static str>,
    /// What the passes skipped (see [`Skipped`]).
    skips: Mutex<SkipLog>,
    /// The staged archives (removed on drop).
    _staged: ScratchDir,
}

impl Input {
    /// Find every process stream under `dir`; stage archives.
    pub fn open(dir: &Path) -> Result<Input, InputError> {
        if !dir.is_dir() {
            return Err(InputError::Missing {
                path: dir.to_path_buf(),
            });
        }
        let staged = ScratchDir::new("input");
        let mut streams = BTreeMap::new();
        let mut skips = SkipLog::default();
        for (i, root) in find_log_roots(dir).into_iter().enumerate() {
            let dest = staged.path().join(i.to_string());
            let segs =
                stage_archive(&root, &dest, &mut skips).map_err(|source| InputError::Io {
                    path: root.clone(),
                    source,
                })?;
            let origins: BTreeMap<PathBuf, PathBuf> = segs
                .into_iter()
                .filter_map(|s| Some((s.stream_dir, s.origin.parent()?.to_path_buf())))
                .collect();
            let read_root = if origins.is_empty() {
                root.clone()
            } else {
                dest
            };
            // A directory below the root keeps only its own streams.
            let only = (dir != root && dir.starts_with(&root)).then_some(dir);
            for (id, seg_dir) in discover(&read_root) {
                let origin = origins.get(&seg_dir).cloned();
                let home = origin.as_deref().unwrap_or(&seg_dir);
                if only.is_some_and(|o| !home.starts_with(o)) {
                    continue;
                }
                streams.entry(id).or_insert(Source { seg_dir, origin });
            }
        }
        if streams.is_empty() && skips.summary().is_empty() {
            return Err(InputError::NoSegments {
                path: dir.to_path_buf(),
            });
        }
        let input = Input {
            dir: dir.to_path_buf(),
            streams,
            progress: None,
            skips: Mutex::new(skips),
            _staged: staged,
        };
        if !input.any_record() {
            return Err(InputError::NoRecords {
                path: dir.to_path_buf(),
                skipped: Box::new(input.skipped()),
            });
        }
        Ok(input)
    }

    /// Whether some stream holds a record that decodes (reads until the first one: a
    /// directory of garbage segments is read whole, what it skipped logged).
    fn any_record(&self) -> bool {
        let mut log = SkipLog::default();
        let mut buf: Vec<RawRecord> = Vec::with_capacity(READ_BATCH);
        let mut recs = Vec::new();
        let mut found = false;
        for (id, src) in &self.streams {
            let mut clock = ProcessClock::default();
            let mut reader = StreamReader::new(self, id, src);
            while !found {
                let Some(segment) = reader.next_batch(&mut buf, &mut log) else {
                    break;
                };
                let (n, b) = crate::engine::decode_batch(&buf, &mut clock, &mut recs);
                reader.note_corrupt(segment, b.corrupt, &mut log);
                found = n > 0;
            }
            if found {
                break;
            }
        }
        self.merge_skips(log);
        found
    }

    /// What the passes so far skipped: corrupt records, unreadable and refused files.
    pub fn skipped(&self) -> Skipped {
        self.skips.lock().map(|l| l.summary()).unwrap_or_default()
    }

    fn merge_skips(&self, log: SkipLog) {
        if let Ok(mut l) = self.skips.lock() {
            l.merge(log);
        }
    }

    /// Where segment `index` of `src` is as the user gave it (the archived file for a staged
    /// archive).
    fn user_path(src: &Source, index: u64) -> PathBuf {
        match &src.origin {
            Some(o) => o.join(format!("{}.zst", segment_file_name(index, false))),
            None => {
                let sealed = src.seg_dir.join(segment_file_name(index, false));
                let open = src.seg_dir.join(segment_file_name(index, true));
                if !sealed.exists() && open.exists() {
                    open
                } else {
                    sealed
                }
            }
        }
    }

    /// Show a progress bar named `label` on standard error while a pass runs (when it is a
    /// terminal).
    pub fn show_progress(&mut self, label: &'static str) {
        self.progress = Some(label);
    }

    /// The directory as given.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every stream, by id.
    pub fn streams(&self) -> impl Iterator<Item = &StreamId> {
        self.streams.keys()
    }

    /// The streams of these jobs, by id.
    pub fn streams_of<'a>(&self, jobs: impl IntoIterator<Item = &'a String>) -> Vec<StreamId> {
        let jobs: BTreeSet<&String> = jobs.into_iter().collect();
        self.streams
            .keys()
            .filter(|id| jobs.contains(&id.job))
            .cloned()
            .collect()
    }

    /// One pass over every stream (by id): each stream's batches through `engine` and
    /// `extras`, its end, then the outputs to `route` after every batch.
    pub fn run(
        &self,
        engine: &mut Engine,
        extras: &mut [&mut dyn Analysis],
        route: &mut dyn FnMut(Output),
    ) -> PassStats {
        self.run_streams(&mut self.streams.keys(), engine, extras, route)
    }

    /// [`Input::run`] over these streams only (unknown ids are skipped).
    pub fn run_streams(
        &self,
        ids: &mut dyn Iterator<Item = &StreamId>,
        engine: &mut Engine,
        extras: &mut [&mut dyn Analysis],
        route: &mut dyn FnMut(Output),
    ) -> PassStats {
        let t0 = Instant::now();
        let bar = progress_bar(self.progress, self.streams.len() as u64);
        let mut buf: Vec<RawRecord> = Vec::with_capacity(READ_BATCH);
        let mut out = Vec::new();
        let mut stats = PassStats::default();
        let mut log = SkipLog::default();
        for id in ids {
            let Some(src) = self.streams.get(id) else {
                continue;
            };
            let mut reader = StreamReader::new(self, id, src);
            while let Some(segment) = reader.next_batch(&mut buf, &mut log) {
                let b = if buf.is_empty() {
                    crate::engine::BatchStats::default()
                } else {
                    engine.apply(id, &buf, Some(segment), extras, &mut out)
                };
                reader.note_corrupt(segment, b.corrupt, &mut log);
                stats.records += b.records;
                stats.corrupt += b.corrupt;
                out.drain(..).for_each(&mut *route);
            }
            engine.end_stream(id, extras, &mut out);
            engine.release_stream(id);
            out.drain(..).for_each(&mut *route);
            stats.per_stream.push((id.clone(), reader.stats()));
            bar.inc(1);
            bar.set_message(format!("{} records", stats.records));
        }
        bar.finish_and_clear();
        self.merge_skips(log);
        stats.seconds = t0.elapsed().as_secs_f64();
        stats
    }

    /// The records of segments `first..=last` of stream `id`, read by a cursor started where
    /// `first` begins and aligned from `clock` (the stream's clock there, e.g. from a time
    /// index), each handed to `f` with the segment it came from.
    pub fn read_segments(
        &self,
        id: &StreamId,
        first: u64,
        last: u64,
        mut clock: ProcessClock,
        f: &mut dyn FnMut(u64, &Decoded),
    ) {
        let Some(src) = self.streams.get(id) else {
            return;
        };
        let from = CursorCheckpoint {
            segment: Some(first),
            ..CursorCheckpoint::default()
        };
        let mut cursor = self.cursor(id, src, Some(from));
        let mut buf: Vec<RawRecord> = Vec::with_capacity(READ_BATCH);
        let mut recs = Vec::with_capacity(READ_BATCH);
        let mut at = None;
        loop {
            buf.clear();
            if let Err(e) = cursor.poll(&mut buf, READ_BATCH) {
                tracing::warn!(stream = %id, "{e}");
                return;
            }
            let cp = cursor.checkpoint();
            let Some(seg) = cp.segment.filter(|s| *s <= last) else {
                return;
            };
            // An empty batch is a segment of corrupt records, unless the cursor did not move.
            let now = Some((seg, cp.offset, cp.segment_done));
            if buf.is_empty() && now == at {
                return;
            }
            at = now;
            let (n, _) = crate::engine::decode_batch(&buf, &mut clock, &mut recs);
            for d in &recs[..n] {
                f(seg, d);
            }
            if seg == last && cp.segment_done {
                return;
            }
        }
    }

    /// Stream `id`'s segment files as the input holds them (the archived `.zst` for a staged
    /// archive), by index; a sealed segment wins over its `.open` twin.
    pub fn segment_files(&self, id: &StreamId) -> Vec<(u64, PathBuf)> {
        let Some(src) = self.streams.get(id) else {
            return Vec::new();
        };
        let dir = src.origin.as_deref().unwrap_or(&src.seg_dir);
        let mut out: Vec<(u64, PathBuf)> = crate::util::fs::files_under(dir, 0, &|n| {
            parse_segment_name(n.strip_suffix(".zst").unwrap_or(n)).is_some()
        })
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let (i, _) = parse_segment_name(name.strip_suffix(".zst").unwrap_or(name))?;
            Some((i, p))
        })
        .collect();
        out.sort();
        out.dedup_by_key(|(i, _)| *i);
        out
    }

    /// The stream's last segment was never sealed (`seg-*.cis.open`): its writer did not finish.
    pub fn unsealed(&self, id: &StreamId) -> bool {
        self.segment_files(id).iter().any(|(_, p)| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".cis.open"))
        })
    }

    fn cursor(&self, id: &StreamId, src: &Source, from: Option<CursorCheckpoint>) -> StreamCursor {
        StreamCursor::new(id.clone(), Some(src.seg_dir.clone()), None, from).with_segment_batches()
    }
}

/// One stream read batch by batch, each batch from one segment, past the segments that cannot
/// be opened or read (logged as skipped, the cursor restarted after them), the corrupt records
/// of each segment logged.
struct StreamReader<'a> {
    input: &'a Input,
    id: &'a StreamId,
    src: &'a Source,
    cursor: StreamCursor,
    /// Counters of the cursors replaced after a skipped segment.
    before: CursorStats,
    /// Corrupt records met on disk by the last batch's poll (invalid headers, torn tail).
    disk_corrupt: u64,
    /// The cursor's refusals already logged.
    refusals_seen: usize,
}

impl<'a> StreamReader<'a> {
    fn new(input: &'a Input, id: &'a StreamId, src: &'a Source) -> StreamReader<'a> {
        StreamReader {
            input,
            id,
            src,
            cursor: input.cursor(id, src, None),
            before: CursorStats::default(),
            disk_corrupt: 0,
            refusals_seen: 0,
        }
    }

    /// The next batch into `buf` and the segment it came from; `None` at the stream's end. A
    /// batch may be empty when its segment held only corrupt records.
    fn next_batch(&mut self, buf: &mut Vec<RawRecord>, log: &mut SkipLog) -> Option<u64> {
        loop {
            buf.clear();
            let was = self.cursor.stats();
            if let Err(e) = self.cursor.poll(buf, READ_BATCH) {
                let (path, how, reason) = of_source_error(&e);
                log.file(&user_path_of(self.src, &path), how, reason);
                let index = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(parse_segment_name)
                    .map(|(i, _)| i);
                let Some(index) = index else {
                    tracing::warn!(stream = %self.id, "{e}");
                    return None;
                };
                // Go on after the segment: a new cursor from where this one stands, that
                // segment counted as done (and as archived: offline nothing is offered).
                let from = CursorCheckpoint {
                    segment: Some(index),
                    offset: 0,
                    segment_done: true,
                    acked: Some(index),
                    ..self.cursor.checkpoint()
                };
                add_stats(&mut self.before, self.cursor.stats());
                self.cursor = self.input.cursor(self.id, self.src, Some(from));
                self.refusals_seen = 0;
                continue;
            }
            for (path, reason) in self.cursor.refusals().skip(self.refusals_seen) {
                log.file(
                    &user_path_of(self.src, path),
                    FileSkip::Refused,
                    reason.to_string(),
                );
            }
            self.refusals_seen = self.cursor.refusals().count();
            let now = self.cursor.stats();
            self.disk_corrupt =
                (now.corrupt - was.corrupt) + u64::from(now.torn_bytes > was.torn_bytes);
            let segment = self.cursor.checkpoint().segment?;
            if buf.is_empty() && self.disk_corrupt == 0 {
                return None;
            }
            return Some(segment);
        }
    }

    /// Log the last batch's corrupt records: those met on disk plus `decoded` (the engine's).
    fn note_corrupt(&self, segment: u64, decoded: u64, log: &mut SkipLog) {
        let n = self.disk_corrupt + decoded;
        if n > 0 {
            log.corrupt(&Input::user_path(self.src, segment), n);
        }
    }

    /// The stream's cursor counters, all cursors together.
    fn stats(&self) -> CursorStats {
        let mut s = self.before;
        add_stats(&mut s, self.cursor.stats());
        s
    }
}

/// A path the cursor named, as the user gave it (the archived file for a staged segment).
fn user_path_of(src: &Source, path: &Path) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str());
    match (&src.origin, name) {
        (Some(o), Some(n)) => o.join(format!("{n}.zst")),
        _ => path.to_path_buf(),
    }
}

fn add_stats(to: &mut CursorStats, s: CursorStats) {
    to.records += s.records;
    to.from_ring += s.from_ring;
    to.from_segments += s.from_segments;
    to.seq_gaps += s.seq_gaps;
    to.corrupt += s.corrupt;
    to.torn_bytes += s.torn_bytes;
    to.epochs = to.epochs.max(s.epochs);
    to.refused_files += s.refused_files;
}

/// Every process stream under one (read) root: id -> segment directory.
fn discover(root: &Path) -> Vec<(StreamId, PathBuf)> {
    let mut d = Discovery::new(&SourcesConfig {
        shm_enabled: false,
        segment_dirs: vec![root.to_path_buf()],
        ..SourcesConfig::default()
    });
    d.scan()
        .into_iter()
        .filter_map(|s| Some((s.id, s.seg_dir?)))
        .collect()
}

fn progress_bar(label: Option<&str>, streams: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    let Some(label) = label.filter(|_| std::io::stderr().is_terminal()) else {
        return indicatif::ProgressBar::hidden();
    };
    let bar = indicatif::ProgressBar::new(streams);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{label} {{bar:30}} {{pos}}/{{len}} streams {{msg}} ({{elapsed}})"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

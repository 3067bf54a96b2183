//! [`Input`]: what an offline command reads, found and staged once. `DIR` may be a segment root,
//! a test-bed output directory, a job, host or process directory below a root, or an agent
//! archive (its `raw/**/seg-*.cis.zst` are decompressed once, into a scratch directory removed
//! with the input). Every pass reads each process stream with the daemon's own exactly-once
//! [`StreamCursor`] and hands its batches to an [`Engine`] (plus the command's extras).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use comminsight_wire::segment::parse_segment_name;
use comminsight_wire::RawRecord;

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
    #[error("{path}: no segment files (seg-*.cis or archived seg-*.cis.zst) under it")]
    NoSegments { path: PathBuf },
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
        for (i, root) in find_log_roots(dir).into_iter().enumerate() {
            let dest = staged.path().join(i.to_string());
            let segs = stage_archive(&root, &dest).map_err(|source| InputError::Io {
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
        if streams.is_empty() {
            return Err(InputError::NoSegments {
                path: dir.to_path_buf(),
            });
        }
        Ok(Input {
            dir: dir.to_path_buf(),
            streams,
            progress: None,
            _staged: staged,
        })
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
        for id in ids {
            let Some(src) = self.streams.get(id) else {
                continue;
            };
            let mut cursor = self.cursor(id, src, None);
            loop {
                buf.clear();
                if let Err(e) = cursor.poll(&mut buf, READ_BATCH) {
                    tracing::warn!(stream = %id, "{e}");
                    break;
                }
                if buf.is_empty() {
                    break;
                }
                let segment = cursor.checkpoint().segment;
                let b = engine.apply(id, &buf, segment, extras, &mut out);
                stats.records += b.records;
                stats.corrupt += b.corrupt;
                out.drain(..).for_each(&mut *route);
            }
            engine.end_stream(id, extras, &mut out);
            engine.release_stream(id);
            out.drain(..).for_each(&mut *route);
            stats.per_stream.push((id.clone(), cursor.stats()));
            bar.inc(1);
            bar.set_message(format!("{} records", stats.records));
        }
        bar.finish_and_clear();
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
            if buf.is_empty() {
                return;
            }
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

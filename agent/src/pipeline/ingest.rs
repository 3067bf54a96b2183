//! The ingest loop (one std thread): discovers streams, polls every cursor, applies the
//! [`Engine`], routes its outputs (and the live hang monitor's) to the sinks through the
//! [`Router`], hands final segments to the archive worker, and checkpoints cursor positions
//! together with the engine's state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comminsight_wire::{RawRecord, RECORD_SIZE};

use super::hang_monitor::HangMonitor;
use super::host_sources::{hang_suspected, host_recorder, host_values};
use super::router::Router;
use super::state;
use super::status::{Live, StreamStatus};
use crate::clock::HostOffset;
use crate::config::AgentConfig;
use crate::engine::{Builtins, Engine, Output};
use crate::host::context::is_host_stream;
use crate::metrics::SelfMetrics;
use crate::sources::{CursorCheckpoint, Discovery, SealedSegment, StreamCursor};
use crate::stream::{Alignment, StreamId};
use crate::util::fs::write_atomic;
use crate::util::time::unix_ms;

/// Most records taken from one stream per poll round (keeps the loop fair between streams).
const BATCH: usize = 65_536;
/// The streams' state is published for `/status` this often.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// The next checkpoint comes no sooner than this many times the last one's duration (so they
/// cost at most 1/20 of the ingest loop; `[agent] checkpoint_interval_ms` is the floor).
const CHECKPOINT_SPACING: u32 = 20;

/// A final segment on its way to the archive worker.
pub struct ArchiveJob {
    pub seg: SealedSegment,
    pub align: Alignment,
    pub gpu_align: Option<Alignment>,
}

/// What the ingest loop shares with the rest of the daemon.
pub struct IngestLinks {
    /// Set to stop the loop (it writes a last checkpoint first).
    pub stop: Arc<AtomicBool>,
    /// Final segments for the archive worker (`None`: archive disabled).
    pub archive_tx: Option<SyncSender<ArchiveJob>>,
    /// `(stream, index)` the archive stored.
    pub archive_ack: Option<Receiver<(StreamId, u64)>>,
    /// This host's latest offset to the master.
    pub host_offset: Arc<Mutex<Option<HostOffset>>>,
    pub self_metrics: Arc<SelfMetrics>,
    /// Milliseconds since the Unix epoch at the loop's last round (for the systemd watchdog).
    pub heartbeat: Arc<std::sync::atomic::AtomicU64>,
    /// Where the outputs go.
    pub router: Router,
    /// The live hang path (None: `[hang] enabled = false`).
    pub hang: Option<HangMonitor>,
    /// Where the loop publishes its streams for `/status` and `status.json`.
    pub live: Arc<Live>,
    /// Where the loop publishes the host context's values (OTLP and `/metrics`).
    pub telemetry: Option<Arc<crate::telemetry::Source>>,
}

/// What the loop did, for the caller's log.
#[derive(Debug, Default)]
pub struct IngestReport {
    pub records: u64,
    pub streams: usize,
    pub checkpoints: u64,
}

struct Tracked {
    cursor: StreamCursor,
    /// Final segments waiting for room in the archive queue.
    pending: Vec<SealedSegment>,
    /// Finished with nothing pending at its last poll: polled again only on scan rounds.
    idle: bool,
    /// Since when the cursor has been finished (for the end of its step session).
    finished_since: Option<Instant>,
    /// How old the newest record of its last batch was when it was read (ms).
    lag_ms: u64,
}

/// Where the loop starts: the last checkpoint, or nothing.
pub struct Start {
    pub cursors: BTreeMap<StreamId, CursorCheckpoint>,
    pub engine: Engine,
}

impl Start {
    /// Load `<state_dir>/checkpoint.json` (fresh state when there is none).
    pub fn load(cfg: &AgentConfig) -> anyhow::Result<Start> {
        let state_dir = &cfg.agent.state_dir;
        std::fs::create_dir_all(state_dir.join("results")).map_err(|e| {
            anyhow::anyhow!(
                "{}: cannot create the state directory ({e}); set [agent] state_dir to a writable directory",
                state_dir.display()
            )
        })?;
        let loaded = match state::load(state_dir) {
            Err(e @ state::StateError::Corrupt { .. }) => {
                // Nothing is lost by starting over: every segment still on disk is read again,
                // the archive skips what it holds, and the metrics are rebuilt from the records.
                let aside = state_dir.join(format!("checkpoint.json.corrupt-{}", unix_ms()));
                let _ = std::fs::rename(state::state_path(state_dir), &aside);
                tracing::warn!("{e}; moved it to {} and starting over", aside.display());
                None
            }
            other => other?,
        };
        let mut start = match loaded {
            Some(st) => {
                tracing::info!(
                    streams = st.cursors.len(),
                    "continuing from the checkpoint in {}",
                    state_dir.display()
                );
                Start {
                    cursors: st.cursors.into_iter().collect(),
                    engine: st.processor,
                }
            }
            None => Start {
                cursors: BTreeMap::new(),
                engine: Engine::default(),
            },
        };
        let mut builtins = Builtins::daemon(cfg.otlp.max_series);
        builtins.moe = cfg.moe.enabled;
        start.engine.enable(builtins);
        if cfg.steps.enabled {
            let templates = cfg.steps.templates().map_err(|e| {
                anyhow::anyhow!(
                    "{e}; fix it or leave [steps] templates_dir empty for the built-in templates"
                )
            })?;
            start.engine.enable_steps(templates, cfg.steps.settings());
        }
        Ok(start)
    }
}

/// The loop's state between rounds.
struct Ingest<'a> {
    cfg: &'a AgentConfig,
    links: IngestLinks,
    engine: Engine,
    discovery: Discovery,
    streams: BTreeMap<StreamId, Tracked>,
    /// Checkpointed streams not rediscovered yet.
    saved: BTreeMap<StreamId, CursorCheckpoint>,
    buf: Vec<RawRecord>,
    out: Vec<Output>,
    report: IngestReport,
}

/// Run until `links.stop` is set.
pub fn run(cfg: &AgentConfig, links: IngestLinks, start: Start) -> anyhow::Result<IngestReport> {
    crate::sources::prepare_shm_dir(&cfg.sources);
    let host_name = super::host_name(cfg);
    let mut recorder = host_recorder(cfg, &host_name);
    let mut sources = cfg.sources.clone();
    if let Some(r) = &recorder {
        // The host streams are one more segment root: read, archived and rebuilt like the
        // plugin's.
        sources.segment_dirs.push(r.root().to_path_buf());
    }
    let mut ing = Ingest {
        cfg,
        links,
        engine: start.engine,
        // Host streams are the agent's own: a `host-*` directory under a log root is refused.
        discovery: Discovery::new(&sources).with_host_root(
            cfg.agent
                .state_dir
                .join(crate::host::recorder::HOST_STREAMS_DIR),
        ),
        streams: BTreeMap::new(),
        saved: start.cursors,
        buf: Vec::with_capacity(BATCH),
        out: Vec::new(),
        report: IngestReport::default(),
    };
    let poll = Duration::from_millis(cfg.agent.poll_interval_ms.max(1));
    let scan_every = Duration::from_millis(cfg.sources.scan_interval_ms.max(1));
    let ckpt_every = Duration::from_millis(cfg.agent.checkpoint_interval_ms.max(1));
    let mut last_scan: Option<Instant> = None;
    let mut last_publish: Option<Instant> = None;
    let mut last_ckpt = Instant::now();
    let mut ckpt_gap = ckpt_every;
    loop {
        ing.links.heartbeat.store(unix_ms(), Ordering::Relaxed);
        let stopping = ing.links.stop.load(Ordering::Acquire);
        let now = Instant::now();
        let scan_round = stopping || last_scan.is_none_or(|t| now.duration_since(t) >= scan_every);
        if scan_round {
            last_scan = Some(now);
            ing.scan();
        }
        if last_publish.is_none_or(|t| now.duration_since(t) >= PUBLISH_EVERY) {
            last_publish = Some(now);
            ing.publish(&host_name);
            if let Some(r) = &recorder {
                ing.links.live.set_host_context(r.status());
            }
        }
        ing.take_acks();
        let host = ing
            .links
            .host_offset
            .lock()
            .map(|g| g.clone())
            .unwrap_or(None);
        let newest = ing.poll_all(scan_round, now, host.as_ref());
        if let Some(r) = recorder.as_mut() {
            let gpus = ing
                .engine
                .host_context()
                .map(|h| h.gpu().bound_gpus(&host_name))
                .unwrap_or_default();
            r.set_gpu_fast(hang_suspected(&ing.engine));
            r.tick(&ing.live_ranks(&host_name), &gpus, now);
            if stopping {
                r.finish();
            }
        }
        // Every stream caught up: a job's step template may be chosen now.
        ing.engine.round(&mut ing.out);
        if let Some(m) = ing.links.hang.as_mut() {
            m.tick(
                &ing.engine,
                host.as_ref().map_or(0, |h| h.offset_ns / 1000),
                &mut ing.out,
            );
        }
        ing.route(host.as_ref());
        ing.links.router.flush_steps(false);
        ing.note_lag(newest);
        if stopping || last_ckpt.elapsed() >= ckpt_gap {
            let t = Instant::now();
            ing.checkpoint();
            last_ckpt = Instant::now();
            // A checkpoint that took T waits at least CHECKPOINT_SPACING x T for the next one:
            // under heavy load (large engine state) checkpoints take at most ~5 % of the loop.
            ckpt_gap = ckpt_every.max(t.elapsed() * CHECKPOINT_SPACING);
        }
        if stopping {
            return Ok(ing.report);
        }
        std::thread::sleep(poll);
    }
}

impl Ingest<'_> {
    /// `(job, pid)` of this host's rank processes whose streams are live: the processes the
    /// host recorder follows.
    fn live_ranks(&self, host: &str) -> BTreeSet<(String, u32)> {
        self.streams
            .iter()
            .filter(|(id, t)| id.host == host && !is_host_stream(id) && !t.cursor.is_finished())
            .filter_map(|(id, _)| Some((id.job.clone(), id.pid.parse::<u32>().ok()?)))
            .collect()
    }

    /// Find new streams, drop finished ones that are gone, update rings and directories.
    fn scan(&mut self) {
        let found = self.discovery.scan();
        // Finished streams whose directory and ring are gone (plugin retention, cleanup) are
        // dropped, with their checkpoint entry: a daemon running for months does not keep
        // polling every process it ever saw.
        let seen: std::collections::BTreeSet<&StreamId> = found.iter().map(|d| &d.id).collect();
        let before = self.streams.len();
        let engine = &mut self.engine;
        self.streams.retain(|id, t| {
            let keep = seen.contains(id) || !t.idle || !t.pending.is_empty();
            if !keep {
                engine.forget(id);
            }
            keep
        });
        if self.streams.len() < before {
            tracing::debug!(
                "forgot {} finished streams that are gone",
                before - self.streams.len()
            );
        }
        // A stream no longer found has no ring of its own: the ring it followed is gone, or it
        // now belongs to another id (discovery split a dotted `<job>.<host>` ring name another
        // way once the process' segment directory appeared); reading it on would count its
        // records twice.
        for (id, t) in self.streams.iter_mut() {
            if !seen.contains(id) {
                t.cursor.set_ring(None);
            }
        }
        for d in found {
            match self.streams.get_mut(&d.id) {
                Some(t) => {
                    // The segment directory may appear after the ring (the plugin creates the
                    // ring first): a cursor made from the ring alone takes it now.
                    t.cursor.set_seg_dir(d.seg_dir);
                    t.cursor.set_ring(d.ring);
                    t.cursor.set_owner(d.ring_owner);
                }
                None => {
                    let from = self.saved.remove(&d.id);
                    let cursor = StreamCursor::for_stream(&d, from, &self.cfg.sources);
                    self.streams.insert(
                        d.id,
                        Tracked {
                            cursor,
                            pending: Vec::new(),
                            idle: false,
                            finished_since: None,
                            lag_ms: 0,
                        },
                    );
                }
            }
        }
        self.report.streams = self.streams.len();
    }

    /// The archive's acknowledgements into the cursors.
    fn take_acks(&mut self) {
        if let Some(acks) = &self.links.archive_ack {
            while let Ok((id, index)) = acks.try_recv() {
                if let Some(t) = self.streams.get_mut(&id) {
                    t.cursor.ack_sealed(index);
                }
            }
        }
    }

    /// Poll every stream that may have news; returns the newest host time seen (ns).
    fn poll_all(&mut self, scan_round: bool, now: Instant, host: Option<&HostOffset>) -> u64 {
        let stream_end = Duration::from_secs(self.cfg.steps.stream_end_s);
        let mut newest = 0u64;
        let ids: Vec<StreamId> = self
            .streams
            .iter()
            .filter(|(_, t)| !t.idle || scan_round)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            newest = newest.max(self.poll_stream(&id, host));
            self.offer_sealed(&id, host);
            let t = self.streams.get_mut(&id).expect("listed above");
            if t.cursor.is_finished() {
                // The process ended (its ring with it, whether or not discovery has noticed the
                // ring is gone yet; segments only: no new segment for [steps] stream_end_s): its
                // step session drains.
                let since = *t.finished_since.get_or_insert(now);
                let rang = t.cursor.has_ring() || t.cursor.had_ring();
                if rang || now.duration_since(since) >= stream_end {
                    self.engine.end_stream(&id, &mut [], &mut self.out);
                    self.route(host);
                    let _ = self.links.router.journal().close(&id);
                }
            } else {
                t.finished_since = None;
            }
            let t = self.streams.get_mut(&id).expect("listed above");
            t.idle = t.pending.is_empty() && t.cursor.is_finished();
        }
        newest
    }

    /// Take every batch the stream has now through the engine.
    fn poll_stream(&mut self, id: &StreamId, host: Option<&HostOffset>) -> u64 {
        let mut newest = 0;
        loop {
            self.buf.clear();
            let t = self.streams.get_mut(id).expect("a tracked stream");
            if let Err(e) = t.cursor.poll(&mut self.buf, BATCH) {
                tracing::warn!(stream = %id, "{e}");
                break;
            }
            if self.buf.is_empty() {
                break;
            }
            // Progress: the stream has not ended (yet).
            t.finished_since = None;
            let b = self
                .engine
                .apply(id, &self.buf, None, &mut [], &mut self.out);
            self.report.records += b.records;
            newest = newest.max(b.newest_ns);
            if b.newest_ns > 0 {
                t.lag_ms = unix_ns().saturating_sub(b.newest_ns) / 1_000_000;
            }
            self.links
                .self_metrics
                .add_records(b.records, b.records * RECORD_SIZE as u64);
            self.route(host);
            if self.buf.len() < BATCH {
                break;
            }
        }
        newest
    }

    /// Final segments go to the archive (taken even without one, so the cursor can finish).
    fn offer_sealed(&mut self, id: &StreamId, host: Option<&HostOffset>) {
        let t = self.streams.get_mut(id).expect("a tracked stream");
        let sealed = t.cursor.take_sealed();
        let Some(tx) = &self.links.archive_tx else {
            return;
        };
        t.pending.extend(sealed);
        while let Some(seg) = t.pending.first() {
            let job = ArchiveJob {
                seg: seg.clone(),
                align: self.engine.alignment(id, host),
                gpu_align: self.engine.gpu_alignment(id, host),
            };
            match tx.try_send(job) {
                Ok(()) => {
                    t.pending.remove(0);
                    self.links
                        .self_metrics
                        .archive_backlog
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(TrySendError::Full(_)) => break,
                Err(TrySendError::Disconnected(_)) => {
                    t.pending.clear();
                    break;
                }
            }
        }
    }

    /// The outputs gathered so far to the sinks.
    fn route(&mut self, host: Option<&HostOffset>) {
        for o in self.out.drain(..) {
            self.links.router.route(o, host);
        }
    }

    /// Every stream's state to [`Live`] (rank from the hang tracker, once the stream said it).
    fn publish(&self, host_name: &str) {
        let mut ranks = BTreeMap::new();
        let jobs: std::collections::BTreeSet<&str> =
            self.streams.keys().map(|id| id.job.as_str()).collect();
        for job in jobs {
            for (id, _, rank) in self.engine.hang().streams_of(job) {
                ranks.insert(id, rank);
            }
        }
        let streams = self
            .streams
            .iter()
            .map(|(id, t)| {
                let st = t.cursor.stats();
                StreamStatus {
                    job: id.job.clone(),
                    host: id.host.clone(),
                    pid: id.pid.clone(),
                    rank: ranks.get(id).copied().filter(|r| *r >= 0),
                    records: st.records,
                    lag_ms: t.lag_ms,
                    drops: st.seq_gaps + st.corrupt,
                    finished: t.idle,
                }
            })
            .collect();
        self.links.live.set_streams(streams);
        if let (Some(t), Some(h)) = (&self.links.telemetry, self.engine.host_context()) {
            t.set_host_values(host_values(h, &ranks, host_name));
        }
    }

    fn note_lag(&self, newest: u64) {
        if newest > 0 {
            let now_ns = unix_ns();
            self.links
                .self_metrics
                .lag_ms
                .store(now_ns.saturating_sub(newest) / 1_000_000, Ordering::Relaxed);
        }
    }

    /// Steps reach the disk before the state that emitted them (a restart re-emits what came
    /// after the checkpoint; the journal skips what it has); then the state and the results.
    fn checkpoint(&mut self) {
        let journal = self.links.router.journal();
        if let Err(e) = journal.sync() {
            tracing::warn!("{}: cannot write the steps: {e}", journal.root().display());
        }
        if let Err(e) = journal.write_jobs(&self.engine.step_jobs()) {
            tracing::warn!("{}: cannot write the steps: {e}", journal.root().display());
        }
        self.links.router.flush_steps(true);
        let archive = self
            .cfg
            .archive
            .enabled
            .then_some(self.cfg.archive.dir.as_path());
        checkpoint(
            &self.cfg.agent.state_dir,
            archive,
            &self.streams,
            &self.saved,
            &self.engine,
        );
        self.report.checkpoints += 1;
    }
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `<state_dir>/results/steps/`: the online step summaries.
pub fn steps_dir(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("results").join("steps")
}

/// Save the state and the results (`<state_dir>/results/{metrics,roles}.json`, and each job's
/// roles with the archive: `<archive>/roles/<job>.json`); failures are logged, the loop goes on
/// (the next checkpoint retries).
fn checkpoint(
    state_dir: &std::path::Path,
    archive: Option<&std::path::Path>,
    streams: &BTreeMap<StreamId, Tracked>,
    not_yet_seen: &BTreeMap<StreamId, CursorCheckpoint>,
    engine: &Engine,
) {
    let mut cursors: Vec<(StreamId, CursorCheckpoint)> = streams
        .iter()
        .map(|(id, t)| (id.clone(), t.cursor.checkpoint()))
        .collect();
    // Streams restored from the last checkpoint but not rediscovered yet keep their place.
    cursors.extend(not_yet_seen.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Err(e) = state::save(state_dir, &cursors, engine) {
        tracing::warn!("{e}");
    }
    let results = results_path(state_dir);
    let text = crate::offline::replay::render_metrics(&engine.snapshot());
    if let Err(e) = write_atomic(&results, text.as_bytes()) {
        tracing::warn!("{}: cannot write results: {e}", results.display());
    }
    let jobs = engine.roles();
    let roles = state_dir.join("results").join("roles.json");
    let text = crate::roles::render(&jobs);
    if let Err(e) = write_atomic(&roles, text.as_bytes()) {
        tracing::warn!("{}: cannot write results: {e}", roles.display());
    }
    if let Some(dir) = archive {
        let dir = dir.join("roles");
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!("{}: cannot create: {e}", dir.display());
            return;
        }
        for j in &jobs {
            // Job ids are directory names already (segment layout); keep them one path component.
            let file = dir.join(format!("{}.json", j.job.replace(['/', '\\'], "_")));
            let text = crate::roles::render(std::slice::from_ref(j));
            if let Err(e) = write_atomic(&file, text.as_bytes()) {
                tracing::warn!("{}: cannot write: {e}", file.display());
            }
        }
    }
}

/// `<state_dir>/results/metrics.json`.
pub fn results_path(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("results").join("metrics.json")
}

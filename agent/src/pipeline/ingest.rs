//! The ingest loop (one std thread): discovers streams, polls every cursor, feeds the
//! [`Processor`], hands final segments to the archive worker and checkpoints cursor positions
//! together with the processor state.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comminsight_wire::record::Record;
use comminsight_wire::{RawRecord, RECORD_SIZE};

use super::process::Processor;
use super::state;
use crate::clock::HostOffset;
use crate::config::AgentConfig;
use crate::metrics::{MetricsSnapshot, SelfMetrics};
use crate::sources::{CursorCheckpoint, Discovery, SealedSegment, StreamCursor};
use crate::steps::journal::StepJournal;
use crate::stream::{Alignment, StreamId};

/// Most records taken from one stream per poll round (keeps the loop fair between streams).
const BATCH: usize = 65_536;

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
    /// First reports of overdue operations (with the comm's name when known).
    pub on_overdue: OverdueHook,
    /// The hang path (None: `[hang] enabled = false`).
    pub hang: Option<crate::hang::monitor::HangMonitor>,
    /// Step summaries for the job master (`(job, JSON lines)`), handed over at each checkpoint
    /// (None: no master configured).
    pub on_steps: Option<StepsHook>,
}

/// Receives a job's step summaries as JSON lines `{"stream", "step": {...}}` (at least once: a
/// restart may repeat steps; readers keep one per `(stream, step.step)`).
pub type StepsHook = Box<dyn FnMut(&str, &[u8]) + Send>;

/// Step summaries waiting for the master, per job.
#[derive(Default)]
struct StepsOutbound {
    pending: BTreeMap<String, Vec<u8>>,
    bytes: usize,
}

/// Hand pending steps to the master this often in bytes at least (else at each checkpoint).
const STEPS_FLUSH_BYTES: usize = 4 << 20;

impl StepsOutbound {
    /// One step line; the arrivals are moved onto the job timeline with this host's offset
    /// (unknown offset: an unbounded error, so none of the rank's waits is attributed).
    fn add(
        &mut self,
        id: &StreamId,
        s: &crate::steps::fsm::StepSummary,
        arrivals: &mut crate::straggler::RankStep,
        host: Option<&HostOffset>,
    ) {
        let (shift_us, err_us) = match host {
            Some(h) => (h.offset_ns / 1000, h.err_ns.div_ceil(1000)),
            None => (0, crate::clock::UNMEASURED_ERR_NS / 1000),
        };
        for a in &mut arrivals.arrivals {
            a.start_us = a.start_us.saturating_add_signed(shift_us);
        }
        arrivals.err_us = arrivals.err_us.saturating_add(err_us);
        let line = serde_json::json!({ "stream": id.to_string(), "step": s, "arrivals": arrivals });
        let buf = self.pending.entry(id.job.clone()).or_default();
        let before = buf.len();
        if serde_json::to_writer(&mut *buf, &line).is_ok() {
            buf.push(b'\n');
        }
        self.bytes += buf.len() - before;
    }

    fn flush(&mut self, hook: &mut StepsHook) {
        for (job, bytes) in std::mem::take(&mut self.pending) {
            hook(&job, &bytes);
        }
        self.bytes = 0;
    }
}

/// Called with the first report of each overdue operation and its comm's name when known.
pub type OverdueHook = Box<dyn FnMut(&StreamId, &Record, Option<&str>) + Send>;

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
}

/// Where the loop starts: the last checkpoint, or nothing.
pub struct Start {
    pub cursors: BTreeMap<StreamId, CursorCheckpoint>,
    pub processor: Processor,
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
                    processor: st.processor,
                }
            }
            None => Start {
                cursors: BTreeMap::new(),
                processor: Processor::new(cfg.otlp.max_series),
            },
        };
        if cfg.steps.enabled {
            let templates = cfg.steps.templates().map_err(|e| {
                anyhow::anyhow!(
                    "{e}; fix it or leave [steps] templates_dir empty for the built-in templates"
                )
            })?;
            start
                .processor
                .enable_steps(templates, cfg.steps.settings());
        }
        Ok(start)
    }
}

/// Run until `links.stop` is set.
pub fn run(
    cfg: &AgentConfig,
    mut links: IngestLinks,
    start: Start,
) -> anyhow::Result<IngestReport> {
    let state_dir = cfg.agent.state_dir.clone();
    let Start {
        cursors: mut saved,
        mut processor,
    } = start;
    let mut discovery = Discovery::new(&cfg.sources);
    let mut streams: BTreeMap<StreamId, Tracked> = BTreeMap::new();
    let poll = Duration::from_millis(cfg.agent.poll_interval_ms.max(1));
    let scan_every = Duration::from_millis(cfg.sources.scan_interval_ms.max(1));
    let ckpt_every = Duration::from_millis(cfg.agent.checkpoint_interval_ms.max(1));
    let stream_end = Duration::from_secs(cfg.steps.stream_end_s);
    let mut last_scan: Option<Instant> = None;
    let mut last_ckpt = Instant::now();
    let mut buf: Vec<RawRecord> = Vec::with_capacity(BATCH);
    let mut report = IngestReport::default();
    let mut journal = StepJournal::new(&steps_dir(&state_dir));
    let mut outbound = links.on_steps.is_some().then(StepsOutbound::default);
    loop {
        links.heartbeat.store(unix_ms(), Ordering::Relaxed);
        let stopping = links.stop.load(Ordering::Acquire);
        let now = Instant::now();
        let scan_round = stopping || last_scan.is_none_or(|t| now.duration_since(t) >= scan_every);
        if scan_round {
            last_scan = Some(now);
            let found = discovery.scan();
            // Finished streams whose directory and ring are gone (plugin retention, cleanup)
            // are dropped, with their checkpoint entry: a daemon running for months does not
            // keep polling every process it ever saw.
            let seen: std::collections::BTreeSet<&StreamId> = found.iter().map(|d| &d.id).collect();
            let before = streams.len();
            streams.retain(|id, t| {
                let keep = seen.contains(id) || !t.idle || !t.pending.is_empty();
                if !keep {
                    processor.forget_steps(id);
                }
                keep
            });
            if streams.len() < before {
                tracing::debug!(
                    "forgot {} finished streams that are gone",
                    before - streams.len()
                );
            }
            // A stream no longer found has no ring of its own: the ring it followed is gone,
            // or it now belongs to another id (discovery split a dotted `<job>.<host>` ring
            // name another way once the process' segment directory appeared); reading it on
            // would count its records twice.
            for (id, t) in streams.iter_mut() {
                if !seen.contains(id) {
                    t.cursor.set_ring(None);
                }
            }
            for d in found {
                match streams.get_mut(&d.id) {
                    Some(t) => {
                        // The segment directory may appear after the ring (the plugin creates
                        // the ring first): a cursor made from the ring alone takes it now.
                        t.cursor.set_seg_dir(d.seg_dir);
                        t.cursor.set_ring(d.ring);
                    }
                    None => {
                        let from = saved.remove(&d.id);
                        let cursor = StreamCursor::for_stream(&d, from, &cfg.sources);
                        streams.insert(
                            d.id,
                            Tracked {
                                cursor,
                                pending: Vec::new(),
                                idle: false,
                                finished_since: None,
                            },
                        );
                    }
                }
            }
            report.streams = streams.len();
        }
        if let Some(acks) = &links.archive_ack {
            while let Ok((id, index)) = acks.try_recv() {
                if let Some(t) = streams.get_mut(&id) {
                    t.cursor.ack_sealed(index);
                }
            }
        }
        let host = links.host_offset.lock().map(|g| g.clone()).unwrap_or(None);
        let mut newest = 0u64;
        for (id, t) in streams.iter_mut() {
            if t.idle && !scan_round {
                continue;
            }
            loop {
                buf.clear();
                match t.cursor.poll(&mut buf, BATCH) {
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(stream = %id, "{e}");
                        break;
                    }
                }
                if buf.is_empty() {
                    break;
                }
                // Progress: the stream has not ended (yet).
                t.finished_since = None;
                let out = processor.apply(id, &buf);
                report.records += out.records;
                newest = newest.max(out.newest_ns);
                links
                    .self_metrics
                    .add_records(out.records, out.records * RECORD_SIZE as u64);
                for (rec, name) in &out.overdue {
                    (links.on_overdue)(id, rec, name.as_deref());
                }
                write_steps(&mut journal, &mut processor, &mut outbound, host.as_ref());
                if buf.len() < BATCH {
                    break;
                }
            }
            // Final segments go to the archive (taken even without one, so the cursor can
            // finish).
            let sealed = t.cursor.take_sealed();
            if let Some(tx) = &links.archive_tx {
                t.pending.extend(sealed);
                while let Some(seg) = t.pending.first() {
                    let job = ArchiveJob {
                        seg: seg.clone(),
                        align: processor.alignment(id, host.as_ref()),
                        gpu_align: processor.gpu_alignment(id, host.as_ref()),
                    };
                    match tx.try_send(job) {
                        Ok(()) => {
                            t.pending.remove(0);
                            links
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
            if t.cursor.is_finished() {
                // The process ended (its ring with it; segments only: no new segment for
                // [steps] stream_end_s): its step session drains.
                let since = *t.finished_since.get_or_insert(now);
                if t.cursor.has_ring() || now.duration_since(since) >= stream_end {
                    processor.end_stream(id);
                    write_steps(&mut journal, &mut processor, &mut outbound, host.as_ref());
                    let _ = journal.close(id);
                }
            } else {
                t.finished_since = None;
            }
            t.idle = t.pending.is_empty() && t.cursor.is_finished();
        }
        // Every stream caught up: a job's step template may be chosen now.
        processor.settle_steps();
        write_steps(&mut journal, &mut processor, &mut outbound, host.as_ref());
        if let (Some(o), Some(hook)) = (outbound.as_mut(), links.on_steps.as_mut()) {
            if o.bytes >= STEPS_FLUSH_BYTES {
                o.flush(hook);
            }
        }
        if let Some(m) = links.hang.as_mut() {
            m.tick(&processor, host.as_ref().map_or(0, |h| h.offset_ns / 1000));
        }
        if newest > 0 {
            let now_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            links
                .self_metrics
                .lag_ms
                .store(now_ns.saturating_sub(newest) / 1_000_000, Ordering::Relaxed);
        }
        if stopping || last_ckpt.elapsed() >= ckpt_every {
            last_ckpt = Instant::now();
            let archive = cfg.archive.enabled.then_some(cfg.archive.dir.as_path());
            // Steps reach the disk before the state that emitted them (a restart re-emits what
            // came after the checkpoint; the journal skips what it has).
            if let Err(e) = journal.sync() {
                tracing::warn!("{}: cannot write the steps: {e}", journal.root().display());
            }
            if let Err(e) = journal.write_jobs(&processor.step_jobs()) {
                tracing::warn!("{}: cannot write the steps: {e}", journal.root().display());
            }
            if let (Some(o), Some(hook)) = (outbound.as_mut(), links.on_steps.as_mut()) {
                o.flush(hook);
            }
            checkpoint(&state_dir, archive, &streams, &saved, &processor);
            report.checkpoints += 1;
        }
        if stopping {
            return Ok(report);
        }
        std::thread::sleep(poll);
    }
}

/// `<state_dir>/results/steps/`: the online step summaries.
pub fn steps_dir(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("results").join("steps")
}

/// Completed steps to their stream files (a write failure is logged; the next ones retry).
fn write_steps(
    journal: &mut StepJournal,
    processor: &mut Processor,
    outbound: &mut Option<StepsOutbound>,
    host: Option<&HostOffset>,
) {
    for (id, s, mut arrivals) in processor.take_steps() {
        if let Err(e) = journal.write(&id, &s) {
            tracing::warn!(stream = %id, "{}: cannot write a step: {e}", journal.root().display());
        }
        if let Some(o) = outbound.as_mut() {
            o.add(&id, &s, &mut arrivals, host);
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Save the state and the results (`<state_dir>/results/{metrics,roles}.json`, and each job's
/// roles with the archive: `<archive>/roles/<job>.json`); failures are logged, the loop goes on
/// (the next checkpoint retries).
fn checkpoint(
    state_dir: &std::path::Path,
    archive: Option<&std::path::Path>,
    streams: &BTreeMap<StreamId, Tracked>,
    not_yet_seen: &BTreeMap<StreamId, CursorCheckpoint>,
    processor: &Processor,
) {
    let mut cursors: Vec<(StreamId, CursorCheckpoint)> = streams
        .iter()
        .map(|(id, t)| (id.clone(), t.cursor.checkpoint()))
        .collect();
    // Streams restored from the last checkpoint but not rediscovered yet keep their place.
    cursors.extend(not_yet_seen.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Err(e) = state::save(state_dir, &cursors, processor) {
        tracing::warn!("{e}");
    }
    let results = results_path(state_dir);
    let text = render_metrics(&processor.snapshot());
    if let Err(e) = state::write_atomic(&results, text.as_bytes()) {
        tracing::warn!("{}: cannot write results: {e}", results.display());
    }
    let jobs = processor.roles();
    let roles = state_dir.join("results").join("roles.json");
    let text = crate::roles::render(&jobs);
    if let Err(e) = state::write_atomic(&roles, text.as_bytes()) {
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
            if let Err(e) = state::write_atomic(&file, text.as_bytes()) {
                tracing::warn!("{}: cannot write: {e}", file.display());
            }
        }
    }
}

/// `<state_dir>/results/metrics.json`.
pub fn results_path(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("results").join("metrics.json")
}

/// The metrics results as written online and by `replay` (byte-identical for the same input).
pub fn render_metrics(s: &MetricsSnapshot) -> String {
    let mut text = serde_json::to_string_pretty(s).expect("snapshot serialises");
    text.push('\n');
    text
}

//! The live topology of `comminsight-agent run`: sources -> transforms -> sinks.
//!
//! * an ingest thread ([`ingest`]) polls every stream cursor, applies the [`crate::engine::Engine`]
//!   (clocks, metrics, roles, hang tracker, steps, straggler arrivals), routes its outputs and
//!   the live hang monitor's ([`hang_monitor`]) to the sinks in one place ([`router`]), and
//!   checkpoints cursors and engine together ([`state`]);
//! * on the job master, every host's hang snapshots are merged and analysed ([`master_hangs`])
//!   and every host's step lines feed the live straggler index;
//! * an archive thread stores every final segment (raw zstd + Parquet) and enforces retention;
//! * tokio tasks: object-store upload, the master link (serve and/or clock sync), signals and
//!   systemd readiness, the HTTP endpoint ([`endpoint`]) and the daemon's state ([`status`]:
//!   `/status`, `<state_dir>/status.json`, systemd `STATUS=`); the OTLP exporter runs its own
//!   thread (it samples the agent's RSS when it exports).
//!
//! Every component degrades alone: no master, no OTLP backend, no object store — the agent keeps
//! ingesting, archiving and checkpointing, and retries.

pub mod endpoint;
pub mod hang_monitor;
mod host_sources;
pub mod ingest;
pub mod master_hangs;
pub mod router;
pub mod state;
pub mod status;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::archive::{Archive, SegmentInput, Uploader};
use crate::clock::{ClockBook, HostOffset};
use crate::config::AgentConfig;
use crate::metrics::SelfMetrics;
use crate::sinks::evidence::EvidenceSink;
use crate::sinks::moe::MoeOutput;
use crate::sinks::step_journal::StepJournal;
use crate::sinks::straggler::{self, StragglerOutput};
use crate::sinks::{LogEvent, OtlpSink};
use crate::stream::StreamId;
use crate::util::time::unix_ms;
use hang_monitor::{HangMonitor, MonitorSettings};
use ingest::{ArchiveJob, IngestLinks};
use router::{MasterPush, Router, StepsTarget};

/// Final segments queued for the archive worker before the ingest loop holds them back.
const ARCHIVE_QUEUE: usize = 256;
/// How often retention runs.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// This host's name: `[agent] host_name`, else the kernel's.
pub fn host_name(cfg: &AgentConfig) -> String {
    if !cfg.agent.host_name.is_empty() {
        return cfg.agent.host_name.clone();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Run the daemon until SIGTERM / SIGINT (or `stop` becomes true, for tests and embedding).
pub fn run(cfg: AgentConfig, stop: Option<watch::Receiver<bool>>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("comminsight-rt")
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(run_async(cfg, stop))
}

async fn run_async(cfg: AgentConfig, stop: Option<watch::Receiver<bool>>) -> anyhow::Result<()> {
    let host = host_name(&cfg);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let self_metrics = Arc::new(SelfMetrics::default());
    // One daemon per state directory: a second one would archive and push everything twice.
    let (_lock, book, host_offset) = open_state(&cfg)?;

    let start = ingest::Start::load(&cfg)?;
    let heartbeat = Arc::new(std::sync::atomic::AtomicU64::new(unix_ms()));
    let live = status::Live::new(
        &host,
        &cfg.agent.state_dir,
        (cfg.otlp.enabled, cfg.archive.enabled),
        heartbeat.clone(),
        self_metrics.clone(),
    );
    let aggregator = start
        .engine
        .metrics()
        .expect("the daemon's engine runs the metrics");
    let source = crate::telemetry::Source::new(aggregator, self_metrics.clone(), &host);
    // The endpoint first (its /readyz says 503 until everything is up) and last: it keeps
    // answering while the daemon shuts down.
    let (http_stop_tx, http_stop_rx) = watch::channel(false);
    let http = endpoint::start(&cfg.http, &live, source.clone(), http_stop_rx).await;

    // Sinks first, so nothing the sources find is waiting for them.
    let otlp = start_otlp(&cfg, &source)?;

    let mut tasks = Vec::new();
    let (archive_tx, archive_ack, archive_thread) =
        start_archive(&cfg, &shutdown_rx, &self_metrics, &mut tasks)?;

    // The agent link: serve it (with the master's store), and/or the outbox to the master and
    // clock sync against it. `link.store` / `link.outbox` are what the hang code uses.
    let mut link = crate::master::start(&cfg, &host, shutdown_rx.clone()).await?;
    tasks.append(&mut link.tasks);
    if let Some(client) = link.client.clone() {
        tasks.push(tokio::spawn(clock_sync(
            cfg.clone(),
            client,
            book.clone(),
            host_offset.clone(),
            shutdown_rx.clone(),
        )));
    }

    // Sources and transforms: the ingest thread.
    let stop_flag = Arc::new(AtomicBool::new(false));
    let router = router(&cfg, &host, &link, (otlp.clone(), &source), &live);
    let links = IngestLinks {
        stop: stop_flag.clone(),
        archive_tx,
        archive_ack,
        host_offset: host_offset.clone(),
        heartbeat: heartbeat.clone(),
        self_metrics: self_metrics.clone(),
        router,
        hang: cfg.hang.enabled.then(|| hang_monitor(&cfg, &host)),
        live: live.clone(),
        telemetry: Some(source.clone()),
    };
    let ingest_cfg = cfg.clone();
    let ingest = std::thread::Builder::new()
        .name("comminsight-ingest".into())
        .spawn(move || ingest::run(&ingest_cfg, links, start))
        .context("cannot start the ingest thread")?;

    let _ = crate::sdnotify::ready();
    live.set_ready();
    tasks.push(tokio::spawn(status::ticker(
        live.clone(),
        shutdown_rx.clone(),
    )));
    tracing::info!(host = %host, "comminsight-agent running");
    wait_for_stop(stop, &ingest, &heartbeat).await;
    let _ = crate::sdnotify::stopping();
    live.set_stopping();
    tracing::info!("stopping: final checkpoint");

    stop_flag.store(true, Ordering::Release);
    let _ = shutdown_tx.send(true);
    let result = finish(ingest, archive_thread, tasks, otlp).await;
    close_endpoint(http_stop_tx, http, &cfg.agent.state_dir).await;
    result
}

/// The OTLP exporter when `[otlp] enabled`, collecting from `source` (what `/metrics` serves).
fn start_otlp(
    cfg: &AgentConfig,
    source: &Arc<crate::telemetry::Source>,
) -> anyhow::Result<Option<Arc<OtlpSink>>> {
    if !cfg.otlp.enabled {
        return Ok(None);
    }
    let sink = OtlpSink::start_with(&cfg.otlp, source.clone())
        .context("cannot start the OTLP exporter")?;
    Ok(Some(Arc::new(sink)))
}

/// The endpoint's last answers are given; then no daemon, no status: `comminsight-agent status`
/// must not show a stale one.
async fn close_endpoint(
    stop: watch::Sender<bool>,
    http: Option<tokio::task::JoinHandle<()>>,
    state_dir: &std::path::Path,
) {
    let _ = stop.send(true);
    if let Some(h) = http {
        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
    }
    let _ = std::fs::remove_file(status::status_path(state_dir));
}

/// The state directory, locked for this process' life; the clock samples kept there; this
/// host's offset to start from (the reference itself without a master, else the last one kept).
#[allow(
    clippy::type_complexity,
    reason = "three parts of one start, named at the call"
)]
fn open_state(
    cfg: &AgentConfig,
) -> anyhow::Result<(
    std::fs::File,
    Arc<Mutex<ClockBook>>,
    Arc<Mutex<Option<HostOffset>>>,
)> {
    std::fs::create_dir_all(&cfg.agent.state_dir).with_context(|| {
        format!(
            "{}: cannot create the state directory; set [agent] state_dir to a writable directory",
            cfg.agent.state_dir.display()
        )
    })?;
    let lock = state::lock(&cfg.agent.state_dir)?;
    let book = Arc::new(Mutex::new(ClockBook::open(&cfg.agent.state_dir)?));
    let initial = if cfg.master.address.is_empty() {
        // No master to sync with: this host's realtime is the job's reference (error 0).
        Some(HostOffset::reference(unix_ms() * 1_000_000))
    } else {
        // Until the first measurement, the last one kept (if any); else "unknown".
        book.lock().ok().and_then(|b| b.latest().cloned())
    };
    Ok((lock, book, Arc::new(Mutex::new(initial))))
}

/// The archive worker (and the object-store upload task) when `[archive] enabled`: the queue
/// to it, its acknowledgements, its thread.
#[allow(
    clippy::type_complexity,
    reason = "three parts of one start, named at the call"
)]
fn start_archive(
    cfg: &AgentConfig,
    shutdown_rx: &watch::Receiver<bool>,
    self_metrics: &Arc<SelfMetrics>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<(
    Option<mpsc::SyncSender<ArchiveJob>>,
    Option<mpsc::Receiver<(StreamId, u64)>>,
    Option<std::thread::JoinHandle<()>>,
)> {
    if !cfg.archive.enabled {
        return Ok((None, None, None));
    }
    let archive = Archive::open(&cfg.archive).context("cannot open the archive")?;
    if cfg.archive.object_store.enabled {
        let up = Uploader::new(&cfg.archive).context("cannot set up the object-store upload")?;
        tasks.push(tokio::spawn(up.run(shutdown_rx.clone())));
    }
    let (tx, rx) = mpsc::sync_channel::<ArchiveJob>(ARCHIVE_QUEUE);
    let (ack_tx, ack_rx) = mpsc::channel();
    let sm = self_metrics.clone();
    let th = std::thread::Builder::new()
        .name("comminsight-archive".into())
        .spawn(move || archive_worker(archive, rx, ack_tx, sm))
        .context("cannot start the archive thread")?;
    Ok((Some(tx), Some(ack_rx), Some(th)))
}

/// The sinks the ingest loop routes to. The straggler index runs where every host's steps
/// meet: on the master, or here when this agent has no master at all.
fn router(
    cfg: &AgentConfig,
    host: &str,
    link: &crate::master::Link,
    (otlp, source): (Option<Arc<OtlpSink>>, &Arc<crate::telemetry::Source>),
    live: &Arc<status::Live>,
) -> Router {
    let standalone = link.outbox.is_none() && link.store.is_none();
    let meet = link.store.is_some() || standalone;
    let straggler =
        (cfg.straggler.enabled && meet).then(|| straggler_output(cfg, host, otlp.clone()));
    let moe = (cfg.moe.enabled && meet).then(|| moe_output(cfg, host, otlp.clone(), source, live));
    if let Some(s) = &straggler {
        s.set_gauges(source.clone());
        let l = live.clone();
        s.set_on_alert(Box::new(move |a, line| {
            l.straggler(&a.job, line.to_string())
        }));
        straggler::start_ticker(s);
    }
    if let Some(store) = &link.store {
        let lines = (straggler.clone(), moe.clone());
        watch_master(cfg, host, store, otlp.clone(), lines, live);
    }
    let steps_to = match (MasterPush::of(link, host), straggler, moe) {
        (Some(m), _, _) => Some(StepsTarget::Master(m)),
        (None, None, None) => None,
        (None, straggler, moe) => Some(StepsTarget::Local { straggler, moe }),
    };
    Router::new(
        host,
        otlp,
        StepJournal::new(&ingest::steps_dir(&cfg.agent.state_dir)),
        steps_to,
        EvidenceSink::new(evidence_dirs(cfg)),
        MasterPush::of(link, host),
        standalone,
    )
    .with_live(live.clone())
}

/// After the stop: the ingest thread's last checkpoint, the archive's queue, the tasks, the
/// last OTLP export.
async fn finish(
    ingest: std::thread::JoinHandle<anyhow::Result<ingest::IngestReport>>,
    archive_thread: Option<std::thread::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    otlp: Option<Arc<OtlpSink>>,
) -> anyhow::Result<()> {
    let ingest_result = tokio::task::spawn_blocking(move || ingest.join())
        .await
        .context("ingest thread join")?;
    if let Some(th) = archive_thread {
        // The ingest loop dropped its sender; the worker finishes the queued segments.
        let _ = tokio::task::spawn_blocking(move || th.join()).await;
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    if let Some(sink) = otlp {
        match Arc::try_unwrap(sink) {
            Ok(s) => tokio::task::spawn_blocking(move || s.shutdown())
                .await
                .unwrap_or(()),
            Err(_) => tracing::warn!("OTLP sink still referenced at shutdown; last export skipped"),
        }
    }
    match ingest_result {
        Ok(Ok(r)) => {
            tracing::info!(
                records = r.records,
                streams = r.streams,
                "stopped after {} checkpoints",
                r.checkpoints
            );
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => anyhow::bail!("the ingest thread panicked; the last checkpoint is kept"),
    }
}

/// `<state_dir>/results/hang/` and, when archiving, `<archive>/hang/`: where hang evidence goes.
fn evidence_dirs(cfg: &AgentConfig) -> Vec<std::path::PathBuf> {
    std::iter::once(cfg.agent.state_dir.join("results"))
        .chain(cfg.archive.enabled.then(|| cfg.archive.dir.clone()))
        .map(|d| d.join("hang"))
        .collect()
}

/// The live straggler index with `[straggler]`'s settings; its reports go to
/// `<state_dir>/results/straggler/` (and the archive's `straggler/`).
fn straggler_output(
    cfg: &AgentConfig,
    host: &str,
    otlp: Option<Arc<OtlpSink>>,
) -> Arc<StragglerOutput> {
    let settings = crate::straggler::live::LiveSettings::from(&cfg.straggler);
    let dirs = std::iter::once(cfg.agent.state_dir.join("results"))
        .chain(cfg.archive.enabled.then(|| cfg.archive.dir.clone()))
        .map(|d| d.join("straggler"))
        .collect();
    StragglerOutput::new(settings, dirs, host, otlp)
}

/// The live EP windows with `[moe]`'s settings; results go to `<state_dir>/results/moe/` (and
/// the archive's `moe/`), gauges into `source`, findings into the daemon's state.
fn moe_output(
    cfg: &AgentConfig,
    host: &str,
    otlp: Option<Arc<OtlpSink>>,
    source: &Arc<crate::telemetry::Source>,
    live: &Arc<status::Live>,
) -> Arc<MoeOutput> {
    let dirs = std::iter::once(cfg.agent.state_dir.join("results"))
        .chain(cfg.archive.enabled.then(|| cfg.archive.dir.clone()))
        .map(|d| d.join("moe"))
        .collect();
    let m = MoeOutput::new(&cfg.moe, dirs, host, otlp);
    m.set_gauges(source.clone());
    let l = live.clone();
    m.set_on_finding(Box::new(move |job, line| l.moe(job, line.to_string())));
    crate::sinks::moe::start_ticker(&m);
    m
}

/// This agent's live hang path (its evidence and verdicts go through the router).
fn hang_monitor(cfg: &AgentConfig, host: &str) -> HangMonitor {
    HangMonitor::new(MonitorSettings {
        hang: cfg.hang.settings(),
        stacks: cfg.hang.stacks,
        native: cfg.hang.native_stacks,
        local_hosts: {
            let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            vec![host.to_string(), kernel]
        },
    })
}

/// On the master: every hang snapshot pushed re-runs the analysis over every host's latest
/// snapshot of that job ([`master_hangs::MasterHangs`]); new verdicts are logged and
/// exported, the evidence goes to `<state_dir>/results/hang/<job>/master-verdict.json` (and the
/// archive). Every batch of steps pushed goes to the live straggler index and the EP windows.
fn watch_master(
    cfg: &AgentConfig,
    host: &str,
    store: &Arc<crate::master::MasterStore>,
    otlp: Option<Arc<OtlpSink>>,
    (straggler, moe): (Option<Arc<StragglerOutput>>, Option<Arc<MoeOutput>>),
    live: &Arc<status::Live>,
) {
    let live = live.clone();
    let hang_enabled = cfg.hang.enabled;
    let weak = Arc::downgrade(store);
    let stale = Duration::from_secs(cfg.clock.sync_interval_s.saturating_mul(3).max(10));
    let hangs = master_hangs::MasterHangs::new(cfg.hang.settings(), stale, evidence_dirs(cfg));
    let h = host.to_string();
    store.set_on_push(Box::new(move |msg| {
        let job = msg.job.as_str();
        if msg.kind == "steps" {
            if let Some(s) = &straggler {
                s.on_lines(job, &msg.payload);
            }
            if let Some(m) = &moe {
                m.on_lines(job, &msg.payload);
            }
            return;
        }
        if msg.kind != "hang" || !hang_enabled {
            return;
        }
        let Some(store) = weak.upgrade() else { return };
        let out = hangs.on_push(
            job,
            &store.hang_snapshots(job),
            &store.hosts(job),
            &store.last_seen(),
        );
        if out.written {
            tracing::debug!(job = %job, "master: the verdict's evidence was rewritten");
        }
        for v in &out.announce {
            tracing::error!(job = %job, "master: {}", v.one_line());
            live.hang_verdict(job, v.one_line());
            if let Some(s) = &otlp {
                s.emit(LogEvent::verdict(&h, v));
            }
        }
    }));
}

/// The systemd watchdog is fed only while the ingest loop made a round this recently.
const INGEST_STALL_MS: u64 = 30_000;

/// Resolve on SIGTERM, SIGINT, the embedding caller's stop, or the ingest thread ending early.
/// Meanwhile feed the systemd watchdog (`WatchdogSec=`) while the ingest loop is alive, so a
/// stuck agent is restarted by systemd.
async fn wait_for_stop(
    stop: Option<watch::Receiver<bool>>,
    ingest: &std::thread::JoinHandle<anyhow::Result<ingest::IngestReport>>,
    heartbeat: &std::sync::atomic::AtomicU64,
) {
    let ping_every = crate::sdnotify::watchdog_interval();
    let mut last_ping = std::time::Instant::now();
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut stop = stop;
    loop {
        tokio::select! {
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => return,
            _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => return,
            _ = async { match stop.as_mut() { Some(s) => { let _ = s.wait_for(|v| *v).await; } None => std::future::pending().await } } => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if ingest.is_finished() { return; }
                let alive = unix_ms().saturating_sub(heartbeat.load(Ordering::Relaxed)) < INGEST_STALL_MS;
                if let Some(every) = ping_every {
                    if alive && last_ping.elapsed() >= every {
                        last_ping = std::time::Instant::now();
                        let _ = crate::sdnotify::watchdog();
                    }
                }
            }
        }
    }
}

fn archive_worker(
    archive: Archive,
    rx: mpsc::Receiver<ArchiveJob>,
    ack: mpsc::Sender<(StreamId, u64)>,
    self_metrics: Arc<SelfMetrics>,
) {
    let mut last_retention: Option<std::time::Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(job) => {
                let seg = &job.seg;
                let input = SegmentInput {
                    id: &seg.id,
                    index: seg.index,
                    path: &seg.path,
                    recovered: &seg.recovered,
                    align: job.align,
                    gpu_align: job.gpu_align,
                };
                let result = archive.archive_segment(input);
                let _ = self_metrics.archive_backlog.fetch_update(
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                    |v| Some(v.saturating_sub(1)),
                );
                match result {
                    Ok(_) => {
                        let _ = ack.send((seg.id.clone(), seg.index));
                    }
                    Err(e) if !seg.path.exists() => {
                        // The plugin's retention deleted it before we got to it: the loss
                        // is counted by the cursor (seq gap); do not offer it forever.
                        tracing::warn!("archive: {e} (deleted by the plugin's retention before it could be archived)");
                        let _ = ack.send((seg.id.clone(), seg.index));
                    }
                    Err(e) => {
                        self_metrics.sink_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("archive: {e}");
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if last_retention.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            last_retention = Some(std::time::Instant::now());
            let r = archive.enforce_retention(std::time::SystemTime::now());
            tracing::debug!("archive retention: {r:?}");
        }
    }
}

/// Measure this host's offset against the master every `sync_interval_s`; keep every sample.
async fn clock_sync(
    cfg: AgentConfig,
    client: crate::master::LinkClient,
    book: Arc<Mutex<ClockBook>>,
    current: Arc<Mutex<Option<HostOffset>>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = Duration::from_secs(cfg.clock.sync_interval_s.max(1));
    // The last failure said (warned once, and again when the reason changes: an unreachable
    // master that comes up and refuses the token must say so).
    let mut failing: Option<String> = None;
    loop {
        let now = crate::master::realtime_ns;
        match crate::master::measure_with(&client, &cfg.clock, &now).await {
            Ok(off) => {
                if failing.is_some() {
                    tracing::info!("clock sync with {} works again", cfg.master.address);
                }
                failing = None;
                if let Ok(mut b) = book.lock() {
                    if let Err(e) = b.append(off.clone()) {
                        tracing::warn!("clock samples: {e}");
                    }
                }
                if let Ok(mut c) = current.lock() {
                    *c = Some(off);
                }
            }
            Err(e) => {
                let said = e.to_string();
                if failing.as_deref() != Some(said.as_str()) {
                    tracing::warn!("clock sync: {said}; retrying every {}s", every.as_secs());
                }
                failing = Some(said);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
    }
}

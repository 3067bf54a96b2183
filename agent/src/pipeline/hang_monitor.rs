//! [`HangMonitor`]: the daemon's hang path, run from the ingest loop about once a second.
//!
//! While a job has an open (overdue) operation on this host: snapshot what this host knows
//! (tracker + membership + procfs state of the local ranks), analyse it, and once the oldest wait
//! passes the hang threshold, capture the Python + native stacks of the job's local ranks (one
//! short locked dump each, on a helper thread, only PIDs the plugin registered). Each change is
//! an [`Output::HangEvidence`] (the router writes it under `<results>/hang/` and the archive and
//! pushes it to the master), and a verdict whose sources are new an [`Output::HangVerdict`]. The
//! event ends when no local op is open any more.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::engine::{Engine, Output};
use crate::hang::analyze::{analyze, HangSettings};
use crate::stacks::{capture_many, proc_state, CaptureMode, ProcessStacks};
use crate::util::time::unix_us;

/// How often the monitor looks (the ingest loop may call more often).
const TICK: Duration = Duration::from_secs(1);
/// A live event is re-sent to the master at most this often.
const PUSH_EVERY: Duration = Duration::from_secs(2);
/// All stack captures of one event together take at most this long.
const CAPTURE_BUDGET: Duration = Duration::from_secs(10);

/// What the monitor does besides analysing.
#[derive(Clone, Debug)]
pub struct MonitorSettings {
    pub hang: HangSettings,
    /// Capture stacks of the local ranks of a hung job.
    pub stacks: bool,
    /// Native frames too (py-spy's unwinder).
    pub native: bool,
    /// Host names of this machine's streams (`[agent] host_name`, the kernel's): only their
    /// pids are looked up in procfs and captured.
    pub local_hosts: Vec<String>,
}

struct Event {
    id: u64,
    capture: Option<std::thread::JoinHandle<Vec<ProcessStacks>>>,
    stacks: BTreeMap<u32, ProcessStacks>,
    captured: bool,
    last_push: Option<Instant>,
    last_sources: Vec<i64>,
}

/// The daemon's hang path (see the module doc).
pub struct HangMonitor {
    settings: MonitorSettings,
    events: BTreeMap<String, Event>,
    last_tick: Option<Instant>,
}

impl HangMonitor {
    pub fn new(settings: MonitorSettings) -> HangMonitor {
        HangMonitor {
            settings,
            events: BTreeMap::new(),
            last_tick: None,
        }
    }

    /// Look at every job with an open op (`shift_us`: this host's offset onto the job timeline);
    /// evidence and verdicts go to `out`.
    pub fn tick(&mut self, engine: &Engine, shift_us: i64, out: &mut Vec<Output>) {
        if self.last_tick.is_some_and(|t| t.elapsed() < TICK) {
            return;
        }
        self.last_tick = Some(Instant::now());
        let open = engine.hang().jobs_with_open_ops();
        // Events whose job has nothing open any more are over.
        let over: Vec<String> = self
            .events
            .keys()
            .filter(|j| !open.contains_key(*j))
            .cloned()
            .collect();
        for job in over {
            if let Some(ev) = self.events.remove(&job) {
                tracing::info!(job = %job, event = ev.id, "the operations that were overdue have finished");
            }
        }
        for (job, oldest) in open {
            self.job_tick(engine, &job, oldest, shift_us, out);
        }
    }

    fn job_tick(
        &mut self,
        engine: &Engine,
        job: &str,
        oldest: u64,
        shift_us: i64,
        out: &mut Vec<Output>,
    ) {
        let now = unix_us().saturating_add_signed(shift_us);
        let mut snap = engine.hang_snapshot(job, now, shift_us);
        // procfs and ptrace only for this host's processes (a shared log directory may hold
        // other hosts' streams, whose pids mean nothing here).
        for r in &mut snap.ranks {
            if r.pid != 0 && !r.ended && self.settings.local_hosts.contains(&r.host) {
                r.proc_state = Some(proc_state(r.pid));
            }
        }
        let ev = self.events.entry(job.to_string()).or_insert_with(|| {
            tracing::warn!(job = %job, "operations overdue on this host: watching for a hang");
            Event {
                id: oldest.saturating_add_signed(shift_us),
                capture: None,
                stacks: BTreeMap::new(),
                captured: false,
                last_push: None,
                last_sources: Vec::new(),
            }
        });
        let analysis = analyze(&snap, &self.settings.hang, &[]);
        let hung = analysis.oldest_open_us >= analysis.threshold_us;
        // Stacks: once per event, when the wait passes the threshold.
        if hung && self.settings.stacks && ev.capture.is_none() && !ev.captured {
            let pids: Vec<u32> = snap
                .ranks
                .iter()
                .filter(|r| r.pid != 0 && !r.ended && self.settings.local_hosts.contains(&r.host))
                .filter(|r| r.proc_state.as_ref().is_none_or(|p| !p.status.is_dead()))
                .map(|r| r.pid)
                .collect();
            let native = self.settings.native;
            ev.capture = std::thread::Builder::new()
                .name("comminsight-stacks".into())
                .spawn(move || capture_many(&pids, CaptureMode::Locked, native, CAPTURE_BUDGET))
                .ok();
        }
        let mut fresh = false;
        if ev.capture.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(h) = ev.capture.take() {
                for s in h.join().unwrap_or_default() {
                    ev.stacks.insert(s.pid, s);
                }
            }
            ev.captured = true;
            fresh = true;
        }
        for r in &mut snap.ranks {
            r.stacks = ev.stacks.get(&r.pid).cloned();
        }
        let analysis = if ev.captured {
            analyze(&snap, &self.settings.hang, &[])
        } else {
            analysis
        };
        let sources: Vec<i64> = analysis
            .verdicts
            .iter()
            .flat_map(|v| v.source_ranks.iter().copied())
            .collect();
        let due = ev.last_push.is_none_or(|t| t.elapsed() >= PUSH_EVERY);
        if !(fresh || due || sources != ev.last_sources) {
            return;
        }
        ev.last_push = Some(Instant::now());
        out.push(Output::HangEvidence {
            job: job.to_string(),
            event: ev.id,
            snapshot: serde_json::to_vec_pretty(&snap).unwrap_or_default(),
            verdicts: (!analysis.verdicts.is_empty())
                .then(|| serde_json::to_vec_pretty(&analysis.verdicts).unwrap_or_default()),
        });
        if sources != ev.last_sources {
            for v in analysis.verdicts {
                tracing::info!(job = %job, "this host's view: {}", v.one_line());
                out.push(Output::HangVerdict(Box::new(v)));
            }
            ev.last_sources = sources;
        }
    }
}

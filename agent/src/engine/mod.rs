//! The one engine the daemon and every offline command drive (DESIGN.md §3, rule 2: the same
//! records give the same results online and offline, byte for byte).
//!
//! A batch of a stream's raw records goes in ([`Engine::apply`]); the engine decodes it, keeps
//! the stream's clock ([`ProcessClock`]), and hands the decoded batch to its built-in analyses
//! in a fixed order — operation metrics, communicator membership and traffic (roles), the hang
//! tracker, the step engine, the straggler arrivals — and then to the caller's extras (offline
//! commands: a time index, op rows). What comes out is a list of [`Output`]s: the daemon routes
//! them to its sinks in one `match`, an offline command to its own.
//!
//! Which built-ins run is chosen at construction ([`Builtins`]): the daemon runs all of them;
//! an offline pass only what its command needs (the step rebuild's second pass: clocks and the
//! step engine). The engine does no I/O and needs no runtime; its whole state round-trips
//! through serde (the daemon's checkpoint).
//!
//! Adding a kind of evidence: its record kind in `wire`, an analysis implementing [`Analysis`],
//! a field here (and in [`Builtins`]), and an [`Output`] variant if it produces findings
//! (`docs/architecture.md`).

mod analysis;
mod builtins;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use comminsight_wire::record::{Body, Record};
use comminsight_wire::RawRecord;
use serde::{Deserialize, Serialize};

pub use analysis::{Analysis, Cx, Decoded, Output, StepDone};
pub(crate) use builtins::step_input;
pub use builtins::SharedMetrics;

use crate::clock::{align, align_gpu, HostOffset, ProcessClock};
use crate::hang::{HangTracker, JobSnapshot};
use crate::host::context::{is_host_stream, HostContext};
use crate::metrics::MetricsAggregator;
use crate::moe::EpRows;
use crate::roles::TopologyCollector;
use crate::steps::engine::{Decision, JobInfo, StepEngine, StepSettings};
use crate::steps::template::TemplateSet;
use crate::steps::StepOp;
use crate::straggler::StepOpCollector;
use crate::stream::{Alignment, StreamId};

/// Which built-in analyses an engine runs (the step engine is enabled on its own, with its
/// templates: [`Engine::enable_steps`]; the straggler arrivals run with it when `arrivals`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Builtins {
    /// Per-communicator operation metrics, with this series cap.
    pub metrics: Option<usize>,
    /// Communicator membership and traffic (role inference, template choice).
    pub topology: bool,
    /// Progress and open operations of every rank (hang analysis).
    pub hang: bool,
    /// Each step's operation arrivals (straggler index); needs the step engine.
    pub arrivals: bool,
    /// The host-context records of the agent's host streams (thread states, QPs, TCP, ports).
    pub host: bool,
    /// The MoE EP wait records of the ranks' streams, as rows (`Output::EpRow`).
    pub moe: bool,
}

impl Builtins {
    /// What the daemon runs: everything.
    pub fn daemon(max_series: usize) -> Builtins {
        Builtins {
            metrics: Some(max_series),
            topology: true,
            hang: true,
            arrivals: true,
            host: true,
            // The rows go where every host's rows meet (the job master) to become windows.
            moe: true,
        }
    }
}

/// What one batch did besides updating state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Records decoded and applied.
    pub records: u64,
    /// Records that did not decode (counted, skipped).
    pub corrupt: u64,
    /// Largest host time seen in the batch (ns), for the ingest lag.
    pub newest_ns: u64,
}

/// The engine: every stream's clock and the enabled built-in analyses. See the module docs.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Engine {
    #[serde(with = "crate::util::serde_pairs")]
    clocks: BTreeMap<StreamId, ProcessClock>,
    #[serde(default)]
    metrics: Option<SharedMetrics>,
    #[serde(default)]
    topology: Option<TopologyCollector>,
    /// The step engine (`None`: steps are not rebuilt here).
    #[serde(default)]
    steps: Option<StepEngine>,
    #[serde(default)]
    hang: Option<HangTracker>,
    /// Each stream's operation arrivals until its step is emitted.
    #[serde(default)]
    arrivals: Option<StepOpCollector>,
    /// Thread states, queue pairs, TCP and ports from the host streams.
    #[serde(default)]
    host: Option<HostContext>,
    /// `ep_stats` parts joined into rows.
    #[serde(default)]
    moe: Option<EpRows>,
    /// The decoded batch (reused).
    #[serde(skip)]
    decoded: Vec<Decoded>,
}

impl Engine {
    /// An engine running `builtins` (no step engine yet).
    pub fn new(builtins: Builtins) -> Engine {
        let mut e = Engine::default();
        e.enable(builtins);
        e
    }

    /// Enable the built-ins of `b` that are not running yet (a loaded checkpoint keeps the
    /// state of those it has).
    pub fn enable(&mut self, b: Builtins) {
        if let (None, Some(n)) = (&self.metrics, b.metrics) {
            self.metrics = Some(SharedMetrics::new(n));
        }
        if b.topology && self.topology.is_none() {
            self.topology = Some(TopologyCollector::default());
        }
        if b.hang && self.hang.is_none() {
            self.hang = Some(HangTracker::default());
        }
        if b.arrivals && self.arrivals.is_none() {
            self.arrivals = Some(StepOpCollector::default());
        }
        if b.host && self.host.is_none() {
            self.host = Some(HostContext::default());
        }
        if b.moe && self.moe.is_none() {
            self.moe = Some(EpRows::default());
        }
    }

    /// Rebuild steps with these templates and settings (a loaded checkpoint's step engine
    /// continues with them).
    pub fn enable_steps(&mut self, templates: TemplateSet, settings: StepSettings) {
        match self.steps.as_mut() {
            Some(e) => e.configure(templates, settings),
            None => self.steps = Some(StepEngine::new(templates, settings)),
        }
    }

    /// Offline: each job's template chosen from the whole input's roles (before any record).
    pub fn decide(&mut self, decisions: BTreeMap<String, Decision>) {
        if let Some(s) = self.steps.as_mut() {
            for (job, d) in decisions {
                s.decide(&job, d);
            }
        }
    }

    /// Apply a stream's next raw records (in the stream's order); `extras` see the same
    /// decoded batch after the built-ins. Outputs are appended to `out`.
    pub fn apply(
        &mut self,
        id: &StreamId,
        batch: &[RawRecord],
        segment: Option<u64>,
        extras: &mut [&mut dyn Analysis],
        out: &mut Vec<Output>,
    ) -> BatchStats {
        if !self.clocks.contains_key(id) {
            self.clocks.insert(id.clone(), ProcessClock::default());
        }
        let clock = self.clocks.get_mut(id).expect("inserted above");
        let mut slots = std::mem::take(&mut self.decoded);
        let (n, stats) = decode_batch(batch, clock, &mut slots);
        let recs = &slots[..n];
        let cx = Cx { id, clock, segment };
        if is_host_stream(id) {
            // The agent's own host stream: host context only (it is no rank).
            if let Some(h) = self.host.as_mut() {
                h.batch(&cx, recs, out);
            }
            for x in extras.iter_mut() {
                x.batch(&cx, recs, out);
            }
            self.decoded = slots;
            return stats;
        }
        if let Some(h) = self.host.as_mut() {
            // The plugin's net records name the QP each work request went on: the QP map's
            // communicator.
            // ... and their comm_device records which GPU the process runs on.
            for d in recs {
                match &d.rec.body {
                    Body::Net(n) => h.net(id, n),
                    Body::CommDevice(c) => h.comm_device(id, c),
                    _ => {}
                }
            }
        }
        if let Some(m) = self.metrics.as_mut() {
            m.batch(&cx, recs, out);
        }
        if let Some(t) = self.topology.as_mut() {
            t.batch(&cx, recs, out);
        }
        if let Some(h) = self.hang.as_mut() {
            h.batch(&cx, recs, out);
        }
        if let Some(s) = self.steps.as_mut() {
            s.batch(&cx, recs, out);
            if let Some(a) = self.arrivals.as_mut() {
                a.batch(&cx, recs, out);
            }
        }
        if let Some(m) = self.moe.as_mut() {
            m.batch(&cx, recs, out);
        }
        for x in extras.iter_mut() {
            x.batch(&cx, recs, out);
        }
        self.decoded = slots;
        self.take_steps(out);
        stats
    }

    /// Offline: a batch's step-engine input that an earlier pass derived from the same records
    /// ([`step_input`], with the stream's alignment), fed without reading them again.
    pub fn apply_step_input(
        &mut self,
        id: &StreamId,
        rank: Option<i64>,
        ops: Vec<(StepOp, u64)>,
        out: &mut Vec<Output>,
    ) {
        if let Some(s) = self.steps.as_mut() {
            s.feed(id, rank, ops);
        }
        self.take_steps(out);
    }

    /// A stream ended (its process is gone, or the offline input has no more of it): its step
    /// session drains.
    pub fn end_stream(
        &mut self,
        id: &StreamId,
        extras: &mut [&mut dyn Analysis],
        out: &mut Vec<Output>,
    ) {
        if let Some(h) = self.hang.as_mut() {
            h.stream_end(id, out);
        }
        if let Some(s) = self.steps.as_mut() {
            s.stream_end(id, out);
        }
        for x in extras.iter_mut() {
            x.stream_end(id, out);
        }
        self.take_steps(out);
    }

    /// Offline, after [`Engine::end_stream`]: drop the stream's buffers that only serve later
    /// records of it (its arrivals); what the results need (clock, step header, hang state)
    /// stays.
    pub fn release_stream(&mut self, id: &StreamId) {
        if let Some(a) = self.arrivals.as_mut() {
            Analysis::forget(a, id);
        }
    }

    /// Forget a finished stream that is gone (the daemon prunes it): its step, hang and
    /// arrival state (its clock and metrics stay).
    pub fn forget(&mut self, id: &StreamId) {
        if let Some(a) = self.arrivals.as_mut() {
            Analysis::forget(a, id);
        }
        if let Some(h) = self.hang.as_mut() {
            Analysis::forget(h, id);
        }
        if let Some(s) = self.steps.as_mut() {
            Analysis::forget(s, id);
        }
        if let (Some(h), Ok(pid)) = (self.host.as_mut(), id.pid.parse::<u32>()) {
            h.forget_proc(&id.job, &id.host, pid);
        }
        if let Some(m) = self.moe.as_mut() {
            m.forget(id);
        }
    }

    /// After a round over every stream (each caught up with its input): evaluate the step
    /// templates of jobs still waiting for one ([`StepEngine::evaluate`]).
    pub fn round(&mut self, out: &mut Vec<Output>) {
        if let (Some(s), Some(t)) = (self.steps.as_mut(), self.topology.as_ref()) {
            s.evaluate(t);
        }
        self.take_steps(out);
    }

    /// The step engine's completed steps, each paired with its arrivals.
    fn take_steps(&mut self, out: &mut Vec<Output>) {
        let Some(steps) = self.steps.as_mut() else {
            return;
        };
        for (id, summary) in steps.take_output() {
            let arrivals = self.arrivals.as_mut().map(|a| {
                let err_us = crate::clock::err_us(self.clocks.get(&id));
                a.take(&id, &summary, summary.step, summary.rank, err_us)
            });
            out.push(Output::Step(Box::new(StepDone {
                id,
                summary,
                arrivals,
            })));
        }
    }

    /// Each job's step result header (empty when steps are off).
    pub fn step_jobs(&self) -> Vec<JobInfo> {
        self.steps
            .as_ref()
            .map(StepEngine::jobs)
            .unwrap_or_default()
    }

    /// Operations the step engine holds now.
    pub fn step_held_ops(&self) -> u64 {
        self.steps.as_ref().map_or(0, StepEngine::held_ops)
    }

    /// Operations the arrivals analysis dropped because a stream's buffer was full.
    pub fn arrivals_dropped(&self) -> u64 {
        self.arrivals.as_ref().map_or(0, StepOpCollector::dropped)
    }

    /// EP wait rows dropped (parts that disagree, counters that could not be decoded).
    pub fn moe_dropped(&self) -> u64 {
        self.moe.as_ref().map_or(0, |m| m.dropped)
    }

    /// The hang tracker (empty when the hang built-in is off).
    pub fn hang(&self) -> &HangTracker {
        static EMPTY: std::sync::OnceLock<HangTracker> = std::sync::OnceLock::new();
        self.hang
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(HangTracker::default))
    }

    /// Membership and traffic per communicator, per job (empty when the topology built-in is
    /// off).
    pub fn topology(&self) -> &TopologyCollector {
        static EMPTY: std::sync::OnceLock<TopologyCollector> = std::sync::OnceLock::new();
        self.topology
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(TopologyCollector::default))
    }

    /// Take the membership and traffic gathered (the topology built-in starts over).
    pub fn take_topology(&mut self) -> TopologyCollector {
        self.topology.take().unwrap_or_default()
    }

    /// What the engine knows about `job` now (`now_us` on the job timeline; `shift_us`: this
    /// host's offset onto it).
    pub fn hang_snapshot(&self, job: &str, now_us: u64, shift_us: i64) -> JobSnapshot {
        let mut snap = self.hang().snapshot(job, self.topology(), now_us, shift_us);
        if let Some(h) = self.host.as_ref() {
            for r in &mut snap.ranks {
                r.host_context = h.view(job, &r.host, r.pid, shift_us);
                r.gpus = h.gpu().view(job, &r.host, r.pid, shift_us);
            }
            let mut procs: Vec<crate::host::qps::ProcQps<'_>> = snap
                .ranks
                .iter_mut()
                .filter_map(|r| {
                    let v = r.host_context.as_mut()?;
                    Some((r.host.as_str(), r.pid, r.rank, &mut v.qps))
                })
                .collect();
            crate::host::qps::join_peers(&mut procs);
        }
        snap
    }

    /// The host-context analysis (`None` when the host built-in is off).
    pub fn host_context(&self) -> Option<&HostContext> {
        self.host.as_ref()
    }

    /// Communicator roles and grid of every job seen (what `results/roles.json` holds).
    pub fn roles(&self) -> Vec<crate::roles::JobRoles> {
        crate::roles::job_roles(self.topology())
    }

    /// The metrics aggregator, shared (for the exporters); `None` when metrics are off.
    pub fn metrics(&self) -> Option<Arc<Mutex<MetricsAggregator>>> {
        self.metrics.as_ref().map(|m| m.0.clone())
    }

    /// The metrics results now (deterministic; what `results/metrics.json` holds).
    pub fn snapshot(&self) -> crate::metrics::MetricsSnapshot {
        self.metrics
            .as_ref()
            .map(|m| m.lock().snapshot())
            .unwrap_or_else(|| MetricsAggregator::new(0).snapshot())
    }

    /// The stream's mapping onto the job timeline given this host's offset to the master.
    pub fn alignment(&self, id: &StreamId, host: Option<&HostOffset>) -> Alignment {
        match self.clocks.get(id) {
            Some(c) => align(c, host),
            None => align(&ProcessClock::default(), host),
        }
    }

    /// The stream's GPU timer values onto the job timeline (`None` before any GPU-timed op).
    pub fn gpu_alignment(&self, id: &StreamId, host: Option<&HostOffset>) -> Option<Alignment> {
        self.clocks.get(id).and_then(|c| align_gpu(c, host))
    }
}

/// Decode `batch` into the first slots of `recs`, each record with the stream's alignment right
/// after it (the clock updated record by record, exactly as [`Engine::apply`] does); returns the
/// number of records decoded. The slots are reused from batch to batch (records are decoded in
/// place, not moved); those past the count are stale.
pub(crate) fn decode_batch(
    batch: &[RawRecord],
    clock: &mut ProcessClock,
    recs: &mut Vec<Decoded>,
) -> (usize, BatchStats) {
    let mut stats = BatchStats::default();
    let mut n = 0;
    for raw in batch {
        if n == recs.len() {
            recs.push(Decoded {
                rec: Record::new(Body::Coll(Default::default())),
                align: Alignment::default(),
            });
        }
        let d = &mut recs[n];
        if Record::decode_into(raw, &mut d.rec).is_err() {
            stats.corrupt += 1;
            continue;
        }
        n += 1;
        stats.records += 1;
        match &d.rec.body {
            Body::Coll(op) | Body::P2p(op) => {
                stats.newest_ns = stats.newest_ns.max(op.end_ns.max(op.start_ns));
            }
            Body::Overdue(o) => stats.newest_ns = stats.newest_ns.max(o.now_ns),
            _ => {}
        }
        clock.observe(&d.rec);
        d.align = align(clock, None);
    }
    (n, stats)
}

impl Serialize for SharedMetrics {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.lock().serialize(s)
    }
}

impl<'de> Deserialize<'de> for SharedMetrics {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SharedMetrics, D::Error> {
        Ok(SharedMetrics(Arc::new(Mutex::new(
            MetricsAggregator::deserialize(d)?,
        ))))
    }
}

#[cfg(test)]
mod tests;

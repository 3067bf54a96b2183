//! The record stages shared by the daemon and `replay`: decode, per-process clock calibration
//! and metrics aggregation. No I/O, no tokio: the same records in give the same state out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use comminsight_wire::record::{Body, Record};
use comminsight_wire::RawRecord;
use serde::{Deserialize, Serialize};

use crate::clock::{align, align_gpu, HostOffset, ProcessClock};
use crate::hang::{HangTracker, JobSnapshot};
use crate::metrics::MetricsAggregator;
use crate::roles::TopologyCollector;
use crate::steps::engine::{JobInfo, StepEngine, StepSettings};
use crate::steps::fsm::StepSummary;
use crate::steps::template::TemplateSet;
use crate::straggler::{RankStep, StepOpCollector};
use crate::stream::{Alignment, StreamId};

/// What one batch of records produced besides state updates.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Records decoded and applied.
    pub records: u64,
    /// Records that did not decode (counted, skipped).
    pub corrupt: u64,
    /// First reports of overdue operations (`repeat == 0`) with their comm's name, for log records.
    pub overdue: Vec<(Record, Option<String>)>,
    /// Largest host time seen in the batch (ns), for the ingest lag.
    pub newest_ns: u64,
}

/// Clock calibration and metrics for every stream the agent has seen. The aggregator is
/// shared with the OTLP exporter, which reads it when it collects.
#[derive(Debug, Serialize, Deserialize)]
pub struct Processor {
    #[serde(with = "pairs")]
    clocks: BTreeMap<StreamId, ProcessClock>,
    #[serde(with = "shared")]
    metrics: Arc<Mutex<MetricsAggregator>>,
    /// Membership and traffic per communicator, for role inference (`results/roles.json`).
    #[serde(default)]
    topology: TopologyCollector,
    /// The step engine (`None`: steps are not rebuilt here, e.g. `replay`'s first pass).
    #[serde(default)]
    steps: Option<StepEngine>,
    /// Per rank: progress, open (overdue) ops, learned gaps — for the hang analysis.
    #[serde(default)]
    hang: HangTracker,
    /// Each stream's operation arrivals until its step is emitted (the straggler index's input;
    /// kept whenever steps are rebuilt).
    #[serde(default)]
    arrivals: StepOpCollector,
}

/// A completed step: the summary, and its arrivals for the straggler index (process clock
/// only: the host's offset onto the job timeline is not applied).
pub type StepDone = (StreamId, StepSummary, RankStep);

/// Serde for a map keyed by stream: a list of pairs (JSON keys must be strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::clock::ProcessClock;
    use crate::stream::StreamId;

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<StreamId, ProcessClock>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<StreamId, ProcessClock>, D::Error> {
        let v: Vec<(StreamId, ProcessClock)> = Vec::deserialize(d)?;
        Ok(v.into_iter().collect())
    }
}

/// Serde for the shared aggregator: its plain value.
mod shared {
    use std::sync::{Arc, Mutex};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::metrics::MetricsAggregator;

    pub fn serialize<S: Serializer>(
        m: &Arc<Mutex<MetricsAggregator>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let g = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        g.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<Mutex<MetricsAggregator>>, D::Error> {
        Ok(Arc::new(Mutex::new(MetricsAggregator::deserialize(d)?)))
    }
}

impl Processor {
    pub fn new(max_series: usize) -> Processor {
        Processor {
            clocks: BTreeMap::new(),
            metrics: Arc::new(Mutex::new(MetricsAggregator::new(max_series))),
            topology: TopologyCollector::default(),
            steps: None,
            hang: HangTracker::default(),
            arrivals: StepOpCollector::default(),
        }
    }

    /// Rebuild steps online with these templates and settings (a loaded checkpoint's engine
    /// continues with them).
    pub fn enable_steps(&mut self, templates: TemplateSet, settings: StepSettings) {
        match self.steps.as_mut() {
            Some(e) => e.configure(templates, settings),
            None => self.steps = Some(StepEngine::new(templates, settings)),
        }
    }

    /// Steps completed since the last call, each with its arrivals.
    pub fn take_steps(&mut self) -> Vec<StepDone> {
        let done = self
            .steps
            .as_mut()
            .map(StepEngine::take_output)
            .unwrap_or_default();
        done.into_iter()
            .map(|(id, s)| {
                let err_us = self
                    .clocks
                    .get(&id)
                    .map_or(crate::clock::PAIR_READ_ERR_NS, |c| c.correction().err_ns)
                    .div_ceil(1000);
                let rs = self.arrivals.take(&id, &s, s.step, s.rank, err_us);
                (id, s, rs)
            })
            .collect()
    }

    /// A stream ended: its step session is drained (then [`Processor::take_steps`]).
    pub fn end_stream(&mut self, id: &StreamId) {
        self.hang.end_stream(id);
        if let Some(e) = self.steps.as_mut() {
            e.end_stream(id);
        }
    }

    /// Forget a stream's step state (finished and gone; after its last steps were taken).
    pub fn forget_steps(&mut self, id: &StreamId) {
        self.arrivals.end_stream(id);
        self.hang.forget(id);
        if let Some(e) = self.steps.as_mut() {
            e.forget_stream(id);
        }
    }

    /// After a round over every stream (each caught up with its input): evaluate the step
    /// templates of jobs still waiting for one (see [`StepEngine::evaluate`]).
    pub fn settle_steps(&mut self) {
        if let Some(e) = self.steps.as_mut() {
            e.evaluate(&self.topology);
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

    /// The hang tracker (progress and open operations of every rank seen).
    pub fn hang(&self) -> &HangTracker {
        &self.hang
    }

    /// What this processor knows about `job` now (`now_us` on the job timeline; `shift_us`:
    /// this host's offset onto it).
    pub fn hang_snapshot(&self, job: &str, now_us: u64, shift_us: i64) -> JobSnapshot {
        self.hang.snapshot(job, &self.topology, now_us, shift_us)
    }

    /// Communicator roles and grid of every job seen (what `results/roles.json` holds).
    pub fn roles(&self) -> Vec<crate::roles::JobRoles> {
        crate::roles::job_roles(&self.topology)
    }

    /// Membership and traffic per communicator, per job.
    pub fn topology(&self) -> &TopologyCollector {
        &self.topology
    }

    /// The aggregator, shared (for the exporters).
    pub fn metrics(&self) -> Arc<Mutex<MetricsAggregator>> {
        self.metrics.clone()
    }

    /// The metrics results now (deterministic; what `results/metrics.json` holds).
    pub fn snapshot(&self) -> crate::metrics::MetricsSnapshot {
        self.metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .snapshot()
    }

    /// Apply a stream's next records (in the stream's order).
    pub fn apply(&mut self, id: &StreamId, batch: &[RawRecord]) -> BatchOutcome {
        let mut out = BatchOutcome::default();
        if !self.clocks.contains_key(id) {
            self.clocks.insert(id.clone(), ProcessClock::default());
        }
        let clock = self.clocks.get_mut(id).expect("inserted above");
        let mut metrics = self
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut step_rank, mut step_ops) = (None, Vec::new());
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                out.corrupt += 1;
                continue;
            };
            out.records += 1;
            match &rec.body {
                Body::ProcStart(_) | Body::Stats(_) => clock.observe(&rec),
                Body::Coll(op) | Body::P2p(op) => {
                    out.newest_ns = out.newest_ns.max(op.end_ns.max(op.start_ns));
                    clock.observe(&rec);
                }
                Body::Overdue(o) => {
                    out.newest_ns = out.newest_ns.max(o.now_ns);
                    if o.repeat == 0 {
                        let name = metrics.comm_name(id, o.comm_hash).map(str::to_owned);
                        out.overdue.push((rec.clone(), name));
                    }
                }
                _ => {}
            }
            metrics.observe(id, &rec);
            self.topology.observe(id, &rec);
            if !matches!(rec.body, Body::Proxy(_) | Body::Net(_)) {
                self.hang.observe(id, &rec, &align(clock, None));
            }
            if self.steps.is_some() {
                if let Body::ProcStart(p) = &rec.body {
                    step_rank = Some(i64::from(p.rank));
                }
                step_ops.extend(StepEngine::op_of(&rec, align(clock, None)));
                self.arrivals.observe(id, &rec, clock.correction());
            }
        }
        if let Some(e) = self.steps.as_mut() {
            e.feed(id, step_rank, step_ops);
        }
        out
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

    /// Forget a finished stream's clock (its metrics stay).
    pub fn forget(&mut self, id: &StreamId) {
        self.clocks.remove(id);
    }
}

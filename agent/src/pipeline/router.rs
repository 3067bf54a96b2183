//! The daemon's sinks, reached from one place: every [`Output`] of the engine and of the live
//! hang monitor is handed to [`Router::route`], whose one `match` sends it where it goes — the
//! agent log and OTLP log records (overdue operations, verdicts), the step journal and the step
//! lines for the job master or this agent's own straggler index, the hang evidence files and the
//! hang snapshots for the master.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::HostOffset;
use crate::engine::{Output, StepDone};
use crate::host::windows::HostSample;
use crate::master::{MasterStore, Outbox};
use crate::moe::EpRow;
use crate::sinks::evidence::EvidenceSink;
use crate::sinks::moe::MoeOutput;
use crate::sinks::step_journal::StepJournal;
use crate::sinks::straggler::StragglerOutput;
use crate::sinks::{LogEvent, OtlpSink};
use crate::straggler::RankStep;
use crate::stream::StreamId;
use crate::util::log_limit::LogLimiter;

/// Hand pending steps over at least this often in bytes (else at each checkpoint).
const STEPS_FLUSH_BYTES: usize = 4 << 20;

/// Messages for the job master: through the outbox, or straight into this agent's own store
/// when it is the master without a master address.
pub enum MasterPush {
    Outbox(Arc<Outbox>),
    Store {
        store: Arc<MasterStore>,
        host: String,
        /// The last sequence number used (they only grow).
        seq: u64,
    },
}

impl MasterPush {
    /// The way to the master of `link`, if any.
    pub fn of(link: &crate::master::Link, host: &str) -> Option<MasterPush> {
        if let Some(ob) = &link.outbox {
            return Some(MasterPush::Outbox(ob.clone()));
        }
        let store = link.store.clone()?;
        Some(MasterPush::Store {
            store,
            host: host.to_string(),
            seq: 0,
        })
    }

    /// Push one message (`what` names it in a warning when it fails).
    pub fn push(&mut self, kind: &str, job: &str, bytes: &[u8], what: &str) {
        match self {
            MasterPush::Outbox(ob) => {
                if let Err(e) = ob.push(kind, job, bytes) {
                    tracing::warn!("{what} for the master: {e}");
                }
            }
            MasterPush::Store { store, host, seq } => {
                *seq = (*seq + 1).max(crate::util::time::unix_ms().saturating_mul(1000));
                let req = crate::master::proto::PushRequest {
                    kind: kind.into(),
                    job: job.into(),
                    host: host.clone(),
                    seq: *seq,
                    payload: bytes.to_vec(),
                };
                if let Err(e) = store.store(&req) {
                    tracing::warn!("{what} into this master's store: {e}");
                }
            }
        }
    }
}

/// Where step lines go: to the master, or to this agent's own live straggler index and EP
/// windows (no master).
pub enum StepsTarget {
    Master(MasterPush),
    Local {
        straggler: Option<Arc<StragglerOutput>>,
        moe: Option<Arc<MoeOutput>>,
    },
}

/// Step lines waiting for their target, per job (JSON lines `{"stream", "step", "arrivals"}`,
/// and `{"stream", "host_sample"}` for the rank streams' host windows; at least once: a restart may repeat steps; readers keep one per `(stream, step.step)`).
#[derive(Default)]
struct StepsOutbound {
    pending: BTreeMap<String, Vec<u8>>,
    bytes: usize,
}

impl StepsOutbound {
    /// One step line (the daemon's engine always runs the arrivals); the arrivals are moved
    /// onto the job timeline with this host's offset (unknown offset: an unbounded error, so none
    /// of the rank's waits is attributed).
    fn add(&mut self, done: StepDone, host: Option<&HostOffset>) {
        let (shift_us, err_us) = match host {
            Some(h) => (h.offset_ns / 1000, h.err_ns.div_ceil(1000)),
            None => (0, crate::clock::UNMEASURED_ERR_NS / 1000),
        };
        let Some(mut arrivals) = done.arrivals else {
            return;
        };
        onto_job_timeline(&mut arrivals, shift_us);
        arrivals.err_us = arrivals.err_us.saturating_add(err_us);
        let line = serde_json::json!({
            "stream": done.id.to_string(),
            "step": done.summary,
            "arrivals": arrivals,
        });
        self.line(&done.id.job, &line);
    }

    /// A host sample of the rank stream `id`, moved onto the job timeline like the arrivals.
    fn add_host(&mut self, id: &StreamId, mut sample: HostSample, host: Option<&HostOffset>) {
        let shift_us = host.map_or(0, |h| h.offset_ns / 1000);
        sample.at_us = sample.at_us.saturating_add_signed(shift_us);
        let line = serde_json::json!({"stream": id.to_string(), "host_sample": sample});
        self.line(&id.job, &line);
    }

    /// An EP row of the rank stream `id`, its window's times moved onto the job timeline.
    fn add_ep(&mut self, id: &StreamId, mut row: EpRow, host: Option<&HostOffset>) {
        let shift = host.map_or(0, |h| h.offset_ns);
        row.row.t_start_ns = row.row.t_start_ns.saturating_add_signed(shift);
        row.row.t_end_ns = row.row.t_end_ns.saturating_add_signed(shift);
        let line = serde_json::json!({"stream": id.to_string(), "ep_row": row});
        self.line(&id.job, &line);
    }

    fn line(&mut self, job: &str, line: &serde_json::Value) {
        let buf = self.pending.entry(job.to_string()).or_default();
        let before = buf.len();
        if serde_json::to_writer(&mut *buf, line).is_ok() {
            buf.push(b'\n');
        }
        self.bytes += buf.len() - before;
    }

    fn flush(&mut self, to: &mut StepsTarget) {
        for (job, bytes) in std::mem::take(&mut self.pending) {
            match to {
                StepsTarget::Master(m) => m.push("steps", &job, &bytes, "step summaries"),
                StepsTarget::Local { straggler, moe } => {
                    if let Some(s) = straggler {
                        s.on_lines(&job, &bytes);
                    }
                    if let Some(m) = moe {
                        m.on_lines(&job, &bytes);
                    }
                }
            }
        }
        self.bytes = 0;
    }
}

/// Move a rank's step by `shift_us`: its arrivals, and where its compute began with them.
fn onto_job_timeline(rs: &mut RankStep, shift_us: i64) {
    for a in &mut rs.arrivals {
        a.start_us = a.start_us.saturating_add_signed(shift_us);
    }
    rs.prev_end_us = rs.prev_end_us.map(|p| p.saturating_add_signed(shift_us));
}

/// The daemon's sinks (see the module docs).
pub struct Router {
    host: String,
    otlp: Option<Arc<OtlpSink>>,
    journal: StepJournal,
    steps: Option<(StepsOutbound, StepsTarget)>,
    evidence: EvidenceSink,
    hang_push: Option<MasterPush>,
    /// Export this host's verdicts (it has no master to merge them).
    export_verdicts: bool,
    /// Overdue lines in the log: one per stream per minute.
    overdue_log: LogLimiter,
    /// The daemon's state (`/status`): the last verdict.
    live: Option<Arc<super::status::Live>>,
}

impl Router {
    pub fn new(
        host: &str,
        otlp: Option<Arc<OtlpSink>>,
        journal: StepJournal,
        steps: Option<StepsTarget>,
        evidence: EvidenceSink,
        hang_push: Option<MasterPush>,
        export_verdicts: bool,
    ) -> Router {
        Router {
            host: host.to_string(),
            otlp,
            journal,
            steps: steps.map(|t| (StepsOutbound::default(), t)),
            overdue_log: LogLimiter::new(std::time::Duration::from_secs(60)),
            evidence,
            hang_push,
            export_verdicts,
            live: None,
        }
    }

    /// Record this host's verdicts in the daemon's state too.
    pub fn with_live(mut self, live: Arc<super::status::Live>) -> Router {
        self.live = Some(live);
        self
    }

    /// The step journal (`<state_dir>/results/steps/`).
    pub fn journal(&mut self) -> &mut StepJournal {
        &mut self.journal
    }

    /// Send `o` where it goes (`host`: this host's offset to the master now).
    pub fn route(&mut self, o: Output, host: Option<&HostOffset>) {
        match o {
            Output::Overdue {
                id,
                record,
                comm_name,
            } => {
                let comminsight_wire::record::Body::Overdue(ov) = &record.body else {
                    return;
                };
                let ev = LogEvent::overdue(&id.job, &self.host, comm_name.as_deref(), ov);
                // One line per stream per minute in the log; every event still goes to OTLP
                // and into the hang evidence.
                match self
                    .overdue_log
                    .admit(&id.to_string(), std::time::Instant::now())
                {
                    Some(0) => tracing::warn!(stream = %id, "{}", ev.body),
                    Some(n) => {
                        tracing::warn!(stream = %id, "{} ({n} more overdue operations of this process in the last minute, not logged)", ev.body)
                    }
                    None => {}
                }
                if let Some(s) = &self.otlp {
                    s.emit(ev);
                }
            }
            Output::Step(done) => {
                if let Err(e) = self.journal.write(&done.id, &done.summary) {
                    tracing::warn!(stream = %done.id, "{}: cannot write a step: {e}", self.journal.root().display());
                }
                if let Some((o, _)) = self.steps.as_mut() {
                    o.add(*done, host);
                }
            }
            Output::HangEvidence {
                job,
                event,
                snapshot,
                verdicts,
            } => {
                self.evidence
                    .host_view(&job, event, &self.host, &snapshot, verdicts.as_deref());
                if let Some(p) = self.hang_push.as_mut() {
                    p.push("hang", &job, &snapshot, "hang snapshot");
                }
            }
            Output::HostSample { id, sample } => {
                if let Some((o, _)) = self.steps.as_mut() {
                    o.add_host(&id, sample, host);
                }
            }
            // EP windows span hosts: the rows go where every host's rows meet (the master,
            // or this agent's own windows when it has none).
            Output::EpRow { id, row } => {
                if let Some((o, _)) = self.steps.as_mut() {
                    o.add_ep(&id, *row, host);
                }
            }
            Output::HangVerdict(v) => {
                if let (true, Some(l)) = (self.export_verdicts, &self.live) {
                    l.hang_verdict(&v.job, v.one_line());
                }
                if let (true, Some(s)) = (self.export_verdicts, &self.otlp) {
                    s.emit(LogEvent::verdict(&self.host, &v));
                }
            }
        }
    }

    /// Hand the pending step lines over when they are many (`force`: at a checkpoint, always).
    pub fn flush_steps(&mut self, force: bool) {
        if let Some((o, to)) = self.steps.as_mut() {
            if force || o.bytes >= STEPS_FLUSH_BYTES {
                o.flush(to);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::windows::SampleKind;
    use crate::straggler::{Arrival, InstanceKey};

    fn offset(offset_ns: i64) -> HostOffset {
        HostOffset {
            offset_ns,
            err_ns: 2_000,
            ..HostOffset::default()
        }
    }

    #[test]
    fn a_step_and_its_compute_start_move_together_onto_the_job_timeline() {
        let mut rs = RankStep {
            rank: 1,
            host: "h".into(),
            step: 3,
            duration_us: 100,
            coverage_complete: true,
            err_us: 0,
            arrivals: vec![Arrival {
                key: InstanceKey::Coll {
                    comm: 1,
                    func: 0,
                    seq: 3,
                },
                start_us: 10_000,
                dur_us: 50,
            }],
            prev_end_us: Some(9_000),
        };
        onto_job_timeline(&mut rs, -4_000);
        assert_eq!(
            (rs.arrivals[0].start_us, rs.prev_end_us),
            (6_000, Some(5_000))
        );
    }

    #[test]
    fn host_samples_go_out_as_step_lines_on_the_job_timeline() {
        let mut o = StepsOutbound::default();
        let id = StreamId::new("j", "h1", "42");
        let sample = HostSample {
            at_us: 1_000_000,
            what: SampleKind::Retransmits {
                local: "a:1".into(),
                remote: "b:2".into(),
                count: 3,
            },
        };
        o.add_host(&id, sample, Some(&offset(250_000_000)));
        let buf = &o.pending["j"];
        assert_eq!(o.bytes, buf.len());
        let v: serde_json::Value =
            serde_json::from_slice(buf.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(v["stream"], "j/h1/42");
        assert_eq!(v["host_sample"]["at_us"], 1_250_000);
        assert_eq!(v["host_sample"]["retransmits"]["count"], 3);
    }
}

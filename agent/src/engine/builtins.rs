//! The built-in analyses, each behind [`Analysis`]: operation metrics, communicator membership
//! and traffic (roles), the hang tracker, the step engine, the straggler arrivals and the host
//! context. The set is
//! closed: [`super::Engine`] holds each as an optional field and calls them in a fixed order.

use std::sync::{Arc, Mutex};

use comminsight_wire::record::Body;

use super::analysis::{Analysis, Cx, Decoded, Output};
use crate::hang::HangTracker;
use crate::host::context::HostContext;
use crate::metrics::MetricsAggregator;
use crate::moe::EpRows;
use crate::roles::TopologyCollector;
use crate::steps::engine::StepEngine;
use crate::steps::StepOp;
use crate::straggler::StepOpCollector;
use crate::stream::StreamId;

/// The metrics aggregator, shared with the OTLP exporter (which reads it when it collects).
#[derive(Clone, Debug)]
pub struct SharedMetrics(pub Arc<Mutex<MetricsAggregator>>);

impl SharedMetrics {
    pub fn new(max_series: usize) -> SharedMetrics {
        SharedMetrics(Arc::new(Mutex::new(MetricsAggregator::new(max_series))))
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, MetricsAggregator> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Analysis for HostContext {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], out: &mut Vec<Output>) {
        let mut samples = Vec::new();
        for d in recs {
            self.apply(cx.id, &d.rec.body, &d.align, &mut samples);
        }
        for (pid, sample) in samples {
            out.push(Output::HostSample {
                id: StreamId::new(&cx.id.job, &cx.id.host, &pid.to_string()),
                sample,
            });
        }
    }
}

impl Analysis for SharedMetrics {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], out: &mut Vec<Output>) {
        let mut m = self.lock();
        for d in recs {
            if let Body::Overdue(o) = &d.rec.body {
                if o.repeat == 0 {
                    out.push(Output::Overdue {
                        id: cx.id.clone(),
                        record: d.rec.clone(),
                        comm_name: m.comm_name(cx.id, o.comm_hash).map(str::to_owned),
                    });
                }
            }
            m.observe(cx.id, &d.rec);
        }
    }
}

impl Analysis for TopologyCollector {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        for d in recs {
            self.observe(cx.id, &d.rec);
        }
    }
}

impl Analysis for HangTracker {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        for d in recs {
            if !matches!(d.rec.body, Body::Proxy(_) | Body::Net(_)) {
                self.observe(cx.id, &d.rec, &d.align);
            }
        }
    }

    fn stream_end(&mut self, id: &StreamId, _out: &mut Vec<Output>) {
        self.end_stream(id);
    }

    fn forget(&mut self, id: &StreamId) {
        HangTracker::forget(self, id);
    }
}

/// The step engine's input from a decoded batch: the stream's rank when a `proc_start` is in it
/// (the last one), and its operations with their end times, aligned.
pub(crate) fn step_input(
    recs: &[Decoded],
) -> (Option<i64>, impl Iterator<Item = (StepOp, u64)> + '_) {
    let rank = recs.iter().rev().find_map(|d| match &d.rec.body {
        Body::ProcStart(p) => Some(i64::from(p.rank)),
        _ => None,
    });
    let ops = recs
        .iter()
        .filter_map(|d| StepEngine::op_of(&d.rec, d.align));
    (rank, ops)
}

/// The step engine's view of a batch: the stream's rank (from a `proc_start`) and its
/// operations, fed once per batch (one stream lookup). Completed steps stay in the engine's
/// outbox; [`super::Engine`] takes them and pairs them with their arrivals.
impl Analysis for StepEngine {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        let (rank, ops) = step_input(recs);
        self.feed(cx.id, rank, ops);
    }

    fn stream_end(&mut self, id: &StreamId, _out: &mut Vec<Output>) {
        self.end_stream(id);
    }

    fn forget(&mut self, id: &StreamId) {
        self.forget_stream(id);
    }
}

impl Analysis for StepOpCollector {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        for d in recs {
            self.observe(cx.id, &d.rec, d.align);
        }
    }

    fn forget(&mut self, id: &StreamId) {
        self.end_stream(id);
    }
}

impl Analysis for EpRows {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], out: &mut Vec<Output>) {
        for d in recs {
            if let Body::EpStats(e) = &d.rec.body {
                if let Some(row) = self.part(cx.id, e) {
                    out.push(Output::EpRow {
                        id: cx.id.clone(),
                        row: Box::new(row),
                    });
                }
            }
        }
    }

    fn forget(&mut self, id: &StreamId) {
        EpRows::forget(self, id);
    }
}

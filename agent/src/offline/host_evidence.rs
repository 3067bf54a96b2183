//! Host context for the offline straggler verdicts (issue 19), shared by `straggler` and
//! `report` so that both call a rank the same: while the steps stream by, [`HostSpans`] notes
//! each rank's stream and the process-clock span of its analysed steps (compute and
//! operations); after the pass, [`HostSpans::evidence`] reads the engine's host context over
//! those spans (main-thread shares, TCP retransmits, port errors) and [`refine`] applies it
//! to a job's report.

use std::collections::BTreeMap;

use crate::engine::Engine;
use crate::straggler::gpu::HostGpuEvidence;
pub use crate::straggler::host::RanksHost;
use crate::straggler::host::{HostLinkEvidence, HostShares, HostTcpEvidence};
use crate::straggler::model::RankStep;
use crate::straggler::StragglerReport;
use crate::stream::StreamId;

/// [`RanksHost`] per job.
pub type JobHost = BTreeMap<String, RanksHost>;

/// Each `(job, rank)`'s stream and the span `[lo, hi]` (process clock µs) of its steps.
#[derive(Debug, Default)]
pub struct HostSpans(BTreeMap<(String, i64), (StreamId, u64, u64)>);

impl HostSpans {
    /// Widen the span of stream `id`'s rank by step `a`'s arrivals (from the previous step's
    /// end): call it for the steps the analysis takes (inside `--steps`), so the host evidence
    /// covers exactly them, as the live report's covers its kept steps.
    pub fn note(&mut self, id: &StreamId, a: &RankStep) {
        if let Some((lo, hi)) = a.span_us() {
            let e = self
                .0
                .entry((id.job.clone(), a.rank))
                .or_insert((id.clone(), lo, hi));
            e.1 = e.1.min(lo);
            e.2 = e.2.max(hi);
        }
    }

    /// The host evidence of every noted rank that `engine`'s host context covers (none when
    /// the engine runs no host context).
    pub fn evidence(self, engine: &Engine) -> JobHost {
        let mut host = JobHost::new();
        let Some(h) = engine.host_context() else {
            return host;
        };
        for ((job, rank), (id, lo, hi)) in self.0 {
            let Ok(pid) = id.pid.parse::<u32>() else {
                continue;
            };
            // The GPUs through the rank's device binding, with or without thread records.
            if let Some(w) = h.gpu().window(&job, &id.host, pid, lo, hi) {
                let e = host.entry(job.clone()).or_default();
                e.gpu.insert(rank, HostGpuEvidence::of(&w));
            }
            let Some((t, covered)) = h.main_thread_window(&job, &id.host, pid, lo, hi) else {
                continue;
            };
            let e = host.entry(job.clone()).or_default();
            e.shares.insert(rank, HostShares::of(&t, covered));
            // Retransmits only where the host stream followed the rank (its thread records):
            // no record then means none, not unknown.
            if let Some(per) = h.tcp_retransmits_window(&job, &id.host, pid, lo, hi) {
                e.tcp.insert(rank, HostTcpEvidence::of(&per));
            }
            if let Some(per) = h.port_errors_window(&job, &id.host, pid, lo, hi) {
                e.links.insert(rank, HostLinkEvidence::of(&per));
            }
        }
        host
    }
}

/// Refine `report` with its job's host evidence in `host`, if any.
pub fn refine(report: &mut StragglerReport, host: &JobHost) {
    if let Some(h) = host.get(&report.job).filter(|h| !h.is_empty()) {
        crate::straggler::host::refine(report, h);
    }
}

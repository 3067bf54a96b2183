//! Stalls a job survived: waits that crossed the hang threshold of their time and then finished
//! (a checkpoint, an evaluation, a slow rank), one entry per episode.

use std::collections::BTreeMap;

use super::analyze::{threshold_us, HangSettings};
use super::model::{GapStats, JobSnapshot, ResolvedStall, VerdictComm};
use super::tracker::Stall;

/// Stalls that crossed the hang threshold of their time and finished, one per instance.
pub fn resolved(
    snap: &JobSnapshot,
    stalls: &[Stall],
    settings: &HangSettings,
) -> Vec<ResolvedStall> {
    let mut by: BTreeMap<(u64, String, u64), ResolvedStall> = BTreeMap::new();
    for s in stalls {
        let probe = JobSnapshot {
            gaps: GapStats {
                plugin_threshold_ms: snap.gaps.plugin_threshold_ms,
                ..s.gaps_before
            },
            ..JobSnapshot::default()
        };
        let threshold = threshold_us(&probe, settings);
        let wait = s.end_us.saturating_sub(s.enqueue_us);
        if wait < threshold {
            continue;
        }
        let comm = snap.comms.iter().find(|c| c.hash == s.comm);
        let e = by
            .entry((s.comm, s.func.clone(), s.seq))
            .or_insert_with(|| ResolvedStall {
                job: snap.job.clone(),
                comm: VerdictComm {
                    hash: s.comm,
                    name: comm.map(|c| c.name.clone()).unwrap_or_default(),
                    role: comm.map(|c| c.role.clone()).unwrap_or_default(),
                },
                func: s.func.clone(),
                seq: s.seq,
                ranks: vec![],
                since_us: s.enqueue_us,
                until_us: s.end_us,
                wait_us: 0,
                threshold_us: threshold,
            });
        e.ranks.push(s.rank);
        e.since_us = e.since_us.min(s.enqueue_us);
        e.until_us = e.until_us.max(s.end_us);
        e.wait_us = e.wait_us.max(wait);
    }
    // One entry per episode: instances whose waits overlap in time are one stall (a pause on
    // one rank holds many instances on many ranks); the earliest instance names it.
    let mut v: Vec<ResolvedStall> = by.into_values().collect();
    v.sort_by_key(|r| (r.since_us, r.comm.hash));
    let mut episodes: Vec<ResolvedStall> = Vec::new();
    for r in v {
        match episodes.last_mut() {
            Some(e) if r.since_us <= e.until_us => {
                e.until_us = e.until_us.max(r.until_us);
                e.wait_us = e.wait_us.max(r.wait_us);
                e.ranks.extend(r.ranks);
                e.ranks.sort_unstable();
                e.ranks.dedup();
            }
            _ => episodes.push(r),
        }
    }
    for e in &mut episodes {
        e.ranks.sort_unstable();
        e.ranks.dedup();
    }
    episodes
}

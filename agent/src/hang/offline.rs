//! `comminsight-agent hang DIR`: the analysis offline, from raw segments alone (each rank's
//! last ops and `overdue` records) and from archived evidence bundles (snapshots with stacks
//! and process states, re-analysed with the current rules). Same tracker, same analysis as the
//! daemon.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use comminsight_wire::record::Record;

use super::analyze::{analyze, threshold_us, HangSettings};
use super::merge::merge;
use super::model::{
    GapStats, HangReport, JobSnapshot, ResolvedStall, VerdictComm, SNAPSHOT_VERSION,
};
use super::tracker::{HangTracker, Stall};
use crate::clock::{align, ProcessClock};
use crate::replay::{read_streams, scratch_dir, ReplayError};
use crate::roles::TopologyCollector;
use crate::stacks::{ProcState, ProcStatus};
use crate::stream::StreamId;

/// Suffix of an archived snapshot (`<job>/<event>/<host>.snapshot.json`).
pub const SNAPSHOT_SUFFIX: &str = ".snapshot.json";

/// Why `hang DIR` could not run.
#[derive(Debug, thiserror::Error)]
pub enum HangError {
    #[error("{path}: no such directory (give a test-bed output directory, a segment root, an agent archive or its hang/ evidence)")]
    Missing { path: PathBuf },
    #[error("{path}: neither segment files (seg-*.cis, seg-*.cis.zst) nor hang evidence (*{SNAPSHOT_SUFFIX}) under it")]
    Empty { path: PathBuf },
    #[error(
        "{path}: not a hang snapshot ({reason}); remove it or re-create it with this agent version"
    )]
    BadSnapshot { path: PathBuf, reason: String },
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// The raw records of `dir` through the tracker: per job, the snapshot at the last moment
/// anything was heard, and the stalls the job survived.
pub fn raw_snapshots(dir: &Path) -> Result<Vec<(JobSnapshot, Vec<Stall>)>, ReplayError> {
    let scratch = scratch_dir("hang");
    let mut tracker = HangTracker::default();
    let mut topo = TopologyCollector::default();
    let mut clocks: BTreeMap<StreamId, ProcessClock> = BTreeMap::new();
    let res = read_streams(dir, &scratch, &mut |id, batch| {
        let clock = clocks.entry(id.clone()).or_default();
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            clock.observe(&rec);
            topo.observe(id, &rec);
            tracker.observe(id, &rec, &align(clock, None));
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    res?;
    let unsealed = unsealed_streams(dir);
    let jobs: Vec<String> = topo.jobs().keys().cloned().collect();
    Ok(jobs
        .into_iter()
        .map(|job| {
            let now = tracker.last_heard(&job);
            let mut snap = tracker.snapshot(&job, &topo, now, 0);
            // When some processes of the job finished cleanly (sealed their last segment),
            // one that did not was killed (or is still stuck): no procfs offline, but this.
            let streams = tracker.streams_of(&job);
            if streams.iter().any(|(id, _, _)| !unsealed.contains(id)) {
                let dead: std::collections::BTreeSet<String> = streams
                    .iter()
                    .filter(|(id, _, _)| unsealed.contains(id))
                    .map(|(id, _, _)| id.to_string())
                    .collect();
                for r in &mut snap.ranks {
                    if dead.contains(&r.stream) {
                        r.proc_state = Some(ProcState {
                            status: ProcStatus::Gone,
                            detail: "its last segment was never sealed while other ranks' were: the process was killed".into(),
                        });
                    }
                }
            }
            (snap, tracker.stalls(&job))
        })
        .collect())
}

/// Every `*.snapshot.json` under `dir`: per job, the latest snapshot of each host (as the master
/// keeps them; a copy in the results and one in the archive count once).
pub fn bundles(dir: &Path) -> Result<BTreeMap<String, Vec<JobSnapshot>>, HangError> {
    let mut files = Vec::new();
    walk(dir, 0, &mut files);
    files.sort();
    let mut latest: BTreeMap<(String, Vec<String>), JobSnapshot> = BTreeMap::new();
    for f in files {
        let bad = |reason: String| HangError::BadSnapshot {
            path: f.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&f).map_err(|e| bad(e.to_string()))?;
        let snap: JobSnapshot = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if snap.v != SNAPSHOT_VERSION {
            return Err(bad(format!(
                "snapshot version {}, this agent reads {SNAPSHOT_VERSION}",
                snap.v
            )));
        }
        let key = (snap.job.clone(), snap.hosts.clone());
        if latest
            .get(&key)
            .is_none_or(|old| old.taken_us < snap.taken_us)
        {
            latest.insert(key, snap);
        }
    }
    let mut out: BTreeMap<String, Vec<JobSnapshot>> = BTreeMap::new();
    for ((job, _), snap) in latest {
        out.entry(job).or_default().push(snap);
    }
    Ok(out)
}

fn walk(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    if depth > 10 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&p, depth + 1, out);
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(SNAPSHOT_SUFFIX))
        {
            out.push(p);
        }
    }
}

/// The report for everything under `dir`.
pub fn report(dir: &Path, settings: &HangSettings) -> Result<HangReport, HangError> {
    if !dir.is_dir() {
        return Err(HangError::Missing {
            path: dir.to_path_buf(),
        });
    }
    let events = bundles(dir)?;
    let raw = match raw_snapshots(dir) {
        Ok(r) => r,
        Err(ReplayError::NoSegments { .. }) if !events.is_empty() => Vec::new(),
        Err(ReplayError::NoSegments { .. }) => {
            return Err(HangError::Empty {
                path: dir.to_path_buf(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    let mut report = HangReport::default();
    let mut raw_by_job: BTreeMap<String, JobSnapshot> = BTreeMap::new();
    for (snap, stalls) in raw {
        report.resolved.extend(resolved(&snap, &stalls, settings));
        raw_by_job.insert(snap.job.clone(), snap);
    }
    let mut analysed: std::collections::BTreeSet<String> = Default::default();
    for (job, snaps) in &events {
        // The evidence as the agents took it; ranks no agent described come from the segments.
        let mut merged = merge(snaps);
        if let Some(r) = raw_by_job.get(job) {
            fill_from(&mut merged, r);
        }
        report
            .verdicts
            .extend(analyze(&merged, settings, &[]).verdicts);
        analysed.insert(job.clone());
    }
    for (job, snap) in &raw_by_job {
        if !analysed.contains(job) {
            report
                .verdicts
                .extend(analyze(snap, settings, &[]).verdicts);
        }
    }
    Ok(report)
}

/// Add to `base` what only `extra` knows: ranks, communicator members, learned gaps.
fn fill_from(base: &mut JobSnapshot, extra: &JobSnapshot) {
    let known: std::collections::BTreeSet<i64> = base.ranks.iter().map(|r| r.rank).collect();
    base.ranks.extend(
        extra
            .ranks
            .iter()
            .filter(|r| r.rank >= 0 && !known.contains(&r.rank))
            .cloned(),
    );
    base.ranks.sort_by_key(|r| r.rank);
    let members = merge(&[base.clone(), extra.clone()]).comms;
    base.comms = members;
    base.hosts.extend(extra.hosts.iter().cloned());
    base.hosts.sort();
    base.hosts.dedup();
    base.world = base.world.max(extra.world);
    base.gaps.max_op_us = base.gaps.max_op_us.max(extra.gaps.max_op_us);
    base.gaps.max_idle_us = base.gaps.max_idle_us.max(extra.gaps.max_idle_us);
}

/// Stalls that crossed the hang threshold of their time and finished, one per instance.
fn resolved(snap: &JobSnapshot, stalls: &[Stall], settings: &HangSettings) -> Vec<ResolvedStall> {
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

/// Streams whose last segment was never sealed (`seg-*.cis.open`): the process did not finish.
fn unsealed_streams(dir: &Path) -> std::collections::BTreeSet<StreamId> {
    let mut out = std::collections::BTreeSet::new();
    let mut stack = vec![(dir.to_path_buf(), 0u32)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if depth < 8 {
                    stack.push((p, depth + 1));
                }
            } else if name.starts_with("seg-") && name.ends_with(".cis.open") {
                let parts: Vec<String> = p
                    .iter()
                    .rev()
                    .skip(1)
                    .take(3)
                    .map(|c| c.to_string_lossy().into_owned())
                    .collect();
                if let [pid, host, job] = parts.as_slice() {
                    out.insert(StreamId::new(job, host, pid));
                }
            }
        }
    }
    out
}

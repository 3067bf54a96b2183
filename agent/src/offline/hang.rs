//! `comminsight-agent hang DIR`: the analysis offline, from raw segments alone (each rank's last
//! ops and `overdue` records, through the daemon's hang tracker) and from archived evidence
//! bundles (snapshots with stacks and process states, re-analysed with the current rules).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{Input, InputError, Skipped};
use crate::engine::{Builtins, Engine, Output};
use crate::hang::analyze::{analyze, HangSettings};
use crate::hang::merge::{fill_from, merge};
use crate::hang::model::{HangReport, JobSnapshot, SNAPSHOT_SUFFIX, SNAPSHOT_VERSION};
use crate::hang::resolved::resolved;
use crate::hang::tracker::Stall;
use crate::stacks::{ProcState, ProcStatus};

/// Directory levels searched for evidence bundles.
const BUNDLE_DEPTH: u32 = 10;

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
    Input(#[from] InputError),
}

/// The engine of the hang pass (it also gathers the roles): clocks, membership, hang tracker.
pub fn hang_engine() -> Engine {
    Engine::new(Builtins {
        topology: true,
        hang: true,
        host: true,
        ..Builtins::default()
    })
}

/// Per job of an engine that ran [`hang_engine`]'s built-ins over `input`: the snapshot at the
/// last moment anything was heard, and the stalls the job survived.
pub fn raw_snapshots(input: &Input, engine: &Engine) -> Vec<(JobSnapshot, Vec<Stall>)> {
    let tracker = engine.hang();
    let jobs: Vec<String> = engine.topology().jobs().keys().cloned().collect();
    jobs.into_iter()
        .map(|job| {
            let now = tracker.last_heard(&job);
            let mut snap = engine.hang_snapshot(&job, now, 0);
            // When some processes of the job finished cleanly (sealed their last segment),
            // one that did not was killed (or is still stuck): no procfs offline, but this.
            let streams = tracker.streams_of(&job);
            let unsealed: BTreeSet<String> = streams
                .iter()
                .filter(|(id, _, _)| input.unsealed(id))
                .map(|(id, _, _)| id.to_string())
                .collect();
            if unsealed.len() < streams.len() {
                for r in &mut snap.ranks {
                    if unsealed.contains(&r.stream) {
                        r.proc_state = Some(ProcState {
                            status: ProcStatus::Gone,
                            detail: "its last segment was never sealed while other ranks' were: the process was killed".into(),
                        });
                    }
                }
            }
            (snap, tracker.stalls(&job))
        })
        .collect()
}

/// Every `*.snapshot.json` under `dir`: per job, the latest snapshot of each host (as the master
/// keeps them; a copy in the results and one in the archive count once).
pub fn bundles(dir: &Path) -> Result<BTreeMap<String, Vec<JobSnapshot>>, HangError> {
    let files = crate::util::fs::files_under(dir, BUNDLE_DEPTH, &|n| n.ends_with(SNAPSHOT_SUFFIX));
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

/// The report for everything under `dir`: its segments (one pass) and its evidence bundles,
/// and what reading the segments skipped.
pub fn report(
    dir: &Path,
    settings: &HangSettings,
    moe: &crate::moe::MoeConfig,
) -> Result<(HangReport, Skipped), HangError> {
    if !dir.is_dir() {
        return Err(HangError::Missing {
            path: dir.to_path_buf(),
        });
    }
    let events = bundles(dir)?;
    let mut ep = Vec::new();
    let (raw, skipped) = match Input::open(dir) {
        Ok(mut input) => {
            input.show_progress("hang");
            let mut engine = hang_engine();
            engine.enable(Builtins {
                moe: moe.enabled,
                ..Builtins::default()
            });
            let mut rows = Vec::new();
            input.run(&mut engine, &mut [], &mut |o| {
                if let Output::EpRow { id, row } = o {
                    rows.push((id, *row));
                }
            });
            ep = super::moe::missing(rows, moe, engine.topology());
            (raw_snapshots(&input, &engine), input.skipped())
        }
        Err(InputError::NoSegments { .. }) if !events.is_empty() => {
            (Vec::new(), Skipped::default())
        }
        Err(InputError::NoRecords { skipped, .. }) if !events.is_empty() => (Vec::new(), *skipped),
        Err(InputError::NoSegments { .. }) => {
            return Err(HangError::Empty {
                path: dir.to_path_buf(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    let mut r = report_of(&events, raw, settings);
    r.ep_incomplete = ep;
    Ok((r, skipped))
}

/// The report from evidence bundles (`events`, per job) and the raw segments' snapshots: a job
/// with bundles is analysed from them (ranks no agent described come from the segments),
/// every other job from its segments.
pub fn report_of(
    events: &BTreeMap<String, Vec<JobSnapshot>>,
    raw: Vec<(JobSnapshot, Vec<Stall>)>,
    settings: &HangSettings,
) -> HangReport {
    let mut report = HangReport::default();
    let mut raw_by_job: BTreeMap<String, JobSnapshot> = BTreeMap::new();
    for (snap, stalls) in raw {
        report.resolved.extend(resolved(&snap, &stalls, settings));
        raw_by_job.insert(snap.job.clone(), snap);
    }
    for (job, snaps) in events {
        let mut merged = merge(snaps);
        if let Some(r) = raw_by_job.get(job) {
            fill_from(&mut merged, r);
        }
        report
            .verdicts
            .extend(analyze(&merged, settings, &[]).verdicts);
    }
    for (job, snap) in &raw_by_job {
        if !events.contains_key(job) {
            report
                .verdicts
                .extend(analyze(snap, settings, &[]).verdicts);
        }
    }
    report
}

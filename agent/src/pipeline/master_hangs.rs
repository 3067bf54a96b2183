//! The job master's side of the hang path: every host's latest snapshot of a job merged into one
//! view and analysed ([`MasterHangs::on_push`]). A verdict is published once every live host has
//! reported the event (or [`SETTLE`] after its first report, naming the hosts that did not);
//! it is rewritten as evidence grows (stacks arrive after the first verdict) and announced again
//! only when its source ranks change.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::hang::analyze::{analyze, HangSettings};
use crate::hang::merge::merge;
use crate::hang::model::{JobSnapshot, Verdict};
use crate::sinks::evidence::EvidenceSink;

/// How long the master waits for every live host's report before publishing without it.
pub const SETTLE: Duration = Duration::from_secs(3);
/// A job is re-analysed at most this often (every agent re-sends a live event every 2 s; a
/// thousand hosts must not mean a thousand merges a second).
const MIN_INTERVAL: Duration = Duration::from_millis(500);
/// Snapshots this much older than a job's newest are from an earlier event and left out (µs).
const STALE_SNAPSHOT_US: u64 = 60_000_000;

#[derive(Default)]
struct JobState {
    first: Option<Instant>,
    last_run: Option<Instant>,
    published: Option<(Vec<i64>, (usize, usize))>,
}

/// The master's hang analysis (see the module doc).
pub struct MasterHangs {
    settings: HangSettings,
    /// A host not heard from for this long is missing.
    stale: Duration,
    /// Where `<job>/master-verdict.json` goes.
    evidence: EvidenceSink,
    jobs: Mutex<BTreeMap<String, JobState>>,
}

/// What one re-analysis produced.
#[derive(Debug, Default)]
pub struct MasterOutcome {
    /// Verdicts whose sources are new (log and export them).
    pub announce: Vec<Verdict>,
    /// The evidence file was (re)written.
    pub written: bool,
}

impl MasterHangs {
    pub fn new(settings: HangSettings, stale: Duration, dirs: Vec<PathBuf>) -> MasterHangs {
        MasterHangs {
            settings,
            stale,
            evidence: EvidenceSink::new(dirs),
            jobs: Mutex::default(),
        }
    }

    /// Re-analyse `job` from `snapshots` (`(host, payload)`), given when each host was last
    /// heard from.
    pub fn on_push(
        &self,
        job: &str,
        snapshots: &[(String, Vec<u8>)],
        last_seen: &BTreeMap<String, SystemTime>,
    ) -> MasterOutcome {
        {
            let mut jobs = self
                .jobs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let st = jobs.entry(job.to_string()).or_default();
            if st.last_run.is_some_and(|t| t.elapsed() < MIN_INTERVAL) {
                return MasterOutcome::default();
            }
            st.last_run = Some(Instant::now());
        }
        let now = SystemTime::now();
        let live: Vec<&String> = last_seen
            .iter()
            .filter(|(_, t)| now.duration_since(**t).unwrap_or_default() <= self.stale)
            .map(|(h, _)| h)
            .collect();
        let mut snaps: Vec<JobSnapshot> = snapshots
            .iter()
            .filter_map(|(host, b)| match serde_json::from_slice::<JobSnapshot>(b) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("hang snapshot from {host} does not parse ({e}); run the same agent version on every host");
                    None
                }
            })
            .collect();
        let newest = snaps.iter().map(|s| s.taken_us).max().unwrap_or(0);
        snaps.retain(|s| s.taken_us + STALE_SNAPSHOT_US >= newest);
        let reported: Vec<&String> = snaps.iter().flat_map(|s| s.hosts.iter()).collect();
        let missing: Vec<String> = live
            .iter()
            .filter(|h| !reported.contains(h))
            .map(|h| (*h).clone())
            .chain(
                last_seen
                    .keys()
                    .filter(|h| !live.contains(h) && !reported.contains(h))
                    .cloned(),
            )
            .collect();
        let mut jobs = self
            .jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let st = jobs.entry(job.to_string()).or_default();
        let first = *st.first.get_or_insert_with(Instant::now);
        if snaps.is_empty() {
            return MasterOutcome::default();
        }
        let merged = merge(&snaps);
        let verdicts = analyze(&merged, &self.settings, &missing).verdicts;
        if verdicts.is_empty() {
            if st.published.is_some() {
                // The hang is over (or was never confirmed): the next one starts afresh.
                *st = JobState::default();
            }
            return MasterOutcome::default();
        }
        // Wait for every live host's view, up to SETTLE.
        let waiting = live.iter().any(|h| !reported.contains(h));
        if waiting && first.elapsed() < SETTLE {
            return MasterOutcome::default();
        }
        let sources: Vec<i64> = verdicts
            .iter()
            .flat_map(|v| v.source_ranks.iter().copied())
            .collect();
        let evidence = (
            merged.hosts.len(),
            merged.ranks.iter().filter(|r| r.stacks.is_some()).count(),
        );
        let before = st.published.replace((sources.clone(), evidence));
        if before.as_ref() == Some(&(sources.clone(), evidence)) {
            return MasterOutcome::default();
        }
        let doc = serde_json::json!({ "verdicts": verdicts, "snapshot": merged });
        let text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        self.evidence.master_verdict(job, &text);
        let new_sources = before.is_none_or(|(s, _)| s != sources);
        MasterOutcome {
            announce: if new_sources { verdicts } else { Vec::new() },
            written: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::model::{CommView, OpenOp, RankView, SNAPSHOT_VERSION};

    /// Host `h` holds rank `h`; both are in one all-reduce; rank 1 stopped in compute.
    fn host(h: i64, stacks: bool) -> (String, Vec<u8>) {
        let now = 100_000_000;
        let mut r = RankView {
            rank: h,
            host: format!("h{h}"),
            pid: 10 + h as u32,
            last_end_us: now - 50_000_000,
            last_heard_us: now,
            ..RankView::default()
        };
        if h == 0 {
            r.open = vec![OpenOp {
                comm: 1,
                func: "AllReduce".into(),
                seq: 3,
                peer: -1,
                enqueue_us: now - 40_000_000,
                ..OpenOp::default()
            }];
        }
        if stacks {
            r.stacks = Some(crate::stacks::ProcessStacks {
                pid: r.pid,
                ..Default::default()
            });
        }
        let s = JobSnapshot {
            v: SNAPSHOT_VERSION,
            job: "j".into(),
            hosts: vec![format!("h{h}")],
            taken_us: now,
            world: 2,
            comms: vec![CommView {
                hash: 1,
                role: "dp".into(),
                nranks: 2,
                members: vec![(0, 0), (1, 1)],
                ..CommView::default()
            }],
            ranks: vec![r],
            ..JobSnapshot::default()
        };
        (format!("h{h}"), serde_json::to_vec(&s).unwrap())
    }

    #[test]
    fn publishes_when_every_live_host_reported_then_grows_the_evidence() {
        let dir = std::env::temp_dir().join(format!("ci-master-hangs-{}", std::process::id()));
        let m = MasterHangs::new(
            HangSettings::default(),
            Duration::from_secs(60),
            vec![dir.clone()],
        );
        let seen: BTreeMap<String, SystemTime> =
            [("h0", SystemTime::now()), ("h1", SystemTime::now())]
                .into_iter()
                .map(|(h, t)| (h.to_string(), t))
                .collect();
        // Only h0 has reported: h1 is live, so the master waits (rank 1 would be "no data").
        let out = m.on_push("j", &[host(0, false)], &seen);
        assert!(!out.written && out.announce.is_empty());
        std::thread::sleep(MIN_INTERVAL);
        let out = m.on_push("j", &[host(0, false), host(1, false)], &seen);
        assert!(out.written);
        assert_eq!(out.announce.len(), 1);
        assert_eq!(out.announce[0].source_ranks, vec![1]);
        assert_eq!(out.announce[0].evidence["sources"][0]["state"], "compute");
        // Within MIN_INTERVAL nothing runs; later, the stacks are written but not announced again.
        let out = m.on_push("j", &[host(0, false), host(1, true)], &seen);
        assert!(!out.written);
        std::thread::sleep(MIN_INTERVAL);
        let out = m.on_push("j", &[host(0, false), host(1, true)], &seen);
        assert!(out.written && out.announce.is_empty());
        let doc: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("j").join("master-verdict.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            doc["verdicts"][0]["evidence"]["sources"][0]["stacks"]["pid"],
            11
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The job master's side of the hang path: every host's latest snapshot of a job merged into one
//! view and analysed ([`MasterHangs::on_push`]). A verdict is published once every live host has
//! reported the event with a current view (or [`SETTLE`] after its first report, naming the
//! hosts that did not); it is rewritten as evidence grows (stacks arrive after the first verdict)
//! and announced again only when its source ranks change.
//!
//! A master that just (re)started does not know yet which hosts are alive, its store holds the
//! views they sent before, and they re-send their backlogs oldest first: for up to the host
//! staleness after its start it waits until every host its store knows has sent a view taken
//! after the start, so a verdict is not made from views of different moments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::hang::analyze::{analyze, HangSettings, CURRENT_VIEW_US};
use crate::hang::merge::merge;
use crate::hang::model::{JobSnapshot, Verdict};
use crate::sinks::evidence::EvidenceSink;
use crate::util::time::unix_us;

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
    /// When this master started (and in µs since the epoch, as snapshots are stamped).
    started: (Instant, u64),
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
            started: (Instant::now(), unix_us()),
            evidence: EvidenceSink::new(dirs),
            jobs: Mutex::default(),
        }
    }

    /// Re-analyse `job` from `snapshots` (`(host, payload)`), given the hosts the master's store
    /// knows for the job (`known`: any kind stored, this run or before) and when each host was
    /// last heard from (this run).
    pub fn on_push(
        &self,
        job: &str,
        snapshots: &[(String, Vec<u8>)],
        known: &[String],
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
        let Coverage {
            missing,
            waiting,
            restarting,
        } = self.coverage(&snaps, known, last_seen);
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
        // Wait for every live host's current view, up to SETTLE; just after a (re)start, for
        // every known host, up to the staleness.
        if (waiting && first.elapsed() < SETTLE) || restarting {
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

    /// Which hosts `snaps` cover with a current view (taken within [`CURRENT_VIEW_US`] of the
    /// newest), which are missing, and what to wait for.
    fn coverage(
        &self,
        snaps: &[JobSnapshot],
        known: &[String],
        last_seen: &BTreeMap<String, SystemTime>,
    ) -> Coverage {
        let now = SystemTime::now();
        let live: Vec<&String> = last_seen
            .iter()
            .filter(|(_, t)| now.duration_since(**t).unwrap_or_default() <= self.stale)
            .map(|(h, _)| h)
            .collect();
        let newest = snaps.iter().map(|s| s.taken_us).max().unwrap_or(0);
        let current = |s: &&JobSnapshot| s.taken_us + CURRENT_VIEW_US >= newest;
        let reported: BTreeSet<&String> = snaps
            .iter()
            .filter(current)
            .flat_map(|s| s.hosts.iter())
            .collect();
        let stored = snaps.iter().flat_map(|s| s.hosts.iter());
        let missing: BTreeSet<&String> = last_seen
            .keys()
            .chain(stored)
            .chain(known)
            .filter(|h| !reported.contains(h))
            .collect();
        // Just (re)started: the stored views are from before the start, and the hosts re-send
        // their backlogs oldest first (after their retry backoff). Until each known host's
        // view is from after the start, views of different moments would be merged.
        let since_start: BTreeSet<&String> = snaps
            .iter()
            .filter(|s| s.taken_us >= self.started.1)
            .flat_map(|s| s.hosts.iter())
            .collect();
        let restarting =
            self.started.0.elapsed() < self.stale && known.iter().any(|h| !since_start.contains(h));
        Coverage {
            missing: missing.into_iter().cloned().collect(),
            waiting: live.iter().any(|h| !reported.contains(h)),
            restarting,
        }
    }
}

/// What a merge of the stored views covers ([`MasterHangs::coverage`]).
struct Coverage {
    /// Hosts heard from, stored or known without a current view.
    missing: Vec<String>,
    /// A live host has no current view yet.
    waiting: bool,
    /// Just (re)started and a known host has no view from after the start yet.
    restarting: bool,
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
        let out = m.on_push("j", &[host(0, false)], &[], &seen);
        assert!(!out.written && out.announce.is_empty());
        std::thread::sleep(MIN_INTERVAL);
        let out = m.on_push("j", &[host(0, false), host(1, false)], &[], &seen);
        assert!(out.written);
        assert_eq!(out.announce.len(), 1);
        assert_eq!(out.announce[0].source_ranks, vec![1]);
        assert_eq!(out.announce[0].evidence["sources"][0]["state"], "compute");
        // Within MIN_INTERVAL nothing runs; later, the stacks are written but not announced again.
        let out = m.on_push("j", &[host(0, false), host(1, true)], &[], &seen);
        assert!(!out.written);
        std::thread::sleep(MIN_INTERVAL);
        let out = m.on_push("j", &[host(0, false), host(1, true)], &[], &seen);
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

    /// `view` taken at `at_us`, its times moved with it.
    fn taken(view: (String, Vec<u8>), at_us: u64) -> (String, Vec<u8>) {
        let mut s: JobSnapshot = serde_json::from_slice(&view.1).unwrap();
        let base = s.taken_us;
        let shift = |t: &mut u64| *t = (*t + at_us).saturating_sub(base);
        for r in &mut s.ranks {
            shift(&mut r.last_end_us);
            shift(&mut r.last_heard_us);
            for o in &mut r.open {
                shift(&mut o.enqueue_us);
            }
        }
        s.taken_us = at_us;
        (view.0, serde_json::to_vec(&s).unwrap())
    }

    #[test]
    fn a_restarted_master_waits_for_the_hosts_it_knows_and_their_current_views() {
        let dir = std::env::temp_dir().join(format!("ci-master-restart-{}", std::process::id()));
        let known = ["h0".to_string(), "h1".to_string()];
        let mut seen: BTreeMap<String, SystemTime> = [("h0".to_string(), SystemTime::now())].into();
        // Just started; the store knows h0 and h1. h0 sent a view taken after the start, h1's
        // is 6 s older and from before (h1 is in its retry backoff): nothing is published.
        let m = MasterHangs::new(
            HangSettings::default(),
            Duration::from_secs(60),
            vec![dir.clone()],
        );
        let after = unix_us();
        let older_h1 = [
            taken(host(0, false), after),
            taken(host(1, false), after - 6_000_000),
        ];
        let out = m.on_push("j", &older_h1, &known, &seen);
        assert!(!out.written && out.announce.is_empty());
        // h1 called and sent a current view from its backlog, still taken before the start.
        seen.insert("h1".into(), SystemTime::now());
        std::thread::sleep(MIN_INTERVAL);
        let backlog = [
            taken(host(0, false), after),
            taken(host(1, false), after - 1_000_000),
        ];
        assert!(!m.on_push("j", &backlog, &known, &seen).written);
        // h1's view from after the start: published, nobody missing.
        std::thread::sleep(MIN_INTERVAL);
        let both = [taken(host(0, false), after), taken(host(1, false), after)];
        let out = m.on_push("j", &both, &known, &seen);
        assert!(out.written);
        assert_eq!(out.announce[0].source_ranks, vec![1]);
        assert_eq!(
            out.announce[0].evidence["missing_hosts"],
            serde_json::json!([])
        );
        // Past the staleness (zero here) nobody waits for h1: its older view is used and h1 is
        // named as a host without a current view.
        seen.remove("h1");
        let m = MasterHangs::new(HangSettings::default(), Duration::ZERO, vec![dir.clone()]);
        let out = m.on_push("j", &older_h1, &known, &seen);
        assert!(out.written);
        assert_eq!(
            out.announce[0].evidence["missing_hosts"],
            serde_json::json!(["h1"])
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

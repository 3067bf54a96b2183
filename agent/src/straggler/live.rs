//! The straggler index live (issue 7): on the job master (or on an agent without one), every
//! host's step arrivals ([`RankStep`]s, pushed with the step summaries) are grouped by step; a
//! step is analysed ([`super::analyze_step`]) once every rank of the job has reported a later
//! step, or `settle` after its first report. Per analysed step: the latest index of every rank
//! (the OTLP gauge `comminsight.straggler.index`) and the "m of n steps" rule — a rank whose
//! index is above the threshold in `min_steps_over` of its last `window_steps` analysed steps
//! is announced once ([`Alert`]) until it falls back under the rule. The last `report_steps`
//! steps are kept for the job's report (`results/straggler/<job>.json`), computed by the same
//! [`super::analyze`] as `comminsight-agent straggler`, its classes refined by the ranks' host
//! context ([`super::host::refine`]) from the host samples the agents push beside their steps
//! (main-thread intervals, retransmits; [`HostWindows`], read over each rank's kept steps as
//! offline over its analysed ones; at most [`MAX_HOST_SAMPLES`] per rank stream).
//!
//! Steps are grouped by the ranks' own step numbers (as the daemon's step engine counts them;
//! the ranks of one job start together). The warm-up steps (numbered below `warmup_steps`) are
//! passed over, not analysed, as offline. A report of a step already analysed is dropped and
//! counted (`late`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::host::{HostLinkEvidence, HostShares, HostTcpEvidence, RanksHost};
use super::{RankStep, StepIndex, StragglerReport, StragglerSettings};
use crate::host::windows::{HostSample, HostWindows};

/// Settings of the live analysis (`[straggler]`).
#[derive(Clone, Debug)]
pub struct LiveSettings {
    pub threshold: f64,
    /// Root-index threshold: the announcement's rule (m of n steps over it).
    pub root_threshold: f64,
    /// ...with an own excess above this (% of the step).
    pub root_min_delay: f64,
    pub window_steps: usize,
    pub min_steps_over: usize,
    pub report_steps: usize,
    pub settle: Duration,
    /// Steps numbered below this (the warm-up) are not analysed.
    pub warmup_steps: u64,
}

/// A rank crossing the threshold in m of its last n steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub job: String,
    pub rank: i64,
    pub host: String,
    /// The step that completed the rule.
    pub step: u64,
    /// Its seed index in that step.
    pub index: f64,
    /// Its root-cause index in that step (what the rule counts).
    pub root_index: f64,
    /// What removing its excess would have saved of that step, %, when computed.
    pub saves_pct: Option<f64>,
    /// Steps over the root threshold among the last `window` analysed steps.
    pub over: usize,
    pub window: usize,
    /// The root threshold of the rule.
    pub threshold: f64,
}

/// One analysed step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutcome {
    pub job: String,
    pub index: StepIndex,
    pub alerts: Vec<Alert>,
}

/// One line of a pushed step batch: `{"stream", "step": {...}, "arrivals": RankStep}`, or
/// `{"stream", "host_sample": HostSample}` (a rank stream's host window); other lines (older
/// agents, steps off) are skipped.
#[derive(Deserialize)]
struct Line {
    stream: String,
    #[serde(default)]
    arrivals: Option<RankStep>,
    #[serde(default)]
    host_sample: Option<HostSample>,
}

/// Host samples kept per rank stream (of each kind); older ones than the kept steps go first.
pub const MAX_HOST_SAMPLES: usize = 1024;
/// Rank streams with host samples kept per job; samples of further ones are dropped.
pub const MAX_HOST_STREAMS: usize = 65_536;

#[derive(Default)]
struct RankLive {
    host: String,
    /// Over the threshold, per analysed step, newest last (at most `window_steps`).
    window: VecDeque<bool>,
    alerted: bool,
    last_index: f64,
    last_root: f64,
}

struct Pending {
    first_seen: Instant,
    ranks: BTreeMap<i64, RankStep>,
}

#[derive(Default)]
struct JobLive {
    pending: BTreeMap<u64, Pending>,
    /// The latest step each stream reported.
    latest: BTreeMap<String, u64>,
    /// Every step up to this one has been analysed.
    done_through: Option<u64>,
    recent: VecDeque<Vec<RankStep>>,
    ranks: BTreeMap<i64, RankLive>,
    late: u64,
    /// Analysed steps since the report was last taken.
    dirty: bool,
    /// Each rank stream's host windows (main-thread intervals, retransmits) and its rank.
    host: BTreeMap<String, HostWindows>,
    stream_rank: BTreeMap<String, i64>,
    /// The span of the kept steps (`recent`), µs: a host sample inside it changes the report.
    recent_span: Option<(u64, u64)>,
    host_dropped: u64,
}

impl JobLive {
    /// Keep a host sample of `stream`.
    fn host_sample(&mut self, stream: String, s: HostSample) {
        if !self.host.contains_key(&stream) && self.host.len() >= MAX_HOST_STREAMS {
            self.host_dropped += 1;
            return;
        }
        if self
            .recent_span
            .is_some_and(|(lo, hi)| (lo..=hi).contains(&s.at_us))
        {
            self.dirty = true;
        }
        self.host
            .entry(stream)
            .or_default()
            .push(&s, MAX_HOST_SAMPLES);
    }

    /// After `recent` changed: its span, and the host samples before it forgotten.
    fn kept_steps_changed(&mut self) {
        let spans = self.recent.iter().flatten().filter_map(RankStep::span_us);
        self.recent_span = spans.fold(None, |acc, (lo, hi)| match acc {
            None => Some((lo, hi)),
            Some((a, b)) => Some((a.min(lo), b.max(hi))),
        });
        if let Some((lo, _)) = self.recent_span {
            for w in self.host.values_mut() {
                w.forget_before(lo);
            }
        }
    }

    /// The host evidence of every rank over its kept steps (as the offline commands read it
    /// over the analysed steps).
    fn host_evidence(&self) -> RanksHost {
        let mut spans: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
        for rs in self.recent.iter().flatten() {
            if let Some((lo, hi)) = rs.span_us() {
                let e = spans.entry(rs.rank).or_insert((lo, hi));
                *e = (e.0.min(lo), e.1.max(hi));
            }
        }
        let mut out = RanksHost::default();
        for (stream, w) in &self.host {
            let Some(rank) = self.stream_rank.get(stream) else {
                continue;
            };
            let Some(&(lo, hi)) = spans.get(rank) else {
                continue;
            };
            if let Some((t, covered)) = w.main_window(lo, hi) {
                out.shares.insert(*rank, HostShares::of(&t, covered));
            }
            out.tcp
                .insert(*rank, HostTcpEvidence::of(&w.retransmits_window(lo, hi)));
            out.links
                .insert(*rank, HostLinkEvidence::of(&w.port_errors_window(lo, hi)));
            if let Some(g) = w.gpu_window(lo, hi) {
                out.gpu.insert(*rank, super::gpu::HostGpuEvidence::of(&g));
            }
        }
        out
    }
}

/// The live analysis of every job; share it behind an `Arc`.
pub struct LiveStraggler {
    settings: LiveSettings,
    jobs: Mutex<BTreeMap<String, JobLive>>,
}

impl LiveStraggler {
    pub fn new(settings: LiveSettings) -> LiveStraggler {
        LiveStraggler {
            settings,
            jobs: Mutex::new(BTreeMap::new()),
        }
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, JobLive>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A batch of step lines of `job` (JSON lines as the agents push them); returns the steps
    /// this made ready, analysed, in step order.
    pub fn on_lines(&self, job: &str, bytes: &[u8], now: Instant) -> Vec<StepOutcome> {
        let mut jobs = self.jobs();
        let j = jobs.entry(job.to_string()).or_default();
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(Line {
                stream,
                arrivals,
                host_sample,
            }) = serde_json::from_slice::<Line>(line)
            else {
                continue;
            };
            let rs = match (arrivals, host_sample) {
                (Some(rs), _) => rs,
                (None, Some(s)) => {
                    j.host_sample(stream, s);
                    continue;
                }
                (None, None) => continue,
            };
            j.stream_rank.insert(stream.clone(), rs.rank);
            let latest = j.latest.entry(stream).or_insert(rs.step);
            *latest = (*latest).max(rs.step);
            if j.done_through.is_some_and(|d| rs.step <= d) {
                j.late += 1;
                continue;
            }
            j.pending
                .entry(rs.step)
                .or_insert_with(|| Pending {
                    first_seen: now,
                    ranks: BTreeMap::new(),
                })
                .ranks
                .insert(rs.rank, rs);
        }
        self.drain(job, j, now)
    }

    /// Analyse the steps whose settle time passed (call it every second or so).
    pub fn tick(&self, now: Instant) -> Vec<StepOutcome> {
        let mut jobs = self.jobs();
        let mut out = Vec::new();
        for (job, j) in jobs.iter_mut() {
            out.extend(self.drain(job, j, now));
        }
        out
    }

    /// Analyse, in order, the pending steps that are ready.
    fn drain(&self, job: &str, j: &mut JobLive, now: Instant) -> Vec<StepOutcome> {
        let mut out = Vec::new();
        while let Some((&step, p)) = j.pending.iter().next() {
            let everyone_past = j.latest.values().all(|&l| l > step);
            let settled = now.saturating_duration_since(p.first_seen) >= self.settings.settle;
            if !everyone_past && !settled {
                break;
            }
            let p = j.pending.remove(&step).expect("first key");
            j.done_through = Some(step);
            if step < self.settings.warmup_steps {
                // The warm-up says nothing of speed (as offline: `super::analyze`).
                continue;
            }
            out.push(self.analyse(job, j, step, p.ranks.into_values().collect()));
        }
        out
    }

    fn analyse(&self, job: &str, j: &mut JobLive, step: u64, ranks: Vec<RankStep>) -> StepOutcome {
        let s = &self.settings;
        let a = super::analyze_step(step, &ranks);
        let mut alerts = Vec::new();
        for (ri, rs) in a.index.ranks.iter().zip(host_of(&ranks, &a.index)) {
            let r = j.ranks.entry(ri.rank).or_default();
            r.host = rs;
            if !ri.coverage_complete {
                // A step cut by a hang (or with lost operations) says nothing of speed.
                continue;
            }
            r.last_index = ri.index;
            r.last_root = ri.root_index;
            r.window.push_back(super::root_over(
                ri.root_index,
                ri.root_delay,
                s.root_threshold,
                s.root_min_delay,
            ));
            while r.window.len() > s.window_steps {
                r.window.pop_front();
            }
            let over = r.window.iter().filter(|o| **o).count();
            if over >= s.min_steps_over {
                if !r.alerted {
                    r.alerted = true;
                    alerts.push(Alert {
                        job: job.to_string(),
                        rank: ri.rank,
                        host: r.host.clone(),
                        step,
                        index: ri.index,
                        root_index: ri.root_index,
                        saves_pct: ri.saves_pct,
                        over,
                        window: r.window.len(),
                        threshold: s.root_threshold,
                    });
                }
            } else {
                r.alerted = false;
            }
        }
        j.recent.push_back(ranks);
        while j.recent.len() > s.report_steps {
            j.recent.pop_front();
        }
        j.kept_steps_changed();
        j.dirty = true;
        StepOutcome {
            job: job.to_string(),
            index: a.index,
            alerts,
        }
    }

    /// The latest indices of every rank: `(job, rank, host, (seed index, root index))`.
    pub fn gauges(&self) -> Vec<(String, i64, String, (f64, f64))> {
        let jobs = self.jobs();
        jobs.iter()
            .flat_map(|(job, j)| {
                j.ranks.iter().map(move |(r, l)| {
                    (job.clone(), *r, l.host.clone(), (l.last_index, l.last_root))
                })
            })
            .collect()
    }

    /// Reports of the jobs analysed since the last call (over each job's last `report_steps`
    /// steps), with the count of late step reports dropped.
    pub fn take_reports(&self) -> Vec<(StragglerReport, u64)> {
        let recent: Vec<(String, Vec<RankStep>, u64, RanksHost)> = {
            let mut jobs = self.jobs();
            jobs.iter_mut()
                .filter(|(_, j)| j.dirty && !j.recent.is_empty())
                .map(|(job, j)| {
                    j.dirty = false;
                    let steps = j.recent.iter().flatten().cloned().collect();
                    (job.clone(), steps, j.late, j.host_evidence())
                })
                .collect()
        };
        // The analysis runs outside the lock.
        let settings = StragglerSettings {
            threshold: self.settings.threshold,
            warmup_steps: self.settings.warmup_steps,
            root_threshold: self.settings.root_threshold,
            root_min_delay: self.settings.root_min_delay,
            ..StragglerSettings::default()
        };
        recent
            .into_iter()
            .map(|(job, steps, late, host)| {
                let mut report = super::analyze(&job, steps, &settings);
                if !host.is_empty() {
                    super::host::refine(&mut report, &host);
                }
                (report, late)
            })
            .collect()
    }
}

/// The host of each rank of `index`, in its order.
fn host_of(ranks: &[RankStep], index: &StepIndex) -> Vec<String> {
    let by_rank: BTreeMap<i64, &str> = ranks.iter().map(|r| (r.rank, r.host.as_str())).collect();
    index
        .ranks
        .iter()
        .map(|r| {
            by_rank
                .get(&r.rank)
                .copied()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::straggler::{Arrival, InstanceKey};

    fn settings() -> LiveSettings {
        LiveSettings {
            root_threshold: 1.0,
            root_min_delay: 2.0,
            threshold: 10.0,
            window_steps: 5,
            min_steps_over: 3,
            report_steps: 4,
            settle: Duration::from_secs(30),
            warmup_steps: 0,
        }
    }

    /// Rank `r` of a 3-rank job in `step`: one all-reduce at `base + late(r)`, step 200 µs.
    fn line(r: i64, step: u64, late_us: u64) -> String {
        line_until(r, step, late_us, late_us)
    }

    /// Rank `r` computes `late_us` longer before step `step`'s collective, which ends when
    /// the latest member (`last_us` late) arrives.
    fn line_until(r: i64, step: u64, late_us: u64, last_us: u64) -> String {
        let rs = RankStep {
            rank: r,
            host: format!("h{r}"),
            step,
            duration_us: 200,
            coverage_complete: true,
            err_us: 0,
            arrivals: vec![Arrival {
                key: InstanceKey::Coll {
                    comm: 7,
                    func: 0,
                    seq: step,
                },
                start_us: step * 1_000 + late_us,
                dur_us: 10 + last_us - late_us,
            }],
            prev_end_us: Some(step * 1_000),
        };
        format!(
            "{}\n",
            serde_json::json!({"stream": format!("j/h{r}/{r}"), "step": {}, "arrivals": rs})
        )
    }

    fn batch(step: u64, late: [u64; 3]) -> String {
        let last = late.iter().copied().max().unwrap_or(0);
        (0..3)
            .map(|r| line_until(r, step, late[r as usize], last))
            .collect()
    }

    #[test]
    fn a_step_waits_for_every_rank_to_move_past_it_or_for_the_settle_time() {
        let live = LiveStraggler::new(settings());
        let t0 = Instant::now();
        assert!(live
            .on_lines("j", batch(0, [0, 0, 50]).as_bytes(), t0)
            .is_empty());
        // Two ranks moved on, the third not yet: step 0 still waits.
        let two: String = (0..2).map(|r| line(r, 1, 0)).collect();
        assert!(live.on_lines("j", two.as_bytes(), t0).is_empty());
        let out = live.on_lines("j", line(2, 1, 50).as_bytes(), t0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].index.step, 0);
        // r2 makes r0 and r1 wait 50 µs of a 200 µs step: 25.
        assert_eq!(out[0].index.ranks[0].rank, 2);
        assert!((out[0].index.ranks[0].index - 25.0).abs() < 1e-9);
        // Step 1 is complete but nobody is past it: the settle time analyses it.
        assert!(live.tick(t0 + Duration::from_secs(29)).is_empty());
        let out = live.tick(t0 + Duration::from_secs(30));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].index.step, 1);
        // A report of an analysed step is dropped and counted.
        assert!(live.on_lines("j", line(0, 1, 0).as_bytes(), t0).is_empty());
        let reports = live.take_reports();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].1, 1);
        assert_eq!(reports[0].0.ranks[0].rank, 2);
        // Nothing new analysed: no report to take.
        assert!(live.take_reports().is_empty());
    }

    #[test]
    fn warmup_steps_are_not_analysed() {
        let live = LiveStraggler::new(LiveSettings {
            warmup_steps: 2,
            min_steps_over: 1,
            ..settings()
        });
        let t0 = Instant::now();
        let mut analysed = Vec::new();
        // Rank 2 late in every step: announced in step 2, the first one past the warm-up.
        for s in 0..=3 {
            for o in live.on_lines("j", batch(s, [0, 0, 50]).as_bytes(), t0) {
                analysed.push((o.index.step, o.alerts.len()));
            }
        }
        assert_eq!(analysed, vec![(2, 1)]);
        let (report, _) = live.take_reports().remove(0);
        let steps: Vec<u64> = report.steps.iter().map(|s| s.step).collect();
        assert_eq!(steps, vec![2]);
        // A late report of a warm-up step is dropped like any analysed step's.
        assert!(live.on_lines("j", line(0, 1, 0).as_bytes(), t0).is_empty());
        assert_eq!(live.take_reports().len(), 0);
    }

    #[test]
    fn a_rank_is_announced_once_when_over_the_threshold_in_m_of_n_steps() {
        let live = LiveStraggler::new(settings());
        let t0 = Instant::now();
        let mut alerts = Vec::new();
        // Steps 0..=9: rank 2 late in steps 1, 3, 4 (the third completes 3 of 5), then again
        // in 5..=6 (still over: no second alert); 7..=9 healthy (falls under: re-armed).
        let late = |s: u64| matches!(s, 1 | 3 | 4 | 5 | 6);
        for s in 0..=10 {
            let l = if late(s) { 50 } else { 0 };
            for o in live.on_lines("j", batch(s, [0, 0, l]).as_bytes(), t0) {
                alerts.extend(o.alerts);
            }
        }
        assert_eq!(alerts.len(), 1, "{alerts:?}");
        let a = &alerts[0];
        assert_eq!((a.rank, a.step, a.over, a.window), (2, 4, 3, 5));
        assert_eq!(a.host, "h2");
        let g = live.gauges();
        assert_eq!(g.len(), 3);
        // The gauge is the latest analysed step's index (step 9: healthy).
        assert!(
            g.iter().all(|(_, _, _, i)| i.0 == 0.0 && i.1 == 0.0),
            "{g:?}"
        );
        // Over again in 3 of 5: announced again.
        let mut again = Vec::new();
        for s in 11..=14 {
            for o in live.on_lines("j", batch(s, [0, 0, 50]).as_bytes(), t0) {
                again.extend(o.alerts);
            }
        }
        assert_eq!(again.len(), 1, "{again:?}");
        // The report covers the last report_steps (4) analysed steps.
        let (report, _) = live.take_reports().remove(0);
        let steps: Vec<u64> = report.steps.iter().map(|s| s.step).collect();
        assert_eq!(steps, vec![10, 11, 12, 13]);
    }

    fn host_line(r: i64, at_us: u64, runnable_pct: u64) -> String {
        let s = HostSample {
            at_us,
            what: crate::host::windows::SampleKind::Main {
                len_ns: 100_000,
                times: crate::host::context::CpuTimes {
                    on_cpu_ns: (100 - runnable_pct) * 1000,
                    runnable_ns: runnable_pct * 1000,
                    ..Default::default()
                },
            },
        };
        format!(
            "{}\n",
            serde_json::json!({"stream": format!("j/h{r}/{r}"), "host_sample": s})
        )
    }

    #[test]
    fn pushed_host_samples_refine_the_live_report_like_offline() {
        let live = LiveStraggler::new(LiveSettings {
            min_steps_over: 1,
            ..settings()
        });
        let t0 = Instant::now();
        for s in 0..=4 {
            live.on_lines("j", batch(s, [0, 0, 50]).as_bytes(), t0);
        }
        let (report, _) = live.take_reports().remove(0);
        let r2 = report.ranks.iter().find(|r| r.rank == 2).unwrap();
        assert_eq!(r2.class, crate::straggler::StragglerClass::ComputeSlow);
        assert_eq!(r2.host_shares, None);
        // Samples inside the kept steps (0..=3, 0..=3 060 µs): rank 2 runnable 60 %, the
        // others 0 % — the report is taken again and rank 2 is cpu-starved.
        let mut lines = String::new();
        for step in 1..=3u64 {
            for r in 0..3 {
                lines += &host_line(r, step * 1000 + 30, if r == 2 { 60 } else { 0 });
            }
        }
        // A sample far outside the kept steps counts for nothing.
        lines += &host_line(0, 900_000, 100);
        live.on_lines("j", lines.as_bytes(), t0);
        let (report, _) = live.take_reports().remove(0);
        let rank = |r: i64| report.ranks.iter().find(|x| x.rank == r).unwrap().clone();
        assert_eq!(rank(2).class, crate::straggler::StragglerClass::CpuStarved);
        let sh = rank(2).host_shares.unwrap();
        assert_eq!((sh.runnable_pct, sh.covered_s), (60.0, 0.0));
        assert_eq!(rank(0).host_shares.unwrap().runnable_pct, 0.0);
        assert_eq!(rank(0).host_tcp.unwrap().retransmits, 0);
        // Samples before the kept steps were forgotten when step 4 moved them on.
        live.on_lines("j", batch(5, [0, 0, 0]).as_bytes(), t0);
        live.on_lines("j", batch(6, [0, 0, 0]).as_bytes(), t0);
        let jobs = live.jobs();
        let w = &jobs["j"].host["j/h2/2"];
        assert_eq!(w.main_window(0, 1_500), None);
        assert!(w.main_window(2_000, 4_000).is_some());
    }
}

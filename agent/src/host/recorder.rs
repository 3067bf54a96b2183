//! [`HostRecorder`]: the daemon's host source. It follows the rank processes the plugin
//! registered on this host (every live stream of this host), samples what the host knows about
//! them — thread states from the sched tracepoints (or `/proc` schedstat without BPF), QP
//! events from the verbs uprobes, TCP retransmits by connection, NIC port counters — and
//! writes them as `thread` / `qp` / `tcp` / `port` records into one host stream per job:
//! `<state_dir>/host-streams/<job>/<host>/host-<agent pid>/seg-NNNNNN.cis`, with the plugin's
//! segment writer. That directory is one more segment root of the sources, so the engine, the
//! archive (raw and Parquet) and every offline command read the host context exactly like the
//! plugin's records (docs/contracts.md "Host context records").
//!
//! Every part is optional and degrades alone: no BPF object, no privilege, no libibverbs, no
//! sysfs ports — one log line each (and [`RecorderStatus`] for `/status`), the rest runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comminsight_wire::host::{qp_event, qp_state, thread_source, thread_state};
use comminsight_wire::record::{Body, HostThread, ProcStart, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::RawRecord;
use serde::{Deserialize, Serialize};

use super::gpu::sampler::GpuSampler;
use super::gpu::{BoundGpus, GpuConfig, GpuStatus};
use super::ports::{PortSampler, PortsConfig};
use super::records::{port_records, qp_record, tcp_record};
use super::schedstat::SchedstatSampler;
use crate::probes::threads::monotonic_ns;
use crate::probes::{ProbeStatus, ProbesConfig, ThreadSample, VerbsCall};

/// Directory of the host streams under `[agent] state_dir`.
pub const HOST_STREAMS_DIR: &str = "host-streams";
/// A host segment is sealed at this size.
const SEGMENT_BYTES: u64 = 16 << 20;
/// ... or this age.
const SEGMENT_AGE: Duration = Duration::from_secs(300);
/// Sealed host segments kept per job stream (the archive copies them first).
const RETENTION_BYTES: u64 = 256 << 20;
/// Threads written per process per interval (the main thread and the most active ones).
pub const THREADS_PER_INTERVAL: usize = 64;

/// What the recorder runs and what it wrote, for `/status` and the log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecorderStatus {
    /// `on`, or why the eBPF probes are off.
    pub ebpf: String,
    /// Where thread times come from: `ebpf`, `schedstat` or `off`.
    pub threads: String,
    /// Port counters sampled.
    pub ports: bool,
    /// Each probe: attached or why not.
    pub probes: Vec<ProbeStatus>,
    /// Rank processes followed now.
    pub tracked: usize,
    /// Records written, and records lost to a failed writer.
    pub records: u64,
    pub lost: u64,
    /// The GPU sources (issue 20).
    #[serde(default)]
    pub gpu: GpuStatus,
}

struct JobStream {
    writer: SegmentWriter,
    seq: u64,
}

/// The recorder. See the module docs.
pub struct HostRecorder {
    host: String,
    root: PathBuf,
    stream: String,
    interval: Duration,
    ports_interval: Duration,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC at start: every record's host time is monotonic + this,
    /// like the plugin's.
    offset_ns: i64,
    start_mono_ns: u64,
    start_real_ns: u64,
    #[cfg(comminsight_bpf)]
    probes: Option<crate::probes::HostProbes>,
    /// Thread states are written (`[probes] sched`).
    threads_on: bool,
    sched_bpf: bool,
    schedstat: SchedstatSampler,
    ports: Option<PortSampler>,
    gpu: GpuSampler,
    /// pid -> job of the rank processes followed.
    tracked: BTreeMap<u32, String>,
    jobs: BTreeMap<String, JobStream>,
    /// Last cumulative totals of each thread and when they were read (monotonic ns).
    thread_last: HashMap<(u32, u32), (ThreadSample, u64)>,
    /// Last known state of each QP.
    qp_last: HashMap<(u32, u32), u8>,
    /// Last cumulative retransmits / state changes of each connection.
    tcp_last: HashMap<(u32, String, String), (u64, u64)>,
    /// Records waiting for the next write, per job.
    pending: BTreeMap<String, Vec<Record>>,
    last_threads: Option<Instant>,
    last_ports: Option<Instant>,
    status: RecorderStatus,
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl HostRecorder {
    /// Start what this host allows: the eBPF probes unless `[probes] enabled = false` (one line
    /// on why not), the schedstat fallback, the port sampler unless `[ports] enabled = false`.
    pub fn start(
        probes: &ProbesConfig,
        ports: &PortsConfig,
        gpu: &GpuConfig,
        state_dir: &Path,
        host: &str,
    ) -> HostRecorder {
        let mono = monotonic_ns();
        let real = realtime_ns();
        let mut r = HostRecorder {
            host: host.to_string(),
            root: state_dir.join(HOST_STREAMS_DIR),
            stream: format!(
                "{}{}",
                super::context::HOST_STREAM_PREFIX,
                std::process::id()
            ),
            interval: Duration::from_millis(probes.interval_ms.max(100)),
            ports_interval: Duration::from_millis(ports.interval_ms.max(100)),
            offset_ns: real as i64 - mono as i64,
            start_mono_ns: mono,
            start_real_ns: real,
            #[cfg(comminsight_bpf)]
            probes: None,
            threads_on: probes.sched,
            sched_bpf: false,
            schedstat: SchedstatSampler::default(),
            ports: ports.enabled.then(|| PortSampler::from_config(ports)),
            gpu: GpuSampler::start(gpu, real as i64 - mono as i64),
            tracked: BTreeMap::new(),
            jobs: BTreeMap::new(),
            thread_last: HashMap::new(),
            qp_last: HashMap::new(),
            tcp_last: HashMap::new(),
            pending: BTreeMap::new(),
            last_threads: None,
            last_ports: None,
            status: RecorderStatus {
                ports: ports.enabled,
                threads: if probes.sched { "schedstat" } else { "off" }.into(),
                ..RecorderStatus::default()
            },
        };
        r.start_probes(probes);
        tracing::info!(
            ebpf = %r.status.ebpf,
            threads = %r.status.threads,
            ports = r.status.ports,
            "host context: writing host streams under {}",
            r.root.display()
        );
        r
    }

    #[cfg(comminsight_bpf)]
    fn start_probes(&mut self, cfg: &ProbesConfig) {
        if !cfg.enabled {
            self.status.ebpf = "off ([probes] enabled = false)".into();
            return;
        }
        match crate::probes::HostProbes::start(cfg, false) {
            Ok(p) => {
                self.status.probes = p.statuses().to_vec();
                for s in p.statuses().iter().filter(|s| !s.ok) {
                    tracing::warn!(probe = %s.name, "host probe not attached: {}", s.detail);
                }
                self.sched_bpf = cfg.sched
                    && p.statuses()
                        .iter()
                        .any(|s| s.ok && s.name == "sched:sched_switch");
                if self.sched_bpf {
                    self.status.threads = "ebpf".into();
                }
                self.status.ebpf = "on".into();
                self.probes = Some(p);
            }
            Err(e) => {
                tracing::warn!(
                    "eBPF host probes off: {e}; thread states come from /proc schedstat"
                );
                self.status.ebpf = format!("off: {e}");
            }
        }
    }

    #[cfg(not(comminsight_bpf))]
    fn start_probes(&mut self, _cfg: &ProbesConfig) {
        let e = crate::probes::ProbeError::NotBuiltIn;
        tracing::warn!("{e}; thread states come from /proc schedstat");
        self.status.ebpf = format!("off: {e}");
    }

    /// The segment root the host streams are written under (a source root of the daemon).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What runs and what was written.
    pub fn status(&self) -> RecorderStatus {
        let mut s = self.status.clone();
        s.tracked = self.tracked.len();
        s.gpu = self.gpu.status();
        s
    }

    /// GPUs at the fast period (a hang is suspected on this host) or the normal one.
    pub fn set_gpu_fast(&mut self, on: bool) {
        self.gpu.set_fast(on);
    }

    /// Follow exactly the rank processes `ranks` (`(job, pid)` of this host's live streams),
    /// drain the probes, sample the GPUs each job's ranks are bound to (`gpus`), and every
    /// interval write the host context of each job.
    pub fn tick(&mut self, ranks: &BTreeSet<(String, u32)>, gpus: &BoundGpus, now: Instant) {
        self.follow(ranks);
        let verbs = self.drain();
        for c in &verbs {
            self.on_verbs(c);
        }
        let threads_due = self
            .last_threads
            .is_none_or(|t| now.duration_since(t) >= self.interval);
        if threads_due {
            self.last_threads = Some(now);
            if self.threads_on {
                self.sample_threads();
            }
            self.sample_tcp();
        }
        if self.ports.is_some()
            && self
                .last_ports
                .is_none_or(|t| now.duration_since(t) >= self.ports_interval)
        {
            self.last_ports = Some(now);
            self.sample_ports();
        }
        let live: BTreeSet<&String> = self.tracked.values().collect();
        for (job, bodies) in self.gpu.tick(gpus, now) {
            if live.contains(&job) {
                let p = self.pending.entry(job).or_default();
                p.extend(bodies.into_iter().map(Record::new));
            }
        }
        if threads_due {
            self.write_pending(now);
        }
    }

    /// Seal every host stream (the daemon stops).
    pub fn finish(&mut self) {
        self.write_pending(Instant::now());
        for (_, j) in std::mem::take(&mut self.jobs) {
            let mut w = j.writer;
            w.seal();
        }
    }

    fn follow(&mut self, ranks: &BTreeSet<(String, u32)>) {
        let want: BTreeMap<u32, &String> = ranks.iter().map(|(j, p)| (*p, j)).collect();
        let gone: Vec<u32> = self
            .tracked
            .keys()
            .filter(|p| !want.contains_key(p))
            .copied()
            .collect();
        for pid in gone {
            self.tracked.remove(&pid);
            self.schedstat.forget(pid);
            self.thread_last.retain(|(p, _), _| *p != pid);
            self.qp_last.retain(|(p, _), _| *p != pid);
            self.tcp_last.retain(|(p, _, _), _| *p != pid);
            #[cfg(comminsight_bpf)]
            if let Some(pr) = self.probes.as_mut() {
                let _ = pr.untrack(pid);
            }
        }
        for (pid, job) in want {
            if self.tracked.contains_key(&pid) {
                continue;
            }
            self.tracked.insert(pid, job.clone());
            #[cfg(comminsight_bpf)]
            if let Some(pr) = self.probes.as_mut() {
                if let Err(e) = pr.track(pid) {
                    tracing::warn!(pid, "host probes cannot follow the process: {e}");
                }
            }
        }
        // A job none of whose processes is followed any more: its host stream is complete.
        let live: BTreeSet<&String> = self.tracked.values().collect();
        let done: Vec<String> = self
            .jobs
            .keys()
            .filter(|j| !live.contains(j))
            .cloned()
            .collect();
        for job in done {
            self.write_job(&job, Instant::now());
            if let Some(mut j) = self.jobs.remove(&job) {
                j.writer.seal();
            }
        }
    }

    #[cfg(comminsight_bpf)]
    fn drain(&mut self) -> Vec<VerbsCall> {
        match self.probes.as_mut() {
            Some(p) => p.poll().0,
            None => Vec::new(),
        }
    }

    #[cfg(not(comminsight_bpf))]
    fn drain(&mut self) -> Vec<VerbsCall> {
        Vec::new()
    }

    fn host_ns(&self, mono_ns: u64) -> u64 {
        mono_ns.saturating_add_signed(self.offset_ns)
    }

    fn push(&mut self, pid: u32, body: Body) {
        let Some(job) = self.tracked.get(&pid) else {
            return;
        };
        self.pending
            .entry(job.clone())
            .or_default()
            .push(Record::new(body));
    }

    fn on_verbs(&mut self, c: &VerbsCall) {
        let key = (c.pid, c.qp_num);
        let old = self.qp_last.get(&key).copied().unwrap_or(qp_state::UNKNOWN);
        let Some(q) = qp_record(c, old, self.host_ns(c.ts_ns)) else {
            return;
        };
        if q.event == qp_event::DESTROY {
            self.qp_last.remove(&key);
        } else {
            self.qp_last.insert(key, q.new_state);
        }
        self.push(c.pid, Body::Qp(q));
    }

    /// Every tracked thread's sample from the BPF map, by pid: one walk of the map per
    /// interval (a walk costs two system calls per entry, and each sample reads its thread's
    /// name), not one per process. `None` without the scheduler probes.
    fn bpf_thread_samples(&self) -> Option<BTreeMap<u32, Vec<ThreadSample>>> {
        #[cfg(comminsight_bpf)]
        if self.sched_bpf {
            if let Some(p) = self.probes.as_ref() {
                let mut by_pid: BTreeMap<u32, Vec<ThreadSample>> = BTreeMap::new();
                for t in p.threads() {
                    by_pid.entry(t.pid).or_default().push(t);
                }
                return Some(by_pid);
            }
        }
        None
    }

    fn sample_threads(&mut self) {
        let now = monotonic_ns();
        let source = if self.sched_bpf {
            thread_source::EBPF
        } else {
            thread_source::SCHEDSTAT
        };
        let pids: Vec<u32> = self.tracked.keys().copied().collect();
        let mut bpf = self.bpf_thread_samples();
        for pid in pids {
            let samples = match bpf.as_mut() {
                Some(m) => m.remove(&pid).unwrap_or_default(),
                None => self.schedstat.sample(pid, now),
            };
            let mut recs = Vec::new();
            for t in samples {
                let prev = self.thread_last.insert((pid, t.tid), (t.clone(), now));
                recs.push(thread_record(
                    &t,
                    prev.as_ref(),
                    now,
                    self.offset_ns,
                    source,
                ));
            }
            // The main thread, then the most active: a process with thousands of idle threads
            // writes at most THREADS_PER_INTERVAL of them.
            recs.sort_by_key(|r| {
                (
                    r.tid != pid,
                    std::cmp::Reverse(r.on_cpu_ns + r.runnable_ns),
                    r.tid,
                )
            });
            recs.truncate(THREADS_PER_INTERVAL);
            for r in recs {
                self.push(pid, Body::Thread(r));
            }
        }
    }

    #[cfg(comminsight_bpf)]
    fn sample_tcp(&mut self) {
        let Some(p) = self.probes.as_ref() else {
            return;
        };
        let now = self.host_ns(monotonic_ns());
        let interval = self.interval.as_nanos() as u64;
        for s in p.tcp_peers() {
            let key = (s.pid, s.local.clone(), s.remote.clone());
            let last = self.tcp_last.insert(key, (s.retransmits, s.state_changes));
            if let Some(t) = tcp_record(&s, last, now, interval) {
                self.push(s.pid, Body::Tcp(t));
            }
        }
    }

    #[cfg(not(comminsight_bpf))]
    fn sample_tcp(&mut self) {
        let _ = (&self.tcp_last, tcp_record);
    }

    fn sample_ports(&mut self) {
        let now_mono = monotonic_ns();
        let Some(s) = self.ports.as_mut() else {
            return;
        };
        let sample = s.sample(now_mono);
        let recs = port_records(&sample, self.host_ns(now_mono));
        // Port counters belong to the host: every job with a process here gets them.
        let jobs: BTreeSet<String> = self.tracked.values().cloned().collect();
        for job in jobs {
            self.pending
                .entry(job)
                .or_default()
                .extend(recs.iter().cloned().map(|b| Record::new(Body::Port(b))));
        }
    }

    fn write_pending(&mut self, now: Instant) {
        let jobs: Vec<String> = self.pending.keys().cloned().collect();
        for job in jobs {
            self.write_job(&job, now);
        }
    }

    fn write_job(&mut self, job: &str, now: Instant) {
        let Some(recs) = self.pending.remove(job) else {
            return;
        };
        if recs.is_empty() {
            return;
        }
        if !self.jobs.contains_key(job) {
            let j = self.open_job(job);
            self.jobs.insert(job.to_string(), j);
        }
        let j = self.jobs.get_mut(job).expect("opened above");
        let raws: Vec<RawRecord> = recs
            .iter()
            .map(|r| {
                let mut raw = r.encode();
                j.seq += 1;
                raw.set_seq(j.seq);
                raw
            })
            .collect();
        let before = j.writer.stats();
        j.writer.write(&raws);
        j.writer.flush();
        j.writer.maybe_rotate(now);
        let after = j.writer.stats();
        let lost = after.records_lost.saturating_sub(before.records_lost);
        self.status.records += raws.len() as u64 - lost.min(raws.len() as u64);
        if lost > 0 && self.status.lost == 0 {
            tracing::warn!(
                job,
                "host stream writer stopped ({}); host context of this job is lost from now on",
                j.writer.failure().unwrap_or("I/O error")
            );
        }
        self.status.lost += lost;
    }

    fn open_job(&self, job: &str) -> JobStream {
        let cfg = SegmentConfig {
            dir: self.root.join(job).join(&self.host).join(&self.stream),
            max_segment_bytes: SEGMENT_BYTES,
            max_segment_age: SEGMENT_AGE,
            retention_bytes: RETENTION_BYTES,
        };
        let mut writer = SegmentWriter::new(cfg, std::process::id());
        let start = Record::new(Body::ProcStart(ProcStart {
            pid: std::process::id(),
            rank: -1,
            local_rank: -1,
            world_size: -1,
            mono_ns: self.start_mono_ns,
            real_ns: self.start_real_ns,
            abi_version: 0,
            host: self.host.as_str().into(),
            job: job.into(),
        }))
        .encode();
        writer.set_preamble(vec![start]);
        writer.write(&[start]);
        JobStream { writer, seq: 0 }
    }
}

/// The `thread` record of sample `t`, its times the change since `prev` (none: a first sample,
/// interval 0), clamped to the interval.
fn thread_record(
    t: &ThreadSample,
    prev: Option<&(ThreadSample, u64)>,
    now_mono: u64,
    offset_ns: i64,
    source: u8,
) -> HostThread {
    let (interval, d) = match prev {
        Some((p, at)) => {
            let interval = now_mono.saturating_sub(*at);
            let c = |a: u64, b: u64| a.saturating_sub(b).min(interval);
            (
                interval,
                [
                    c(t.on_cpu_ns, p.on_cpu_ns),
                    c(t.runnable_ns, p.runnable_ns),
                    c(t.blocked_ns, p.blocked_ns),
                    c(t.blocked_io_ns, p.blocked_io_ns),
                    t.voluntary_switches.saturating_sub(p.voluntary_switches),
                    t.involuntary_switches
                        .saturating_sub(p.involuntary_switches),
                ],
            )
        }
        None => (0, [0; 6]),
    };
    let host = |mono: u64| mono.saturating_add_signed(offset_ns);
    HostThread {
        time_ns: host(now_mono),
        interval_ns: interval,
        on_cpu_ns: d[0],
        runnable_ns: d[1],
        blocked_ns: d[2],
        blocked_io_ns: d[3].min(d[2]),
        state_since_ns: host(now_mono.saturating_sub(t.in_state_ns)),
        pid: t.pid,
        tid: t.tid,
        voluntary_switches: d[4].min(u64::from(u32::MAX)) as u32,
        involuntary_switches: d[5].min(u64::from(u32::MAX)) as u32,
        state: thread_state::from_name(&t.state),
        source,
        comm: t.comm.as_str().into(),
        syscall: t.syscall.as_deref().unwrap_or("").into(),
    }
}

#[cfg(test)]
mod tests;

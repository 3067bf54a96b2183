//! [`HostContext`]: the engine's analysis of the host-context records (`thread`, `qp`, `tcp`,
//! `port`; docs/contracts.md "Host context records") that the agent's host stream carries.
//!
//! It keeps, per rank process (`job`, `host`, `pid`): each thread's latest interval and current
//! state, the process' cumulative per-state totals, its queue pairs with their state history,
//! and its TCP connections' retransmits; and per port of a host its counters. The hang
//! snapshot gives each rank its [`HostView`] from it, so a verdict's evidence says whether the
//! source rank's main thread is blocked (and in which system call) or on-CPU, and which QPs
//! errored. Everything is bounded ([`MAX_THREADS`], [`MAX_QPS`], [`MAX_PEERS`]), aligned like
//! the op records (the stream's clock), and round-trips through serde (the checkpoint), so the
//! same records give the same views live and offline.

use std::collections::BTreeMap;

use comminsight_wire::host::thread_state;
use comminsight_wire::record::{Body, HostPort, HostQp, HostTcp, HostThread, NetRecord};
use serde::{Deserialize, Serialize};

use super::gpu::context::GpuContext;
use super::qps::QpComms;
pub use super::qps::{QpPeer, QpView, MAX_QPS, MAX_QP_HISTORY};
pub use super::windows::{CpuTimes, PortErrors, Shares};
use super::windows::{HostSample, HostWindows, SampleKind};
use crate::stream::{Alignment, StreamId};

/// Threads kept per process (the busiest replace the idlest beyond it).
pub const MAX_THREADS: usize = 256;
/// TCP connections kept per process.
pub const MAX_PEERS: usize = 256;
/// Threads shown per rank in a [`HostView`].
pub const VIEW_THREADS: usize = 8;

/// The stream-name prefix of the agent's host streams (`<job>/<host>/host-<agent pid>`):
/// records of such a stream go to this analysis only.
pub const HOST_STREAM_PREFIX: &str = "host-";

/// Whether `id` is one of the agent's host streams rather than a rank process' stream.
pub fn is_host_stream(id: &StreamId) -> bool {
    id.pid.starts_with(HOST_STREAM_PREFIX)
}

/// One thread as the latest `thread` record described it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct ThreadLast {
    comm: String,
    state: u8,
    /// Aligned µs (process clock) when the current state began.
    since_us: u64,
    syscall: String,
    /// The latest interval's times and its end (aligned µs).
    last: CpuTimes,
    last_end_us: u64,
    last_interval_ns: u64,
    total: CpuTimes,
}

/// One TCP connection of a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpView {
    /// `ip:port`.
    pub local: String,
    pub remote: String,
    pub retransmits: u64,
    pub state_changes: u64,
    /// Kernel `TCP_*` state of the last change (0: none seen).
    pub last_state: u8,
    /// Aligned µs of the latest record.
    pub last_us: u64,
}

/// One thread in a [`HostView`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadView {
    pub tid: u32,
    pub comm: String,
    /// `on-cpu`, `runnable`, `blocked`, `blocked-io`, `exited`, `unknown`.
    pub state: String,
    /// Since when it is in that state (job timeline µs).
    pub since_us: u64,
    /// The system call it sleeps in, when blocked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub syscall: String,
    /// Its shares over the latest sampling interval and since it was first seen.
    pub last: Shares,
    pub total: Shares,
}

/// What the host probes say about one rank process (a hang snapshot's `RankView::host`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostView {
    /// The main thread (tid = pid) first, then the busiest.
    pub threads: Vec<ThreadView>,
    /// All threads together since first seen.
    pub total: Shares,
    pub qps: Vec<QpView>,
    pub tcp: Vec<TcpView>,
    /// When the latest host record of the process was taken (job timeline µs).
    pub sampled_us: u64,
}

/// Main-thread intervals kept per process for window queries (an hour at 1 s).
pub const MAX_INTERVALS: usize = 3600;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct ProcHost {
    /// The main thread's intervals and the retransmits, for window queries
    /// ([`MAX_INTERVALS`] of each at most).
    #[serde(flatten)]
    windows: HostWindows,
    #[serde(with = "crate::util::serde_pairs")]
    threads: BTreeMap<u32, ThreadLast>,
    #[serde(with = "crate::util::serde_pairs")]
    qps: BTreeMap<u32, QpView>,
    #[serde(with = "crate::util::serde_pairs")]
    tcp: BTreeMap<(String, String), TcpView>,
    /// The communicator of each QP, from the process' own `net` records.
    #[serde(default)]
    qp_comms: QpComms,
    last_us: u64,
}

/// A rank process' cumulative host values ([`HostContext::proc_totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcTotals {
    pub main: CpuTimes,
    pub retransmits: u64,
}

/// One port's counters, summed over the records seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortView {
    pub device: String,
    pub port: u8,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub errors: u64,
    pub link_downed: u64,
    pub up: bool,
    /// Aligned µs of the latest record.
    pub last_us: u64,
    /// Host time (ns) of the latest record counted: the recorder writes each sample into
    /// every job's host stream on the host, and a port counts it once.
    #[serde(default)]
    pub last_ns: u64,
}

/// Processes are keyed `(job, host, pid)`; ports `(host, device, port)`.
type ProcKey = (String, String, u32);

/// The analysis. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostContext {
    #[serde(with = "crate::util::serde_pairs")]
    procs: BTreeMap<ProcKey, ProcHost>,
    #[serde(with = "crate::util::serde_pairs")]
    ports: BTreeMap<(String, String, u8), PortView>,
    /// Records dropped because a bound was reached.
    dropped: u64,
    /// The GPU records and the rank -> GPU bindings (issue 20).
    #[serde(default)]
    gpu: GpuContext,
}

fn us(align: &Alignment, ns: u64) -> u64 {
    align.apply(ns) / 1000
}

impl HostContext {
    /// Records dropped at a bound.
    pub fn dropped(&self) -> u64 {
        self.dropped + self.gpu.dropped()
    }

    /// The GPU part (bindings, device windows and views).
    pub fn gpu(&self) -> &GpuContext {
        &self.gpu
    }

    /// A `comm_device` record of rank stream `id` (the plugin's): which GPU the process runs on.
    pub fn comm_device(&mut self, id: &StreamId, d: &comminsight_wire::record::CommDevice) {
        self.gpu.comm_device(id, d);
    }

    fn proc_mut(&mut self, id: &StreamId, pid: u32) -> &mut ProcHost {
        self.procs
            .entry((id.job.clone(), id.host.clone(), pid))
            .or_default()
    }

    fn thread(&mut self, id: &StreamId, t: &HostThread, a: &Alignment) -> Option<HostSample> {
        let p = self.proc_mut(id, t.pid);
        let end_us = us(a, t.time_ns);
        p.last_us = p.last_us.max(end_us);
        if !p.threads.contains_key(&t.tid) && p.threads.len() >= MAX_THREADS {
            // Make room by dropping the thread with the least on-CPU time (never the main one).
            let idlest = p
                .threads
                .iter()
                .filter(|(tid, _)| **tid != t.pid)
                .min_by_key(|(_, th)| th.total.on_cpu_ns)
                .map(|(tid, _)| *tid);
            match idlest {
                Some(tid) => {
                    p.threads.remove(&tid);
                }
                None => {
                    self.dropped += 1;
                    return None;
                }
            }
        }
        let sample = (t.tid == t.pid && t.interval_ns > 0).then(|| HostSample {
            at_us: end_us,
            what: SampleKind::Main {
                len_ns: t.interval_ns,
                times: CpuTimes::of(t),
            },
        });
        if let Some(s) = &sample {
            p.windows.push(s, MAX_INTERVALS);
        }
        let th = p.threads.entry(t.tid).or_default();
        th.comm = t.comm.as_str_lossy().into_owned();
        th.state = t.state;
        th.since_us = us(a, t.state_since_ns);
        th.syscall = t.syscall.as_str_lossy().into_owned();
        th.last = CpuTimes::of(t);
        th.last_end_us = end_us;
        th.last_interval_ns = t.interval_ns;
        th.total.add(&CpuTimes::of(t));
        sample
    }

    fn qp(&mut self, id: &StreamId, q: &HostQp, a: &Alignment) {
        let p = self
            .procs
            .entry((id.job.clone(), id.host.clone(), q.pid))
            .or_default();
        let at = us(a, q.time_ns);
        p.last_us = p.last_us.max(at);
        if !super::qps::apply(&mut p.qps, q, at, us(a, q.created_ns)) {
            self.dropped += 1;
        }
    }

    /// A `net` record of rank stream `id` (the plugin's): the QP it names carried its
    /// communicator. Only processes the host streams know are kept.
    pub fn net(&mut self, id: &StreamId, n: &NetRecord) {
        let Ok(pid) = id.pid.parse::<u32>() else {
            return;
        };
        if n.qp_num == 0 {
            return;
        }
        if let Some(p) = self.procs.get_mut(&(id.job.clone(), id.host.clone(), pid)) {
            p.qp_comms.note(n.qp_num, n.comm_hash);
        }
    }

    fn tcp(&mut self, id: &StreamId, t: &HostTcp, a: &Alignment) -> Option<HostSample> {
        let key = (sockaddr(&t.saddr, t.sport), sockaddr(&t.daddr, t.dport));
        let dropped = &mut self.dropped;
        let p = self
            .procs
            .entry((id.job.clone(), id.host.clone(), t.pid))
            .or_default();
        let at = us(a, t.time_ns);
        p.last_us = p.last_us.max(at);
        if !p.tcp.contains_key(&key) && p.tcp.len() >= MAX_PEERS {
            *dropped += 1;
            return None;
        }
        let v = p.tcp.entry(key.clone()).or_insert_with(|| TcpView {
            local: key.0.clone(),
            remote: key.1.clone(),
            ..TcpView::default()
        });
        v.retransmits += u64::from(t.retransmits);
        v.state_changes += u64::from(t.state_changes);
        let sample = (t.retransmits > 0).then(|| HostSample {
            at_us: at,
            what: SampleKind::Retransmits {
                local: key.0.clone(),
                remote: key.1.clone(),
                count: t.retransmits,
            },
        });
        if let Some(s) = &sample {
            p.windows.push(s, MAX_INTERVALS);
        }
        if t.new_state != 0 {
            v.last_state = t.new_state;
        }
        v.last_us = at;
        sample
    }

    fn port(
        &mut self,
        id: &StreamId,
        p: &HostPort,
        a: &Alignment,
        out: &mut Vec<(u32, HostSample)>,
    ) {
        let device = p.device.as_str_lossy().into_owned();
        let v = self
            .ports
            .entry((id.host.clone(), device.clone(), p.port))
            .or_default();
        if p.time_ns > v.last_ns || v.last_ns == 0 {
            v.device = device.clone();
            v.port = p.port;
            v.rx_bytes = v.rx_bytes.saturating_add(p.rx_bytes);
            v.tx_bytes = v.tx_bytes.saturating_add(p.tx_bytes);
            v.errors = v.errors.saturating_add(p.errors);
            v.link_downed = v.link_downed.saturating_add(u64::from(p.link_downed));
            v.up = p.up == 1;
            v.last_us = us(a, p.time_ns);
            v.last_ns = p.time_ns;
        }
        if p.errors == 0 && p.link_downed == 0 {
            return;
        }
        let sample = HostSample {
            at_us: us(a, p.time_ns),
            what: SampleKind::PortErrors {
                device: device.clone(),
                port: p.port,
                errors: p.errors,
                link_downed: p.link_downed,
            },
        };
        for pid in self.port_users(&id.job, &id.host, &device, p.port) {
            if let Some(proc_) = self.procs.get_mut(&(id.job.clone(), id.host.clone(), pid)) {
                proc_.windows.push(&sample, MAX_INTERVALS);
            }
            out.push((pid, sample.clone()));
        }
    }

    /// The rank processes of `job` on `host` whose traffic port `device`/`port` carries (the
    /// port -> rank mapping): those with a queue pair on it; when no process of the job there
    /// has a queue pair (the socket transport), every one of them, unless the port is the
    /// loopback. `[ports] devices` narrows the ports sampled at all.
    fn port_users(&self, job: &str, host: &str, device: &str, port: u8) -> Vec<u32> {
        let lo = (job.to_string(), host.to_string(), 0);
        let hi = (job.to_string(), host.to_string(), u32::MAX);
        let procs: Vec<(u32, &ProcHost)> = self
            .procs
            .range(lo..=hi)
            .map(|((_, _, pid), p)| (*pid, p))
            .collect();
        if procs.iter().all(|(_, p)| p.qps.is_empty()) {
            if device == "lo" {
                return Vec::new();
            }
            return procs.iter().map(|(pid, _)| *pid).collect();
        }
        procs
            .iter()
            .filter(|(_, p)| {
                p.qps
                    .values()
                    .any(|q| q.device == device && (q.port == port || q.port == 0))
            })
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// The ports of `host` seen so far.
    pub fn ports(&self, host: &str) -> Vec<PortView> {
        self.ports
            .iter()
            .filter(|((h, _, _), _)| h == host)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The cumulative values of process `pid` of `job` on `host` for the exporters: its main
    /// thread's times since first seen and its connections' retransmits; `None` when no host
    /// record named it.
    pub fn proc_totals(&self, job: &str, host: &str, pid: u32) -> Option<ProcTotals> {
        let p = self.procs.get(&(job.to_string(), host.to_string(), pid))?;
        Some(ProcTotals {
            main: p.threads.get(&pid).map(|t| t.total).unwrap_or_default(),
            retransmits: p.tcp.values().map(|t| t.retransmits).sum(),
        })
    }

    /// What is known about the process `pid` of `job` on `host`, its times moved by `shift_us`
    /// onto the job timeline; `None` when no host record named it.
    pub fn view(&self, job: &str, host: &str, pid: u32, shift_us: i64) -> Option<HostView> {
        let p = self.procs.get(&(job.to_string(), host.to_string(), pid))?;
        let shift = |t: u64| {
            if t == 0 {
                0
            } else {
                t.saturating_add_signed(shift_us)
            }
        };
        let mut total = CpuTimes::default();
        let mut threads: Vec<(u32, &ThreadLast)> = p.threads.iter().map(|(k, v)| (*k, v)).collect();
        for (_, t) in &threads {
            total.add(&t.total);
        }
        threads.sort_by_key(|(tid, t)| (*tid != pid, std::cmp::Reverse(t.total.on_cpu_ns), *tid));
        let threads = threads
            .into_iter()
            .take(VIEW_THREADS)
            .map(|(tid, t)| ThreadView {
                tid,
                comm: t.comm.clone(),
                state: thread_state::name(t.state).to_string(),
                since_us: shift(t.since_us),
                syscall: t.syscall.clone(),
                last: t.last.shares(),
                total: t.total.shares(),
            })
            .collect();
        let qps = p
            .qps
            .values()
            .map(|q| {
                let mut q = q.clone();
                q.comm = p.qp_comms.name(q.qp_num);
                q.created_us = shift(q.created_us);
                q.modified_us = shift(q.modified_us);
                for h in &mut q.history {
                    h.0 = shift(h.0);
                }
                q
            })
            .collect();
        let tcp = p
            .tcp
            .values()
            .map(|t| TcpView {
                last_us: shift(t.last_us),
                ..t.clone()
            })
            .collect();
        Some(HostView {
            threads,
            total: total.shares(),
            qps,
            tcp,
            sampled_us: shift(p.last_us),
        })
    }

    /// The main thread's times over the intervals ending in `[from_us, to_us]` (process clock
    /// µs), and the time they cover (ns); `None` when there is none.
    pub fn main_thread_window(
        &self,
        job: &str,
        host: &str,
        pid: u32,
        from_us: u64,
        to_us: u64,
    ) -> Option<(CpuTimes, u64)> {
        self.procs
            .get(&(job.to_string(), host.to_string(), pid))?
            .windows
            .main_window(from_us, to_us)
    }

    /// The errors and link-downs of the ports under process `pid`'s traffic in
    /// `[from_us, to_us]` (the clock of [`Self::main_thread_window`]); `None` when the host
    /// streams do not know the process.
    pub fn port_errors_window(
        &self,
        job: &str,
        host: &str,
        pid: u32,
        from_us: u64,
        to_us: u64,
    ) -> Option<Vec<PortErrors>> {
        let p = self.procs.get(&(job.to_string(), host.to_string(), pid))?;
        Some(p.windows.port_errors_window(from_us, to_us))
    }

    /// The TCP retransmits of process `pid` in `[from_us, to_us]` per connection
    /// `(local, remote, count)`, most first (the clock of [`Self::main_thread_window`]); `None`
    /// when the host streams do not know the process.
    pub fn tcp_retransmits_window(
        &self,
        job: &str,
        host: &str,
        pid: u32,
        from_us: u64,
        to_us: u64,
    ) -> Option<Vec<(String, String, u64)>> {
        let p = self.procs.get(&(job.to_string(), host.to_string(), pid))?;
        Some(p.windows.retransmits_window(from_us, to_us))
    }

    /// Forget the processes of `job` on `host` whose pid is in `pids` (their streams are gone).
    pub fn forget_proc(&mut self, job: &str, host: &str, pid: u32) {
        self.procs.remove(&(job.to_string(), host.to_string(), pid));
        self.gpu.forget_proc(job, host, pid);
    }
}

/// `ip:port` of a 16-byte address (v4-mapped shown as IPv4).
fn sockaddr(a: &[u8; 16], port: u16) -> String {
    let v6 = std::net::Ipv6Addr::from(*a);
    match v6.to_ipv4_mapped() {
        Some(v4) => format!("{v4}:{port}"),
        None => format!("[{v6}]:{port}"),
    }
}

impl HostContext {
    /// One record of the host stream `id` (other kinds are ignored), `align` its stream's
    /// mapping right after it; the samples it made for the rank processes' straggler windows
    /// (a main-thread interval, retransmits, port errors), with each process' pid, go to `out`.
    pub fn apply(
        &mut self,
        id: &StreamId,
        body: &Body,
        align: &Alignment,
        out: &mut Vec<(u32, HostSample)>,
    ) {
        match body {
            Body::Thread(t) => out.extend(self.thread(id, t, align).map(|s| (t.pid, s))),
            Body::Qp(q) => self.qp(id, q, align),
            Body::Tcp(t) => out.extend(self.tcp(id, t, align).map(|s| (t.pid, s))),
            Body::Port(p) => self.port(id, p, align, out),
            Body::Gpu(_) | Body::GpuLink(_) | Body::Xid(_) => self.gpu.apply(id, body, align, out),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;

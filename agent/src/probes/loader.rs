//! Loading and attaching the embedded BPF object, tracking rank processes, and reading back what
//! the programs saw. Built only with `cfg(comminsight_bpf)` (the object is embedded).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeScope};
use aya::programs::{TracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use comminsight_ebpf_common::{kind, ProbeCounts, ThreadTimes, Tracked, EVENT_ABI};
use object::{Object, ObjectSection, ObjectSymbol};

use super::events::{
    decode, ProbeEvent, QpTable, TcpPeerStats, TcpPeerTable, TcpRecord, VerbsCall, VERBS_FUNCTIONS,
};
use super::sockets::SocketOwners;
use super::threads::{monotonic_ns, proc_state, sample, ThreadSample};
use super::{symbols, tracefs, ProbeCount, ProbeError, ProbeStatus, ProbesConfig};

/// The BPF object built by `cargo xtask build-ebpf` (agent/build.rs passes its path).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("COMMINSIGHT_BPF_OBJECT"));

/// Scheduler tracepoints: (program, category, event).
const SCHED_POINTS: [(&str, &str, &str); 5] = [
    ("sched_switch", "sched", "sched_switch"),
    ("sched_wakeup", "sched", "sched_wakeup"),
    ("sched_wakeup_new", "sched", "sched_wakeup_new"),
    ("sched_process_fork", "sched", "sched_process_fork"),
    ("sched_process_exit", "sched", "sched_process_exit"),
];
/// TCP tracepoints.
const TCP_POINTS: [(&str, &str, &str); 2] = [
    ("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb"),
    ("inet_sock_set_state", "sock", "inet_sock_set_state"),
];
/// Globals of the object that hold tracepoint field offsets: (global, category, event, field).
const OFFSETS: [(&str, &str, &str, &str); 6] = [
    ("SWITCH_PREV_PID", "sched", "sched_switch", "prev_pid"),
    ("SWITCH_PREV_STATE", "sched", "sched_switch", "prev_state"),
    ("SWITCH_NEXT_PID", "sched", "sched_switch", "next_pid"),
    ("WAKEUP_PID", "sched", "sched_wakeup", "pid"),
    ("FORK_CHILD_PID", "sched", "sched_process_fork", "child_pid"),
    ("EXIT_PID", "sched", "sched_process_exit", "pid"),
];

/// TCP events waiting for a socket-table read before a forced one.
const MAX_PENDING_TCP: usize = 65_536;

/// A TCP event not yet attributed: the record, its canonical (local, remote), and the socket
/// table's generation when it arrived.
type PendingTcp = (TcpRecord, (SocketAddr, SocketAddr), u64);

/// The loaded probes.
pub struct HostProbes {
    bpf: Ebpf,
    ring: RingBuf<MapData>,
    statuses: Vec<ProbeStatus>,
    pids: Vec<u32>,
    qps: QpTable,
    /// Owner of each TCP connection of the tracked processes (the events' pid is whatever task
    /// was current, often softirq).
    owners: SocketOwners,
    peers: TcpPeerTable,
    pending_tcp: VecDeque<PendingTcp>,
    /// TCP events of sockets no tracked process owns (dropped).
    tcp_unowned: u64,
    /// Ring records that did not decode.
    pub undecodable: u64,
}

fn status(name: impl Into<String>, r: Result<String, String>) -> ProbeStatus {
    let (ok, detail) = match r {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    ProbeStatus {
        name: name.into(),
        ok,
        detail,
    }
}

/// The `ABI_VERSION` global of a BPF object.
pub fn object_abi(data: &[u8]) -> Option<u32> {
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(data).ok()?;
    let sym = file.symbols().find(|s| s.name() == Ok("ABI_VERSION"))?;
    let sec = file.section_by_index(sym.section_index()?).ok()?;
    let bytes = sec.data().ok()?;
    let at = (sym.address() - sec.address()) as usize;
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

impl HostProbes {
    /// Load the object and attach what `cfg` asks for. Fails only when nothing can be loaded;
    /// a probe that cannot attach is a failed [`ProbeStatus`].
    pub fn start(cfg: &ProbesConfig, attach_by_name: bool) -> Result<Self, ProbeError> {
        match object_abi(OBJECT) {
            Some(EVENT_ABI) => {}
            other => {
                return Err(ProbeError::Abi {
                    object: other.unwrap_or(0),
                    agent: EVENT_ABI,
                })
            }
        }
        raise_memlock();
        let mut statuses = Vec::new();
        let tracefs_root = if cfg.sched || cfg.tcp {
            let r = tracefs::ensure_mounted(cfg.mount_tracefs);
            statuses.push(status(
                "tracefs",
                r.clone().map(|p| p.display().to_string()),
            ));
            r.ok()
        } else {
            None
        };
        let mut offsets: Vec<(&'static str, u32)> = Vec::new();
        let mut sched_ok = tracefs_root.is_some();
        if let Some(root) = &tracefs_root {
            for (global, cat, ev, field) in OFFSETS {
                match tracefs::field_offset(root, cat, ev, field) {
                    Some(off) => offsets.push((global, off)),
                    None => {
                        sched_ok = false;
                        statuses.push(status(
                            format!("sched:{ev}"),
                            Err(format!("no field {field} in {}/events/{cat}/{ev}/format; scheduler probes off", root.display())),
                        ));
                    }
                }
            }
        }
        let mut loader = EbpfLoader::new();
        for (name, off) in &offsets {
            loader.override_global(name, off, true);
        }
        let mut bpf = loader
            .load(OBJECT)
            .map_err(|e| ProbeError::Load(e.to_string()))?;
        if cfg.verbs {
            attach_verbs(&mut bpf, cfg, attach_by_name, &mut statuses);
        }
        if let (true, true, Some(_)) = (cfg.sched, sched_ok, &tracefs_root) {
            for (prog, cat, ev) in SCHED_POINTS {
                statuses.push(status(
                    format!("sched:{ev}"),
                    attach_tp(&mut bpf, prog, cat, ev),
                ));
            }
        }
        if let (true, Some(_)) = (cfg.tcp, &tracefs_root) {
            for (prog, cat, ev) in TCP_POINTS {
                statuses.push(status(
                    format!("tcp:{ev}"),
                    attach_tp(&mut bpf, prog, cat, ev),
                ));
            }
        }
        let ring = bpf.take_map("EVENTS").ok_or(ProbeError::Map {
            map: "EVENTS",
            reason: "missing from the object".into(),
        })?;
        let ring = RingBuf::try_from(ring).map_err(|e| ProbeError::Map {
            map: "EVENTS",
            reason: e.to_string(),
        })?;
        Ok(HostProbes {
            bpf,
            ring,
            statuses,
            pids: Vec::new(),
            qps: QpTable::default(),
            owners: SocketOwners::default(),
            peers: TcpPeerTable::default(),
            pending_tcp: VecDeque::new(),
            tcp_unowned: 0,
            undecodable: 0,
        })
    }

    /// What attached and what did not.
    pub fn statuses(&self) -> &[ProbeStatus] {
        &self.statuses
    }

    /// Report process `pid` from now on: its ibverbs calls, its threads' scheduling and its TCP
    /// sockets. Threads that exist already start in the state `/proc` shows.
    pub fn track(&mut self, pid: u32) -> Result<(), ProbeError> {
        let kinds = (1 << kind::VERBS) | (1 << kind::SCHED) | (1 << kind::TCP);
        let now = monotonic_ns();
        let tasks =
            std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| ProbeError::Process {
                pid,
                reason: format!("cannot list /proc/{pid}/task: {e}"),
            })?;
        let mut threads: BpfHashMap<_, u32, ThreadTimes> = map(&mut self.bpf, "THREADS")?;
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let v = ThreadTimes {
                pid,
                state: proc_state(pid, tid),
                since_ns: now,
                ..ThreadTimes::default()
            };
            threads
                .insert(tid, v, 0)
                .map_err(|e| map_err("THREADS", e))?;
        }
        let mut pids: BpfHashMap<_, u32, Tracked> = map(&mut self.bpf, "PIDS")?;
        pids.insert(pid, Tracked { kinds, _pad: 0 }, 0)
            .map_err(|e| map_err("PIDS", e))?;
        if !self.pids.contains(&pid) {
            self.pids.push(pid);
        }
        self.owners.track(pid);
        self.owners.refresh();
        // Listeners opened before the process was tracked: their passive opens run in softirq
        // context, and the kernel finds them by port (`LISTEN_PORTS`).
        if let Ok(mut listen) = map::<u32>(&mut self.bpf, "LISTEN_PORTS") {
            for port in self.owners.listening_ports(pid) {
                let _ = listen.insert(u32::from(port), pid, 0);
            }
        }
        Ok(())
    }

    /// Drop `pid`'s entries from the kernel's TCP socket and listener maps (an object without
    /// them has nothing to drop).
    fn forget_tcp_owner(&mut self, pid: u32) {
        remove_owned::<u32>(&mut self.bpf, "LISTEN_PORTS", pid);
        remove_owned::<u64>(&mut self.bpf, "TCP_SOCKS", pid);
    }

    /// Stop reporting `pid` and drop its threads' totals and QPs.
    pub fn untrack(&mut self, pid: u32) -> Result<(), ProbeError> {
        let mut pids: BpfHashMap<_, u32, Tracked> = map(&mut self.bpf, "PIDS")?;
        let _ = pids.remove(&pid);
        let mut threads: BpfHashMap<_, u32, ThreadTimes> = map(&mut self.bpf, "THREADS")?;
        let gone: Vec<u32> = threads
            .iter()
            .flatten()
            .filter(|(_, t)| t.pid == pid)
            .map(|(k, _)| k)
            .collect();
        for tid in gone {
            let _ = threads.remove(&tid);
        }
        self.pids.retain(|p| *p != pid);
        self.forget_tcp_owner(pid);
        self.qps.forget(pid);
        self.owners.untrack(pid);
        self.peers.forget(pid);
        Ok(())
    }

    /// Drain the ring buffer: the ibverbs calls (applied to the QP map) and the TCP records of
    /// the tracked processes' sockets, with the owner's pid (`tid` 0 when the event ran in
    /// another task). A record whose socket is not known yet waits for the next socket-table
    /// read (at most [`super::sockets::REFRESH_INTERVAL`]); one still unknown after it is
    /// dropped and counted ([`Self::tcp_unowned`]).
    pub fn poll(&mut self) -> (Vec<VerbsCall>, Vec<TcpRecord>) {
        let mut verbs = Vec::new();
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(ProbeEvent::Verbs(c)) => verbs.push(c),
                Some(ProbeEvent::Tcp(t)) => match t.endpoints() {
                    Some(eps) => {
                        let g = self.owners.generation();
                        self.pending_tcp.push_back((t, eps, g));
                    }
                    None => self.tcp_unowned += 1,
                },
                None => self.undecodable += 1,
            }
        }
        for c in &verbs {
            self.qps.apply(c);
        }
        let tcp = self.attribute_tcp(false);
        (verbs, tcp)
    }

    /// Attribute every waiting TCP record now (reading the socket tables once more): for the
    /// end of a session.
    pub fn flush_tcp(&mut self) -> Vec<TcpRecord> {
        self.attribute_tcp(true)
    }

    /// Give the waiting TCP records their owner, in arrival order; a miss waits for a
    /// socket-table read that came after it (`force`: read now).
    fn attribute_tcp(&mut self, force: bool) -> Vec<TcpRecord> {
        let missing = self
            .pending_tcp
            .iter()
            .any(|(_, (l, r), _)| self.owners.lookup(*l, *r).is_none());
        if missing
            && (force || self.owners.refresh_due() || self.pending_tcp.len() >= MAX_PENDING_TCP)
        {
            self.owners.refresh();
        }
        let generation = self.owners.generation();
        let mut out = Vec::new();
        while let Some((mut r, (l, rem), g)) = self.pending_tcp.pop_front() {
            let owner = self
                .owners
                .lookup(l, rem)
                .map(|o| (o.pid, o.rto_ms, o.snd_cwnd));
            let (pid, rto_ms, cwnd) = match owner {
                Some(o) => o,
                // A connect or listen in progress has no local port yet and runs in its
                // owner's task (the kernel reports only tracked tasks' state changes).
                None if r.what == "state" && l.port() == 0 && self.pids.contains(&r.pid) => {
                    (r.pid, None, None)
                }
                None if generation > g => {
                    self.tcp_unowned += 1;
                    continue;
                }
                None => {
                    self.pending_tcp.push_front((r, (l, rem), g));
                    break;
                }
            };
            if r.pid != pid {
                r.pid = pid;
                r.tid = 0;
            }
            self.peers.apply(&r, pid, (l, rem), (rto_ms, cwnd));
            out.push(r);
        }
        out
    }

    /// Per tracked process and connection: retransmits, state changes, last state.
    pub fn tcp_peers(&self) -> Vec<TcpPeerStats> {
        self.peers.all()
    }

    /// TCP events dropped because no tracked process owns their socket.
    pub fn tcp_unowned(&self) -> u64 {
        self.tcp_unowned
    }

    /// The QP map.
    pub fn qps(&self) -> &QpTable {
        &self.qps
    }

    /// A sample of every tracked thread now.
    pub fn threads(&self) -> Vec<ThreadSample> {
        let Ok(threads) = self
            .bpf
            .map("THREADS")
            .ok_or(())
            .and_then(|m| BpfHashMap::<_, u32, ThreadTimes>::try_from(m).map_err(|_| ()))
        else {
            return Vec::new();
        };
        let now = monotonic_ns();
        let mut out: Vec<ThreadSample> = threads
            .iter()
            .flatten()
            .map(|(tid, t)| sample(tid, &t, now))
            .collect();
        out.sort_by_key(|s| (s.pid, s.tid));
        out
    }

    /// Hits and lost records per probe.
    pub fn counts(&self) -> Vec<ProbeCount> {
        let Some(Ok(arr)) = self
            .bpf
            .map("COUNTS")
            .map(PerCpuArray::<_, ProbeCounts>::try_from)
        else {
            return Vec::new();
        };
        let mut names: Vec<(u32, &str)> = VERBS_FUNCTIONS.to_vec();
        names.push((0, "sched"));
        names.push((31, "tcp"));
        names
            .into_iter()
            .filter_map(|(i, n)| {
                let per_cpu = arr.get(&i, 0).ok()?;
                let (hits, lost) = per_cpu
                    .iter()
                    .fold((0, 0), |(h, l), c| (h + c.hits, l + c.lost));
                Some(ProbeCount {
                    name: n.to_string(),
                    hits,
                    lost,
                })
            })
            .collect()
    }

    /// Processes tracked now.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }
}

/// Remove the entries of map `name` (keys `K`, values an owner pid) whose owner is `pid`.
fn remove_owned<K: aya::Pod>(bpf: &mut Ebpf, name: &str, pid: u32) {
    let Some(m) = bpf.map_mut(name) else {
        return;
    };
    let Ok(mut owners) = BpfHashMap::<_, K, u32>::try_from(m) else {
        return;
    };
    let gone: Vec<K> = owners
        .iter()
        .flatten()
        .filter(|(_, o)| *o == pid)
        .map(|(k, _)| k)
        .collect();
    for k in gone {
        let _ = owners.remove(&k);
    }
}

fn map<'a, V: aya::Pod>(
    bpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<BpfHashMap<&'a mut MapData, u32, V>, ProbeError> {
    let m = bpf.map_mut(name).ok_or(ProbeError::Map {
        map: name,
        reason: "missing from the object".into(),
    })?;
    BpfHashMap::try_from(m).map_err(|e| map_err(name, e))
}

fn map_err(map: &'static str, e: aya::maps::MapError) -> ProbeError {
    ProbeError::Map {
        map,
        reason: e.to_string(),
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK: lift it (best effort).
fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads one valid rlimit struct.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

fn attach_tp(bpf: &mut Ebpf, prog: &str, cat: &str, ev: &str) -> Result<String, String> {
    let p: &mut TracePoint = bpf
        .program_mut(prog)
        .ok_or_else(|| {
            format!("program {prog} missing from the BPF object; rebuild with `cargo xtask build`")
        })?
        .try_into()
        .map_err(|e| format!("{prog}: {e}"))?;
    p.load().map_err(|e| format!("loading {prog}: {e}"))?;
    p.attach(cat, ev)
        .map_err(|e| format!("attaching {prog} to {cat}:{ev}: {e}"))?;
    Ok(format!("{cat}:{ev}"))
}

fn attach_verbs(
    bpf: &mut Ebpf,
    cfg: &ProbesConfig,
    by_name: bool,
    statuses: &mut Vec<ProbeStatus>,
) {
    let path = match Some(cfg.libibverbs.clone())
        .filter(|p| !p.as_os_str().is_empty())
        .or_else(|| symbols::find_library("libibverbs.so.1"))
    {
        Some(p) => p,
        None => {
            statuses.push(status(
                "verbs",
                Err(
                    "libibverbs.so.1 not found; install libibverbs1 or set [probes] libibverbs"
                        .into(),
                ),
            ));
            return;
        }
    };
    let funcs = match symbols::dynamic_functions(&path) {
        Ok(f) => f,
        Err(e) => {
            statuses.push(status("verbs", Err(e.to_string())));
            return;
        }
    };
    for (_, name) in VERBS_FUNCTIONS {
        let r = attach_one(bpf, &path, &funcs, name, by_name);
        statuses.push(status(format!("verbs:{name}"), r));
    }
}

fn attach_one(
    bpf: &mut Ebpf,
    path: &Path,
    funcs: &[symbols::DynFunction],
    name: &str,
    by_name: bool,
) -> Result<String, String> {
    let (offset, what) = if by_name {
        (None, format!("{}:{name} (by plain name)", path.display()))
    } else {
        let f = symbols::resolve(path, funcs, name).map_err(|e| e.to_string())?;
        (
            Some(f.file_offset),
            format!(
                "{}+{:#x} ({})",
                path.display(),
                f.file_offset,
                f.versioned_name()
            ),
        )
    };
    for suffix in ["enter", "leave"] {
        let prog = format!("{name}_{suffix}");
        let p: &mut UProbe = bpf
            .program_mut(&prog)
            .ok_or_else(|| format!("program {prog} missing from the BPF object"))?
            .try_into()
            .map_err(|e| format!("{prog}: {e}"))?;
        p.load().map_err(|e| format!("loading {prog}: {e}"))?;
        let loc = match offset {
            Some(off) => UProbeAttachLocation::AbsoluteOffset(off),
            None => UProbeAttachLocation::Symbol(name),
        };
        p.attach(loc, path, UProbeScope::AllProcesses)
            .map_err(|e| format!("attaching {prog} at {what}: {e}"))?;
    }
    Ok(what)
}

//! The host context in a trace (issue 19), from the job's host streams: per drawn rank a
//! "main thread CPU" track (one slice per sampling interval, named by the state it spent most
//! of the interval in, with the on-CPU / runnable / blocked shares as arguments), a "TCP
//! retransmits" counter and a "QPs" track of instants (create, each state change, ERR,
//! destroy); per host a counter track per port (rx / tx GB/s, errors); per drawn rank the
//! counters of the GPU it is bound to ([`gpu`], issue 20).

mod gpu;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;

use comminsight_wire::host::{qp_event, qp_state};
use comminsight_wire::record::{Body, HostPort, HostQp, HostTcp, HostThread};

use super::draw::{host_uuid, rank_uuid, HostDrawn};
use super::writer::{ArgValue, TraceWriter};
use crate::clock::ProcessClock;
use crate::host::context::is_host_stream;
use crate::offline::Input;

const CPU_UUID: u64 = 5 << 48;
const TCP_UUID: u64 = 6 << 48;
const QP_UUID: u64 = 7 << 48;
const PORT_UUID: u64 = 8 << 48;

/// A drawn rank: its host's index, pid and rank.
pub(super) struct DrawnRank {
    pub host: usize,
    pub pid: u32,
    pub rank: i64,
}

fn pct(v: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        (v as f64 * 1000.0 / of as f64).round() / 10.0
    }
}

/// Draw the host context of `job` in `[w0_us, w1_us]` for `ranks` (hosts by name in `hosts`).
pub(super) fn draw_host<W: Write>(
    w: &mut TraceWriter<W>,
    input: &Input,
    job: &str,
    hosts: &[String],
    ranks: &[DrawnRank],
    (w0_us, w1_us): (u64, u64),
) -> std::io::Result<HostDrawn> {
    let mut d = Drawer {
        w,
        by_pid: ranks.iter().map(|r| ((r.host, r.pid), r.rank)).collect(),
        gpu_ranks: gpu::bindings(input, job, hosts, ranks),
        tracks: Default::default(),
        ports: BTreeMap::new(),
        drawn: HostDrawn::default(),
    };
    let streams: Vec<_> = input
        .streams()
        .filter(|id| id.job == job && is_host_stream(id))
        .cloned()
        .collect();
    for id in streams {
        let Some(hi) = hosts.iter().position(|h| *h == id.host) else {
            continue;
        };
        let files = input.segment_files(&id);
        let (Some(first), Some(last)) = (files.first(), files.last()) else {
            continue;
        };
        let mut items: Vec<(u64, Body)> = Vec::new();
        input.read_segments(
            &id,
            first.0,
            last.0,
            ProcessClock::default(),
            &mut |_, r| {
                let t_ns = match &r.rec.body {
                    Body::Thread(t) => t.time_ns,
                    Body::Tcp(t) => t.time_ns,
                    Body::Qp(q) => q.time_ns,
                    Body::Port(p) => p.time_ns,
                    Body::Gpu(g) => g.time_ns,
                    Body::GpuLink(l) => l.time_ns,
                    Body::Xid(x) => x.time_ns,
                    _ => return,
                };
                let at = r.align.apply(t_ns) / 1000;
                if (w0_us..=w1_us).contains(&at) {
                    items.push((at, r.rec.body.clone()));
                }
            },
        );
        items.sort_by_key(|(t, _)| *t);
        for (at, body) in items {
            match body {
                Body::Thread(t) if t.tid == t.pid && t.interval_ns > 0 => d.thread(hi, at, &t)?,
                Body::Tcp(t) => d.tcp(hi, at, &t)?,
                Body::Qp(q) => d.qp(hi, at, &q)?,
                Body::Port(p) if p.interval_ns > 0 => d.port(hi, at, &p)?,
                Body::Gpu(g) if g.interval_ns > 0 => d.gpu(hi, at, &g)?,
                Body::GpuLink(l) if l.interval_ns > 0 => d.link(hi, at, &l)?,
                Body::Xid(x) => d.xid(hi, at, &x)?,
                _ => {}
            }
        }
    }
    Ok(d.drawn)
}

struct Drawer<'a, W: Write> {
    w: &'a mut TraceWriter<W>,
    /// `(host index, pid)` -> rank of the drawn ranks.
    by_pid: HashMap<(usize, u32), i64>,
    /// `(host index, PCI address)` -> the drawn ranks bound to that GPU.
    gpu_ranks: HashMap<(usize, u64), Vec<i64>>,
    /// Tracks described so far.
    tracks: BTreeSet<u64>,
    /// The first of the three counter tracks of each port.
    ports: BTreeMap<(usize, String, u8), u64>,
    drawn: HostDrawn,
}

impl<W: Write> Drawer<'_, W> {
    /// The rank's child track `base + rank`, described on first use.
    fn rank_track(
        &mut self,
        base: u64,
        rank: i64,
        what: &str,
        counter: Option<&str>,
    ) -> std::io::Result<u64> {
        let track = base + rank_uuid(rank);
        if self.tracks.insert(track) {
            let name = format!("rank {rank} · {what}");
            match counter {
                Some(unit) => self.w.counter_track(track, rank_uuid(rank), &name, unit)?,
                None => self.w.child_track(track, rank_uuid(rank), &name)?,
            }
        }
        Ok(track)
    }

    /// A main-thread interval: one slice named by its largest state.
    fn thread(&mut self, hi: usize, at: u64, t: &HostThread) -> std::io::Result<()> {
        let Some(&rank) = self.by_pid.get(&(hi, t.pid)) else {
            return Ok(());
        };
        let track = self.rank_track(CPU_UUID, rank, "main thread CPU", None)?;
        let parts = [
            ("on-cpu", t.on_cpu_ns),
            ("runnable", t.runnable_ns),
            ("blocked", t.blocked_ns),
        ];
        let top = parts.iter().max_by_key(|p| p.1).map_or("idle", |p| p.0);
        let sum = t.on_cpu_ns + t.runnable_ns + t.blocked_ns;
        let syscall = t.syscall.as_str_lossy().into_owned();
        let mut args = vec![
            ("on_cpu_pct", ArgValue::Double(pct(t.on_cpu_ns, sum))),
            ("runnable_pct", ArgValue::Double(pct(t.runnable_ns, sum))),
            ("blocked_pct", ArgValue::Double(pct(t.blocked_ns, sum))),
            (
                "involuntary_switches",
                ArgValue::Uint(u64::from(t.involuntary_switches)),
            ),
        ];
        if !syscall.is_empty() {
            args.push(("syscall", ArgValue::Str(syscall)));
        }
        let start_ns = (at * 1000).saturating_sub(t.interval_ns);
        self.w.begin(track, start_ns, top, true, &args, &[])?;
        self.w.end(track, at * 1000)?;
        self.drawn.cpu_slices += 1;
        Ok(())
    }

    /// A connection's retransmits in the interval, on the rank's counter.
    fn tcp(&mut self, hi: usize, at: u64, t: &HostTcp) -> std::io::Result<()> {
        let Some(&rank) = self.by_pid.get(&(hi, t.pid)) else {
            return Ok(());
        };
        let track = self.rank_track(TCP_UUID, rank, "TCP retransmits", Some("retransmits"))?;
        self.w.counter(track, at * 1000, f64::from(t.retransmits))?;
        self.drawn.tcp_values += 1;
        Ok(())
    }

    /// A QP event as an instant.
    fn qp(&mut self, hi: usize, at: u64, q: &HostQp) -> std::io::Result<()> {
        let Some(&rank) = self.by_pid.get(&(hi, q.pid)) else {
            return Ok(());
        };
        let track = self.rank_track(QP_UUID, rank, "QPs", None)?;
        let name = match q.event {
            qp_event::CREATE => format!("QP 0x{:x} create", q.qp_num),
            qp_event::DESTROY => format!("QP 0x{:x} destroy", q.qp_num),
            _ => format!(
                "QP 0x{:x} {}→{}",
                q.qp_num,
                qp_state::name(q.old_state),
                qp_state::name(q.new_state)
            ),
        };
        let args = [
            (
                "device",
                ArgValue::Str(q.device.as_str_lossy().into_owned()),
            ),
            ("dest_qp_num", ArgValue::Uint(u64::from(q.dest_qp_num))),
            ("event", ArgValue::Str(qp_event::name(q.event).into())),
        ];
        self.w.instant(track, at * 1000, &name, &args)?;
        self.drawn.qp_events += 1;
        Ok(())
    }

    /// A port's interval: rx / tx GB/s and errors on its host's counters.
    fn port(&mut self, hi: usize, at: u64, p: &HostPort) -> std::io::Result<()> {
        let dev = p.device.as_str_lossy().into_owned();
        let next = PORT_UUID + ((hi as u64) << 32) + (self.ports.len() as u64) * 4;
        let base = *self.ports.entry((hi, dev.clone(), p.port)).or_insert(next);
        if base == next {
            let label = if p.port == 0 {
                dev
            } else {
                format!("{dev}:{}", p.port)
            };
            let host = host_uuid(hi);
            self.w
                .counter_track(base, host, &format!("{label} rx"), "GB/s")?;
            self.w
                .counter_track(base + 1, host, &format!("{label} tx"), "GB/s")?;
            self.w
                .counter_track(base + 2, host, &format!("{label} errors"), "errors")?;
        }
        let secs = p.interval_ns as f64 / 1e9;
        let ts = at * 1000;
        self.w.counter(base, ts, p.rx_bytes as f64 / secs / 1e9)?;
        self.w
            .counter(base + 1, ts, p.tx_bytes as f64 / secs / 1e9)?;
        self.w.counter(base + 2, ts, p.errors as f64)?;
        self.drawn.port_values += 3;
        Ok(())
    }
}

//! The drain thread (one std thread, no async runtime): ring → segment files, overdue scan,
//! control file, periodic `stats`, segment preamble and Inspector-compatible output.
//! [`Drain::tick`] does one pass and takes the time as arguments, so tests drive it directly.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use comminsight_wire::record::{Body, Kind, Overdue, RawRecord, Record, Stats};
use comminsight_wire::ring::ShmRing;
use comminsight_wire::segment::{SegmentWriter, WriterStats};

use crate::abi::LOG_WARN;
use crate::control::Control;
use crate::core::Shared;
use crate::inspector::{CommHeader, InspectorWriter};
use crate::op;
use crate::pace::Pacer;

/// Records moved per ring pop.
const BATCH: usize = 4096;
/// Control file check period.
const CTL_PERIOD_NS: u64 = 1_000_000_000;
/// `stats` record period.
const STATS_PERIOD_NS: u64 = 10_000_000_000;
/// Longest interval between two overdue reports of one op.
pub const OVERDUE_CAP_NS: u64 = 600_000_000_000;

/// Where records go (a [`SegmentWriter`] in production, a vector in tests).
pub trait SegmentSink: Send {
    fn set_preamble(&mut self, recs: Vec<RawRecord>);
    fn write(&mut self, recs: &[RawRecord]);
    fn flush(&mut self);
    fn maybe_rotate(&mut self, now: Instant);
    fn seal(&mut self);
    fn stats(&self) -> WriterStats;
    /// Why the sink stopped writing, once it has (one line naming the path and the fix).
    fn failure(&self) -> Option<String> {
        None
    }
}

impl SegmentSink for SegmentWriter {
    fn set_preamble(&mut self, recs: Vec<RawRecord>) {
        SegmentWriter::set_preamble(self, recs);
    }
    fn write(&mut self, recs: &[RawRecord]) {
        SegmentWriter::write(self, recs);
    }
    fn flush(&mut self) {
        SegmentWriter::flush(self);
    }
    fn maybe_rotate(&mut self, now: Instant) {
        SegmentWriter::maybe_rotate(self, now);
    }
    fn seal(&mut self) {
        SegmentWriter::seal(self);
    }
    fn stats(&self) -> WriterStats {
        SegmentWriter::stats(self)
    }
    fn failure(&self) -> Option<String> {
        SegmentWriter::failure(self).map(str::to_string)
    }
}

/// Age at which report `repeat + 1` of an overdue op is due, given report `repeat` was due at
/// `age_ns`: the interval doubles (threshold × 2^repeat) up to `cap_ns`.
pub fn next_overdue_age(age_ns: u64, repeat: u32, threshold_ns: u64, cap_ns: u64) -> u64 {
    let interval = if repeat >= 63 {
        cap_ns
    } else {
        threshold_ns.saturating_mul(1u64 << repeat).min(cap_ns)
    };
    age_ns.saturating_add(interval.max(1))
}

#[derive(Clone, Copy, Debug)]
struct OverdueState {
    repeat: u32,
    due_age_ns: u64,
    seen: bool,
}

/// The drain state.
pub struct Drain {
    sh: &'static Shared,
    ring: Arc<ShmRing>,
    sink: Box<dyn SegmentSink>,
    inspector: Option<InspectorWriter>,
    buf: Vec<RawRecord>,
    overdue: HashMap<(u32, u32), OverdueState>,
    proc_start: Option<RawRecord>,
    comms: HashMap<(u64, i32), (RawRecord, CommHeader)>,
    /// The `comm_device` record of each live communicator (repeated in the preamble with it).
    devices: HashMap<(u64, i32), RawRecord>,
    preamble_dirty: bool,
    ctl: Option<Control>,
    next_ctl_ns: u64,
    /// The writer's failure was logged.
    writer_warned: bool,
    next_stats_ns: u64,
    wrote: bool,
    /// Inspector compat: coll_local_sn -> longest per-channel GPU time.
    channel_times: HashMap<u64, u64>,
}

impl Drain {
    pub fn new(
        sh: &'static Shared,
        ring: Arc<ShmRing>,
        sink: Box<dyn SegmentSink>,
        ctl_path: Option<PathBuf>,
    ) -> Drain {
        let inspector = sh.cfg.inspector_compat.then(|| {
            let mut w = InspectorWriter::new(&sh.cfg.inspector_dir, &sh.cfg.host, sh.pid);
            w.min_size = sh.cfg.inspector_min_size;
            w.p2p = sh.cfg.inspector_p2p;
            w.require_kernel = sh.cfg.inspector_require_kernel;
            w
        });
        Drain {
            sh,
            ring,
            sink,
            inspector,
            buf: Vec::with_capacity(BATCH),
            overdue: HashMap::new(),
            proc_start: None,
            comms: HashMap::new(),
            devices: HashMap::new(),
            preamble_dirty: false,
            ctl: ctl_path.map(Control::new),
            next_ctl_ns: 0,
            writer_warned: false,
            next_stats_ns: 0,
            wrote: false,
            channel_times: HashMap::new(),
        }
    }

    /// One full pass at plugin time `now_ns`; returns the records moved.
    pub fn tick(&mut self, now_ns: u64, now: Instant) -> u64 {
        self.scan_overdue(now_ns);
        if now_ns >= self.next_ctl_ns {
            self.next_ctl_ns = now_ns + CTL_PERIOD_NS;
            self.check_control();
        }
        if self.next_stats_ns == 0 {
            self.next_stats_ns = now_ns + STATS_PERIOD_NS;
        } else if now_ns >= self.next_stats_ns {
            self.next_stats_ns = now_ns + STATS_PERIOD_NS;
            let raw = self.stats_record(now_ns);
            self.sh.push_raw(&raw);
        }
        let moved = self.move_records();
        self.sink.maybe_rotate(now);
        self.flush();
        self.warn_writer_failure();
        moved
    }

    /// A pass that only moves records (between two full passes while records flow).
    pub fn move_pass(&mut self) -> u64 {
        let moved = self.move_records();
        self.flush();
        moved
    }

    fn flush(&mut self) {
        if self.wrote {
            self.sink.flush();
            self.wrote = false;
        }
    }

    /// Final pass: everything left in the ring, a last `stats`, seal.
    pub fn finish(&mut self, now_ns: u64) {
        self.move_records();
        let raw = self.stats_record(now_ns);
        // The ring may already be detached from producers: write the last stats directly too if
        // the push failed.
        if self.ring.push(&raw) {
            self.move_records();
        } else {
            self.sink.write(&[raw]);
        }
        self.sink.seal();
    }

    /// Collect the per-channel times completions queued (before the records they belong to).
    fn take_channel_times(&mut self) {
        let Some(q) = &self.sh.channel_times else {
            return;
        };
        if self.channel_times.len() > 1 << 16 {
            self.channel_times.clear(); // records lost elsewhere: forget their times
        }
        let mut v = Vec::new();
        q.pop_into(&mut v, usize::MAX);
        for r in v {
            let sn = u64::from_le_bytes(r.0[16..24].try_into().unwrap_or_default());
            let ns = u64::from_le_bytes(r.0[24..32].try_into().unwrap_or_default());
            self.channel_times.insert(sn, ns);
        }
    }

    /// Move everything the ring holds to the sink; returns the number of records.
    fn move_records(&mut self) -> u64 {
        let mut total = 0;
        loop {
            self.take_channel_times();
            self.buf.clear();
            let n = self.ring.pop_into(&mut self.buf, BATCH);
            if n == 0 {
                break;
            }
            total += n as u64;
            let mut lines = String::new();
            let batch = std::mem::take(&mut self.buf);
            for raw in &batch {
                self.observe(raw, &mut lines);
            }
            self.buf = batch;
            if self.preamble_dirty {
                self.preamble_dirty = false;
                let mut pre: Vec<RawRecord> = self.proc_start.iter().copied().collect();
                let mut comms: Vec<_> = self.comms.values().map(|(r, _)| *r).collect();
                comms.extend(self.devices.values().copied());
                comms.sort_by_key(|r| r.seq());
                pre.extend(comms);
                self.sink.set_preamble(pre);
            }
            self.sink.write(&self.buf);
            self.wrote = true;
            if let Some(w) = &mut self.inspector {
                if !lines.is_empty() && !w.write_lines(&lines) {
                    self.sh
                        .counters
                        .inspector_errors
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            if n < BATCH {
                break;
            }
        }
        total
    }

    /// Track preamble records and produce Inspector lines.
    fn observe(&mut self, raw: &RawRecord, lines: &mut String) {
        let kind = Kind::from_u8(raw.kind_byte());
        match kind {
            Some(Kind::ProcStart) => {
                self.proc_start = Some(*raw);
                self.preamble_dirty = true;
            }
            Some(Kind::CommDevice) => {
                let Ok(rec) = Record::decode(raw) else { return };
                if let Body::CommDevice(d) = rec.body {
                    self.devices.insert((d.comm_hash, d.rank), *raw);
                    self.preamble_dirty = true;
                }
            }
            Some(Kind::CommInit) | Some(Kind::CommFini) => {
                let Ok(rec) = Record::decode(raw) else { return };
                match rec.body {
                    Body::CommInit(c) => {
                        let h = CommHeader {
                            comm_hash: c.comm_hash,
                            name: c.comm_name.as_str_lossy().into_owned(),
                            rank: c.rank,
                            nranks: c.nranks,
                            nnodes: c.nnodes,
                        };
                        self.comms.insert((c.comm_hash, c.rank), (*raw, h));
                    }
                    Body::CommFini(c) => {
                        self.comms.remove(&(c.comm_hash, c.rank));
                        self.devices.remove(&(c.comm_hash, c.rank));
                    }
                    _ => {}
                }
                self.preamble_dirty = true;
            }
            Some(Kind::Coll) | Some(Kind::P2p) if self.inspector.is_some() => {
                let Ok(rec) = Record::decode(raw) else { return };
                if rec.flags & comminsight_wire::record::FLAG_INCOMPLETE != 0 {
                    return;
                }
                let (op, p2p) = match rec.body {
                    Body::Coll(o) => (o, false),
                    Body::P2p(o) => (o, true),
                    _ => return,
                };
                let header = self
                    .comms
                    .get(&(op.comm_hash, op.rank))
                    .map(|(_, h)| h.clone())
                    .unwrap_or(CommHeader {
                        comm_hash: op.comm_hash,
                        rank: op.rank,
                        ..Default::default()
                    });
                let now_us = crate::sys::real_ns() / 1000;
                let max_ch = self.channel_times.remove(&op.coll_local_sn);
                if let Some(w) = &self.inspector {
                    if let Some(l) = w.line_for(&header, &op, p2p, now_us, max_ch) {
                        lines.push_str(&l);
                        lines.push('\n');
                    }
                }
            }
            _ => {}
        }
    }

    fn scan_overdue(&mut self, now_ns: u64) {
        let sh = self.sh;
        let threshold_ns = sh.cfg.overdue_ms.saturating_mul(1_000_000);
        for st in self.overdue.values_mut() {
            st.seen = false;
        }
        for idx in 0..sh.ops.high_water() {
            let Some(snap) = op::snapshot(sh, idx) else {
                continue;
            };
            let age = now_ns.saturating_sub(snap.op.enqueue_ns);
            let st = self
                .overdue
                .entry((snap.index, snap.gen))
                .or_insert(OverdueState {
                    repeat: 0,
                    due_age_ns: threshold_ns,
                    seen: true,
                });
            st.seen = true;
            if age < st.due_age_ns {
                continue;
            }
            let o = &snap.op;
            let rec = Overdue {
                comm_hash: o.comm_hash,
                coll_sn: o.coll_sn,
                coll_local_sn: o.coll_local_sn,
                enqueue_ns: o.enqueue_ns,
                start_ns: o.start_ns,
                now_ns,
                count: o.count,
                bytes: o.bytes,
                age_ms: (age / 1_000_000).min(u64::from(u32::MAX)) as u32,
                repeat: st.repeat,
                threshold_ms: sh.cfg.overdue_ms.min(u64::from(u32::MAX)) as u32,
                rank: o.rank,
                peer: o.peer,
                func: o.func,
                phase: if snap.started == 0 {
                    0
                } else if snap.done == 0 {
                    1
                } else {
                    2
                },
                channels_started: snap.started,
                channels_done: snap.done,
                is_p2p: u8::from(snap.is_p2p),
                nchannels: o.nchannels,
            };
            // Next report: skip any that were missed while we were late.
            while st.due_age_ns <= age {
                st.due_age_ns =
                    next_overdue_age(st.due_age_ns, st.repeat, threshold_ns, OVERDUE_CAP_NS);
                st.repeat += 1;
            }
            sh.push_body(Body::Overdue(rec), snap.flags);
            sh.counters.overdue_emitted.fetch_add(1, Ordering::Relaxed);
        }
        self.overdue.retain(|_, st| st.seen);
    }

    fn check_control(&mut self) {
        if let Some(c) = &mut self.ctl {
            c.check(self.sh);
        }
    }

    /// One WARN when the segment writer stops (I/O error, refused directory): why, and the fix.
    fn warn_writer_failure(&mut self) {
        if self.writer_warned || !self.sink.stats().failed {
            return;
        }
        self.writer_warned = true;
        let why = self
            .sink
            .failure()
            .unwrap_or_else(|| "an I/O error stopped the segment writer".into());
        self.sh.log(
            LOG_WARN,
            &format!("CommInsight: {why}; records are counted as lost (stats records_lost_io)"),
        );
    }

    fn stats_record(&self, now_ns: u64) -> RawRecord {
        let sh = self.sh;
        let c = &sh.counters;
        let ws = self.sink.stats();
        let mono = crate::sys::mono_ns();
        let real = crate::sys::real_ns();
        let rel = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let st = Stats {
            time_ns: now_ns,
            mono_ns: mono,
            real_ns: real,
            records_pushed: self.ring.pushed(),
            ring_drops: self.ring.drops() + rel(&c.no_ring_drops),
            pool_drops: rel(&c.pool_drops) + rel(&c.proxy_drops),
            bytes_written: ws.bytes_written,
            records_lost_io: ws.records_lost,
            events_ignored: rel(&c.events_ignored),
            overdue_emitted: rel(&c.overdue_emitted),
            segments_sealed: ws.segments_sealed.min(u64::from(u32::MAX)) as u32,
            segments_deleted: ws.segments_deleted.min(u64::from(u32::MAX)) as u32,
            io_errors: (ws.io_errors + rel(&c.inspector_errors)).min(u64::from(u32::MAX)) as u32,
            event_mask: sh.mask(),
            writer_failed: u8::from(ws.failed),
            ctl_refused: rel(&c.ctl_refused).min(u64::from(u32::MAX)) as u32,
            mask_changes: rel(&c.mask_changes).min(u64::from(u32::MAX)) as u32,
        };
        Record::new(Body::Stats(st)).encode()
    }

    /// Run until `stop` is set (shutdown unparks). A full pass ([`Drain::tick`]: overdue scan,
    /// control file, stats, rotation) once per drain period; in between, passes that only move
    /// records, as often as the [`Pacer`] says: short sleeps while records flow, the period when
    /// idle, never a spin. Each pass also refits the TSC clock (rate-limited inside).
    pub fn run(mut self, stop: Arc<AtomicBool>) {
        let period_ns = self.sh.cfg.drain_period_ms().saturating_mul(1_000_000);
        let mut pacer = Pacer::new(self.ring.capacity(), period_ns);
        let mut next_full = 0;
        let mut last = Instant::now();
        loop {
            self.sh.clock.calibrate();
            let now_ns = self.sh.clock.now();
            let moved = if now_ns >= next_full {
                next_full = now_ns.saturating_add(period_ns);
                self.tick(now_ns, Instant::now())
            } else {
                self.move_pass()
            };
            if stop.load(Ordering::Acquire) {
                break;
            }
            let t = Instant::now();
            let dt = t.duration_since(last).as_nanos() as u64;
            last = t;
            std::thread::park_timeout(Duration::from_nanos(pacer.next(moved, dt)));
            if stop.load(Ordering::Acquire) {
                break;
            }
        }
        self.finish(self.sh.clock.now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::stop_event;
    use crate::testutil::*;
    use std::sync::Mutex;

    /// Keeps what was written, for inspection.
    #[derive(Clone, Default)]
    struct VecSink(Arc<Mutex<Vec<RawRecord>>>, Arc<Mutex<u32>>);

    impl SegmentSink for VecSink {
        fn set_preamble(&mut self, _: Vec<RawRecord>) {}
        fn write(&mut self, recs: &[RawRecord]) {
            self.0.lock().unwrap().extend_from_slice(recs);
        }
        fn flush(&mut self) {}
        fn maybe_rotate(&mut self, _: Instant) {}
        fn seal(&mut self) {
            *self.1.lock().unwrap() += 1;
        }
        fn stats(&self) -> WriterStats {
            WriterStats::default()
        }
    }

    impl VecSink {
        fn take(&self) -> Vec<Record> {
            let v = std::mem::take(&mut *self.0.lock().unwrap());
            v.iter().map(|r| Record::decode(r).unwrap()).collect()
        }
    }

    fn overdues(recs: &[Record]) -> Vec<Overdue> {
        recs.iter()
            .filter_map(|r| match &r.body {
                Body::Overdue(o) => Some(o.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn overdue_backoff_doubles_and_is_capped() {
        let t = 10;
        assert_eq!(next_overdue_age(10, 0, t, 1000), 20);
        assert_eq!(next_overdue_age(20, 1, t, 1000), 40);
        assert_eq!(next_overdue_age(40, 2, t, 1000), 80);
        assert_eq!(next_overdue_age(5000, 20, t, 1000), 6000, "capped interval");
        assert_eq!(next_overdue_age(u64::MAX - 1, 200, t, 1000), u64::MAX);
    }

    #[test]
    fn a_stuck_op_is_reported_at_threshold_then_with_backoff_and_phase() {
        let mut cfg = small_cfg();
        cfg.overdue_ms = 10;
        let (sh, ring) = fixture(cfg);
        let ctx = context(sh, 9, 2, 4);
        let sink = VecSink::default();
        let mut d = Drain::new(sh, ring.clone(), Box::new(sink.clone()), None);
        let c = start(sh, &ctx, &coll(5, c"AllReduce", 256, 2));
        stop_event(sh, c);
        let h = crate::handle::Handle::from_ptr(c).unwrap();
        let enq = crate::op::snapshot(sh, h.index).unwrap().op.enqueue_ns;
        let ms = 1_000_000;
        let now = Instant::now();
        let mut got = Vec::new();
        for at in [5, 10, 15, 19, 20, 39, 40, 79] {
            d.tick(enq + at * ms, now);
            got.extend(overdues(&sink.take()).into_iter().map(|o| (at, o)));
        }
        let reps: Vec<(u64, u32)> = got.iter().map(|(at, o)| (*at, o.repeat)).collect();
        assert_eq!(reps, vec![(10, 0), (20, 1), (40, 2)]);
        let o = &got[0].1;
        assert_eq!(
            (o.comm_hash, o.coll_sn, o.rank, o.threshold_ms, o.age_ms),
            (9, 5, 2, 10, 10)
        );
        assert_eq!(
            (
                o.phase,
                o.channels_started,
                o.start_ns,
                o.nchannels,
                o.is_p2p
            ),
            (0, 0, 0, 2, 0)
        );
        assert_eq!(o.bytes, 1024);
        // The kernel starts: the next report says so.
        let k = start(sh, &ctx, &kernel_ch(c, 0, 0));
        d.tick(enq + 80 * ms, now);
        let o = overdues(&sink.take()).pop().unwrap();
        assert_eq!((o.repeat, o.phase, o.channels_started), (3, 1, 1));
        assert!(o.start_ns >= enq);
        stop_event(sh, k);
        d.tick(enq + 160 * ms, now);
        let o = overdues(&sink.take()).pop().unwrap();
        assert_eq!((o.repeat, o.phase, o.channels_done), (4, 2, 1));
        assert_eq!(sh.counters.overdue_emitted.load(Ordering::Relaxed), 5);
        // Late drain (e.g. descheduled): one report, not a burst.
        d.tick(enq + 10_000 * ms, now);
        assert_eq!(overdues(&sink.take()).len(), 1);
    }

    #[test]
    fn finish_writes_the_rest_and_a_stats_record_then_seals() {
        let (sh, ring) = fixture(small_cfg());
        let ctx = context(sh, 9, 2, 4);
        let sink = VecSink::default();
        let mut d = Drain::new(sh, ring, Box::new(sink.clone()), None);
        sh.set_mask(crate::abi::EV_COLL as u32);
        sh.counters.ctl_refused.store(3, Ordering::Relaxed);
        sh.counters.mask_changes.store(1, Ordering::Relaxed);
        let c = start(sh, &ctx, &coll(5, c"AllReduce", 256, 2));
        stop_event(sh, c);
        d.finish(sh.clock.now());
        let recs = sink.take();
        let kinds: Vec<Kind> = recs.iter().map(|r| r.kind()).collect();
        assert_eq!(
            kinds,
            vec![Kind::CommInit, Kind::CommDevice, Kind::Coll, Kind::Stats]
        );
        let Body::CommDevice(dev) = &recs[1].body else {
            panic!()
        };
        assert_eq!(
            (dev.comm_hash, dev.rank, dev.device, dev.pci),
            (9, 2, -1, 0),
            "no CUDA in the test process: no device"
        );
        let Body::Stats(st) = &recs[3].body else {
            panic!()
        };
        assert_eq!(st.event_mask, 2);
        assert_eq!(
            (st.ctl_refused, st.mask_changes),
            (3, 1),
            "control counts reach the agent"
        );
        assert_eq!(st.records_pushed, 3, "pushed before this stats record");
        assert_eq!(*sink.1.lock().unwrap(), 1);
    }

    #[test]
    fn inspector_compat_writes_one_json_line_per_completed_op_with_the_comm_header() {
        let dir = std::env::temp_dir().join(format!("ci-insp-drain-{}", std::process::id()));
        let mut cfg = small_cfg();
        cfg.inspector_compat = true;
        cfg.inspector_dir = dir.clone();
        cfg.host = "node7".into();
        let (sh, ring) = fixture(cfg);
        let ctx = context(sh, 0xfeed, 3, 8);
        let sink = VecSink::default();
        let mut d = Drain::new(sh, ring, Box::new(sink), None);
        let c = start(sh, &ctx, &coll(12, c"AllReduce", 1 << 20, 1));
        stop_event(sh, c);
        let k = start(sh, &ctx, &kernel_ch(c, 0, 1_000));
        record(sh, k, crate::abi::ST_KERNEL_CH_STOP, 1_000 + 2_000_000);
        stop_event(sh, k);
        // A small op (below 8192 bytes) is not written, as in Inspector.
        let small = start(sh, &ctx, &coll(13, c"AllReduce", 16, 1));
        stop_event(sh, small);
        let k = start(sh, &ctx, &kernel_ch(small, 0, 1));
        record(sh, k, crate::abi::ST_KERNEL_CH_STOP, 2);
        stop_event(sh, k);
        // Two channels: Inspector's exec time is the longest channel (1.5 ms), not the span (2 ms).
        let two = start(sh, &ctx, &coll(14, c"AllReduce", 1 << 20, 2));
        stop_event(sh, two);
        let k0 = start(sh, &ctx, &kernel_ch(two, 0, 1_000));
        let k1 = start(sh, &ctx, &kernel_ch(two, 1, 501_000));
        record(sh, k0, crate::abi::ST_KERNEL_CH_STOP, 1_501_000);
        record(sh, k1, crate::abi::ST_KERNEL_CH_STOP, 2_001_000);
        stop_event(sh, k0);
        stop_event(sh, k1);
        d.tick(sh.clock.now(), Instant::now());
        let text = std::fs::read_to_string(dir.join(format!("node7-pid{}.log", sh.pid))).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[1].contains("\"coll_sn\":14,\"coll_msg_size_bytes\":4194304,\"coll_exec_time_us\":1500,\"coll_timing_source\":\"kernel_gpu\",\"coll_algobw_gbs\":2.80,\"coll_busbw_gbs\":4.89}"), "{}", lines[1]);
        let l = lines[0];
        assert!(l.starts_with("{\"header\":{\"id\":\"0xfeed\",\"comm_name\":\"test\",\"rank\":3,\"n_ranks\":8,\"nnodes\":1},"), "{l}");
        assert!(l.contains("\"coll_perf\":{\"coll\":\"AllReduce\",\"coll_sn\":12,\"coll_msg_size_bytes\":4194304,\"coll_exec_time_us\":2000,\"coll_timing_source\":\"kernel_gpu\",\"coll_algobw_gbs\":2.10,\"coll_busbw_gbs\":3.67}}"), "{l}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

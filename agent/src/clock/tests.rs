use comminsight_wire::record::{Body, ProcStart, Record, Stats};

use super::*;

fn temp_dir(tag: &str) -> TempDir {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let p = std::env::temp_dir().join(format!(
        "ciagent-clock-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    TempDir(p)
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(mono: u64, real: u64) -> Record {
    Record::new(Body::ProcStart(ProcStart {
        mono_ns: mono,
        real_ns: real,
        ..Default::default()
    }))
}

fn stats(mono: u64, real: u64) -> Record {
    Record::new(Body::Stats(Stats {
        mono_ns: mono,
        real_ns: real,
        ..Default::default()
    }))
}

#[test]
fn process_correction_follows_realtime_drift() {
    let mut c = ProcessClock::new();
    assert_eq!(c.correction().offset_ns, 0);
    c.observe(&start(1_000, 5_000_000)); // fixed offset 4_999_000
    assert_eq!(
        c.correction(),
        Alignment {
            offset_ns: 0,
            err_ns: PAIR_READ_ERR_NS
        }
    );
    // Realtime slewed +300 ns relative to the fixed offset after 1 s.
    c.observe(&stats(1_000_001_000, 1_005_000_300));
    let a = c.correction();
    assert_eq!(a.offset_ns, 300);
    assert_eq!(a.err_ns, PAIR_READ_ERR_NS);
    // Then +500: the drift moved 200 ns between pairs.
    c.observe(&stats(2_000_001_000, 2_005_000_500));
    assert_eq!(
        c.correction(),
        Alignment {
            offset_ns: 500,
            err_ns: 200 + PAIR_READ_ERR_NS
        }
    );
    // An older pair (reordered) is ignored.
    c.observe(&stats(1_500_001_000, 1_505_999_999));
    assert_eq!(c.correction().offset_ns, 500);
    // A host time at mono 3 s maps onto realtime by the correction.
    let host = 3_000_001_000u64 + 4_999_000;
    assert_eq!(c.correction().apply(host), host + 500);
    // A restarted runtime starts over.
    c.observe(&start(10, 20));
    assert_eq!(c.correction().offset_ns, 0);
    assert!(c.latest.is_none());
}

fn exchange(
    client_send: u64,
    offset: i64,
    one_way_out: u64,
    server: u64,
    one_way_back: u64,
) -> Exchange {
    let t1 = client_send;
    let t2 = (t1 + one_way_out).saturating_add_signed(offset);
    let t3 = t2 + server;
    let t4 = (t3.saturating_add_signed(-offset)) + one_way_back;
    Exchange { t1, t2, t3, t4 }
}

#[test]
fn estimate_takes_the_fastest_round_trip_and_bounds_its_error() {
    let off = 37_000_000i64;
    let samples = [
        exchange(1_000_000_000, off, 900_000, 10_000, 100_000), // asymmetric, rtt 1 ms
        exchange(2_000_000_000, off, 20_000, 5_000, 30_000),    // rtt 50 us
        exchange(3_000_000_000, off, 70_000_000, 5_000, 10),    // slow
    ];
    let h = estimate(&samples).unwrap();
    assert_eq!(h.rtt_ns, 50_000);
    assert_eq!(h.err_ns, 25_000 + CLOCK_READ_ERR_NS);
    assert!((h.offset_ns - off).unsigned_abs() <= h.err_ns, "{h:?}");
    assert_eq!(h.measured_real_ns, samples[1].t4);
    // Every sample above max_rtt: none.
    assert!(estimate_within(&samples, 10_000).is_none());
    assert!(estimate(&[]).is_none());
    // Negative offsets.
    let neg = exchange(10_000_000_000, -5_000_000_000, 40_000, 1_000, 60_000);
    let h = estimate(&[neg]).unwrap();
    assert!(
        (h.offset_ns + 5_000_000_000).unsigned_abs() <= h.err_ns,
        "{h:?}"
    );
    assert_eq!(h.offset_ns, -5_000_000_000 - 10_000);
}

#[test]
fn align_sums_offsets_and_errors() {
    let mut c = ProcessClock::new();
    c.observe(&start(1_000, 2_000));
    c.observe(&stats(11_000, 12_100));
    let host = HostOffset {
        offset_ns: -40,
        err_ns: 7,
        ..Default::default()
    };
    let a = align(&c, Some(&host));
    assert_eq!(
        a,
        Alignment {
            offset_ns: 60,
            err_ns: PAIR_READ_ERR_NS + 7
        }
    );
    assert_eq!(align(&c, None).err_ns, UNMEASURED_ERR_NS);
    assert_eq!(
        align(&c, Some(&HostOffset::reference(5))).err_ns,
        PAIR_READ_ERR_NS
    );
}

#[test]
fn book_persists_and_stays_bounded() {
    let dir = temp_dir("book");
    let mut b = ClockBook::open(&dir.0).unwrap();
    assert!(b.latest().is_none());
    for i in 0..(MAX_BOOK_LINES as i64 + MAX_BOOK_LINES as i64 / 10 + 5) {
        b.append(HostOffset {
            offset_ns: i,
            ..Default::default()
        })
        .unwrap();
    }
    let n = MAX_BOOK_LINES as i64 + MAX_BOOK_LINES as i64 / 10 + 4;
    assert_eq!(b.latest().unwrap().offset_ns, n);
    assert_eq!(b.len(), MAX_BOOK_LINES);
    let text = std::fs::read_to_string(b.path()).unwrap();
    assert!(text.lines().count() <= MAX_BOOK_LINES + MAX_BOOK_LINES / 10);
    // A torn last line (crash mid-append) is skipped on load.
    std::fs::write(b.path(), format!("{text}{{\"offset_ns\":")).unwrap();
    let again = ClockBook::open(&dir.0).unwrap();
    assert_eq!(again.latest().unwrap().offset_ns, n);
    assert_eq!(again.len(), MAX_BOOK_LINES);
    assert_eq!(
        again.entries().next().unwrap().offset_ns,
        n + 1 - MAX_BOOK_LINES as i64
    );
}

#[test]
fn gpu_timer_offset_is_the_smallest_observed_delay() {
    use comminsight_wire::record::{OpRecord, Timing};
    let op = |gpu_start: u64, start: u64, gpu_end: u64, end: u64, timing: Timing| {
        Record::new(Body::Coll(OpRecord {
            gpu_start_ns: gpu_start,
            start_ns: start,
            gpu_end_ns: gpu_end,
            end_ns: end,
            timing,
            ..Default::default()
        }))
    };
    let mut c = ProcessClock::new();
    c.observe(&start(10, 1_000_000_010));
    assert_eq!(align_gpu(&c, None), None, "no GPU-timed op yet");
    // GPU timer = host - 5_000 ns; the host sees starts 700 / 300 ns late, ends 260 / 900 late.
    c.observe(&op(100_000, 105_700, 200_000, 205_260, Timing::KernelGpu));
    c.observe(&op(300_000, 305_300, 400_000, 405_900, Timing::KernelGpu));
    // Host-timed ops do not count, whatever their GPU fields say.
    c.observe(&op(1, 2, 3, 4, Timing::KernelCpu));
    let g = c.gpu.to_host().unwrap();
    assert_eq!(g.offset_ns, 5_260);
    assert_eq!(g.err_ns, 40 + PAIR_READ_ERR_NS);
    assert_eq!(c.gpu.samples, 2);
    // The true offset (5_000) lies within the bound's reach of the estimate's delay side.
    let host = HostOffset {
        offset_ns: -1_000,
        err_ns: 50,
        ..HostOffset::reference(0)
    };
    let a = align_gpu(&c, Some(&host)).unwrap();
    assert_eq!(a.offset_ns, 5_260 - 1_000);
    assert_eq!(a.err_ns, 40 + PAIR_READ_ERR_NS + PAIR_READ_ERR_NS + 50);
    // A restarted runtime (new proc_start pair) forgets the fit.
    c.observe(&start(20, 2_000_000_020));
    assert_eq!(c.gpu, GpuFit::default());
}

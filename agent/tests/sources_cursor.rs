//! StreamCursor against real plugin-format files: segments written by `SegmentWriter` and rings
//! created by `ShmRing::create`, in a temp dir.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use comminsight_agent::sources::{CursorCheckpoint, StreamCursor};
use comminsight_agent::StreamId;
use comminsight_wire::record::{Body, OpRecord, ProcStart, RawRecord, Record};
use comminsight_wire::ring::ShmRing;
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};

mod support;
use support::TempDir;

/// A plugin process: its ring and its segment writer, driven by hand.
struct Plugin {
    ring: ShmRing,
    writer: Option<SegmentWriter>,
    seg_dir: PathBuf,
    ring_path: PathBuf,
    pushed: u64,
}

const PID: &str = "4242";

impl Plugin {
    fn start(t: &TempDir, seg_bytes: u64, ring_name: &str, key: u64) -> Plugin {
        let seg_dir = t.path().join("logs/j1/h.x/4242");
        let ring_path = t.path().join("shm").join(ring_name);
        let ring = ShmRing::create(&ring_path, 1024).unwrap();
        let writer = SegmentWriter::new(
            SegmentConfig {
                dir: seg_dir.clone(),
                max_segment_bytes: seg_bytes,
                max_segment_age: Duration::from_secs(3600),
                retention_bytes: u64::MAX,
            },
            4242,
        );
        let mut p = Plugin {
            ring,
            writer: Some(writer),
            seg_dir,
            ring_path,
            pushed: 0,
        };
        let start = Record::new(Body::ProcStart(ProcStart {
            pid: 4242,
            mono_ns: key,
            real_ns: key + 1_700_000_000_000_000_000,
            ..Default::default()
        }))
        .encode();
        assert!(p.ring.push(&start));
        p.pushed += 1;
        p
    }

    /// Push `n` operation records into the ring.
    fn emit(&mut self, n: u64) {
        for i in 0..n {
            let rec = Record::new(Body::Coll(OpRecord {
                coll_local_sn: self.pushed + i,
                ..Default::default()
            }))
            .encode();
            assert!(self.ring.push(&rec));
        }
        self.pushed += n;
    }

    /// The drain thread: pop everything, write it, flush.
    fn drain(&mut self) {
        let mut buf = Vec::new();
        self.ring.pop_into(&mut buf, usize::MAX);
        let w = self.writer.as_mut().unwrap();
        if let Some(first) = buf.first().filter(|r| r.seq() == 0) {
            w.set_preamble(vec![*first]);
        }
        w.write(&buf);
        w.flush();
    }

    fn seal(&mut self) {
        self.writer.as_mut().unwrap().seal();
    }

    /// kill -9: nothing sealed, the ring file stays.
    fn kill(mut self) -> PathBuf {
        std::mem::forget(self.writer.take());
        self.ring_path.clone()
    }

    fn cursor(&self, ring: bool, from: Option<CursorCheckpoint>, t: &TempDir) -> StreamCursor {
        StreamCursor::new(
            StreamId::new("j1", "h.x", PID),
            Some(self.seg_dir.clone()),
            ring.then(|| self.ring_path.clone()),
            from,
        )
        .with_stale_after(Duration::from_secs(10))
        .with_proc_root(t.path().join("proc"))
    }
}

fn seqs(recs: &[RawRecord]) -> Vec<u64> {
    recs.iter().map(|r| r.seq()).collect()
}

fn poll_all(c: &mut StreamCursor, out: &mut Vec<RawRecord>, now: Instant) {
    while c.poll_at(out, 1000, now).unwrap().more {}
}

#[test]
fn sealed_then_open_then_renamed_between_polls() {
    let t = TempDir::new("cur-seal");
    let mut p = Plugin::start(&t, 128 * 40, "j1.h.x.4242.ring", 1);
    p.emit(99); // seq 0..=99, rotates every ~38 records
    p.drain();
    let mut c = p.cursor(false, None, &t);
    let mut out = Vec::new();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..100).collect::<Vec<_>>());
    let sealed = c.take_sealed();
    assert_eq!(sealed.iter().map(|s| s.index).collect::<Vec<_>>(), [0, 1]);
    assert!(sealed
        .iter()
        .all(|s| !s.abandoned && s.recovered.is_empty()));
    assert!(!c.is_finished(), "segment 2 is still open");

    // More records in the open segment, read; then it is sealed with unread records in it.
    p.emit(5);
    p.drain();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(out.len(), 105);
    p.emit(3);
    p.drain();
    p.seal();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..108).collect::<Vec<_>>());
    assert_eq!(
        c.take_sealed().iter().map(|s| s.index).collect::<Vec<_>>(),
        [2]
    );
    assert!(c.take_sealed().is_empty(), "never offered twice");
    assert!(c.is_finished());
    let st = c.stats();
    assert_eq!(
        (st.records, st.from_segments, st.seq_gaps, st.corrupt),
        (108, 108, 0, 0)
    );
    // The next segment (with its preamble repeat) appears later: the cursor is not terminal.
    p.emit(2);
    p.drain();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out[108..]), [108, 109]);
}

#[test]
fn the_ring_delivers_what_is_not_on_disk_yet_and_the_disk_never_repeats_it() {
    let t = TempDir::new("cur-ring");
    let mut p = Plugin::start(&t, 1 << 20, "j1.h.x.4242.ring", 1);
    p.emit(20);
    p.drain(); // 0..=20 on disk
    p.emit(30); // 21..=50 only in the ring
    let mut c = p.cursor(true, None, &t);
    let mut out = Vec::new();
    let pr = c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..51).collect::<Vec<_>>());
    assert_eq!(pr.from_ring, 30);
    p.drain();
    p.emit(5);
    c.poll(&mut out, 10_000).unwrap();
    p.drain();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..56).collect::<Vec<_>>());
    let st = c.stats();
    assert_eq!((st.from_ring, st.from_segments, st.seq_gaps), (35, 21, 0));
    // Normal exit: sealed, ring unlinked.
    p.seal();
    p.ring.unlink();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(out.len(), 56);
    assert!(!c.is_finished(), "segment 0 not offered yet");
    assert_eq!(c.take_sealed().len(), 1);
    assert!(c.is_finished());
}

/// The ring's owner truncates it while the cursor maps it (a job user against the root agent):
/// no `SIGBUS`, what was read stands, the ring is let go and counted, the disk goes on.
#[test]
fn a_ring_truncated_by_its_owner_is_let_go_and_the_segments_go_on() {
    let t = TempDir::new("cur-trunc");
    let mut p = Plugin::start(&t, 1 << 20, "j1.h.x.4242.ring", 1);
    p.emit(20);
    p.drain(); // 0..=20 on disk
    p.emit(30); // 21..=50 only in the ring
    let mut c = p.cursor(true, None, &t);
    let mut out = Vec::new();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..51).collect::<Vec<_>>());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p.ring_path)
        .unwrap()
        .set_len(0)
        .unwrap();
    c.poll(&mut out, 10_000).unwrap();
    c.poll(&mut out, 10_000).unwrap();
    let st = c.stats();
    assert_eq!((st.rings_truncated, st.records, st.corrupt), (1, 51, 0));
    // The writer seals what it wrote; the cursor takes it, nothing repeated.
    p.seal();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(out.len(), 51);
    assert_eq!(c.take_sealed().len(), 1);
    assert_eq!(
        c.stats().rings_truncated,
        1,
        "the truncated file is not attached again"
    );
    std::mem::forget(p.ring); // the writer's own mapping of the truncated file stays untouched
}

#[test]
fn a_killed_writer_leaves_an_open_segment_and_its_ring_records_are_recovered() {
    let t = TempDir::new("cur-kill");
    std::fs::create_dir_all(t.path().join("proc")).unwrap();
    let mut p = Plugin::start(&t, 1 << 20, "j1.h.x.4242.ring", 1);
    p.emit(99);
    p.drain(); // 0..=99 on disk (open)
    p.emit(50); // 100..=149 never reach the disk
    let ring = p.kill();
    // A torn last record, as a writer killed mid-write leaves.
    let open = t.path().join("logs/j1/h.x/4242/seg-000000.cis.open");
    let mut bytes = std::fs::read(&open).unwrap();
    bytes.extend_from_slice(&[7u8; 60]);
    std::fs::write(&open, bytes).unwrap();

    let t0 = Instant::now();
    let mut c = StreamCursor::new(
        StreamId::new("j1", "h.x", PID),
        Some(t.path().join("logs/j1/h.x/4242")),
        Some(ring.clone()),
        None,
    )
    .with_stale_after(Duration::from_secs(10))
    .with_proc_root(t.path().join("proc"));
    let mut out = Vec::new();
    poll_all(&mut c, &mut out, t0);
    assert_eq!(
        seqs(&out),
        (0..150).collect::<Vec<_>>(),
        "live: disk then ring"
    );
    assert!(c.take_sealed().is_empty());
    // The pid is alive (in our namespace): never abandoned.
    std::fs::create_dir_all(t.path().join("proc").join(PID)).unwrap();
    poll_all(&mut c, &mut out, t0 + Duration::from_secs(60));
    assert!(c.take_sealed().is_empty());
    std::fs::remove_dir(t.path().join("proc").join(PID)).unwrap();
    // Not stale yet, then stale: abandoned, the ring's records recovered.
    poll_all(&mut c, &mut out, t0 + Duration::from_secs(5));
    assert!(c.take_sealed().is_empty());
    poll_all(&mut c, &mut out, t0 + Duration::from_secs(120));
    let sealed = c.take_sealed();
    assert_eq!(sealed.len(), 1);
    assert!(sealed[0].abandoned);
    assert!(sealed[0].path.ends_with("seg-000000.cis.open"));
    assert_eq!(seqs(&sealed[0].recovered), (100..150).collect::<Vec<_>>());
    assert_eq!(out.len(), 150, "nothing delivered twice");
    assert_eq!(c.stats().torn_bytes, 60);
    assert!(c.is_finished());

    // A fresh cursor (agent restarted after the kill) delivers all, ring records included.
    let mut c2 = StreamCursor::new(
        StreamId::new("j1", "h.x", PID),
        Some(t.path().join("logs/j1/h.x/4242")),
        Some(ring),
        None,
    )
    .with_stale_after(Duration::from_secs(10))
    .with_proc_root(t.path().join("proc"));
    let mut out2 = Vec::new();
    let t1 = Instant::now();
    poll_all(&mut c2, &mut out2, t1);
    assert_eq!(seqs(&out2), (0..150).collect::<Vec<_>>());
    poll_all(&mut c2, &mut out2, t1 + Duration::from_secs(30));
    assert_eq!(out2.len(), 150);
    assert_eq!(c2.take_sealed()[0].recovered.len(), 50);
}

#[test]
fn resuming_from_checkpoints_loses_and_repeats_nothing() {
    let t = TempDir::new("cur-resume");
    let mut p = Plugin::start(&t, 128 * 23, "j1.h.x.4242.ring", 1);
    let mut got: Vec<u64> = Vec::new();
    let mut cp: Option<CursorCheckpoint> = None;
    let mut offered = Vec::new();
    // Small polls, a new cursor (agent restart) after each, the plugin writing in between;
    // some records only in the ring when the agent restarts.
    for round in 0..40u64 {
        p.emit(round % 7 + 1);
        if round % 3 != 0 {
            p.drain();
        }
        let mut c = p.cursor(true, cp.take(), &t);
        let mut out = Vec::new();
        c.poll(&mut out, (round % 5 + 1) as usize).unwrap();
        for s in c.take_sealed() {
            offered.push(s.index);
            c.ack_sealed(s.index);
        }
        got.extend(seqs(&out));
        let saved = serde_json::to_string(&c.checkpoint()).unwrap();
        cp = Some(serde_json::from_str(&saved).unwrap());
    }
    p.drain();
    p.seal();
    let mut c = p.cursor(true, cp, &t);
    let mut out = Vec::new();
    poll_all(&mut c, &mut out, Instant::now());
    got.extend(seqs(&out));
    offered.extend(c.take_sealed().iter().map(|s| s.index));
    let unique: BTreeSet<u64> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "no duplicate");
    assert_eq!(got, (0..p.pushed).collect::<Vec<_>>(), "no loss, in order");
    let segs = std::fs::read_dir(&p.seg_dir).unwrap().count() as u64;
    assert_eq!(
        offered,
        (0..segs).collect::<Vec<_>>(),
        "each segment offered once"
    );
}

#[test]
fn a_segment_deleted_by_retention_is_counted_as_a_gap() {
    let t = TempDir::new("cur-retention");
    let mut p = Plugin::start(&t, 128 * 12, "j1.h.x.4242.ring", 1);
    p.emit(29);
    p.drain();
    p.seal();
    // Segment 0: header + 0..=10; segment 1: header + repeat + 11..=20; segment 2: 21..=29.
    std::fs::remove_file(p.seg_dir.join("seg-000001.cis")).unwrap();
    let mut c = p.cursor(false, None, &t);
    let mut out = Vec::new();
    c.poll(&mut out, 10_000).unwrap();
    let got = seqs(&out);
    assert_eq!(got.len() as u64 + c.stats().seq_gaps, 30, "{got:?}");
    assert_eq!(c.stats().seq_gaps, 10);
    assert_eq!(
        c.take_sealed().iter().map(|s| s.index).collect::<Vec<_>>(),
        [0, 2]
    );
}

#[test]
fn corrupt_records_and_torn_tails_are_counted_and_skipped() {
    let t = TempDir::new("cur-corrupt");
    let mut p = Plugin::start(&t, 1 << 20, "j1.h.x.4242.ring", 1);
    p.emit(9);
    p.drain();
    p.seal();
    let path = p.seg_dir.join("seg-000000.cis");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[128 * 3] = b'X'; // record 3 of the file: seq 2
    bytes[128 * 5 + 2] = 99; // version of seq 4
    bytes.extend_from_slice(&[1u8; 50]);
    std::fs::write(&path, bytes).unwrap();
    let mut c = p.cursor(false, None, &t);
    let mut out = Vec::new();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), [0, 1, 3, 5, 6, 7, 8, 9]);
    let st = c.stats();
    assert_eq!((st.corrupt, st.torn_bytes, st.seq_gaps), (2, 50, 2));
}

#[test]
fn a_restarted_runtime_starts_a_new_seq_epoch() {
    let t = TempDir::new("cur-epoch");
    let mut a = Plugin::start(&t, 128 * 8, "j1.h.x.4242.ring", 1);
    a.emit(9);
    a.drain();
    let mut c = a.cursor(true, None, &t);
    let mut out = Vec::new();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(out.len(), 10);
    a.seal();
    a.ring.unlink();
    drop(a);
    // Same process, new runtime: a new ring (its seq restarts at 0), a new writer.
    let mut b = Plugin::start(&t, 128 * 8, "j1.h.x.4242.2-99.ring", 2);
    b.emit(11);
    c.set_ring(Some(b.ring_path.clone()));
    let pr = c.poll(&mut out, 10_000).unwrap();
    assert_eq!(
        pr.records, 0,
        "the new ring waits for the disk to reach its epoch"
    );
    b.drain();
    c.poll(&mut out, 10_000).unwrap();
    b.emit(4); // only in the ring
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out[10..]), (0..16).collect::<Vec<_>>());
    let st = c.stats();
    assert_eq!((st.epochs, st.seq_gaps, st.records), (2, 0, 26));
    assert_eq!(c.checkpoint().epoch, 1);
    // Resuming in epoch 1 re-reads nothing of epoch 0 or 1.
    let mut c2 = b.cursor(true, Some(c.checkpoint()), &t);
    let mut more = Vec::new();
    c2.poll(&mut more, 10_000).unwrap();
    assert!(more.is_empty(), "{:?}", seqs(&more));
}

#[test]
fn idle_polls_are_cheap_and_reading_is_fast() {
    let t = TempDir::new("cur-perf");
    let mut p = Plugin::start(&t, 64 << 20, "j1.h.x.4242.ring", 1);
    let n = 400_000u64;
    for _ in 0..(n / 1000) {
        p.emit(1000);
        p.drain();
    }
    let mut c = p.cursor(true, None, &t);
    let mut out = Vec::with_capacity(n as usize + 1);
    let t0 = Instant::now();
    poll_all(&mut c, &mut out, Instant::now());
    let rate = out.len() as f64 / t0.elapsed().as_secs_f64();
    assert_eq!(out.len() as u64, n + 1);
    let t1 = Instant::now();
    for _ in 0..1000 {
        c.poll(&mut out, 1000).unwrap();
    }
    let idle = t1.elapsed() / 1000;
    eprintln!("read {rate:.0} records/s; idle poll {idle:?}");
    assert_eq!(out.len() as u64, n + 1);
    assert!(idle < Duration::from_millis(2), "idle poll {idle:?}");
}

#[test]
fn a_live_writer_and_restarting_readers_agree_on_every_seq() {
    let t = TempDir::new("cur-live");
    let mut p = Plugin::start(&t, 128 * 300, "j1.h.x.4242.ring", 1);
    let (seg_dir, ring_path) = (p.seg_dir.clone(), p.ring_path.clone());
    let total = 60_000u64;
    let writer = std::thread::spawn(move || {
        let mut i = 0u64;
        while p.pushed < total {
            let n = (i * 7919 % 97 + 1).min(total - p.pushed);
            p.emit(n);
            if i.is_multiple_of(3) {
                p.drain();
            }
            if i.is_multiple_of(50) {
                p.seal();
            }
            i += 1;
            std::thread::yield_now();
        }
        p.drain();
        p.seal();
        p.ring.unlink();
    });
    let new_cursor = |cp| {
        StreamCursor::new(
            StreamId::new("j1", "h.x", PID),
            Some(seg_dir.clone()),
            Some(ring_path.clone()),
            cp,
        )
    };
    let mut c = new_cursor(None);
    let mut got: Vec<u64> = Vec::new();
    let mut offered = Vec::new();
    let mut out = Vec::new();
    let mut polls = 0u64;
    let mut ring_records = 0;
    // A liveness bound in wall time (a poll count ran out on a loaded machine while the
    // writer was still writing).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = writer.is_finished();
        out.clear();
        let pr = c.poll(&mut out, (polls % 13 + 1) as usize * 100).unwrap();
        got.extend(seqs(&out));
        ring_records += pr.from_ring;
        for s in c.take_sealed() {
            offered.push(s.index);
            c.ack_sealed(s.index);
        }
        polls += 1;
        if polls.is_multiple_of(17) {
            c = new_cursor(Some(c.checkpoint())); // agent restart
        }
        if done && c.is_finished() && got.len() as u64 >= total {
            break;
        }
        if Instant::now() > deadline {
            let set: BTreeSet<u64> = got.iter().copied().collect();
            let missing: Vec<u64> = (0..total).filter(|s| !set.contains(s)).take(10).collect();
            panic!(
                "stuck at {} records; missing {missing:?}; {:?} {:?} finished {}",
                got.len(),
                c.stats(),
                c.checkpoint(),
                c.is_finished()
            );
        }
    }
    writer.join().unwrap();
    eprintln!("{polls} polls, {ring} from the ring", ring = ring_records);
    assert_eq!(
        got,
        (0..total).collect::<Vec<_>>(),
        "exactly once, in order"
    );
    let segs = std::fs::read_dir(&seg_dir).unwrap().count() as u64;
    assert_eq!(offered, (0..segs).collect::<Vec<_>>());
}

#[test]
fn a_final_stats_written_past_the_ring_is_delivered_without_a_seq() {
    let t = TempDir::new("cur-final-stats");
    let mut p = Plugin::start(&t, 1 << 20, "j1.h.x.4242.ring", 1);
    p.emit(4);
    p.drain();
    let stats = Record::new(Body::Stats(comminsight_wire::record::Stats {
        records_pushed: 5,
        ..Default::default()
    }))
    .encode();
    p.writer.as_mut().unwrap().write(&[stats]);
    p.seal();
    let mut c = p.cursor(false, None, &t);
    let mut out = Vec::new();
    c.poll(&mut out, 100).unwrap();
    assert_eq!(seqs(&out), [0, 1, 2, 3, 4, 0]);
    assert_eq!(out[5], stats);
    let st = c.stats();
    assert_eq!((st.records, st.corrupt, st.seq_gaps), (6, 0, 0));
}

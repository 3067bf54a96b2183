use super::*;
use crate::record::{CommFini, CommInit, DecodeError, ProcStart, FLAG_REPEAT};
use crate::testutil::TempDir;

fn op(n: u64) -> RawRecord {
    let mut r = Record::new(Body::CommFini(CommFini {
        ops: n,
        ..Default::default()
    }))
    .encode();
    r.set_seq(n);
    r
}

fn preamble() -> Vec<RawRecord> {
    vec![
        Record::new(Body::ProcStart(ProcStart {
            pid: 9,
            ..Default::default()
        }))
        .encode(),
        Record::new(Body::CommInit(CommInit {
            comm_hash: 5,
            ..Default::default()
        }))
        .encode(),
    ]
}

fn cfg(dir: &Path, max_records: u64) -> SegmentConfig {
    SegmentConfig {
        dir: dir.to_path_buf(),
        max_segment_bytes: max_records * RECORD_SIZE as u64,
        ..Default::default()
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The stream records (no segment record, no repeats) of every segment under `dir`, in order.
fn stream(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    for f in find_segments(dir).unwrap() {
        let seg = read_segment(&f).unwrap();
        assert!(seg.bad.is_empty() && seg.torn_tail_bytes == 0);
        for r in seg.records {
            if r.flags & FLAG_REPEAT == 0 {
                if let Body::CommFini(c) = r.body {
                    out.push(c.ops);
                }
            }
        }
    }
    out
}

#[test]
fn defaults_follow_the_contract() {
    let c = SegmentConfig::default();
    assert_eq!(c.max_segment_bytes, 64 << 20);
    assert_eq!(c.max_segment_age, Duration::from_secs(300));
    assert_eq!(c.retention_bytes, 1 << 30);
    assert_eq!(segment_file_name(7, true), "seg-000007.cis.open");
    assert_eq!(parse_segment_name("seg-000007.cis"), Some((7, false)));
    assert_eq!(
        parse_segment_name("seg-1234567.cis.open"),
        Some((1_234_567, true))
    );
    for bad in [
        "seg-.cis",
        "seg-12a.cis",
        "seg-1.cis.tmp",
        "xseg-1.cis",
        "seg-1",
    ] {
        assert_eq!(parse_segment_name(bad), None, "{bad}");
    }
}

#[test]
fn rotates_by_size_with_a_segment_record_first_and_the_preamble_repeated() {
    let tmp = TempDir::new("seg");
    let dir = tmp.path().join("job/host/9");
    let mut w = SegmentWriter::new(cfg(&dir, 10), 9);
    w.set_preamble(preamble());
    w.write(&(0..30).map(op).collect::<Vec<_>>());
    w.seal();
    // seg 0: header + 9; then header + 2 repeats + 7 each: 9 + 7 + 7 + 7 = 30.
    assert_eq!(
        names(&dir),
        [0, 1, 2, 3].map(|i| segment_file_name(i, false))
    );
    assert_eq!(stream(&dir), (0..30).collect::<Vec<_>>());
    for (i, f) in find_segments(&dir).unwrap().iter().enumerate() {
        assert!(std::fs::metadata(f).unwrap().len() <= 10 * RECORD_SIZE as u64);
        let seg = read_segment(f).unwrap();
        let h = seg.header().expect("segment record first");
        assert_eq!(
            (h.format, h.record_size, h.segment_index, h.pid),
            (1, 128, i as u64, 9)
        );
        assert!(!seg.open);
        let repeats: Vec<_> = seg
            .records
            .iter()
            .filter(|r| r.flags & FLAG_REPEAT != 0)
            .collect();
        if i == 0 {
            assert!(
                repeats.is_empty(),
                "no preamble in the writer's first segment"
            );
        } else {
            assert_eq!(repeats.len(), 2);
            assert!(matches!(seg.records[1].body, Body::ProcStart(_)));
            assert!(matches!(seg.records[2].body, Body::CommInit(_)));
        }
    }
    let st = w.stats();
    assert_eq!(st.segments_sealed, 4);
    assert_eq!(st.bytes_written, (10 + 10 + 10 + 10) * 128);
    assert!(!st.failed);
}

#[test]
fn rotates_by_age_only_when_the_segment_holds_records() {
    let tmp = TempDir::new("seg");
    let mut c = cfg(tmp.path(), 1000);
    c.max_segment_age = Duration::from_secs(60);
    let mut w = SegmentWriter::new(c, 1);
    let t0 = Instant::now();
    w.maybe_rotate(t0 + Duration::from_secs(3600));
    assert!(
        names(tmp.path()).is_empty(),
        "no file before the first record"
    );
    w.write(&[op(0)]);
    w.flush();
    assert_eq!(names(tmp.path()), ["seg-000000.cis.open"]);
    w.maybe_rotate(Instant::now());
    assert_eq!(w.stats().segments_sealed, 0);
    w.maybe_rotate(Instant::now() + Duration::from_secs(61));
    assert_eq!(names(tmp.path()), ["seg-000000.cis"]);
    assert_eq!(w.current_index(), None);
    w.maybe_rotate(Instant::now() + Duration::from_secs(200));
    assert_eq!(w.stats().segments_sealed, 1, "idle: nothing to rotate");
    w.write(&[op(1)]);
    assert_eq!(w.current_index(), Some(1));
    drop(w); // seals
    assert_eq!(names(tmp.path()), ["seg-000000.cis", "seg-000001.cis"]);
}

#[test]
fn a_new_writer_continues_after_the_highest_index_present() {
    let tmp = TempDir::new("seg");
    std::fs::write(tmp.path().join("seg-000041.cis"), b"").unwrap();
    std::fs::write(tmp.path().join("seg-000007.cis.open"), b"").unwrap();
    std::fs::write(tmp.path().join("notes.txt"), b"").unwrap();
    let mut w = SegmentWriter::new(cfg(tmp.path(), 100), 1);
    w.set_preamble(preamble());
    w.write(&[op(0)]);
    assert_eq!(w.current_index(), Some(42));
    w.seal();
    let seg = read_segment(&tmp.path().join("seg-000042.cis")).unwrap();
    assert_eq!(
        seg.records.len(),
        2,
        "first segment of this writer: no preamble"
    );
    assert_eq!(seg.header().unwrap().segment_index, 42);
}

#[test]
fn seal_renames_atomically_and_leaves_no_open_file() {
    let tmp = TempDir::new("seg");
    let mut w = SegmentWriter::new(cfg(tmp.path(), 100), 1);
    w.write(&(0..5).map(op).collect::<Vec<_>>());
    w.flush();
    assert_eq!(names(tmp.path()), ["seg-000000.cis.open"]);
    let live = read_segment(&tmp.path().join("seg-000000.cis.open")).unwrap();
    assert!(live.open);
    assert_eq!(live.records.len(), 6);
    w.seal();
    w.seal(); // idempotent
    assert_eq!(names(tmp.path()), ["seg-000000.cis"]);
    assert_eq!(w.stats().segments_sealed, 1);
}

#[test]
fn retention_deletes_the_oldest_sealed_segments_beyond_the_cap() {
    let tmp = TempDir::new("seg");
    let mut c = cfg(tmp.path(), 4);
    c.retention_bytes = 3 * 4 * RECORD_SIZE as u64;
    let mut w = SegmentWriter::new(c, 1);
    w.write(&(0..30).map(op).collect::<Vec<_>>());
    w.seal();
    // 30 stream records, 3 per segment -> 10 segments; keep the newest 3.
    assert_eq!(
        names(tmp.path()),
        [7, 8, 9].map(|i| segment_file_name(i, false))
    );
    let st = w.stats();
    assert_eq!((st.segments_sealed, st.segments_deleted), (10, 7));
    assert_eq!(stream(tmp.path()), (21..30).collect::<Vec<_>>());
}

#[test]
fn retention_counts_the_segments_of_an_earlier_writer_and_ones_removed_by_others() {
    let tmp = TempDir::new("seg");
    let mut c = cfg(tmp.path(), 4);
    c.retention_bytes = u64::MAX;
    let mut w = SegmentWriter::new(c.clone(), 1);
    w.write(&(0..12).map(op).collect::<Vec<_>>());
    drop(w); // 4 sealed segments left by a process that restarted
    assert_eq!(names(tmp.path()).len(), 4);
    std::fs::remove_file(tmp.path().join(segment_file_name(1, false))).unwrap();
    c.retention_bytes = 3 * 4 * RECORD_SIZE as u64;
    let mut w = SegmentWriter::new(c, 1);
    w.write(&(12..18).map(op).collect::<Vec<_>>());
    w.seal();
    // Segments 0, 2, 3 from before (1 was removed by someone else), 4 and 5 now: keep 3.
    assert_eq!(
        names(tmp.path()),
        [3, 4, 5].map(|i| segment_file_name(i, false))
    );
    assert_eq!(w.stats().segments_deleted, 2, "0 and 2 deleted");
}

#[test]
fn torn_tail_and_corrupt_records_are_reported_not_fatal() {
    let tmp = TempDir::new("seg");
    let mut bytes = Vec::new();
    for i in 0..5 {
        bytes.extend_from_slice(&op(i).0);
    }
    bytes[2 * RECORD_SIZE] = b'X'; // bad magic in record 2
    bytes[3 * RECORD_SIZE + 3] = 200; // unknown kind in record 3
    bytes.extend_from_slice(&[1u8; 50]);
    let path = tmp.path().join("seg-000003.cis");
    std::fs::write(&path, &bytes).unwrap();
    let seg = read_segment(&path).unwrap();
    assert_eq!(seg.torn_tail_bytes, 50);
    assert_eq!(seg.records.len(), 3);
    assert_eq!(seg.bad.len(), 2);
    assert_eq!(seg.bad[0].0, 2);
    assert!(matches!(seg.bad[0].1, DecodeError::BadMagic(_)));
    assert_eq!(seg.bad[1], (3, DecodeError::UnknownKind(200)));
    assert!(seg.header().is_none());
}

#[test]
fn find_segments_walks_any_root_in_directory_then_index_order() {
    let tmp = TempDir::new("seg");
    let out = tmp.path();
    let a = out.join("inspector_logs/job/h1/100");
    let b = out.join("inspector_logs/job/h2/200");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    for (d, n) in [
        (&a, "seg-000010.cis"),
        (&a, "seg-000002.cis"),
        (&a, "seg-000011.cis.open"),
        (&b, "seg-000000.cis"),
    ] {
        std::fs::write(d.join(n), b"").unwrap();
    }
    std::fs::write(a.join("other.json"), b"").unwrap();
    std::fs::write(out.join("truth.json"), b"{}").unwrap();
    let all = find_segments(out).unwrap();
    let rel: Vec<_> = all
        .iter()
        .map(|p| p.strip_prefix(out).unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        rel,
        [
            "inspector_logs/job/h1/100/seg-000002.cis",
            "inspector_logs/job/h1/100/seg-000010.cis",
            "inspector_logs/job/h1/100/seg-000011.cis.open",
            "inspector_logs/job/h2/200/seg-000000.cis",
        ]
    );
    assert_eq!(find_segments(&b).unwrap().len(), 1);
    let one = b.join("seg-000000.cis");
    assert_eq!(find_segments(&one).unwrap(), vec![one]);
    let e = find_segments(&out.join("truth.json")).unwrap_err();
    assert!(matches!(e, SegmentError::NotASegment { .. }), "{e}");
    let e = find_segments(&out.join("nope")).unwrap_err();
    assert!(matches!(e, SegmentError::Missing { .. }));
    assert!(e.to_string().contains("nope"), "{e}");
    assert!(matches!(
        read_segment(&out.join("nope")),
        Err(SegmentError::Missing { .. })
    ));
}

#[test]
fn an_unusable_directory_fails_once_and_counts_lost_records() {
    let tmp = TempDir::new("seg");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let mut w = SegmentWriter::new(cfg(&file.join("pid"), 100), 1);
    w.write(&[op(0), op(1), op(2)]);
    w.flush();
    w.write(&[op(3)]);
    w.maybe_rotate(Instant::now() + Duration::from_secs(1000));
    w.seal();
    let st = w.stats();
    assert!(st.failed);
    assert_eq!((st.io_errors, st.records_lost, st.bytes_written), (1, 4, 0));
}

#[test]
fn enospc_mid_stream_stops_writing_for_good() {
    let tmp = TempDir::new("seg");
    let mut w = SegmentWriter::new(cfg(tmp.path(), 1 << 20), 1);
    w.fail_after_bytes = Some(600 * RECORD_SIZE as u64);
    // 64 KiB buffers: the 1st flush (512 records incl. header) succeeds, the 2nd fails.
    w.write(&(0..1200).map(op).collect::<Vec<_>>());
    let st = w.stats();
    assert!(st.failed);
    assert_eq!(st.io_errors, 1);
    assert_eq!(st.bytes_written, 512 * 128);
    assert_eq!(st.records_lost, 1200 - 511);
    w.write(&[op(1200), op(1201)]);
    w.flush();
    w.seal();
    let st2 = w.stats();
    assert_eq!(st2.records_lost, st.records_lost + 2);
    assert_eq!(st2.io_errors, 1, "no retries");
    // What reached the disk is readable; the file keeps its .open name.
    let seg = read_segment(&tmp.path().join("seg-000000.cis.open")).unwrap();
    assert_eq!(seg.records.len(), 512);
}

/// A real full filesystem: a 256 KiB tmpfs. Needs CAP_SYS_ADMIN (root in CI); skipped otherwise.
#[test]
fn a_full_tmpfs_stops_the_writer_without_panicking() {
    let tmp = TempDir::new("seg");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let mut c = cfg(&mnt.join("pid"), 1 << 20);
    c.retention_bytes = u64::MAX;
    let mut w = SegmentWriter::new(c, 1);
    let batch: Vec<_> = (0..1000).map(op).collect();
    for _ in 0..10 {
        w.write(&batch); // 10 x 128 KB into 256 KiB
        w.flush();
    }
    w.seal();
    let st = w.stats();
    assert!(st.failed);
    assert_eq!(st.io_errors, 1);
    assert!(st.records_lost >= 10_000 - 2048, "{st:?}");
    assert!(st.bytes_written <= 256 << 10);
}

#[test]
fn directories_it_creates_are_0700_and_segments_0600_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("seg");
    let root = tmp.path().join("logs");
    let dir = root.join("j/h/7");
    let before = std::fs::metadata(tmp.path()).unwrap().permissions().mode();
    // SAFETY: umask only changes this process' creation mask; 0 would widen everything.
    let old = unsafe { libc::umask(0) };
    let mut w = SegmentWriter::new(cfg(&dir, 2), 7);
    w.write(&[op(0), op(1), op(2)]);
    w.seal();
    // SAFETY: restores the previous mask; plain integer call.
    unsafe { libc::umask(old) };
    assert!(!w.stats().failed, "{:?}", w.failure());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    for d in [&root, &root.join("j"), &root.join("j/h"), &dir] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    let files = names(&dir);
    assert!(files.len() >= 2, "{files:?}");
    for f in &files {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
    let after = std::fs::metadata(tmp.path()).unwrap().permissions().mode();
    assert_eq!(before, after, "an existing parent is left alone");
}

#[test]
fn a_foreign_or_symlinked_process_directory_is_refused_not_written() {
    let tmp = TempDir::new("seg");
    let foreign = tmp.path().join("j/h/8");
    std::fs::create_dir_all(&foreign).unwrap();
    std::os::unix::fs::chown(&foreign, Some(12345), Some(12345)).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = tmp.path().join("j/h/9");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    for (dir, says) in [(&foreign, "owned by uid 12345"), (&link, "symbolic link")] {
        let mut w = SegmentWriter::new(cfg(dir, 100), 1);
        w.write(&[op(0), op(1)]);
        w.seal();
        let st = w.stats();
        assert!(st.failed);
        assert_eq!((st.io_errors, st.records_lost), (1, 2));
        let why = w.failure().unwrap();
        assert!(
            why.contains(says) && why.contains(&dir.display().to_string()),
            "{why}"
        );
        assert!(why.contains("COMMINSIGHT_LOG_DIR"), "{why}");
    }
    assert!(names(&foreign).is_empty());
    assert!(
        names(&elsewhere).is_empty(),
        "nothing written through the link"
    );
}

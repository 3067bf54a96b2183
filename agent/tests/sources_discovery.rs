//! Discovery of process streams, log roots from any directory, checkpoint files, and the ring
//! alone (no segments; lapped while the disk is being written).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use comminsight_agent::config::SourcesConfig;
use comminsight_agent::sources::{find_log_roots, Discovery, StreamCursor};
use comminsight_agent::StreamId;
use comminsight_wire::record::{Body, OpRecord, RawRecord, Record};
use comminsight_wire::ring::ShmRing;
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};

mod support;
use support::TempDir;

fn op(i: u64) -> RawRecord {
    Record::new(Body::Coll(OpRecord {
        coll_local_sn: i,
        ..Default::default()
    }))
    .encode()
}

fn write_segment(dir: &Path, n: u64) {
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: dir.to_path_buf(),
            ..Default::default()
        },
        1,
    );
    let recs: Vec<RawRecord> = (0..n)
        .map(|i| {
            let mut r = op(i);
            r.set_seq(i);
            r
        })
        .collect();
    w.write(&recs);
    w.seal();
}

#[test]
fn discovery_pairs_segment_dirs_and_the_newest_ring() {
    let t = TempDir::new("disc");
    let logs = t.path().join("logs");
    let shm = t.path().join("shm");
    write_segment(&logs.join("j1/node.a/10"), 3);
    std::fs::create_dir_all(logs.join("j1/node.a/11")).unwrap();
    // Rings live in the per-user directory `<shm>/<uid>/`, mode 0700, owned by that uid.
    let uid = 4321;
    let user = shm.join(uid.to_string());
    std::fs::create_dir_all(&user).unwrap();
    std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&user, Some(uid), None).unwrap();
    // The stream's segments are that user's too (a stream's files must match its ring's owner).
    let pid_dir = logs.join("j1/node.a/10");
    for e in std::fs::read_dir(&pid_dir).unwrap().flatten() {
        std::os::unix::fs::chown(e.path(), Some(uid), None).unwrap();
    }
    std::os::unix::fs::chown(&pid_dir, Some(uid), None).unwrap();
    for name in [
        "j1.node.a.10.ring",
        "j1.node.a.10.3-200.ring",
        "j1.node.a.10.2-100.ring",
        "j1.node.a.10.ring.ctl",
        "j2.h.7.ring",
        "garbage",
    ] {
        std::fs::write(user.join(name), b"").unwrap();
    }
    let cfg = SourcesConfig {
        shm_dir: shm.clone(),
        segment_dirs: vec![logs.clone(), t.path().join("missing")],
        ..Default::default()
    };
    let found = Discovery::new(&cfg).scan();
    let summary: Vec<(String, bool, Option<String>)> = found
        .iter()
        .map(|s| {
            let ring = s
                .ring
                .as_ref()
                .map(|r| r.file_name().unwrap().to_string_lossy().into_owned());
            (s.id.to_string(), s.seg_dir.is_some(), ring)
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "j1/node.a/10".into(),
                true,
                Some("j1.node.a.10.3-200.ring".into())
            ),
            ("j1/node.a/11".into(), true, None),
            ("j2/h/7".into(), false, Some("j2.h.7.ring".into())),
        ]
    );
    assert_eq!(found[0].ring_owner, Some(uid));
    assert_eq!(found[1].ring_owner, None, "no ring, no owner");
    // A cursor over a discovered stream (its ring file is not a ring yet: ignored).
    let mut c = StreamCursor::for_stream(&found[0], None, &cfg);
    let mut out = Vec::new();
    c.poll(&mut out, 100).unwrap();
    assert_eq!(out.iter().map(|r| r.seq()).collect::<Vec<_>>(), [0, 1, 2]);
    // Rings off: segment directories only.
    let cfg = SourcesConfig {
        shm_enabled: false,
        ..cfg
    };
    assert!(Discovery::new(&cfg).scan().iter().all(|s| s.ring.is_none()));
    // Nothing configured exists: empty, not an error.
    let cfg = SourcesConfig {
        shm_dir: t.path().join("nope"),
        segment_dirs: vec![t.path().join("nope2")],
        ..Default::default()
    };
    assert!(Discovery::new(&cfg).scan().is_empty());
}

#[test]
fn log_roots_are_found_from_any_directory_above_segments() {
    let t = TempDir::new("roots");
    let bed = t.path().join("out");
    write_segment(&bed.join("inspector_logs/j1/h1/5"), 2);
    write_segment(&bed.join("inspector_logs/j1/h2/6"), 2);
    let archive = t.path().join("archive");
    std::fs::create_dir_all(archive.join("raw/j9/h/1")).unwrap();
    std::fs::write(archive.join("raw/j9/h/1/seg-000000.cis.zst"), b"x").unwrap();
    std::fs::create_dir_all(t.path().join("empty/a/b")).unwrap();

    let logs = bed.join("inspector_logs");
    let just_logs = vec![logs.clone()];
    assert_eq!(find_log_roots(&bed), just_logs);
    assert_eq!(find_log_roots(&logs), just_logs);
    assert_eq!(find_log_roots(&logs.join("j1")), just_logs);
    assert_eq!(find_log_roots(&logs.join("j1/h1/5")), just_logs);
    assert_eq!(find_log_roots(&archive), [archive.join("raw")]);
    assert_eq!(find_log_roots(t.path()), [archive.join("raw"), logs]);
    assert!(find_log_roots(&t.path().join("empty")).is_empty());
    assert!(find_log_roots(&t.path().join("missing")).is_empty());
}

#[test]
fn a_ring_alone_is_followed_and_its_gaps_counted() {
    let t = TempDir::new("ringonly");
    let path = t.path().join("j.h.77.ring");
    let ring = ShmRing::create(&path, 64).unwrap();
    let mut c = StreamCursor::new(
        StreamId::new("j", "h", "77"),
        None,
        Some(path.clone()),
        None,
    )
    .with_proc_root(t.path().join("proc"))
    .with_stale_after(Duration::from_secs(5));
    let mut out = Vec::new();
    for i in 0..10 {
        assert!(ring.push(&op(i)));
    }
    c.poll(&mut out, 1000).unwrap();
    assert_eq!(out.len(), 10);
    // The drain pops; 100 more lap the 64-slot ring before the next poll.
    let mut sink = Vec::new();
    for i in 10..110 {
        ring.pop_into(&mut sink, usize::MAX);
        assert!(ring.push(&op(i)));
    }
    c.poll(&mut out, 1000).unwrap();
    let st = c.stats();
    assert_eq!(st.records + st.seq_gaps, 110, "{st:?}");
    assert!(st.seq_gaps >= 110 - 10 - 64, "{st:?}");
    assert_eq!(out.last().unwrap().seq(), 109);
    assert!(!c.is_finished());
    // Writer gone (no /proc entry here) and the ring quiet: finished.
    let t0 = Instant::now();
    c.poll_at(&mut out, 1000, t0).unwrap();
    c.poll_at(&mut out, 1000, t0 + Duration::from_secs(6))
        .unwrap();
    assert!(c.is_finished());
}

#[test]
fn ring_records_beyond_a_lap_wait_for_the_disk_while_it_is_written() {
    let t = TempDir::new("lap");
    let dir = t.path().join("logs/j/h/5");
    let path = t.path().join("j.h.5.ring");
    let ring = ShmRing::create(&path, 64).unwrap();
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: dir.clone(),
            ..Default::default()
        },
        5,
    );
    let drain = |w: &mut SegmentWriter| {
        let mut buf = Vec::new();
        ring.pop_into(&mut buf, usize::MAX);
        w.write(&buf);
        w.flush();
    };
    for i in 0..20 {
        assert!(ring.push(&op(i)));
    }
    drain(&mut w);
    let mut c = StreamCursor::new(StreamId::new("j", "h", "5"), Some(dir), Some(path), None);
    let mut out = Vec::new();
    c.poll(&mut out, 1000).unwrap();
    assert_eq!(out.len(), 20);
    // 200 records pass through the ring; the drain writes only the first 100 for now.
    let mut held = Vec::new();
    for i in 20..220 {
        assert!(ring.push(&op(i)));
        ring.pop_into(&mut held, usize::MAX);
    }
    w.write(&held[..100]);
    w.flush();
    c.poll(&mut out, 1000).unwrap();
    assert_eq!(
        out.last().unwrap().seq(),
        119,
        "the disk is being written: wait for it"
    );
    w.write(&held[100..]);
    w.flush();
    c.poll(&mut out, 1000).unwrap();
    let seqs: Vec<u64> = out.iter().map(|r| r.seq()).collect();
    assert_eq!(seqs, (0..220).collect::<Vec<_>>());
    assert_eq!(c.stats().seq_gaps, 0);
}

//! A cursor made from a ring alone takes the segment directory when it appears (discovery
//! often sees a process' ring before the plugin created its segment directory).

use std::path::{Path, PathBuf};
use std::time::Duration;

use comminsight_wire::record::{Body, OpRecord, ProcStart, RawRecord, Record};
use comminsight_wire::ring::ShmRing;
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};

use super::StreamCursor;
use crate::stream::StreamId;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let p = std::env::temp_dir().join(format!("ciagent-{tag}-{}-{nanos}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn op(n: u64) -> RawRecord {
    Record::new(Body::Coll(OpRecord {
        coll_local_sn: n,
        ..Default::default()
    }))
    .encode()
}

fn seqs(recs: &[RawRecord]) -> Vec<u64> {
    recs.iter().map(|r| r.seq()).collect()
}

#[test]
fn a_ring_only_cursor_takes_the_segment_directory_when_it_appears() {
    let t = TempDir::new("cur-late-dir");
    let seg_dir = t.path().join("logs/j1/h1/4242");
    let ring_path = t.path().join("shm/j1.h1.4242.ring");
    std::fs::create_dir_all(ring_path.parent().unwrap()).unwrap();
    let ring = ShmRing::create(&ring_path, 1024).unwrap();
    let start = Record::new(Body::ProcStart(ProcStart {
        pid: 4242,
        mono_ns: 7,
        real_ns: 1_700_000_000_000_000_007,
        ..Default::default()
    }))
    .encode();
    assert!(ring.push(&start));
    for i in 1..=10 {
        assert!(ring.push(&op(i)));
    }
    // Discovery saw the ring only: the segment directory does not exist yet.
    let id = StreamId::new("j1", "h1", "4242");
    let mut c = StreamCursor::new(id, None, Some(ring_path.clone()), None)
        .with_proc_root(t.path().join("proc"));
    let mut out = Vec::new();
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..11).collect::<Vec<_>>());

    // The drain thread writes what the ring held, then 5 more records reach the ring and the
    // disk between two polls; the process exits (segment sealed, ring unlinked).
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: seg_dir.clone(),
            max_segment_bytes: 1 << 20,
            max_segment_age: Duration::from_secs(3600),
            retention_bytes: u64::MAX,
        },
        4242,
    );
    let mut buf = Vec::new();
    ring.pop_into(&mut buf, usize::MAX);
    w.set_preamble(vec![buf[0]]);
    for i in 11..=15 {
        assert!(ring.push(&op(i)));
    }
    ring.pop_into(&mut buf, usize::MAX);
    w.write(&buf);
    w.flush();
    w.seal();
    ring.unlink();

    // Rediscovered with its directory: the cursor reads the disk for what the ring never
    // showed it, repeats nothing, and offers the segment to the archive.
    c.set_seg_dir(Some(seg_dir.clone()));
    c.set_ring(Some(ring_path));
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(seqs(&out), (0..16).collect::<Vec<_>>());
    let st = c.stats();
    assert_eq!(
        (st.from_ring, st.from_segments, st.seq_gaps, st.corrupt),
        (11, 5, 0, 0)
    );
    let sealed = c.take_sealed();
    assert_eq!(sealed.iter().map(|s| s.index).collect::<Vec<_>>(), [0]);
    assert!(!sealed[0].abandoned);
    assert!(c.is_finished());
    assert_eq!(c.checkpoint().disk_seq, Some(15));

    // A directory once followed is kept.
    c.set_seg_dir(Some(t.path().join("elsewhere")));
    c.set_seg_dir(None);
    c.poll(&mut out, 10_000).unwrap();
    assert_eq!(out.len(), 16);
}

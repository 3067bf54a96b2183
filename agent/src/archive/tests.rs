//! Unit tests of the archive: layout, atomic rewrite, retention with an injected `now`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use super::*;

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ci-archive-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

use comminsight_wire::record::{CommInit, OpRecord, Record, FLAG_REPEAT};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::{Body, Func};

fn cfg(dir: &Path) -> ArchiveConfig {
    ArchiveConfig {
        dir: dir.to_path_buf(),
        ..ArchiveConfig::default()
    }
}

fn rec(seq: u64, body: Body) -> RawRecord {
    let mut r = Record::new(body);
    r.seq = seq;
    r.encode()
}

/// A sealed segment with a comm_init and `ops` collectives; returns its path and raw records.
fn segment(root: &Path, ops: u64) -> (PathBuf, Vec<RawRecord>) {
    let dir = root.join("logs/j1/h1/42");
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: dir.clone(),
            ..Default::default()
        },
        42,
    );
    let mut recs = vec![rec(
        1,
        Body::CommInit(CommInit {
            comm_hash: 0xabc,
            time_ns: 1_795_969_683_000_000_000,
            comm_name: "dp".into(),
            ..Default::default()
        }),
    )];
    for i in 0..ops {
        recs.push(rec(
            2 + i,
            Body::Coll(OpRecord {
                comm_hash: 0xabc,
                coll_sn: i,
                start_ns: 1_795_969_683_000_000_000 + i * 1000,
                end_ns: 1_795_969_683_000_000_500 + i * 1000,
                func: Func::ALL_REDUCE,
                ..Default::default()
            }),
        ));
    }
    w.write(&recs);
    w.seal();
    (dir.join("seg-000000.cis"), recs)
}

fn parquet_rows(path: &Path) -> i64 {
    use ::parquet::file::reader::{FileReader, SerializedFileReader};
    let r = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    r.metadata().file_metadata().num_rows()
}

#[test]
fn archives_raw_and_parquet_and_repeats_identically() {
    let d = TempDir::new("roundtrip");
    let (seg, _) = segment(d.path(), 10);
    // A torn tail after a crash.
    let mut bytes = std::fs::read(&seg).unwrap();
    let whole = bytes.clone();
    bytes.extend_from_slice(&[0x43; 50]);
    std::fs::write(&seg, &bytes).unwrap();
    let recovered = [rec(
        12,
        Body::Coll(OpRecord {
            comm_hash: 0xabc,
            start_ns: 5,
            ..Default::default()
        }),
    )];
    let a = Archive::open(&cfg(&d.path().join("arch"))).unwrap();
    let id = StreamId::new("j1", "h1", "42");
    assert!(!a.contains(&id, 0));
    let input = SegmentInput {
        id: &id,
        index: 0,
        path: &seg,
        recovered: &recovered,
        align: Alignment {
            offset_ns: 10,
            err_ns: 3,
        },
        gpu_align: None,
    };
    let out = a.archive_segment(input).unwrap();
    assert!(a.contains(&id, 0));
    assert_eq!(out.torn_bytes, 50);
    assert_eq!(out.records, 1 + 11 + 1);
    assert_eq!(out.rows, 11 + 1, "segment header not a row");
    let raw = zstd::decode_all(std::fs::File::open(&out.raw_path).unwrap()).unwrap();
    let mut expect = whole;
    expect.extend_from_slice(&recovered[0].0);
    assert_eq!(raw, expect);
    let pq = out.parquet_path.clone().unwrap();
    // The hour partition is the segment header's creation time (the writer's wall clock).
    let created = comminsight_wire::segment::read_segment(&seg)
        .unwrap()
        .header()
        .unwrap()
        .created_real_ns;
    let hour = super::parquet_file::hour_of_ns(created);
    assert!(
        pq.ends_with(format!(
            "parquet/job=j1/host=h1/hour={hour}/42-seg-000000.parquet"
        )),
        "{}",
        pq.display()
    );
    assert_eq!(parquet_rows(&pq), 12);
    let first = (
        std::fs::read(&out.raw_path).unwrap(),
        std::fs::read(&pq).unwrap(),
    );
    let again = a.archive_segment(input).unwrap();
    assert_eq!(again, out);
    assert_eq!(first.0, std::fs::read(&out.raw_path).unwrap());
    assert_eq!(first.1, std::fs::read(&pq).unwrap());
    let files = retention::list_files(a.dir(), true).unwrap();
    assert_eq!(files.len(), 2, "no tmp left, no duplicate: {files:?}");
    assert_eq!(a.stats().snapshot().segments, 2);
}

/// `seg` archived as segment 0 of stream j1/h1/42 into a new archive at `dir`.
fn archive_once(dir: &Path, seg: &Path) -> ArchivedSegment {
    let a = Archive::open(&cfg(dir)).unwrap();
    let id = StreamId::new("j1", "h1", "42");
    a.archive_segment(SegmentInput {
        id: &id,
        index: 0,
        path: seg,
        recovered: &[],
        align: Alignment::default(),
        gpu_align: None,
    })
    .unwrap()
}

#[test]
fn number_columns_are_delta_coded_and_statistics_are_where_queries_filter() {
    use ::parquet::basic::Encoding;
    use ::parquet::file::reader::{FileReader, SerializedFileReader};
    use ::parquet::file::statistics::Statistics;
    let d = TempDir::new("pqmeta");
    let (seg, _) = segment(d.path(), 100);
    let out = archive_once(&d.path().join("arch"), &seg);
    let r =
        SerializedFileReader::new(std::fs::File::open(out.parquet_path.unwrap()).unwrap()).unwrap();
    let rg = r.metadata().row_group(0);
    let column = |name: &str| {
        rg.columns()
            .iter()
            .find(|c| c.column_path().string() == name)
            .unwrap_or_else(|| panic!("column {name}"))
    };
    for name in ["seq", "start_ns", "coll_sn", "rank", "flags"] {
        let encs: Vec<Encoding> = column(name).encodings().collect();
        assert!(
            encs.contains(&Encoding::DELTA_BINARY_PACKED),
            "{name}: {encs:?}"
        );
    }
    assert!(column("func")
        .encodings()
        .any(|e| e == Encoding::RLE_DICTIONARY));
    // The 100 ops start 1 µs apart from 1_795_969_683 s, the comm_init's event time.
    match column("start_ns").statistics() {
        Some(Statistics::Int64(s)) => {
            assert_eq!(s.min_opt(), Some(&1_795_969_683_000_000_000));
            assert_eq!(s.max_opt(), Some(&1_795_969_683_000_099_000));
            assert_eq!(s.null_count_opt(), Some(0));
        }
        other => panic!("start_ns statistics: {other:?}"),
    }
    for name in super::parquet_file::NO_STATISTICS {
        let s = column(name).statistics();
        assert!(
            s.is_none_or(|s| s.min_bytes_opt().is_none()),
            "{name}: {s:?}"
        );
    }
}

#[test]
fn preamble_repeats_and_corrupt_records_are_not_rows() {
    let d = TempDir::new("repeats");
    let (seg, recs) = segment(d.path(), 3);
    let mut bytes = std::fs::read(&seg).unwrap();
    let mut rep = recs[0];
    rep.0[6] |= FLAG_REPEAT as u8;
    bytes.extend_from_slice(&rep.0);
    bytes.extend_from_slice(&[0u8; 128]); // bad magic
    std::fs::write(&seg, &bytes).unwrap();
    let out = archive_once(&d.path().join("arch"), &seg);
    assert_eq!(out.bad_records, 1);
    assert_eq!(out.records, 1 + 4 + 2);
    assert_eq!(out.rows, 4);
    assert_eq!(parquet_rows(out.parquet_path.as_ref().unwrap()), 4);
}

#[test]
fn bad_inputs_are_typed_errors_naming_the_input() {
    let d = TempDir::new("bad");
    let a = Archive::open(&cfg(d.path())).unwrap();
    let id = StreamId::new("j1", "h1", "42");
    let missing = d.path().join("nope/seg-000001.cis");
    let input = SegmentInput {
        id: &id,
        index: 1,
        path: &missing,
        recovered: &[],
        align: Alignment::default(),
        gpu_align: None,
    };
    let e = a.archive_segment(input).unwrap_err();
    assert!(e.to_string().contains("nope/seg-000001.cis"), "{e}");
    let evil = StreamId::new("..", "h1", "42");
    let e = a
        .archive_segment(SegmentInput { id: &evil, ..input })
        .unwrap_err();
    assert!(
        matches!(e, ArchiveError::BadStreamId { what: "job", .. }),
        "{e}"
    );
    assert_eq!(a.stats().snapshot().errors, 2);
}

#[test]
fn open_removes_stale_tmp_files() {
    let d = TempDir::new("tmp");
    let stale = d.path().join("raw/j/h/1/.seg-000000.cis.zst.9-0.tmp");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, b"partial").unwrap();
    let keep = d.path().join("raw/j/h/1/seg-000000.cis.zst");
    std::fs::write(&keep, b"done").unwrap();
    Archive::open(&cfg(d.path())).unwrap();
    assert!(!stale.exists());
    assert!(keep.exists());
}

/// `n` files of `size` bytes, file i archived `n - i` days before `now`.
fn aged_files(dir: &Path, n: u64, size: usize, now: SystemTime) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("raw/j/h/{i}/seg-{i:06}.cis.zst"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![1u8; size]).unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(now - Duration::from_secs((n - i) * 86_400))
                .unwrap();
            p
        })
        .collect()
}

#[test]
fn retention_deletes_oldest_first_by_size_and_age() {
    let d = TempDir::new("retention");
    let now = SystemTime::now();
    let files = aged_files(d.path(), 5, 100, now);
    let mut c = cfg(d.path());
    c.retention_bytes = 250;
    c.retention_days = 0;
    let a = Archive::open(&c).unwrap();
    let rep = a.enforce_retention(now);
    assert_eq!((rep.deleted_files, rep.deleted_bytes), (3, 300));
    assert_eq!(
        (rep.kept_files, rep.kept_bytes, rep.over_budget),
        (2, 200, false)
    );
    assert!(files[..3].iter().all(|p| !p.exists()));
    assert!(files[3..].iter().all(|p| p.exists()));
    assert!(!d.path().join("raw/j/h/0").exists(), "empty dirs pruned");
    assert!(d.path().join("raw").is_dir());
    // Age (1 day, checked 12 h ago): the file archived 2 days ago goes, yesterday's stays.
    c.retention_bytes = u64::MAX;
    c.retention_days = 1;
    let a = Archive::open(&c).unwrap();
    let rep = a.enforce_retention(now - Duration::from_secs(12 * 3600));
    assert_eq!(rep.deleted_files, 1);
    assert!(!files[3].exists() && files[4].exists());
    assert_eq!(
        a.enforce_retention(now - Duration::from_secs(3600))
            .deleted_files,
        0
    );
    assert_eq!(a.stats().snapshot().stored_bytes, 100);
}

#[test]
fn retention_keeps_files_waiting_for_upload() {
    let d = TempDir::new("retention-upload");
    let now = SystemTime::now();
    let files = aged_files(d.path(), 4, 100, now);
    let mut c = cfg(d.path());
    c.retention_bytes = 100;
    c.object_store.enabled = true;
    // Only the two oldest are uploaded.
    let mut j = journal::Journal::load(d.path()).unwrap();
    for (i, p) in files.iter().enumerate().take(2) {
        let v = journal::version_of(&std::fs::metadata(p).unwrap());
        j.record(&format!("raw/j/h/{i}/seg-{i:06}.cis.zst"), v)
            .unwrap();
    }
    let a = Archive::open(&c).unwrap();
    let rep = a.enforce_retention(now);
    assert_eq!(rep.deleted_files, 2);
    assert_eq!(
        (rep.waiting_upload_files, rep.waiting_upload_bytes),
        (2, 200)
    );
    assert!(rep.over_budget);
    assert_eq!(
        rep.warning().unwrap(),
        "archive over budget, 200 bytes waiting for upload"
    );
    assert!(files[2].exists() && files[3].exists());
}

#[test]
fn contains_survives_retention_and_restart() {
    let d = TempDir::new("contains");
    let (seg, _) = segment(d.path(), 2);
    let mut c = cfg(&d.path().join("arch"));
    let id = StreamId::new("j1", "h1", "42");
    let a = Archive::open(&c).unwrap();
    a.archive_segment(SegmentInput {
        id: &id,
        index: 0,
        path: &seg,
        recovered: &[],
        align: Alignment::default(),
        gpu_align: None,
    })
    .unwrap();
    c.retention_bytes = 0;
    let a = Archive::open(&c).unwrap();
    assert_eq!(a.enforce_retention(SystemTime::now()).kept_files, 0);
    assert!(!a.raw_path(&id, 0).exists());
    assert!(a.contains(&id, 0));
    assert!(!a.contains(&id, 1));
    assert!(!a.contains(&StreamId::new("j1", "h1", "43"), 0));
}

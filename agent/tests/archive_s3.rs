//! Upload of the archive to a real S3-compatible server (moto_server from the test venv):
//! upload, no re-upload after a restart, store down -> files stay spooled and retention keeps
//! them, store back (empty, new instance) -> everything not yet uploaded arrives.

mod archive_util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use archive_util::{free_port, python, tool, wait_for, write_process, TempDir};
use comminsight_agent::archive::{Archive, ArchiveStats, SegmentInput, Uploader, MULTIPART_BYTES};
use comminsight_agent::config::{ArchiveConfig, ObjectStoreConfig};
use comminsight_agent::stream::{Alignment, StreamId};
use comminsight_wire::segment::{find_segments, parse_segment_name};

const BUCKET: &str = "ci-archive";
const PREFIX: &str = "site1/archive";

/// A moto_server on 127.0.0.1:port, killed on drop.
struct Moto(Child);

impl Moto {
    fn start(port: u16) -> Moto {
        let child = Command::new(tool("venv/bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let m = Moto(child);
        assert!(
            wait_for(30, || std::net::TcpStream::connect(("127.0.0.1", port))
                .is_ok()),
            "moto_server did not listen on {port}"
        );
        s3(port, "create", &[]);
        m
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn s3(port: u16, cmd: &str, extra: &[&str]) -> String {
    let ep = format!("http://127.0.0.1:{port}");
    let mut args = vec![ep.as_str(), BUCKET, cmd];
    args.extend_from_slice(extra);
    python("archive_s3.py", &args)
}

type Listing = BTreeMap<String, (u64, String)>;

fn parse(json: &str) -> Listing {
    let v: BTreeMap<String, (u64, String)> = serde_json::from_str(json).unwrap();
    v
}

/// The store's objects, keys without the prefix.
fn store(port: u16) -> Listing {
    parse(&s3(port, "list", &[]))
        .into_iter()
        .map(|(k, v)| {
            (
                k.strip_prefix(&format!("{PREFIX}/")).unwrap().to_string(),
                v,
            )
        })
        .collect()
}

/// The archive's files (raw/, parquet/) by relative path.
fn local(root: &Path) -> Listing {
    parse(&python(
        "archive_s3.py",
        &["-", "-", "hash", root.to_str().unwrap()],
    ))
    .into_iter()
    .filter(|(k, _)| k.starts_with("raw/") || k.starts_with("parquet/"))
    .collect()
}

fn archive_logs(a: &Archive, logs: &Path) {
    for seg in find_segments(logs).unwrap() {
        let id = StreamId::from_dir(logs, seg.parent().unwrap()).unwrap();
        let (index, _) = parse_segment_name(seg.file_name().unwrap().to_str().unwrap()).unwrap();
        if !a.contains(&id, index) {
            a.archive_segment(SegmentInput {
                id: &id,
                index,
                path: &seg,
                recovered: &[],
                align: Alignment::default(),
                gpu_align: None,
            })
            .unwrap();
        }
    }
}

/// A file above the multipart threshold (incompressible bytes) in the archive's raw tree.
fn big_file(root: &Path) -> PathBuf {
    let p = root.join("raw/jbig/h/1/seg-000000.cis.zst");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = Vec::with_capacity(MULTIPART_BYTES as usize + 3_000_000);
    while data.len() < MULTIPART_BYTES as usize + 3_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(&p, data).unwrap();
    p
}

#[test]
fn upload_spools_while_the_store_is_down_and_loses_nothing() {
    let d = TempDir::new("s3");
    let logs = d.path().join("logs");
    let root = d.path().join("archive");
    let port = free_port();
    let cfg = ArchiveConfig {
        dir: root.clone(),
        retention_bytes: u64::MAX,
        retention_days: 0,
        object_store: ObjectStoreConfig {
            enabled: true,
            bucket: BUCKET.into(),
            prefix: format!("/{PREFIX}/"),
            endpoint: format!("http://127.0.0.1:{port}"),
            allow_http: true,
            retry_initial_ms: 50,
            retry_max_ms: 400,
            ..Default::default()
        },
        ..Default::default()
    };
    let creds = || Some(("test".to_string(), "test".to_string()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let archive = Archive::open(&cfg).unwrap();
    let stats: Arc<ArchiveStats> = archive.stats();

    // 1. Store up: everything is uploaded, the big file in parts.
    let moto = Moto::start(port);
    write_process(&logs, "job1", "h1", 10, 0);
    archive_logs(&archive, &logs);
    big_file(&root);
    let up = Uploader::with_credentials(&cfg, creds())
        .unwrap()
        .with_stats(stats.clone());
    let rep = rt.block_on(up.upload_pending());
    assert_eq!(rep.error, None);
    assert_eq!(rep.uploaded_files, 5, "{rep:?}");
    assert_eq!(store(port), local(&root));
    // Nothing is uploaded twice: not by the same uploader, not after a restart.
    assert_eq!(rt.block_on(up.upload_pending()).uploaded_files, 0);
    drop(up);
    let up = Uploader::with_credentials(&cfg, creds()).unwrap();
    let rep = rt.block_on(up.upload_pending());
    assert_eq!((rep.uploaded_files, rep.skipped_files), (0, 5));
    drop(up);

    // 2. Store down: uploads fail softly, new files stay spooled, retention keeps them.
    drop(moto);
    write_process(&logs, "job1", "h2", 11, 1);
    archive_logs(&archive, &logs);
    let up = Uploader::with_credentials(&cfg, creds())
        .unwrap()
        .with_stats(stats.clone());
    let rep = rt.block_on(up.upload_pending());
    assert!(rep.error.is_some(), "{rep:?}");
    assert_eq!((rep.uploaded_files, rep.pending_files), (0, 4), "{rep:?}");
    let spooled: Listing = local(&root)
        .into_iter()
        .filter(|(k, _)| k.contains("h2"))
        .collect();
    assert_eq!(spooled.len(), 4);
    let retention = Archive::open(&ArchiveConfig {
        retention_bytes: 0,
        ..cfg.clone()
    })
    .unwrap()
    .enforce_retention(SystemTime::now());
    assert_eq!(
        retention.deleted_files, 5,
        "uploaded files may go: {retention:?}"
    );
    assert_eq!(retention.waiting_upload_files, 4);
    assert!(retention
        .warning()
        .unwrap()
        .contains("bytes waiting for upload"));
    assert_eq!(
        local(&root),
        spooled,
        "nothing waiting for upload was deleted"
    );

    // 3. Store back (a new, empty instance): `run` retries with backoff and uploads the spool.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = rt.spawn(up.run(rx));
    std::thread::sleep(Duration::from_millis(300)); // let it fail and back off at least once
    let failures = stats.snapshot().upload_failures;
    assert!(failures >= 2, "failed passes counted: {failures}");
    let _moto = Moto::start(port);
    assert!(
        wait_for(30, || stats.snapshot().uploaded_files >= 5 + 4
            && stats.snapshot().backlog_files == 0),
        "spool not uploaded: {:?}",
        stats.snapshot()
    );
    assert_eq!(store(port), spooled);
    tx.send(true).unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), task).await })
        .expect("run stops on shutdown")
        .unwrap();
}

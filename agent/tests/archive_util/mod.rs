//! Helpers shared by the archive integration tests: temp dirs, test tools, segment generation.

#![allow(dead_code, reason = "each test file uses a subset")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use comminsight_wire::record::{CommInit, OpRecord, Overdue, ProcStart, RawRecord, Record, Stats};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::{Algo, Body, DataType, Func, Proto};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ci-archive-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `$COMMINSIGHT_TEST_TOOLS/<rel>`, which must exist.
pub fn tool(rel: &str) -> PathBuf {
    let root = std::env::var_os("COMMINSIGHT_TEST_TOOLS").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-tools")),
        PathBuf::from,
    );
    let p = root.join(rel);
    assert!(
        p.exists(),
        "missing test tool {}: run `cargo xtask deps`",
        p.display()
    );
    p
}

/// Run `agent/tests/py/<script>` with the venv's python; returns stdout (panics on failure).
pub fn python(script: &str, args: &[&str]) -> String {
    let py = tool("venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let out = Command::new(py)
        .arg(&script)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind port 0")
        .local_addr()
        .expect("local addr")
        .port()
}

/// Poll `cond` every 50 ms for up to `secs` seconds.
pub fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cond()
}

/// What a generated process stream holds.
#[derive(Clone, Debug, Default)]
pub struct Written {
    /// (comm hash, comm name, coll + p2p records) per comm.
    pub ops: Vec<(u64, String, u64)>,
    /// Records written (not counting segment headers and repeats).
    pub records: u64,
}

/// Base time of generated records: 2026-11-29T16:28:03Z.
pub const T0: u64 = 1_795_969_683_000_000_000;

fn rec(seq: &mut u64, body: Body) -> RawRecord {
    let mut r = Record::new(body);
    r.seq = *seq;
    *seq += 1;
    r.encode()
}

fn op(comm: u64, i: u64, rank: i32, peer: i32, func: Func) -> OpRecord {
    OpRecord {
        comm_hash: comm,
        coll_sn: i,
        coll_local_sn: i,
        count: 1024 * (i + 1),
        bytes: 4096 * (i + 1),
        enqueue_ns: T0 + i * 10_000,
        start_ns: T0 + i * 10_000 + 100,
        end_ns: T0 + i * 10_000 + 5_000,
        gpu_start_ns: 7_000 + i,
        gpu_end_ns: 9_000 + i,
        rank,
        root: -1,
        peer,
        func,
        datatype: DataType::from_name("ncclFloat32"),
        algo: Algo::from_name("RING"),
        proto: Proto::from_name("SIMPLE"),
        nchannels: 2,
        api_ns: 3,
        nwarps: 16,
        channels_done: 2,
        ..Default::default()
    }
}

/// Write two sealed segments for process `pid` under `logs/<job>/<host>/<pid>`: the first with
/// `proc_start`, three comm_inits and coll/p2p records; the second (with a preamble of the
/// process' live records) with more ops, an `overdue` and a `stats` record.
/// `salt` varies the op counts between processes.
pub fn write_process(logs: &Path, job: &str, host: &str, pid: u32, salt: u64) -> Written {
    let dir = logs.join(job).join(host).join(pid.to_string());
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir,
            ..Default::default()
        },
        pid,
    );
    let comms = [
        (0x1111_0000_0000_0001u64, "dp"),
        (0x2222_0000_0000_0002u64, "tp:stage1"),
        (0xf333_0000_0000_0003u64, "pp"),
    ];
    let mut seq = 1u64;
    let mut out = Written::default();
    let ps = rec(
        &mut seq,
        Body::ProcStart(ProcStart {
            pid,
            rank: salt as i32,
            real_ns: T0,
            host: host.into(),
            job: job.into(),
            ..Default::default()
        }),
    );
    let mut first = vec![ps];
    let mut preamble = vec![ps];
    for (h, name) in comms {
        let r = rec(
            &mut seq,
            Body::CommInit(CommInit {
                comm_hash: h,
                nranks: 8,
                rank: salt as i32,
                time_ns: T0 + 1,
                comm_name: name.into(),
                ..Default::default()
            }),
        );
        first.push(r);
        preamble.push(r);
        out.ops.push((h, name.into(), 0));
    }
    let ops = |seq: &mut u64, n: u64, out: &mut Written, recs: &mut Vec<RawRecord>| {
        for i in 0..n {
            let c = (i % 3) as usize;
            let h = comms[c].0;
            let body = if c == 2 {
                Body::P2p(op(h, i, salt as i32, (salt as i32 + 1) % 8, Func::SEND))
            } else {
                Body::Coll(op(h, i, salt as i32, -1, Func::ALL_REDUCE))
            };
            recs.push(rec(seq, body));
            out.ops[c].2 += 1;
        }
    };
    ops(&mut seq, 40 + salt, &mut out, &mut first);
    w.write(&first);
    w.seal();
    w.set_preamble(preamble);
    let mut second = Vec::new();
    ops(&mut seq, 25 + 2 * salt, &mut out, &mut second);
    second.push(rec(
        &mut seq,
        Body::Overdue(Overdue {
            comm_hash: comms[0].0,
            coll_sn: 99,
            enqueue_ns: T0 + 9_000_000,
            now_ns: T0 + 40_000_000_000,
            age_ms: 31_000,
            threshold_ms: 30_000,
            func: Func::ALL_REDUCE,
            ..Default::default()
        }),
    ));
    second.push(rec(
        &mut seq,
        Body::Stats(Stats {
            time_ns: T0 + 50_000_000_000,
            records_pushed: 1000,
            ..Default::default()
        }),
    ));
    w.write(&second);
    w.seal();
    out.records = seq - 1;
    out
}

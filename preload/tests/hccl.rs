//! The HCCL interposition in real processes: two Python ranks drive the libhccl stand-in through
//! ctypes with `LD_PRELOAD=libcomminsight-preload.so` and no NCCL anywhere; the plugin (loaded by
//! the shim) writes `comm_init` / `coll` / `p2p` records flagged `FLAG_HCCL`. Needs
//! `cargo xtask build` first.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use comminsight_wire::record::{Body, Record, Timing, FLAG_HCCL, FLAG_INCOMPLETE};
use comminsight_wire::segment::{find_segments, read_segment};
use common::{lib_dir, Children, TempDir};

const NRANKS: usize = 2;
/// Operations each rank issues on its first communicator (hccl_child.py; one more on the second).
const OPS: u64 = 12;

/// Run the two ranks; their stdout's last line (`ok [stats]`) parsed.
fn run(dir: &Path, preload: bool, env: &[(&str, &str)]) -> Vec<Vec<u64>> {
    let lib = lib_dir();
    assert!(lib.join("libhccl.so").exists(), "run `cargo xtask build`");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hccl_child.py");
    let mut kids = Children(Vec::new());
    for r in 0..NRANKS {
        let mut c = Command::new("python3");
        c.arg(script)
            .arg(r.to_string())
            .arg(NRANKS.to_string())
            .arg(dir)
            .arg(&lib)
            .env("COMMINSIGHT_LOG_DIR", dir.join("logs"))
            .env("COMMINSIGHT_JOB_ID", "hccl")
            .env("COMMINSIGHT_SHM_DIR", dir.join("shm"))
            .env_remove("NCCL_PROFILER_PLUGIN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if preload {
            c.env("LD_PRELOAD", lib.join("libcomminsight-preload.so"));
        }
        for (k, v) in env {
            c.env(k, v);
        }
        kids.0.push(c.spawn().expect("python3"));
    }
    let mut stats = Vec::new();
    for k in std::mem::take(&mut kids.0) {
        let o = k.wait_with_output().expect("rank output");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "rank failed: {out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let line = out.lines().last().and_then(|l| l.strip_prefix("ok "));
        stats.push(serde_json(line.expect("ok line")));
    }
    stats
}

fn serde_json(s: &str) -> Vec<u64> {
    s.trim_matches(['[', ']'])
        .split(',')
        .map(|v| v.trim().parse().expect("u64"))
        .collect()
}

/// Every record of every rank process (by pid directory).
fn records(dir: &Path) -> Vec<Vec<Record>> {
    let root = dir.join("logs").join("hccl");
    let mut out = Vec::new();
    let Ok(hosts) = std::fs::read_dir(&root) else {
        return out;
    };
    for h in hosts.flatten() {
        for p in std::fs::read_dir(h.path()).expect("pids").flatten() {
            let mut recs = Vec::new();
            for s in find_segments(&p.path()).expect("segments") {
                recs.extend(read_segment(&s).expect("segment").records);
            }
            out.push(recs);
        }
    }
    out
}

#[test]
fn hccl_ops_become_flagged_records_closed_by_stream_events() {
    let t = TempDir::new("hccl");
    let stats = run(t.path(), true, &[("CHILD_COMM_NAME", "tp:mine")]);
    for s in &stats {
        assert_eq!(s[0], OPS, "recorded: {s:?}");
        assert_eq!(s[5], OPS, "closed by their stream event: {s:?}");
        assert_eq!(&s[1..5], &[0, 0, 0, 0], "no failures: {s:?}");
    }
    let procs = records(t.path());
    assert_eq!(procs.len(), NRANKS);
    // Per process: (comm hash, name) of its communicators in order.
    let mut comms: Vec<Vec<(u64, String)>> = Vec::new();
    for recs in &procs {
        let mut seqs: BTreeMap<(u64, String), Vec<u64>> = BTreeMap::new();
        let mut mine = Vec::new();
        let mut fini = BTreeMap::new();
        let mut ops = 0;
        for r in recs {
            match &r.body {
                Body::CommInit(c) => {
                    assert_ne!(r.flags & FLAG_HCCL, 0, "{r:?}");
                    assert_eq!(c.nranks as usize, NRANKS, "{c:?}");
                    mine.push((c.comm_hash, c.comm_name.as_str_lossy().to_string()));
                }
                Body::Coll(o) | Body::P2p(o) => {
                    ops += 1;
                    assert_eq!(r.flags, FLAG_HCCL, "complete and HCCL: {r:?}");
                    assert_eq!(o.timing, Timing::KernelCpu, "{o:?}");
                    assert!(
                        o.enqueue_ns <= o.start_ns && o.start_ns <= o.end_ns,
                        "{o:?}"
                    );
                    seqs.entry((o.comm_hash, o.func.name().to_string()))
                        .or_default()
                        .push(o.coll_sn);
                    if o.func.name() == "AllGather" {
                        assert_eq!((o.count, o.bytes), (8, 32), "{o:?}");
                    }
                }
                Body::CommFini(c) => {
                    assert_ne!(r.flags & FLAG_HCCL, 0);
                    fini.insert(c.comm_hash, (c.ops, c.open_ops));
                }
                _ => {}
            }
        }
        assert_eq!(ops, OPS + 1);
        assert_eq!(
            mine.len(),
            2,
            "root-info and cluster communicators: {mine:?}"
        );
        let (root, cluster) = (mine[0].0, mine[1].0);
        assert_ne!(root, cluster);
        assert_eq!(mine[0].1, "tp:mine", "the caller's hcclCommName");
        assert_eq!(mine[1].1, "", "no name given, none announced");
        assert_eq!(fini[&root], (OPS, 0));
        assert_eq!(fini[&cluster], (1, 0));
        // Sequence numbers per (comm, func), the barrier counted as an all-reduce.
        let seq = |h: u64, f: &str| seqs[&(h, f.to_string())].clone();
        assert_eq!(seq(root, "AllReduce"), vec![0, 1, 2, 3], "{seqs:?}");
        assert_eq!(seq(root, "AlltoAll"), vec![0, 1], "{seqs:?}");
        assert_eq!(seq(root, "Send"), vec![0]);
        assert_eq!(seq(root, "Recv"), vec![0]);
        assert_eq!(seq(cluster, "AllReduce"), vec![0]);
        comms.push(mine);
    }
    assert_eq!(
        comms[0], comms[1],
        "the same communicators, hashes and names on every rank"
    );
}

#[test]
fn without_events_ops_close_at_return_and_disabled_records_nothing() {
    let t = TempDir::new("hccl-noev");
    let stats = run(
        t.path(),
        true,
        &[
            ("COMMINSIGHT_HCCL_EVENTS", "0"),
            ("COMMINSIGHT_COMM_ROLE", "dp"),
        ],
    );
    for s in &stats {
        assert_eq!((s[0], s[5]), (OPS, 0), "{s:?}");
    }
    for recs in records(t.path()) {
        let ops: Vec<_> = recs
            .iter()
            .filter_map(|r| match &r.body {
                Body::Coll(o) | Body::P2p(o) => Some((r.flags, o.timing)),
                _ => None,
            })
            .collect();
        assert_eq!(ops.len() as u64, OPS + 1);
        for (f, timing) in ops {
            assert_eq!(f & (FLAG_HCCL | FLAG_INCOMPLETE), FLAG_HCCL);
            assert_eq!(timing, Timing::Enqueue);
        }
        let names: Vec<String> = recs
            .iter()
            .filter_map(|r| match &r.body {
                Body::CommInit(c) => Some(c.comm_name.as_str_lossy().to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["dp", "dp"], "no name given: COMMINSIGHT_COMM_ROLE");
    }

    let t = TempDir::new("hccl-off");
    run(t.path(), true, &[("COMMINSIGHT_DISABLE", "1")]);
    assert!(records(t.path()).is_empty(), "disabled: forwarded only");
    let t = TempDir::new("hccl-none");
    run(t.path(), false, &[]);
    assert!(
        records(t.path()).is_empty(),
        "no shim: HCCL has no recorder"
    );
}

//! Tests on the real traces in shared/data/real-traces/hta-kineto-nccl and generated ones.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use comminsight_wire::names::Func;
use comminsight_wire::record::Body;

use super::*;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/real-traces/hta-kineto-nccl")
        .join(name)
}

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ci-import-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every record of every segment under `dir`, asserting none is invalid.
pub(crate) fn read_all(dir: &Path) -> Vec<Body> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "cis") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(!files.is_empty(), "no segment under {}", dir.display());
    let mut out = Vec::new();
    for f in files {
        let r = comminsight_wire::segment::read_segment(&f).unwrap();
        assert!(r.bad.is_empty(), "{}: {:?}", f.display(), r.bad);
        out.extend(r.records.into_iter().map(|r| r.body));
    }
    out
}

fn ops(bodies: &[Body]) -> Vec<&comminsight_wire::record::OpRecord> {
    bodies
        .iter()
        .filter_map(|b| match b {
            Body::Coll(o) | Body::P2p(o) => Some(o),
            _ => None,
        })
        .collect()
}

fn import(name: &str) -> (ImportSummary, Vec<StepTruth>, Vec<Body>) {
    let dir = TempDir::new("kineto");
    let mut calls = 0;
    let (sum, steps) = import_file(&data(name), "job", &dir.0, &mut |_| calls += 1).unwrap();
    assert!(calls >= 1);
    let bodies = read_all(&dir.0);
    (sum, steps, bodies)
}

fn step_numbers(steps: &[StepTruth]) -> Vec<u64> {
    steps
        .iter()
        .filter(|s| s.track == "cpu")
        .map(|s| s.step)
        .collect()
}

#[test]
fn nccl_parser_config_has_pg_metadata() {
    let (sum, steps, bodies) = import("nccl_parser_config__rank0of2__nccl_data.json.gz");
    assert_eq!(sum.ops, 21, "{sum:?}");
    let ops = ops(&bodies);
    let n = |f: Func| ops.iter().filter(|o| o.func == f).count();
    assert_eq!((n(Func::ALL_REDUCE), n(Func::BROADCAST)), (15, 6));
    let first = ops[0];
    assert_eq!(first.datatype.name(), "ncclFloat32");
    assert!(ops
        .iter()
        .any(|o| o.count == 6_637_568 && o.bytes == 4 * 6_637_568));
    // baseTimeNanoseconds (after traceEvents in the file) is added.
    assert!(
        first.start_ns > 1_711_964_646_000_000_000,
        "{}",
        first.start_ns
    );
    let inits: Vec<_> = bodies
        .iter()
        .filter_map(|b| match b {
            Body::CommInit(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0].comm_name.as_str_lossy(), "default_pg:0");
    assert_eq!((inits[0].nranks, inits[0].rank), (2, 0));
    assert_eq!(inits[0].comm_hash, fnv1a64("kineto:pg:0"));
    assert_eq!(step_numbers(&steps), vec![4, 5, 6]);
    assert!(steps.iter().all(|s| s.end_ns > s.start_ns && s.rank == 0));
    // Per-(comm, func) sequence numbers.
    let ar: Vec<u64> = ops
        .iter()
        .filter(|o| o.func == Func::ALL_REDUCE)
        .map(|o| o.coll_sn)
        .collect();
    assert_eq!(ar, (0..15).collect::<Vec<_>>());
}

#[test]
fn older_traces_use_streams() {
    let cases: [(&str, u64, u64, u64, Vec<u64>); 4] = [
        (
            "trace_diff_control__rank3of8.json.gz",
            60,
            42,
            18,
            (1009..=1014).collect(),
        ),
        (
            "negative_queue_check__rank0of16.json.gz",
            80,
            80,
            0,
            (550..=554).collect(),
        ),
        (
            "trace_filter_sampled__rank0of128.json.gz",
            10,
            10,
            0,
            vec![551, 552],
        ),
        (
            "trace_filter_sampled__rank1of128.json.gz",
            10,
            10,
            0,
            vec![551, 552],
        ),
    ];
    for (name, total, sendrecv, allreduce, want_steps) in cases {
        let (sum, steps, bodies) = import(name);
        let ops = ops(&bodies);
        assert_eq!((sum.ops, ops.len() as u64), (total, total), "{name}");
        let n = |f: Func| ops.iter().filter(|o| o.func == f).count() as u64;
        assert_eq!(
            (n(Func::SEND_RECV), n(Func::ALL_REDUCE)),
            (sendrecv, allreduce),
            "{name}"
        );
        assert_eq!(step_numbers(&steps), want_steps, "{name}");
        assert!(
            ops.windows(2).all(|w| w[0].start_ns <= w[1].start_ns),
            "{name}"
        );
        assert!(bodies.iter().any(
            |b| matches!(b, Body::CommInit(c) if c.comm_name.as_str_lossy().starts_with("stream"))
        ));
        assert_eq!(sum.skipped.total(), 0, "{name}: {:?}", sum.skipped);
    }
}

#[test]
fn truncated_gzip_imports_a_prefix() {
    let src = std::fs::read(data("trace_diff_control__rank3of8.json.gz")).unwrap();
    let dir = TempDir::new("kineto-trunc");
    let p = dir.0.join("half.json.gz");
    std::fs::write(&p, &src[..src.len() / 2]).unwrap();
    let out = dir.0.join("out");
    match import_file(&p, "job", &out, &mut |_| {}) {
        Ok((sum, _)) => {
            assert!(sum.ops > 0 && sum.ops < 60, "{sum:?}");
            let d = sum.skipped.describe().unwrap();
            assert!(d.contains("truncated or corrupt JSON after byte"), "{d}");
            assert_eq!(ops(&read_all(&out)).len() as u64, sum.ops);
        }
        // The kernels may all lie in the second half: then nothing is imported, and it says why.
        Err(e) => assert!(e.to_string().contains("not a readable Kineto trace"), "{e}"),
    }
}

#[test]
fn no_trace_events_is_a_format_error() {
    let e = parse_reader(&b"{\"schemaVersion\": 1}"[..], Path::new("x.json")).unwrap_err();
    assert!(matches!(e, ImportError::Format { .. }), "{e}");
    assert!(e.to_string().contains("x.json"));
}

const KERNEL: &str = r#"{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllGather_RING_LL(x)","pid":0,"tid":7,"ts":TS,"dur":12.5,"args":{"stream":7,"device":0,"Collective name":"_allgather_base","In msg nelems":1024,"dtype":"BFloat16","Process Group Name":"3","Process Group Description":"mesh_tp","Process Group Ranks":[0,1,2,3]}}"#;
const CPU_OP: &str = r#"{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":4242,"tid":4242,"ts":TS,"dur":3,"args":{"External id":1,"Input Dims":[[64,64],[64,64]],"Input type":["float","float"]}}"#;

fn small_trace() -> String {
    let mut s = String::from(
        r#"{"schemaVersion":1,"distributedInfo":{"rank":1,"world_size":4},"traceEvents":["#,
    );
    s.push_str(r#"{"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","pid":4242,"ts":100,"dur":900},"#);
    for i in 0..3 {
        s.push_str(&KERNEL.replace("TS", &(200 + i * 100).to_string()));
        s.push(',');
    }
    s.push_str(&CPU_OP.replace("TS", "150"));
    s.push_str(r#"],"baseTimeNanoseconds":1700000000000000000}"#);
    s
}

#[test]
fn small_trace_in_any_key_order() {
    let t = parse_reader(small_trace().as_bytes(), Path::new("s.json")).unwrap();
    assert_eq!(t.kernels.len(), 3);
    assert_eq!(t.base_ns, Some(1_700_000_000_000_000_000));
    assert_eq!((t.rank, t.world), (1, 4));
    assert_eq!(t.kernels[0].func, Func::ALL_GATHER);
    assert_eq!(t.kernels[0].dtype.name(), "ncclBfloat16");
    let st = t.step_truths();
    assert_eq!(st[0].start_ns, 1_700_000_000_000_100_000);
    let dir = TempDir::new("kineto-small");
    let sum = write::write_trace(&t, "j", &dir.0).unwrap();
    assert_eq!(sum.ops, 3);
    let bodies = read_all(&dir.0);
    let init = bodies.iter().find_map(|b| match b {
        Body::CommInit(c) => Some(c.clone()),
        _ => None,
    });
    let init = init.unwrap();
    assert_eq!((init.nranks, init.rank), (4, 1));
    assert_eq!(init.comm_name.as_str_lossy(), "mesh_tp:3");
    let o = ops(&bodies);
    assert_eq!((o[0].bytes, o[0].end_ns - o[0].start_ns), (2048, 12_500));
    // pid from the CPU-side ProfilerStep.
    assert!(dir.0.join("j/rank1/4242").is_dir());
}

#[test]
fn streams_a_200mb_trace() {
    let dir = TempDir::new("kineto-big");
    let p = dir.0.join("big.json");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&p).unwrap());
    f.write_all(
        br#"{"schemaVersion":1,"distributedInfo":{"rank":0,"world_size":2},"traceEvents":["#,
    )
    .unwrap();
    let mut kernels = 0u64;
    let mut written = 0usize;
    let mut i = 0u64;
    while written < 200 << 20 {
        let ev = if i.is_multiple_of(1000) {
            kernels += 1;
            KERNEL.replace("TS", &(1_000_000 + i).to_string())
        } else {
            CPU_OP.replace("TS", &(1_000_000 + i).to_string())
        };
        if i > 0 {
            f.write_all(b",\n").unwrap();
        }
        f.write_all(ev.as_bytes()).unwrap();
        written += ev.len() + 2;
        i += 1;
    }
    f.write_all(b"]}").unwrap();
    drop(f);
    let mut reports = Vec::new();
    let out = dir.0.join("out");
    let (sum, _) = import_file(&p, "job", &out, &mut |n| reports.push(n)).unwrap();
    assert_eq!(sum.ops, kernels);
    assert!(
        reports.len() >= 20 && reports.len() < 40,
        "{}",
        reports.len()
    );
    assert!(reports.windows(2).all(|w| w[0] <= w[1]));
}

/// xorshift64*: deterministic pseudo-random numbers for the mutation test.
pub(crate) struct XorShift(pub u64);

impl XorShift {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `base` with a few random byte changes, insertions, deletions or a cut.
    pub(crate) fn mutate(&mut self, base: &[u8]) -> Vec<u8> {
        const BYTES: &[u8] = b"{}[]\",:0123456789-.eE \\utfnal\x00\xff#_";
        let mut v = base.to_vec();
        let n = 1 + self.next() % 6;
        for _ in 0..n {
            if v.is_empty() {
                break;
            }
            let at = (self.next() % v.len() as u64) as usize;
            let b = BYTES[(self.next() % BYTES.len() as u64) as usize];
            match self.next() % 5 {
                0 => v[at] = b,
                1 => v.insert(at, b),
                2 => {
                    v.remove(at);
                }
                3 => v.truncate(at),
                _ => {
                    let end = (at + 1 + (self.next() % 16) as usize).min(v.len());
                    let chunk = v[at..end].to_vec();
                    v.splice(at..at, chunk);
                }
            }
        }
        v
    }
}

#[test]
fn random_mutations_never_panic() {
    let base = small_trace().into_bytes();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut ok = 0;
    for _ in 0..20_000 {
        let m = rng.mutate(&base);
        if let Ok(t) = parse_reader(&m[..], Path::new("m.json")) {
            ok += 1;
            let _ = t.step_truths();
            for k in &t.kernels {
                let c = write::comm_init(&t.comms[k.comm as usize], t.rank, t.world);
                assert!(c.nranks == 0 || c.rank < c.nranks as i32);
            }
            if ok % 200 == 1 && !t.kernels.is_empty() {
                let dir = TempDir::new("kineto-fuzz");
                if write::write_trace(&t, "j", &dir.0).is_ok_and(|s| s.ops > 0) {
                    read_all(&dir.0);
                }
            }
        }
    }
    assert!(ok > 0);
}

#[test]
fn an_unknown_schema_version_is_refused_naming_it() {
    let e = parse_reader(
        &br#"{"schemaVersion": 7, "traceEvents": []}"#[..],
        Path::new("new.json"),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("new.json") && msg.contains("schemaVersion version 7"),
        "{msg}"
    );
}

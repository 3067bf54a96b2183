//! Tests: NVIDIA's line shape (research/nccl-abi.md §4), our plugin's shape, skips, several
//! processes, segments readable, random mutations.

use std::path::PathBuf;

use comminsight_wire::names::Func;
use comminsight_wire::record::{Body, Timing};

use super::*;
use crate::kineto::tests::{read_all, TempDir, XorShift};

/// NVIDIA Inspector's exact shape (nccl-abi.md §4).
const NVIDIA: &str = r#"{"header":{"id":"0x7f3a9c21d4e5b601","comm_name":"unknown","rank":2,"n_ranks":8,"nnodes":1},"metadata":{"inspector_output_format_version":"v4.0","git_rev":"abc123","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1700000000123456,"hostname":"node1","pid":1639453},"coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,"coll_exec_time_us":61974,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":277.21,"coll_busbw_gbs":485.12}}"#;

/// NVIDIA's P2p shape.
const NVIDIA_P2P: &str = r#"{"header":{"id":"0x7f3a9c21d4e5b601","comm_name":"unknown","rank":2,"n_ranks":8,"nnodes":1},"metadata":{"inspector_output_format_version":"v4.0","git_rev":"abc123","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1700000000223456,"hostname":"node1","pid":1639453},"p2p_perf":{"p2p":"Send","p2p_sn":3,"p2p_peer":3,"p2p_msg_size_bytes":1048576,"p2p_exec_time_us":120,"p2p_timing_source":"kernel_gpu","p2p_algobw_gbs":8.74,"p2p_busbw_gbs":8.74}}"#;

/// What plugin/src/inspector.rs `format_line` writes (written by hand from its code).
const PLUGIN: &str = r#"{"header":{"id":"0xabc","comm_name":"tp:TENSOR_MODEL_PARALLEL_GROUP:0","rank":1,"n_ranks":4,"nnodes":1},"metadata":{"inspector_output_format_version":"v4.0","git_rev":"comminsight-0.1.0","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1700000001000000,"hostname":"node2","pid":77},"p2p_perf":{"p2p":"Recv","p2p_sn":0,"p2p_peer":0,"p2p_msg_size_bytes":4096,"p2p_exec_time_us":5,"p2p_timing_source":"kernel_cpu","p2p_algobw_gbs":0.82,"p2p_busbw_gbs":0.82}}"#;

const PLUGIN_COLL: &str = r#"{"header":{"id":"0xdef","comm_name":"dp:DATA_PARALLEL_GROUP:0","rank":3,"n_ranks":16,"nnodes":2},"metadata":{"inspector_output_format_version":"v4.0","git_rev":"comminsight-0.1.0","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1700000002000000,"hostname":"node2","pid":77},"coll_perf":{"coll":"ReduceScatter","coll_sn":9,"coll_msg_size_bytes":65536,"coll_exec_time_us":40,"coll_timing_source":"collective_cpu","coll_algobw_gbs":26.21,"coll_busbw_gbs":24.58}}"#;

/// Verbose mode: event_trace_ts inside coll_perf.
const VERBOSE: &str = r#"{"header":{"id":"0x7f3a9c21d4e5b601","comm_name":"unknown","rank":2,"n_ranks":8,"nnodes":1},"metadata":{"inspector_output_format_version":"v4.1","dump_timestamp_us":1700000009000000,"hostname":"node1","pid":1639453},"coll_perf":{"coll":"AllGather","coll_sn":5,"coll_msg_size_bytes":8192,"coll_exec_time_us":10,"coll_timing_source":"kernel_gpu","event_trace_sn":{"coll_start_sn":1,"coll_stop_sn":2},"event_trace_ts":{"coll_start":1700000000500000,"coll_stop":1700000000500012,"kernel_events":[{"channel_id":0,"kernel_start":1700000000500001,"kernel_stop":1700000000500011,"kernel_record":"kernel_gpu"}]}}}"#;

#[test]
fn parses_nvidia_and_plugin_lines() {
    let o = parse_line(NVIDIA).unwrap();
    assert_eq!(o.comm_hash, 0x7f3a_9c21_d4e5_b601);
    assert_eq!((o.rank, o.n_ranks, o.nnodes), (2, 8, 1));
    assert_eq!(
        (o.func, o.sn, o.bytes),
        (Func::ALL_REDUCE, 1407, 17_179_869_184)
    );
    assert_eq!((o.hostname.as_str(), o.pid), ("node1", 1_639_453));
    assert_eq!(o.timing, Timing::KernelGpu);
    assert!(!o.is_p2p && o.peer == -1 && o.stop_us.is_none());
    let p = parse_line(NVIDIA_P2P).unwrap();
    assert!(p.is_p2p);
    assert_eq!((p.func, p.peer, p.sn), (Func::SEND, 3, 3));
    let q = parse_line(PLUGIN).unwrap();
    assert_eq!(
        (q.func, q.peer, q.timing),
        (Func::RECV, 0, Timing::KernelCpu)
    );
    assert_eq!(q.comm_name, "tp:TENSOR_MODEL_PARALLEL_GROUP:0");
    let v = parse_line(VERBOSE).unwrap();
    assert_eq!(
        (v.start_us, v.stop_us),
        (Some(1_700_000_000_500_000), Some(1_700_000_000_500_012))
    );
}

#[test]
fn bad_lines_say_why() {
    let invalid = NVIDIA.replace("\"AllReduce\"", "\"Invalid\"");
    assert!(parse_line(&invalid)
        .unwrap_err()
        .contains("Invalid by Inspector"));
    assert_eq!(parse_line("not json").unwrap_err(), "line not JSON");
    let v3 = NVIDIA.replace("v4.0", "v3.2");
    assert_eq!(
        parse_line(&v3).unwrap_err(),
        "line in unsupported format version v3.2"
    );
    let nohdr = NVIDIA.replace("\"header\"", "\"hdr\"");
    assert!(parse_line(&nohdr).unwrap_err().contains("header"));
    assert!(parse_line("[1,2]").is_err());
    let nopeer = NVIDIA_P2P.replace("\"p2p_peer\":3,", "");
    assert_eq!(parse_line(&nopeer).unwrap().peer, -1);
}

fn proc_start(b: &[Body]) -> comminsight_wire::record::ProcStart {
    b.iter()
        .find_map(|b| match b {
            Body::ProcStart(p) => Some(p.clone()),
            _ => None,
        })
        .unwrap()
}

fn write_file(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

#[test]
fn imports_several_processes_with_skips() {
    let dir = TempDir::new("insp");
    let invalid = NVIDIA
        .replace("\"AllReduce\"", "\"Invalid\"")
        .replace("1407", "1408");
    let long = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_LINE + 10));
    let a = write_file(
        &dir.0,
        "node1-pid1639453.log",
        &[
            NVIDIA,
            NVIDIA_P2P,
            NVIDIA,
            &invalid,
            "garbage {",
            "",
            VERBOSE,
            &long,
        ],
    );
    // One file holding two processes (two hosts' logs concatenated).
    let b = write_file(
        &dir.0,
        "mixed.log",
        &[
            PLUGIN,
            PLUGIN_COLL,
            NVIDIA.replace("node1", "node3").as_str(),
        ],
    );
    let out = dir.0.join("out");
    let mut last = 0;
    let sum = import_files(&[a, b], "job", &out, &mut |n| last = n).unwrap();
    assert!(last > (MAX_LINE as u64));
    assert_eq!((sum.files, sum.streams, sum.ops), (2, 3, 6), "{sum:?}");
    let d = sum.skipped.describe().unwrap();
    for want in [
        "1 duplicate operation",
        "1 collective named Invalid by Inspector",
        "1 line not JSON",
        "1 line over 1 MiB",
    ] {
        assert!(d.contains(want), "{want}: {d}");
    }
    let node1 = read_all(&out.join("job/node1/1639453"));
    let ops: Vec<_> = node1
        .iter()
        .filter_map(|b| match b {
            Body::Coll(o) | Body::P2p(o) => Some(o),
            _ => None,
        })
        .collect();
    assert_eq!(ops.len(), 3);
    // In end order; the verbose op ends at its coll_stop, the others at their dump time.
    let funcs: Vec<Func> = ops.iter().map(|o| o.func).collect();
    assert_eq!(funcs, vec![Func::ALL_REDUCE, Func::SEND, Func::ALL_GATHER]);
    assert_eq!(
        (ops[2].start_ns, ops[2].end_ns),
        (1_700_000_000_500_002_000, 1_700_000_000_500_012_000)
    );
    assert_eq!(ops[0].end_ns, 1_700_000_000_123_456_000);
    assert_eq!(ops[0].start_ns, 1_700_000_000_123_456_000 - 61_974_000);
    assert_eq!((ops[0].coll_sn, ops[0].bytes), (1407, 17_179_869_184));
    assert!(node1
        .iter()
        .any(|b| matches!(b, Body::P2p(o) if o.peer == 3)));
    let ps = proc_start(&node1);
    assert_eq!((ps.rank, ps.world_size), (2, 8));
    let inits = node1
        .iter()
        .filter(|b| matches!(b, Body::CommInit(_)))
        .count();
    assert_eq!(inits, 1);
    // node2: rank of its largest communicator (16 ranks).
    let node2 = read_all(&out.join("job/node2/77"));
    let ps = proc_start(&node2);
    assert_eq!((ps.rank, ps.world_size), (3, 16));
    assert_eq!(
        node2
            .iter()
            .filter(|b| matches!(b, Body::CommInit(_)))
            .count(),
        2
    );
    read_all(&out.join("job/node3"));
}

#[test]
fn whole_file_errors() {
    let dir = TempDir::new("insp-err");
    let v3 = NVIDIA.replace("v4.0", "v3.2");
    let p = write_file(&dir.0, "old.log", &[&v3, &v3]);
    let e = import_files(&[p], "job", &dir.0.join("out"), &mut |_| {}).unwrap_err();
    assert!(matches!(e, ImportError::Version { .. }), "{e}");
    assert!(e.to_string().contains("v3.2"), "{e}");
    let p = write_file(&dir.0, "junk.log", &["hello", "world"]);
    let e = import_files(&[p], "job", &dir.0.join("out"), &mut |_| {}).unwrap_err();
    assert!(
        matches!(e, ImportError::Format { .. }) && e.to_string().contains("junk.log"),
        "{e}"
    );
    // Mixed versions: the valid lines are imported, the others counted.
    let p = write_file(&dir.0, "mixed.log", &[&v3, NVIDIA]);
    let sum = import_files(&[p], "job", &dir.0.join("out"), &mut |_| {}).unwrap();
    assert_eq!(sum.ops, 1);
    assert_eq!(
        sum.skipped.0.get("line in unsupported format version v3.2"),
        Some(&1)
    );
}

#[test]
fn random_mutations_never_panic() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let bases = [NVIDIA, NVIDIA_P2P, PLUGIN, VERBOSE];
    let mut ok = 0;
    let mut r = Reader::default();
    for i in 0..20_000 {
        let m = rng.mutate(bases[i % bases.len()].as_bytes());
        let s = String::from_utf8_lossy(&m);
        if let Ok(op) = line::parse(&s) {
            ok += 1;
            let _ = r.take(op);
        }
    }
    assert!(ok > 0);
    let dir = TempDir::new("insp-fuzz");
    for ((host, pid), p) in std::mem::take(&mut r.procs) {
        if !p.ops.is_empty() {
            write_proc("job", &host, pid, p, &dir.0).unwrap();
        }
    }
    read_all(&dir.0);
}

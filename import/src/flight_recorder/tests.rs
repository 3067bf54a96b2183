use std::path::{Path, PathBuf};

use comminsight_wire::names::{DataType, Func};
use comminsight_wire::record::Body;
use comminsight_wire::segment::{find_segments, read_segment, SOURCE_FLIGHT_RECORDER};

use super::*;
use crate::pickle::tests::{real_fr_dir, XorShift};

const SCENARIOS: [&str; 2] = ["gpu_error_2nd", "lock_gil_1st"];

fn entry(name: &str, sizes: Vec<Vec<i64>>, dtype: &str) -> FrEntry {
    FrEntry {
        profiling_name: name.into(),
        input_sizes: sizes,
        input_dtypes: vec![dtype.into()],
        ..FrEntry::default()
    }
}

#[test]
fn entry_accessors() {
    let cases = [
        ("nccl:all_reduce", Some(Func::ALL_REDUCE)),
        ("nccl:allreduce_coalesced", Some(Func::ALL_REDUCE)),
        ("nccl:barrier", Some(Func::ALL_REDUCE)),
        ("nccl:_all_gather_base", Some(Func::ALL_GATHER)),
        (
            "nccl:all_gather_into_tensor_coalesced",
            Some(Func::ALL_GATHER),
        ),
        ("nccl:_reduce_scatter_base", Some(Func::REDUCE_SCATTER)),
        ("nccl:all_to_all", Some(Func::ALL_TO_ALL)),
        ("nccl:alltoall_base", Some(Func::ALL_TO_ALL)),
        ("nccl:broadcast", Some(Func::BROADCAST)),
        ("nccl:reduce", Some(Func::REDUCE)),
        ("nccl:send 0->1", Some(Func::SEND)),
        ("nccl:recv 0<-8", Some(Func::RECV)),
        ("nccl:gather", Some(Func::GATHER)),
        ("nccl:scatter", Some(Func::SCATTER)),
        ("nccl:coalesced", None),
        ("", None),
    ];
    for (n, f) in cases {
        assert_eq!(entry(n, vec![], "Float").func(), f, "{n}");
    }
    assert_eq!(entry("nccl:send 0->1", vec![], "").p2p_pair(), Some((0, 1)));
    assert_eq!(entry("nccl:recv 0<-8", vec![], "").p2p_pair(), Some((8, 0)));
    assert_eq!(entry("nccl:all_reduce", vec![], "").p2p_pair(), None);
    let e = entry(
        "nccl:all_reduce",
        vec![vec![2048, 1, 5120], vec![3], vec![]],
        "BFloat16",
    );
    assert_eq!(e.count(), 2048 * 5120 + 3 + 1);
    assert_eq!(e.datatype(), DataType::from_name("ncclBfloat16"));
    assert_eq!(e.bytes(), e.count() * 2);
    let huge = entry(
        "nccl:all_reduce",
        vec![vec![i64::MAX, i64::MAX], vec![-4]],
        "Float",
    );
    assert_eq!(huge.count(), u64::MAX);
    assert_eq!(huge.bytes(), u64::MAX);
    assert_eq!(entry("x", vec![], "Float").datatype().name(), "ncclFloat32");
    assert_eq!(entry("x", vec![], "Short").datatype(), DataType(0));
    assert_eq!(comm_hash("37"), 0xb70a_364d_4c4a_cffa);
    assert_ne!(comm_hash("37"), comm_hash("38"));
    assert_eq!(rank_from_name(Path::new("a/nccl_trace_rank_9")), Some(9));
    assert_eq!(rank_from_name(Path::new("_dump_12.json")), Some(12));
    assert_eq!(rank_from_name(Path::new("dump")), None);
}

/// Every scenario's dumps: (pickle, json) pairs by rank.
fn real() -> Option<Vec<(String, Vec<PathBuf>)>> {
    let dir = real_fr_dir()?;
    Some(
        SCENARIOS
            .iter()
            .map(|sc| (sc.to_string(), find_dumps(&dir.join(sc)).unwrap()))
            .collect(),
    )
}

#[test]
fn real_dumps_pickle_and_json_agree() {
    let Some(all) = real() else { return };
    for (sc, paths) in all {
        assert_eq!(paths.len(), 16, "{sc}");
        for (r, p) in paths.iter().enumerate() {
            let (d, skips) = read_dump(p).unwrap();
            assert_eq!(d.rank, r as i64, "{}", p.display());
            assert_eq!(d.version, "2.9");
            assert_eq!(d.nccl_version, "2.27.3");
            assert_eq!(skips, Skips::default(), "{}", p.display());
            let (mut j, jskips) = read_dump(&p.with_extension("json")).unwrap();
            assert_eq!(jskips, skips);
            j.path = d.path.clone();
            assert_eq!(j, d, "{}", p.display());
            assert_eq!(d.world(), 16);
            let want = match (sc.as_str(), r) {
                ("gpu_error_2nd", 9) => Some(20),
                ("lock_gil_1st", 9 | 14) => Some(0),
                _ => None,
            };
            if let Some(n) = want {
                assert_eq!(d.entries.len(), n, "{sc} rank {r}");
            }
            assert!(d.pg_config.values().any(|g| g.desc == "default_pg"));
            assert!(!d.pg_status.is_empty());
            for (id, name) in d.pg_names() {
                assert!(d.pg_config.contains_key(&name), "pg_id {id}: {name}");
            }
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ci-fr-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn real_dumps_write_streams_every_reader_accepts() {
    let Some(all) = real() else { return };
    for (sc, paths) in all {
        let dumps: Vec<FrDump> = paths.iter().map(|p| read_dump(p).unwrap().0).collect();
        let out = scratch(&sc);
        let sum = write_streams(&dumps, "job", &out).unwrap();
        let entries: u64 = dumps.iter().map(|d| d.entries.len() as u64).sum();
        assert_eq!((sum.files, sum.streams, sum.ops), (16, 16, entries), "{sc}");
        assert_eq!(sum.skipped, Skips::default());
        for d in &dumps {
            let dir = out
                .join("job")
                .join(format!("rank{}", d.rank))
                .join(d.rank.to_string());
            let mut ops = Vec::new();
            let mut inits = 0;
            for seg in find_segments(&dir).unwrap() {
                let r = read_segment(&seg).unwrap();
                assert!(r.bad.is_empty(), "{}: {:?}", seg.display(), r.bad);
                assert_eq!(r.header().map(|h| h.source), Some(SOURCE_FLIGHT_RECORDER));
                for rec in r.records {
                    match rec.body {
                        Body::ProcStart(p) => {
                            assert_eq!((p.rank, p.world_size), (d.rank as i32, 16))
                        }
                        Body::CommInit(_) => inits += 1,
                        Body::Coll(o) | Body::P2p(o) => ops.push(o),
                        _ => {}
                    }
                }
            }
            let member = d
                .pg_config
                .values()
                .filter(|g| g.ranks.contains(&d.rank))
                .count();
            assert_eq!(inits, member, "{sc} rank {}", d.rank);
            assert_eq!(ops.len(), d.entries.len(), "{sc} rank {}", d.rank);
            for (i, (o, e)) in ops.iter().zip(&d.entries).enumerate() {
                assert_eq!(o.coll_local_sn, i as u64);
                assert_eq!(o.comm_hash, comm_hash(&e.pg_name));
                assert_eq!(o.enqueue_ns, e.time_created_ns);
                assert_eq!(o.end_ns, 0, "scheduled entries have not ended");
                if e.is_p2p {
                    assert!(o.peer >= 0);
                    assert_eq!(o.coll_sn, e.p2p_seq_id as u64);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn unreadable_dumps_name_the_problem() {
    let p = Path::new("x/_dump_3");
    let msg = |b: &[u8]| parse_dump(b, p).unwrap_err().to_string();
    assert!(msg(b"[1, 2]").contains("not a Flight Recorder dump"));
    assert!(msg(b"{\"version\": \"2.9\"}").contains("no \"entries\""));
    assert!(msg(b"{\"version\": \"2.9\", \"entries\": {}}").contains("not a list"));
    assert!(matches!(
        parse_dump(b"{\"version\": \"3.0\", \"entries\": []}", p),
        Err(ImportError::Version { .. })
    ));
    let m = msg(b"cos\nsystem\n(S'echo'\ntR.");
    assert!(
        m.contains("x/_dump_3") && m.contains("GLOBAL") && m.contains("os.system"),
        "{m}"
    );
    let m = parse_dump(
        b"{\"version\": \"2.1\", \"entries\": []}",
        Path::new("dump"),
    )
    .unwrap_err()
    .to_string();
    assert!(m.contains("rank"), "{m}");
    // The rank key wins over the name; a bad entry is skipped and counted.
    let (d, skips) = parse_dump(
        br#"{"version": "2.10", "rank": 5, "entries": [{"record_id": 1}, 7,
            {"process_group": ["0", "default_pg"], "collective_seq_id": 1,
             "profiling_name": "nccl:all_reduce", "time_created_ns": 10, "state": "completed",
             "frames": [{"name": "f", "filename": "a.py", "line": 3}]}],
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0,1,2,3,4,5]}}}"#,
        p,
    )
    .unwrap();
    assert_eq!((d.rank, d.entries.len(), skips.total()), (5, 1, 2));
    assert_eq!(d.entries[0].frames[0].line, 3);
    // Written: the completed entry ends (at its start: no completion time).
    let out = scratch("synthetic");
    let sum = write_streams(&[d.clone(), d.clone()], "j", &out).unwrap_err();
    assert!(sum.to_string().contains("rank 5"), "{sum}");
    let sum = write_streams(&[d], "j", &out).unwrap();
    assert_eq!((sum.ops, sum.records), (1, 3));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn random_mutations_of_a_real_dump_never_panic() {
    let Some(dir) = real_fr_dir() else { return };
    let p = dir.join("gpu_error_2nd").join("_dump_9");
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for base in [
        std::fs::read(&p).unwrap(),
        std::fs::read(p.with_extension("json")).unwrap(),
    ] {
        let mut ok = 0;
        for _ in 0..20_000 {
            let m = rng.mutate(&base);
            if let Ok((d, _)) = parse_dump(&m, &p) {
                ok += 1;
                for e in &d.entries {
                    let _ = (e.func(), e.p2p_pair(), e.count(), e.bytes(), e.datatype());
                }
            }
        }
        eprintln!("{ok} of 20000 mutations still parse");
    }
}

//! Archive throughput (records/s) for the raw zstd file and for Parquet, on a full-size segment.
//! `cargo test -p comminsight-agent --test archive_throughput -- --ignored --nocapture`

mod archive_util;

use std::time::Instant;

use archive_util::{TempDir, T0};
use comminsight_agent::archive::{Archive, SegmentInput};
use comminsight_agent::config::ArchiveConfig;
use comminsight_agent::stream::{Alignment, StreamId};
use comminsight_wire::record::{CommInit, OpRecord, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::{Algo, Body, DataType, Func, Proto};

/// Records in a default-size (64 MiB) segment.
const RECORDS: u64 = (64 << 20) / 128 - 1;

#[test]
#[ignore = "timing; run explicitly"]
fn archive_throughput() {
    let d = TempDir::new("throughput");
    let logs = d.path().join("logs/j/h/1");
    let mut w = SegmentWriter::new(
        SegmentConfig {
            dir: logs.clone(),
            max_segment_bytes: 1 << 40,
            ..Default::default()
        },
        1,
    );
    let mut recs = Vec::with_capacity(RECORDS as usize);
    for i in 0..RECORDS {
        let body = if i % 1000 == 0 {
            Body::CommInit(CommInit {
                comm_hash: i % 7,
                comm_name: format!("comm{}", i % 7).as_str().into(),
                time_ns: T0 + i,
                ..Default::default()
            })
        } else {
            Body::Coll(OpRecord {
                comm_hash: i % 7,
                coll_sn: i / 7,
                coll_local_sn: i,
                count: 1 << (i % 20),
                bytes: 4 << (i % 20),
                enqueue_ns: T0 + i * 20_000,
                start_ns: T0 + i * 20_000 + 1_000 + i % 333,
                end_ns: T0 + i * 20_000 + 15_000 + i % 777,
                rank: (i % 8) as i32,
                root: -1,
                peer: -1,
                func: Func::ALL_REDUCE,
                datatype: DataType::from_name("ncclBfloat16"),
                algo: Algo::from_name("RING"),
                proto: Proto::from_name("SIMPLE"),
                nchannels: 4,
                ..Default::default()
            })
        };
        let mut r = Record::new(body);
        r.seq = i + 1;
        recs.push(r.encode());
    }
    w.write(&recs);
    w.seal();
    let seg = logs.join("seg-000000.cis");
    let id = StreamId::new("j", "h", "1");
    let input = SegmentInput {
        id: &id,
        index: 0,
        path: &seg,
        recovered: &[],
        align: Alignment::default(),
        gpu_align: None,
    };
    for parquet in [false, true] {
        let a = Archive::open(&ArchiveConfig {
            dir: d.path().join(format!("archive-{parquet}")),
            parquet,
            ..Default::default()
        })
        .unwrap();
        let t = Instant::now();
        let out = a.archive_segment(input).unwrap();
        let s = t.elapsed().as_secs_f64();
        println!(
            "parquet={parquet}: {} records in {s:.2} s = {:.0} records/s; raw {} -> {} bytes, parquet {} bytes",
            out.records,
            out.records as f64 / s,
            out.input_bytes,
            out.raw_bytes,
            out.parquet_bytes
        );
        assert_eq!(out.records, RECORDS + 1);
    }
}

//! The archive thread's cost per record (issue 23: the soak found it is ~3/4 of the agent's CPU
//! at 400 k ops/s). One plugin-format segment of 200 000 collective records (25.6 MB, written
//! with the plugin's own `SegmentWriter`) archived by `Archive::archive_segment`, in one run:
//! raw only at several zstd levels, and raw + Parquet. Throughput is records per second; the
//! inverse is the archive's ns per record, which at 400 k records/s is its share of a core
//! (1 µs/record = 40 %).
//!
//! ```text
//! cargo bench -p comminsight-agent --bench archive
//! ```

use std::path::{Path, PathBuf};

use comminsight_agent::archive::{Archive, ArchiveConfig, SegmentInput};
use comminsight_agent::stream::{Alignment, StreamId};
use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::{Algo, DataType, Func, Proto, RawRecord};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const OPS: u64 = 200_000;
const PID: u32 = 4242;

/// One sealed segment of `OPS` collectives on 4 communicators (plus its preamble); its path
/// and record count.
fn write_segment(dir: &Path) -> (PathBuf, u64) {
    let cfg = SegmentConfig {
        dir: dir.to_path_buf(),
        max_segment_bytes: 1 << 30,
        ..SegmentConfig::default()
    };
    let mut w = SegmentWriter::new(cfg, PID);
    let mut seq = 0u64;
    let mut raw = |body: Body| {
        let mut r = Record::new(body).encode();
        r.set_seq(seq);
        seq += 1;
        r
    };
    let mut batch: Vec<RawRecord> = vec![raw(Body::ProcStart(ProcStart {
        pid: PID,
        rank: 3,
        mono_ns: 1,
        real_ns: 1_764_000_000_000_000_000,
        ..Default::default()
    }))];
    for c in 0..4u64 {
        batch.push(raw(Body::CommInit(CommInit {
            comm_hash: 0x9e37_79b9_0000 + c,
            nranks: 8,
            rank: 3,
            comm_name: format!("tp{c}").as_str().into(),
            ..Default::default()
        })));
    }
    let funcs = [
        Func::ALL_REDUCE,
        Func::from_name("AllGather"),
        Func::from_name("ReduceScatter"),
    ];
    // Times with jitter (a splitmix64 stream): ops 1-4 µs apart, 5-500 µs long, the GPU
    // window inside the host one; sizes from 4 KiB to 8 MiB.
    let mut state = 0x853c_49e6_748f_ea9bu64;
    let mut rnd = |n: u64| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    };
    let mut t = 1_764_000_000_000_000_000u64;
    for i in 0..OPS {
        t += 1_000 + rnd(3_000);
        let start = t + 200 + rnd(800);
        let end = start + 5_000 + rnd(495_000);
        let gpu_start = start - 1_763_999_995_000_000_000 + rnd(2_000);
        let gpu_end = gpu_start + (end - start) - rnd(1_000);
        let shift = 10 + rnd(12);
        batch.push(raw(Body::Coll(OpRecord {
            comm_hash: 0x9e37_79b9_0000 + i % 4,
            coll_sn: i / 4,
            coll_local_sn: i,
            count: 1 << shift,
            bytes: 2 << shift,
            enqueue_ns: t,
            start_ns: start,
            end_ns: end,
            api_ns: t - 100 - rnd(400),
            gpu_start_ns: gpu_start,
            gpu_end_ns: gpu_end,
            rank: 3,
            root: -1,
            peer: -1,
            func: funcs[(i % 3) as usize],
            datatype: DataType::from_name("ncclBfloat16"),
            algo: Algo::from_name("RING"),
            proto: Proto::from_name("SIMPLE"),
            nchannels: 16,
            nwarps: 8,
            channels_done: 16,
            ..Default::default()
        })));
        if batch.len() == 4096 {
            w.write(&batch);
            batch.clear();
        }
    }
    w.write(&batch);
    w.seal();
    let seg = std::fs::read_dir(dir)
        .expect("segment dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".cis"))
        .expect("a sealed segment");
    (seg, seq)
}

fn bench(c: &mut Criterion) {
    let dir =
        std::env::temp_dir().join(format!("comminsight-archive-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (seg, records) = write_segment(&dir.join("logs"));
    let id = StreamId::new("bench", "h0", &PID.to_string());
    let mut g = c.benchmark_group("archive 200k ops");
    g.sample_size(10);
    g.throughput(Throughput::Elements(records));
    for (name, level, parquet) in [
        ("raw zstd 1", 1, false),
        ("raw zstd -1", -1, false),
        ("raw zstd -5", -5, false),
        ("raw zstd 1 + parquet", 1, true),
        ("raw zstd -1 + parquet", -1, true),
    ] {
        let cfg = ArchiveConfig {
            dir: dir.join(format!("archive-{level}-{parquet}")),
            zstd_level: level,
            parquet,
            ..ArchiveConfig::default()
        };
        let archive = Archive::open(&cfg).expect("archive");
        let input = SegmentInput {
            id: &id,
            index: 0,
            path: &seg,
            recovered: &[],
            align: Alignment {
                offset_ns: -1_200,
                err_ns: 800,
            },
            gpu_align: Some(Alignment {
                offset_ns: 1_763_999_995_000_000_000,
                err_ns: 2_000,
            }),
        };
        let a = archive.archive_segment(input).expect("archive a segment");
        eprintln!(
            "{name}: {} records, raw {} B ({:.1} B/record), parquet {} B ({:.1} B/row)",
            a.records,
            a.raw_bytes,
            a.raw_bytes as f64 / a.records as f64,
            a.parquet_bytes,
            a.parquet_bytes as f64 / a.rows.max(1) as f64
        );
        g.bench_function(name, |b| {
            b.iter(|| archive.archive_segment(input).expect("archive a segment"))
        });
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Replay rate: `comminsight_agent::offline::replay::replay` over 8 plugin-format streams (segments
//! written with the plugin's own `SegmentWriter`), single-threaded, records per second.
//!
//! ```text
//! cargo bench -p comminsight-agent --bench replay
//! ```

use std::path::Path;
use std::time::Instant;

use comminsight_agent::offline::replay::replay;
use comminsight_agent::offline::{Input, Settings};
use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::{Algo, DataType, Func, Proto, RawRecord};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const STREAMS: u32 = 8;
const OPS_PER_STREAM: u64 = 250_000;

fn write_job(root: &Path) -> u64 {
    let mut total = 0;
    for s in 0..STREAMS {
        let pid = 1000 + s;
        let cfg = SegmentConfig {
            dir: root
                .join("bench")
                .join(format!("h{}", s / 4))
                .join(pid.to_string()),
            ..SegmentConfig::default()
        };
        let mut w = SegmentWriter::new(cfg, pid);
        let mut seq = 0u64;
        let mut push = |w: &mut SegmentWriter, body: Body| {
            let mut r = Record::new(body).encode();
            r.set_seq(seq);
            seq += 1;
            w.write(&[r]);
        };
        push(
            &mut w,
            Body::ProcStart(ProcStart {
                pid,
                rank: s as i32,
                mono_ns: 1,
                real_ns: 2,
                ..Default::default()
            }),
        );
        for c in 0..4u64 {
            push(
                &mut w,
                Body::CommInit(CommInit {
                    comm_hash: 0x100 + c,
                    nranks: 8,
                    rank: s as i32,
                    comm_name: format!("comm{c}").as_str().into(),
                    ..Default::default()
                }),
            );
        }
        let funcs = [
            Func::ALL_REDUCE,
            Func::from_name("AllGather"),
            Func::from_name("ReduceScatter"),
        ];
        let mut batch: Vec<RawRecord> = Vec::with_capacity(1024);
        for i in 0..OPS_PER_STREAM {
            let t = 1_764_000_000_000_000_000 + i * 20_000;
            let mut r = Record::new(Body::Coll(OpRecord {
                comm_hash: 0x100 + i % 4,
                coll_sn: i / 4,
                coll_local_sn: i,
                count: 1 << (10 + i % 12),
                bytes: 4 << (10 + i % 12),
                enqueue_ns: t,
                start_ns: t + 1000,
                end_ns: t + 10_000 + (i % 97) * 100,
                rank: s as i32,
                root: -1,
                peer: -1,
                func: funcs[(i % 3) as usize],
                datatype: DataType::from_name("ncclFloat32"),
                algo: Algo::from_name("RING"),
                proto: Proto::from_name("SIMPLE"),
                nchannels: 4,
                ..Default::default()
            }))
            .encode();
            r.set_seq(seq);
            seq += 1;
            batch.push(r);
            if batch.len() == batch.capacity() {
                w.write(&batch);
                batch.clear();
            }
        }
        w.write(&batch);
        w.seal();
        total += seq;
    }
    total
}

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("comminsight-replay-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let logs = dir.join("logs");
    let records = write_job(&logs);
    let out = dir.join("out");
    let settings = Settings::default();
    let run = || replay(&Input::open(&logs).expect("input"), &out, &settings).expect("replay");
    let t = Instant::now();
    let s = run();
    eprintln!(
        "replay: {} records in {:.3} s = {:.2} M records/s (one thread)",
        s.records,
        t.elapsed().as_secs_f64(),
        s.records as f64 / t.elapsed().as_secs_f64() / 1e6
    );
    let mut g = c.benchmark_group("replay");
    g.sample_size(10);
    g.throughput(Throughput::Elements(records));
    g.bench_function("8 streams x 250k ops", |b| b.iter(run));
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);

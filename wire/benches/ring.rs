//! Push throughput of the shared-memory ring.
//!
//! `cargo bench -p comminsight-wire --bench ring`
//! * `push/drained`: one producer (the bench thread) with a consumer thread draining.
//! * `push/full`: no consumer, the ring is full, every push takes the drop path.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use comminsight_wire::record::{Body, CommFini, Record};
use comminsight_wire::ring::ShmRing;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BATCH: u64 = 1024;

fn bench_push(c: &mut Criterion) {
    let rec = Record::new(Body::CommFini(CommFini {
        comm_hash: 7,
        ..Default::default()
    }))
    .encode();
    let mut g = c.benchmark_group("push");
    g.throughput(Throughput::Elements(BATCH));
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));

    let ring = Arc::new(ShmRing::private(65536).expect("ring"));
    let stop = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (ring, stop) = (Arc::clone(&ring), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut out = Vec::with_capacity(4096);
            while !stop.load(Ordering::Relaxed) {
                out.clear();
                if ring.pop_into(&mut out, 4096) == 0 {
                    std::thread::yield_now();
                }
            }
        })
    };
    g.bench_function("drained", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(ring.push(black_box(&rec)));
            }
        })
    });
    stop.store(true, Ordering::Relaxed);
    consumer.join().expect("consumer");
    eprintln!(
        "drained: pushed {} dropped {} (drops = consumer fell behind)",
        ring.pushed(),
        ring.drops()
    );

    let full = ShmRing::private(64).expect("ring");
    while full.push(&rec) {}
    g.bench_function("full", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(full.push(black_box(&rec)));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench_push);
criterion_main!(benches);

//! ABI driver benchmark: `dlopen`s ANY NCCL profiler plugin by path and times one collective's
//! full event sequence (GroupApi start, CollApi start/stop, Group start, Coll start/stop, Group
//! stop, GroupApi stop, KernelCh start, KernelCh state 22, KernelCh stop) and one P2p sequence,
//! per iteration, through the plugin's newest exported table (`ncclProfiler_v6` → v5 → v4).
//!
//! ```text
//! cargo bench -p comminsight-plugin --bench abi                      # our cdylib
//! COMMINSIGHT_BENCH_PLUGIN=/path/libnccl-profiler-x.so cargo bench -p comminsight-plugin --bench abi
//! ```
//! Descriptors are raw bytes at the offsets of research/nccl-abi.md §2.6 (no plugin types used).
//! COMMINSIGHT_LOG_DIR / COMMINSIGHT_SHM_DIR default to a temporary directory (on /dev/shm when
//! present); every other setting is the plugin's default (its drain paces itself to keep up, so
//! every push is a real push).

mod common;

use common::{load, set_default_env, thread_cpu_ns};
use criterion::{criterion_group, criterion_main, Criterion};

fn bench(c: &mut Criterion) {
    let tmp = set_default_env(&[
        ("COMMINSIGHT_RETENTION_BYTES", "67108864"),
        ("COMMINSIGHT_SEGMENT_BYTES", "16777216"),
    ]);
    let p = load();
    let mut seq = 0u64;
    let mut t = 1_764_000_000_000_000_000u64;
    // Batch means (ns/sequence) over 300 batches of 10k, by wall clock and by this thread's CPU
    // time (which leaves out time the thread spent preempted by other processes).
    for name in ["collective", "p2p"] {
        let mut cpu: Vec<f64> = Vec::with_capacity(300);
        let mut means: Vec<f64> = (0..300)
            .map(|_| {
                let c0 = thread_cpu_ns();
                let t0 = std::time::Instant::now();
                for _ in 0..10_000 {
                    seq += 1;
                    t += 10_000;
                    if name == "collective" {
                        p.collective(seq, t);
                    } else {
                        p.p2p(t);
                    }
                }
                let wall = t0.elapsed().as_nanos() as f64 / 10_000.0;
                cpu.push((thread_cpu_ns() - c0) as f64 / 10_000.0);
                wall
            })
            .collect();
        means.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        eprintln!(
            "bench: {name} sequence: wall batch median {:.1} ns (fastest {:.1}); thread-CPU batch median {:.1} ns",
            means[150], means[0], cpu[150]
        );
    }
    c.bench_function("collective_sequence", |b| {
        b.iter(|| {
            seq += 1;
            t += 10_000;
            p.collective(seq, t);
        })
    });
    c.bench_function("p2p_sequence", |b| {
        b.iter(|| {
            t += 10_000;
            p.p2p(t);
        })
    });
    p.finalize();
    if let Some(d) = tmp {
        let _ = std::fs::remove_dir_all(d);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

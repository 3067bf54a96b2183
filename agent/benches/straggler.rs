//! Straggler analysis rate (issue 7): `straggler::analyze` over synthetic rank-steps of a
//! megatron-like grid — 1024 ranks (tp=8, pp=4, dp=32) × 100 steps, and 16 ranks (tp=2, pp=2,
//! dp=4) for comparison. Each rank-step: a world anchor all-reduce (1024 members: 523k member
//! pairs), TP all-reduces per microbatch and layer, PP sends / receives, DP all-reduces; one
//! rank arrives late at every operation.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-agent --bench straggler
//! ```

use std::time::Instant;

use comminsight_agent::straggler::{analyze, Arrival, InstanceKey, RankStep, StragglerSettings};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const MICROBATCHES: u64 = 4;
const LAYERS: u64 = 2;
/// Time between two operations of a rank, µs.
const OP_GAP_US: u64 = 1_000;
const STEP_US: u64 = 100_000;
/// Extra lateness of the slow rank at every operation, µs.
const SLOW_US: u64 = 3_000;

struct Grid {
    tp: u64,
    pp: u64,
    dp: u64,
}

/// Deterministic jitter in 0..100 µs.
fn jitter(rank: u64, step: u64, op: u64) -> u64 {
    let mut x = rank
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(step.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(op.wrapping_mul(0x94D0_49BB_1331_11EB));
    x ^= x >> 31;
    x = x.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (x >> 33) % 100
}

/// When an instance is due in its step (every member aims at it; jitter and the slow rank's
/// lateness make the waits), µs.
fn offset(key: &InstanceKey) -> u64 {
    let per_dir = MICROBATCHES;
    match *key {
        InstanceKey::Coll { comm: 0xFFFF, .. } => 80 * OP_GAP_US,
        InstanceKey::Coll { comm, seq, .. } if comm >= 0x3000_0000 => (70 + seq % 2) * OP_GAP_US,
        InstanceKey::Coll { seq, .. } => (seq % (2 * MICROBATCHES * LAYERS)) * 3 * OP_GAP_US + 1,
        InstanceKey::P2p { seq, .. } => (seq % (2 * per_dir)) * 6 * OP_GAP_US + 2,
    }
}

fn coll(comm: u64, func: u8, seq: u64) -> InstanceKey {
    InstanceKey::Coll { comm, func, seq }
}

/// Every rank-step of the job; rank = tp + tp·dp_index + tp·dp·stage.
fn job(g: &Grid, steps: u64, slow: u64) -> Vec<RankStep> {
    let n = g.tp * g.pp * g.dp;
    let mut out = Vec::with_capacity((n * steps) as usize);
    for step in 0..steps {
        for rank in 0..n {
            let (t, d, p) = (rank % g.tp, rank / g.tp % g.dp, rank / (g.tp * g.dp));
            let tp_comm = 0x1000_0000 + p * g.dp + d;
            let pp_comm = 0x2000_0000 + d * g.tp + t;
            let dp_comm = 0x3000_0000 + p * g.tp + t;
            let mut keys = Vec::new();
            let (mut tp_sn, mut dp_sn) = (step * 2 * MICROBATCHES * LAYERS, step * 2);
            for _mb in 0..MICROBATCHES {
                // Forward: receive from the previous stage, TP all-reduces, send to the next.
                if p > 0 {
                    keys.push(InstanceKey::P2p {
                        comm: pp_comm,
                        src: (p - 1) as u32,
                        dst: p as u32,
                        seq: step * 2 * MICROBATCHES + _mb,
                    });
                }
                for _ in 0..LAYERS {
                    keys.push(coll(tp_comm, 5, tp_sn));
                    tp_sn += 1;
                }
                if p + 1 < g.pp {
                    keys.push(InstanceKey::P2p {
                        comm: pp_comm,
                        src: p as u32,
                        dst: (p + 1) as u32,
                        seq: step * 2 * MICROBATCHES + _mb,
                    });
                }
            }
            for _mb in 0..MICROBATCHES {
                // Backward: the other direction.
                if p + 1 < g.pp {
                    keys.push(InstanceKey::P2p {
                        comm: pp_comm,
                        src: (p + 1) as u32,
                        dst: p as u32,
                        seq: step * 2 * MICROBATCHES + MICROBATCHES + _mb,
                    });
                }
                for _ in 0..LAYERS {
                    keys.push(coll(tp_comm, 5, tp_sn));
                    tp_sn += 1;
                }
                if p > 0 {
                    keys.push(InstanceKey::P2p {
                        comm: pp_comm,
                        src: p as u32,
                        dst: (p - 1) as u32,
                        seq: step * 2 * MICROBATCHES + MICROBATCHES + _mb,
                    });
                }
            }
            for _ in 0..2 {
                keys.push(coll(dp_comm, 5, dp_sn));
                dp_sn += 1;
            }
            keys.push(coll(0xFFFF, 5, step));
            let late = if rank == slow { SLOW_US } else { 0 };
            let arrivals = keys
                .into_iter()
                .enumerate()
                .map(|(i, key)| Arrival {
                    key,
                    start_us: step * STEP_US + offset(&key) + jitter(rank, step, i as u64) + late,
                    dur_us: 200,
                })
                .collect();
            out.push(RankStep {
                rank: rank as i64,
                host: format!("h{}", rank / 8),
                step,
                duration_us: STEP_US - 10_000,
                coverage_complete: true,
                err_us: 1,
                arrivals,
                prev_end_us: Some(step * STEP_US),
            });
        }
    }
    // As the collector delivers them: each rank's arrivals in start order, and every member of
    // an instance leaving it together (its last arrival + 200 µs), so durations carry the waits.
    let mut last: std::collections::HashMap<(u64, InstanceKey), u64> = Default::default();
    for r in &out {
        for a in &r.arrivals {
            let e = last.entry((r.step, a.key)).or_default();
            *e = (*e).max(a.start_us);
        }
    }
    for r in &mut out {
        for a in &mut r.arrivals {
            a.dur_us = last[&(r.step, a.key)] - a.start_us + 200;
        }
        r.arrivals.sort_by_key(|a| a.start_us);
    }
    out
}

fn bench(c: &mut Criterion) {
    let settings = StragglerSettings::default();
    let seed_only = StragglerSettings {
        root_cause: false,
        ..StragglerSettings::default()
    };
    let mut g = c.benchmark_group("straggler analyze");
    g.sample_size(10);
    for (name, grid) in [
        (
            "16 ranks (tp2 pp2 dp4)",
            Grid {
                tp: 2,
                pp: 2,
                dp: 4,
            },
        ),
        (
            "1024 ranks (tp8 pp4 dp32)",
            Grid {
                tp: 8,
                pp: 4,
                dp: 32,
            },
        ),
    ] {
        let steps = 100;
        let input = job(&grid, steps, 5);
        let ops: u64 = input.iter().map(|r| r.arrivals.len() as u64).sum();
        // One run outside criterion: the result must name the slow rank.
        let t0 = Instant::now();
        let rep = analyze("bench", input.clone(), &settings);
        eprintln!(
            "{name} x {steps} steps: {ops} arrivals, one analysis {:.2} s, top rank {} root index {:.1} index {:.1}",
            t0.elapsed().as_secs_f64(),
            rep.ranks[0].rank,
            rep.ranks[0].root_index,
            rep.ranks[0].index
        );
        assert_eq!(rep.ranks[0].rank, 5, "the slow rank tops the root cause");
        let seed_top = rep
            .ranks
            .iter()
            .max_by(|a, b| a.index.total_cmp(&b.index).then(b.rank.cmp(&a.rank)))
            .map(|r| r.rank);
        assert_eq!(seed_top, Some(5), "the slow rank tops the seed index");
        g.throughput(Throughput::Elements(ops));
        g.bench_function(format!("{name} x {steps} steps"), |b| {
            b.iter_batched(
                || input.clone(),
                |i| analyze("bench", i, &settings),
                BatchSize::LargeInput,
            )
        });
        // The same job with the seed index alone (issue 17: the root cause within 2x of it).
        g.bench_function(format!("{name} x {steps} steps, seed index only"), |b| {
            b.iter_batched(
                || input.clone(),
                |i| analyze("bench", i, &seed_only),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

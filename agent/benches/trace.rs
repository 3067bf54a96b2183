//! Perfetto trace writing (issue 7): the encoder alone (op slices per second and bytes per op on
//! synthetic operations), then `trace::write_trace` end to end over a synthetic test-bed job
//! (`tests/scenarios/megatron.toml`), steps pass and time index included.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-agent --bench trace
//! ```
//!
//! `COMMINSIGHT_BENCH_TRACE_RANKS` (default 64) and `COMMINSIGHT_BENCH_TRACE_STEPS` (default 40)
//! size the job; the trace covers its steps 10..19.

use std::time::Instant;

use comminsight_agent::offline::{Input, Settings};
use comminsight_agent::trace::{flow_id, write_trace, ArgValue, TraceOptions, TraceWriter, Window};
use comminsight_wire::Func;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

mod support;
use support::{env_or, synthetic_job, TempDir};

/// Synthetic ops per encoder iteration.
const OPS: u64 = 100_000;
/// Ranks the synthetic ops are spread over (one thread track each).
const RANKS: u64 = 64;

/// `OPS` op slices (with the arguments `trace` writes) over `RANKS` ranks; returns the bytes.
fn encode(out: Vec<u8>) -> Vec<u8> {
    let mut w = TraceWriter::new(out);
    w.process_track(1 << 48, 1_000_000_000, "host0").unwrap();
    for r in 0..RANKS {
        w.thread_track(
            r + 1,
            1 << 48,
            1_000_000_000,
            r as i32 + 1,
            &format!("rank {r}"),
        )
        .unwrap();
    }
    let funcs = [Func::ALL_REDUCE, Func::ALL_GATHER, Func::REDUCE_SCATTER];
    let mut t = 1_796_013_567_000_000u64;
    for i in 0..OPS {
        let rank = i % RANKS;
        let func = funcs[(i / RANKS) as usize % funcs.len()];
        let seq = i / RANKS;
        let comm = 0x03a1_2ad8_98ec_5dbb_u64 ^ (rank / 8);
        let args = [
            ("role", ArgValue::Str("tp".into())),
            ("comm", ArgValue::Str(format!("0x{comm:016x}"))),
            ("func", ArgValue::Str(func.name().into())),
            ("seq", ArgValue::Uint(seq)),
            ("bytes", ArgValue::Uint(65_536)),
            ("count", ArgValue::Uint(16_384)),
            ("algo", ArgValue::Str("RING".into())),
            ("proto", ArgValue::Str("SIMPLE".into())),
            ("busbw_gbps", ArgValue::Double(12.5)),
            ("start_us", ArgValue::Uint(t)),
            ("end_us", ArgValue::Uint(t + 40)),
        ];
        let flow = flow_id(false, comm, func, seq, rank as i32, -1);
        w.begin(rank + 1, t * 1000, func.name(), true, &args, &[flow])
            .unwrap();
        w.end(rank + 1, (t + 40) * 1000).unwrap();
        if rank == RANKS - 1 {
            t += 125;
        }
    }
    w.finish().unwrap()
}

fn bench(c: &mut Criterion) {
    let bytes = encode(Vec::new()).len();
    eprintln!(
        "encoder: {OPS} op slices on {RANKS} ranks = {bytes} bytes, {:.1} bytes/op",
        bytes as f64 / OPS as f64
    );
    let mut g = c.benchmark_group("trace encoder");
    g.throughput(Throughput::Elements(OPS));
    g.bench_function("op slices (begin + end, 11 args, 1 flow)", |b| {
        b.iter(|| encode(Vec::with_capacity(bytes)))
    });
    g.finish();

    let ranks = env_or("COMMINSIGHT_BENCH_TRACE_RANKS", 64) as usize;
    let steps = env_or("COMMINSIGHT_BENCH_TRACE_STEPS", 40) as u32;
    let dir = TempDir::new("trace");
    synthetic_job(&dir.0, "megatron.toml", ranks, steps);
    let opts = TraceOptions {
        window: Window::Steps(10..=19),
        ranks: None,
        job: None,
    };
    let t0 = Instant::now();
    let settings = Settings::default();
    let run = || {
        let input = Input::open(&dir.0).expect("input");
        write_trace(&input, &opts, &settings, Vec::new()).expect("trace")
    };
    let sum = run();
    eprintln!(
        "write_trace: {ranks} ranks x steps 10..19: {} op slices, {} bytes ({:.1} bytes/op), {} flows, {:.3} s (first run: time index built)",
        sum.op_slices,
        sum.bytes,
        sum.bytes_per_op(),
        sum.flows,
        t0.elapsed().as_secs_f64()
    );
    let mut g = c.benchmark_group("trace end to end");
    g.sample_size(10);
    g.throughput(Throughput::Elements(sum.op_slices));
    g.bench_function(
        format!("megatron {ranks} ranks x {steps} steps, steps 10..19"),
        |b| b.iter(run),
    );
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Step engine rate (issue 5): operations per second through the per-GPU session (reorder
//! behind the safe window) and the boundary machine with the built-in `megatron-1f1b` template,
//! on one thread — in order, and shuffled within the safe window — then end to end:
//! `offline::steps::rebuild` over a synthetic test-bed job (`tests/scenarios/megatron.toml`).
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-agent --bench steps
//! ```
//!
//! `COMMINSIGHT_BENCH_STEPS_RANKS` (default 64) and `COMMINSIGHT_BENCH_STEPS_STEPS` (default 200)
//! size the end-to-end job.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use comminsight_agent::offline::steps::rebuild;
use comminsight_agent::offline::Settings;
use comminsight_agent::sinks::step_journal::read_stream;
use comminsight_agent::steps::config::DEFAULT_SAFE_WINDOW_US as SAFE_WINDOW_US;
use comminsight_agent::steps::fsm::{StepFsm, StepSummary};
use comminsight_agent::steps::session::RankSession;
use comminsight_agent::steps::template::{Template, TemplateSet};
use comminsight_agent::steps::StepOp;
use comminsight_wire::roles::Role;
use comminsight_wire::Func;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

mod support;
use support::{env_or, synthetic_job, TempDir};

/// Pipeline stages of the in-memory stream (the rank sits in stage 1: it receives and sends).
const PP: usize = 4;
const STAGE: usize = 1;
const MICROBATCHES: usize = 8;
const LAYERS: usize = 4;
const STEPS: u64 = 2_000;
/// Time between two operations of the rank (compute in between), µs.
const OP_GAP_US: u64 = 125;
/// Operation duration, µs.
const OP_US: u64 = 40;

/// Builds one rank's operations (with end times) in issue order.
#[derive(Default)]
struct Gen {
    ops: Vec<(StepOp, u64)>,
    sn: HashMap<(Role, Func), u64>,
    t: u64,
}

impl Gen {
    fn push(&mut self, role: Role, func: Func, bytes: u64) {
        let s = self.sn.entry((role, func)).or_default();
        let start_us = self.t;
        self.ops.push((
            StepOp {
                comm_hash: 0x1000 + role as u64,
                role: Some(role),
                func,
                bytes,
                coll_sn: *s,
                coll_local_sn: self.ops.len() as u64,
                start_us,
            },
            start_us + OP_US,
        ));
        *s += 1;
        self.t += OP_GAP_US;
    }

    /// One forward or backward pass of one microbatch: two TP all-reduces per layer.
    fn pass(&mut self) {
        for _ in 0..LAYERS * 2 {
            self.push(Role::Tp, Func::ALL_REDUCE, 65_536);
        }
    }

    /// A grouped pipeline transfer: (send?, towards the next stage?) parts, those with a peer.
    fn p2p(&mut self, parts: &[(bool, bool)]) {
        for &(send, next) in parts {
            if (next && STAGE + 1 < PP) || (!next && STAGE > 0) {
                let f = if send { Func::SEND } else { Func::RECV };
                self.push(Role::Pp, f, 65_536);
            }
        }
    }
}

/// One rank's operations in issue order, shaped like the test bed's Megatron step
/// (`tests/testbed/src/plan.rs`, `megatron_step`): non-interleaved 1F1B over the microbatches, two
/// TP all-reduces per layer and pass, grouped pipeline send/recv, the DP gradient all-reduce,
/// the tiny global all-reduce.
fn megatron_stream(steps: u64) -> Vec<(StepOp, u64)> {
    let mut g = Gen {
        t: 1_000_000,
        ..Gen::default()
    };
    let warmup = (PP - STAGE - 1).min(MICROBATCHES);
    let remaining = MICROBATCHES - warmup;
    for _ in 0..steps {
        for _ in 0..warmup {
            g.p2p(&[(false, false)]);
            g.pass();
            g.p2p(&[(true, true)]);
        }
        if remaining > 0 {
            g.p2p(&[(false, false)]);
        }
        for i in 0..remaining {
            g.pass();
            g.p2p(&[(true, true), (false, true)]);
            g.pass();
            if i == remaining - 1 {
                g.p2p(&[(true, false)]);
            } else {
                g.p2p(&[(true, false), (false, false)]);
            }
        }
        for _ in 0..warmup {
            g.p2p(&[(false, true)]);
            g.pass();
            g.p2p(&[(true, false)]);
        }
        g.push(Role::Dp, Func::ALL_REDUCE, 1 << 20);
        g.push(Role::Global, Func::ALL_REDUCE, 8);
    }
    g.ops
}

/// The same operations in an arrival order shuffled within the safe window: each arrives a
/// random delay in [0, 0.9 x window) after its start (so none is late).
fn shuffled(ops: &[(StepOp, u64)]) -> Vec<(StepOp, u64)> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut keyed: Vec<(u64, &(StepOp, u64))> = ops
        .iter()
        .map(|o| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (o.0.start_us + x % (SAFE_WINDOW_US * 9 / 10), o)
        })
        .collect();
    keyed.sort_by_key(|(arrival, o)| (*arrival, o.0.coll_local_sn));
    keyed.into_iter().map(|(_, o)| o.clone()).collect()
}

/// Push every operation through one rank's session, drain it: the steps and the largest number
/// of operations the reorder buffer held.
fn run_session(t: &Template, ops: Vec<(StepOp, u64)>) -> (Vec<StepSummary>, usize, u64) {
    let mut s = RankSession::new(StepFsm::new(t, 1), SAFE_WINDOW_US);
    let mut out = Vec::new();
    let mut held = 0;
    for (i, (op, end)) in ops.into_iter().enumerate() {
        s.push(op, end, &mut out);
        if i % 1024 == 0 {
            held = held.max(s.held());
        }
    }
    s.drain(&mut out);
    (out, held, s.late)
}

/// This process's user + system CPU time.
fn cpu_time() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the valid, writable pointer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage failed");
    // SAFETY: getrusage returned 0, so it filled the struct (and it was zeroed before).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn bench(c: &mut Criterion) {
    let templates = TemplateSet::builtin();
    let t = templates
        .get("megatron-1f1b")
        .expect("built-in megatron-1f1b template")
        .clone();
    let ops = megatron_stream(STEPS);
    let n = ops.len() as u64;
    let mixed = shuffled(&ops);
    let (ordered_steps, held, late) = run_session(&t, ops.clone());
    assert_eq!(ordered_steps.len() as u64, STEPS, "one summary per step");
    assert!(ordered_steps.iter().all(|s| s.coverage_complete));
    assert_eq!(late, 0);
    let (mixed_steps, mixed_held, mixed_late) = run_session(&t, mixed.clone());
    assert_eq!(mixed_late, 0, "no op arrived behind the safe window");
    assert_eq!(
        mixed_steps, ordered_steps,
        "shuffled within the window: same steps"
    );
    eprintln!(
        "engine: {} ops, {} ops/step; reorder buffer held <= {held} ops in order, <= {mixed_held} shuffled",
        n,
        n / STEPS
    );
    let mut g = c.benchmark_group("steps engine");
    g.throughput(Throughput::Elements(n));
    g.bench_function("megatron in order", |b| {
        b.iter_batched(
            || ops.clone(),
            |o| run_session(&t, o),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("megatron shuffled in window", |b| {
        b.iter_batched(
            || mixed.clone(),
            |o| run_session(&t, o),
            BatchSize::LargeInput,
        )
    });
    // The boundary machine alone (no reorder buffer): what the session adds.
    g.bench_function("megatron fsm only", |b| {
        b.iter_batched(
            || ops.clone(),
            |o| {
                let mut fsm = StepFsm::new(&t, 1);
                let mut out = Vec::new();
                for (op, end) in &o {
                    fsm.push(op, *end, &mut out);
                }
                out
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();

    let ranks = env_or("COMMINSIGHT_BENCH_STEPS_RANKS", 64) as usize;
    let steps = env_or("COMMINSIGHT_BENCH_STEPS_STEPS", 200) as u32;
    let dir = TempDir::new("steps");
    let t0 = Instant::now();
    synthetic_job(&dir.0, "megatron.toml", ranks, steps);
    eprintln!(
        "synthetic job: {ranks} ranks x {steps} steps written in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let out = TempDir(dir.0.with_extension("out"));
    let settings = Settings::default();
    let (w0, c0) = (Instant::now(), cpu_time());
    let jobs = rebuild(&dir.0, &settings, &out.0).expect("rebuild");
    let (wall, cpu) = (w0.elapsed(), cpu_time() - c0);
    assert_eq!(jobs.len(), 1, "one job");
    let job = &jobs[0];
    assert_eq!(
        job.template.as_ref().map(|t| t.name.as_str()),
        Some("megatron-1f1b")
    );
    let mut summaries = Vec::new();
    walk_jsonl(&out.0, &mut summaries);
    let (mut n, mut ops) = (0usize, 0u64);
    for f in &summaries {
        for s in read_stream(f).expect("read steps") {
            n += 1;
            ops += s.ops;
        }
    }
    assert_eq!(n, ranks * steps as usize, "every (rank, step)");
    let total = ops + job.open_ops.values().sum::<u64>();
    eprintln!(
        "rebuild: {total} ops in {:.3} s wall, {:.3} s CPU = {:.2} M ops/s per core",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        total as f64 / cpu.as_secs_f64() / 1e6
    );
    let mut g = c.benchmark_group("steps rebuild");
    g.sample_size(10);
    g.throughput(Throughput::Elements(total));
    g.bench_function(format!("megatron {ranks} ranks x {steps} steps"), |b| {
        b.iter(|| {
            let _ = std::fs::remove_dir_all(&out.0);
            rebuild(&dir.0, &settings, &out.0).expect("rebuild")
        })
    });
    g.finish();
}

/// Every `*.jsonl` under `dir`.
fn walk_jsonl(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk_jsonl(&p, out);
        } else if p.extension().is_some_and(|x| x == "jsonl") {
            out.push(p);
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

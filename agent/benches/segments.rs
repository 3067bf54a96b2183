//! Offline commands over many small segments (issue 16: run time was quadratic in the segments
//! per process — 1 000 segments 1 s, 4 000 15 s, 10 000 over 120 s). A synthetic 2-rank DDP job
//! whose records are re-written as 10 000 segments per process (two records each, as a plugin
//! with a tiny `max_segment_bytes` would write them); then every offline command — `dump`, `roles`,
//! `steps`, `hang`, `straggler`, `report`, `trace`, `replay` — as a user runs it (the binary, one
//! process per run). Target: each under 10 s. When `COMMINSIGHT_BENCH_BASELINE_BIN` names another
//! build's `comminsight-agent`, it is timed once per command in the same run (not in criterion:
//! before the fix one run took minutes).
//!
//! ```text
//! cargo bench -p comminsight-agent --bench segments
//! COMMINSIGHT_BENCH_SEGMENTS=2000 COMMINSIGHT_BENCH_BASELINE_BIN=/path/to/old/comminsight-agent \
//!   cargo bench -p comminsight-agent --bench segments
//! ```
//!
//! `COMMINSIGHT_BENCH_SEGMENTS` (default 10 000) sets the segments per process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use comminsight_wire::record::{Kind, RawRecord, RECORD_SIZE};
use comminsight_wire::segment::segment_file_name;
use criterion::{criterion_group, criterion_main, Criterion};

mod support;
use support::{env_or, synthetic_job, TempDir};

/// Stream records per segment.
const PER_SEGMENT: u64 = 2;

/// The stream records of a segment file (its `segment` header left out).
fn stream_records(f: &Path) -> Vec<RawRecord> {
    let bytes = std::fs::read(f).expect("read a segment");
    bytes
        .chunks_exact(RECORD_SIZE)
        .map(|c| RawRecord(c.try_into().expect("record-sized")))
        .filter(|r| r.kind_byte() != Kind::Segment as u8)
        .collect()
}

/// Every process directory's records under `logs` re-written as segments of [`PER_SEGMENT`]
/// records; the segments per process.
fn resegment(logs: &Path) -> Vec<usize> {
    let mut files = Vec::new();
    collect(logs, &mut files);
    files.sort();
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .collect();
    dirs.dedup();
    dirs.iter()
        .map(|dir| {
            let mine: Vec<&PathBuf> = files.iter().filter(|f| f.parent() == Some(dir)).collect();
            let recs: Vec<RawRecord> = mine.iter().flat_map(|f| stream_records(f)).collect();
            for f in &mine {
                std::fs::remove_file(f).expect("remove the original segment");
            }
            // Written directly (stream records only, as `seg-N.cis`): the plugin's
            // SegmentWriter lists its directory at every seal (retention), which takes minutes
            // for 10 000 segments.
            for (i, chunk) in recs.chunks(PER_SEGMENT as usize).enumerate() {
                let bytes: Vec<u8> = chunk.iter().flat_map(|r| r.0).collect();
                std::fs::write(dir.join(segment_file_name(i as u64, false)), bytes)
                    .expect("write a segment");
            }
            std::fs::read_dir(dir).expect("listable").count()
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "cis") {
            out.push(p);
        }
    }
}

/// The offline commands, each with its arguments over `dir` (outputs under `scratch`).
fn commands(dir: &Path, scratch: &Path) -> Vec<(&'static str, Vec<String>)> {
    let d = dir.display().to_string();
    let s = |p: &str| scratch.join(p).display().to_string();
    let v = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        ("dump", v(&["dump", &d, "--summary"])),
        ("roles", v(&["roles", &d])),
        ("steps", v(&["steps", &d, "--json"])),
        ("hang", v(&["hang", &d])),
        ("straggler", v(&["straggler", &d])),
        ("report", v(&["report", &d, "-o", &s("r.html")])),
        (
            "trace",
            v(&["trace", &d, "--steps", "0..99999", "-o", &s("t.pftrace")]),
        ),
        ("replay", v(&["replay", &d, "--out", &s("replay")])),
    ]
}

/// One run of `bin ARGS`; fails the bench on an input error (exit 2) or a crash.
fn run(bin: &Path, args: &[String]) {
    let o = Command::new(bin)
        .args(args)
        .output()
        .expect("run the agent");
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{} {args:?}: {}",
        bin.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn bench(c: &mut Criterion) {
    let per_proc = env_or("COMMINSIGHT_BENCH_SEGMENTS", 10_000);
    let steps = (per_proc * PER_SEGMENT / 5) as u32; // DDP: 5 records per rank and step
    let dir = TempDir::new("segments");
    let job = dir.0.join("job");
    let t0 = Instant::now();
    synthetic_job(&job, "ddp.toml", 2, steps);
    let logs = job.join("inspector_logs");
    let segs = resegment(&logs);
    eprintln!(
        "synthetic ddp job: 2 ranks x {steps} steps, segments per process {segs:?}, made in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let scratch = dir.0.join("out");
    std::fs::create_dir_all(&scratch).expect("mkdir");
    let current = PathBuf::from(env!("CARGO_BIN_EXE_comminsight-agent"));
    let baseline = std::env::var_os("COMMINSIGHT_BENCH_BASELINE_BIN").map(PathBuf::from);
    let mut bins = vec![("current", current.clone())];
    if let Some(b) = baseline {
        bins.push(("baseline", b));
    }
    for (name, args) in commands(&logs, &scratch) {
        for (which, bin) in &bins {
            let t = Instant::now();
            run(bin, &args);
            eprintln!("{name} ({which}, once): {:.3} s", t.elapsed().as_secs_f64());
        }
    }
    let mut g = c.benchmark_group(format!(
        "offline commands, {} segments per process",
        segs[0]
    ));
    g.sample_size(10);
    for (name, args) in commands(&logs, &scratch) {
        g.bench_function(name, |b| b.iter(|| run(&current, &args)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Offline commands end to end (issue 15): `comminsight-agent report ARCHIVE -o F.html` over an
//! agent archive (`raw/<job>/<host>/<pid>/seg-N.cis.zst`) of a synthetic megatron job, 64 ranks x
//! 100 steps by default, run as a user runs it (the binary, one process per run). When
//! `COMMINSIGHT_BENCH_BASELINE_BIN` names another build's `comminsight-agent` (e.g. the commit
//! before issue 15, built in its own target dir), the same command with that binary is measured
//! in the same run, so the two are compared on the same machine state.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-agent --bench offline
//! COMMINSIGHT_BENCH_BASELINE_BIN=/work/target-base/release/comminsight-agent \
//!   CARGO_TARGET_DIR=/work/target-rel cargo bench -p comminsight-agent --bench offline
//! ```
//!
//! `COMMINSIGHT_BENCH_OFFLINE_RANKS` (default 64) and `COMMINSIGHT_BENCH_OFFLINE_STEPS` (default
//! 100) size the job.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};

mod support;
use support::{env_or, synthetic_job, TempDir};

/// Every segment file under `dir`.
fn segments(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            segments(&p, out);
        } else if p.extension().is_some_and(|x| x == "cis") {
            out.push(p);
        }
    }
}

/// A synthetic job under `root`, archived under `archive` as the daemon lays it out.
fn archived_job(root: &Path, archive: &Path, ranks: usize, steps: u32) -> usize {
    synthetic_job(root, "megatron.toml", ranks, steps);
    let logs = root.join("inspector_logs");
    let mut segs = Vec::new();
    segments(&logs, &mut segs);
    for f in &segs {
        let rel = f.strip_prefix(&logs).expect("below the logs");
        let mut name = rel.file_name().expect("a file").to_os_string();
        name.push(".zst");
        let dest = archive
            .join("raw")
            .join(rel.parent().expect("in a process dir"))
            .join(name);
        std::fs::create_dir_all(dest.parent().expect("has a parent")).expect("mkdir");
        let bytes = zstd::encode_all(std::fs::File::open(f).expect("open"), 1).expect("zstd");
        std::fs::write(dest, bytes).expect("write");
    }
    segs.len()
}

/// One `report` run of `bin`; its first output line.
fn report(bin: &Path, archive: &Path, out: &Path) -> String {
    let o = Command::new(bin)
        .arg("report")
        .arg(archive)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run the agent");
    assert!(
        o.status.success(),
        "{} report: {}",
        bin.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn bench(c: &mut Criterion) {
    let ranks = env_or("COMMINSIGHT_BENCH_OFFLINE_RANKS", 64) as usize;
    let steps = env_or("COMMINSIGHT_BENCH_OFFLINE_STEPS", 100) as u32;
    let dir = TempDir::new("offline");
    let archive = dir.0.join("archive");
    let t0 = Instant::now();
    let n = archived_job(&dir.0.join("job"), &archive, ranks, steps);
    eprintln!(
        "synthetic job: {ranks} ranks x {steps} steps, {n} segments archived in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let current = PathBuf::from(env!("CARGO_BIN_EXE_comminsight-agent"));
    let baseline = std::env::var_os("COMMINSIGHT_BENCH_BASELINE_BIN").map(PathBuf::from);
    let html = dir.0.join("report.html");
    let mut bins = vec![("current", current)];
    if let Some(b) = baseline {
        bins.push(("baseline", b));
    }
    for (name, bin) in &bins {
        let t = Instant::now();
        let line = report(bin, &archive, &html);
        eprintln!(
            "{name} ({}): {:.3} s: {line}",
            bin.display(),
            t.elapsed().as_secs_f64()
        );
    }
    let mut g = c.benchmark_group(format!(
        "report over an archive, {ranks} ranks x {steps} steps"
    ));
    g.sample_size(10);
    for (name, bin) in &bins {
        g.bench_function(*name, |b| b.iter(|| report(bin, &archive, &html)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

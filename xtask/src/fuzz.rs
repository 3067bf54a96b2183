//! `cargo xtask fuzz [--minutes M | --seconds S] [--dev] [TARGET...]`: the cargo-fuzz targets of
//! `fuzz/` (`decode`: record decoding and the wire bounds; `analyses`: valid-shaped records through
//! the engine's roles, steps, hang and straggler analyses; `import_fr`, `import_kineto`,
//! `import_inspector`: the importers over arbitrary bytes, the Flight Recorder one through its
//! hang snapshot and the analysis; `plugin_abi`: call sequences through the plugin's exported
//! profiler tables on several threads; `segment`: segment files; `json_lines`: record, step
//! journal and clock book lines; `templates`: step templates and their state machine; `config`:
//! the agent's configuration loader; `master_link`: the link's protobuf messages and the
//! master's store and push consumers; `prometheus_text`: dcgm-exporter bodies and their
//! conversion), each for the given time (default 10
//! minutes), one after the other, seeded from the committed corpus `fuzz/corpus/<target>/`
//! (new inputs libFuzzer finds stay there, ignored by git; a crash is written to
//! `fuzz/artifacts/<target>/`). `cargo xtask test` ends with a [`SHORT_S`]-second run of each.
//!
//! The machine has only a stable toolchain: the targets are built without a sanitizer
//! (`--sanitizer none`; coverage instrumentation only) with debug assertions on (overflow
//! checks), and `RUSTC_BOOTSTRAP=1` lets cargo-fuzz pass its `-Z` flags to the stable compiler.
//! cargo-fuzz itself is installed with `cargo install --locked` when missing (~2 min cold).
//!
//! Builds go to the workspace's target directory (`target/x86_64-unknown-linux-gnu/`), but
//! share nothing with the workspace's own builds: cargo-fuzz instruments every crate (its
//! RUSTFLAGS), so every dependency is compiled again. The long run builds optimized (cargo-fuzz's
//! release: one codegen unit; cold 13 CPU-minutes, 17 min on the 2 shared cores here); the short
//! run of `cargo xtask test` builds `--dev` (unoptimized: cold 5 CPU-minutes, 5 min here; with
//! the install and the two runs it adds ~8 minutes to a cold `cargo xtask test`).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The fuzz targets (`fuzz/fuzz_targets/<name>.rs`).
pub const TARGETS: [&str; 12] = [
    "decode",
    "analyses",
    "import_fr",
    "import_kineto",
    "import_inspector",
    "plugin_abi",
    "segment",
    "json_lines",
    "templates",
    "config",
    "master_link",
    "prometheus_text",
];

/// Seconds per target of the short run in `cargo xtask test`.
pub const SHORT_S: u64 = 10;

/// How the targets are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// Optimized (the long run: the most executions a second).
    Release,
    /// Unoptimized (the short run: the cheapest cold build).
    Dev,
}

/// Install cargo-fuzz unless `cargo fuzz` already runs (idempotent).
fn ensure_cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        println!("xtask: tool cargo-fuzz: present");
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz");
    crate::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

/// Run each of `targets` for `seconds`, built as `build`.
pub fn run_targets(root: &Path, targets: &[&str], seconds: u64, build: Build) -> Result<()> {
    ensure_cargo_fuzz()?;
    let dir = root.join("fuzz");
    for t in targets {
        if !TARGETS.contains(t) {
            bail!("unknown fuzz target {t:?}: give one of {TARGETS:?}");
        }
        let corpus = dir.join("corpus").join(t);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        eprintln!("xtask: fuzzing {t} for {seconds} s");
        crate::run(
            Command::new("cargo")
                .current_dir(&dir)
                .env("RUSTC_BOOTSTRAP", "1")
                .args(["fuzz", "run", "--sanitizer", "none"])
                // Both keep debug assertions and overflow checks on.
                .args(match build {
                    Build::Release => &["--release", "--debug-assertions"][..],
                    Build::Dev => &["--dev"][..],
                })
                .arg("--target-dir")
                .arg(crate::target_dir(root))
                .arg(t)
                .arg(&corpus)
                .arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg("-print_final_stats=1"),
        )?;
    }
    Ok(())
}

/// `cargo xtask fuzz` with its arguments.
pub fn fuzz(root: &Path, args: &[String]) -> Result<()> {
    let mut seconds = 600;
    let mut build = Build::Release;
    let mut targets: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            it.next()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{name} needs a whole number, e.g. {name} 10"))
        };
        match a.as_str() {
            "--minutes" => seconds = value("--minutes")? * 60,
            "--seconds" => seconds = value("--seconds")?,
            // The build of the short run in `cargo xtask test`.
            "--dev" => build = Build::Dev,
            t => targets.push(t),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    run_targets(root, &targets, seconds, build)
}

//! `cargo xtask <command>`: build, test and demo CommInsight on a fresh machine of this kind.
//!
//! * `build-ebpf` — installs the BPF toolchain when missing (pinned nightly + rust-src, LLVM 22,
//!   bpf-linker) and builds `ebpf/probes` into `target/bpf/comminsight-probes.bpf.o` ([`ebpf`]).
//! * `build [--no-ebpf]` — builds the BPF object (`build-ebpf`; `--no-ebpf` or
//!   `COMMINSIGHT_NO_EBPF=1` leaves it out: the agent then says "eBPF not built in"), then
//!   builds the workspace (dev profile, the one profile tests and the demo use) and
//!   stages the shared libraries under their real names in `target/debug/lib/`:
//!   `libnccl-profiler-comminsight.so` (the plugin), `libcomminsight-preload.so` (the LD_PRELOAD
//!   shim), `libnccl.so.2` (the CPU test-bed stand-in), and the Python inject in `python/`.
//! * `test`   — installs what the tests need (idempotent; test tools under `target/test-tools`),
//!   checks formatting, licenses and sources (`deny`) and lints, builds, runs every test with `COMMINSIGHT_TEST_TOOLS` set, then
//!   a short run of each fuzz target.
//! * `fuzz [--minutes M | --seconds S] [--dev] [TARGET...]` — the cargo-fuzz targets of `fuzz/`,
//!   each for M minutes (default 10), built optimized (`--dev`: unoptimized, the cheaper build),
//!   installing cargo-fuzz when missing ([`fuzz`]); `test` ends with a 10-second run of each,
//!   built `--dev` (`COMMINSIGHT_SKIP_FUZZ=1` skips it).
//! * `dist [--profile dev|release] [--out DIR]` — the release tarball and the `.deb` (agent,
//!   plugin, preload, Python inject, templates, unit, example config, man pages, completions)
//!   into DIR (default `target/dist`), built in the release profile unless `--profile dev`
//!   ([`dist`]).
//! * `deny`   — `cargo deny check licenses bans sources` against `deny.toml`, installing
//!   cargo-deny when missing ([`deny`]); `test` runs it after the format check.
//! * `deps`   — only the installation step: system packages, toolchain components, test tools.
//! * `demo`   — builds, runs an 8-rank job (2 simulated hosts × 4 ranks) with one slow rank and,
//!   later, a hung rank on the CPU test bed, followed live by the agent daemon, then diagnoses it
//!   from the archive (`hang`, `straggler`), writes the HTML report and a Perfetto trace of the
//!   interesting steps, and prints a one-screen summary ([`demo`]).
//! * `eval hang [--scenarios N] [--synthetic] [--max-ranks R] [--healthy H] [--seed S] [--out DIR]
//!   [--keep]` — builds, then the randomised evaluation of `comminsight-agent hang`: N random
//!   faulty test-bed runs (hang, pyhang, kill, mismatch, PP-chain hang; default 200; layouts up
//!   to R ranks, default 1024 with `--synthetic`, 16 with real processes) and H healthy jittered
//!   runs (default 50); prints top-1 source-rank accuracy per kind (target >= 99.5 %) and false
//!   alarms (target 0), writes `DIR/eval-hang.json` (default `target/eval-hang`), exits 1 when a
//!   target is missed. `cargo xtask eval hang --help` lists every option.
//! * `eval straggler [--scenarios N] [--synthetic] [--max-ranks R] [--healthy H] [--seed S]
//!   [--out DIR] [--keep]` — the same for `comminsight-agent straggler`: a rank slowed by 5, 10,
//!   20 or 50 % of the step (measured per layout), alone or with a slow link, and healthy jittered
//!   runs; prints top-1 accuracy, per-step accuracy per slowdown (targets >= 97 %, 100 % at 50 %)
//!   and false positives (target 0), writes `DIR/eval-straggler.json` (default
//!   `target/eval-straggler`), exits 1 when a target is missed.

mod demo;
mod deny;
mod deps;
mod dist;
mod ebpf;
mod eval;
mod fuzz;
mod tools;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("build") => {
            if args.iter().any(|a| a == "--no-ebpf") {
                std::env::set_var("COMMINSIGHT_NO_EBPF", "1");
            }
            build(&root).map(|_| ())
        }
        Some("build-ebpf") => ebpf::build(&root).map(|_| ()),
        Some("test") => test(&root, &args[1..]),
        Some("demo") => demo::demo(&root, &args[1..]),
        Some("eval") => eval::eval(&root, &args[1..]),
        Some("fuzz") => fuzz::fuzz(&root, &args[1..]),
        Some("deny") => deny::check(&root),
        Some("dist") => dist::dist(&root, &args[1..]),
        Some("deps") => {
            deps::ensure()?;
            tools::ensure(&test_tools_dir(&root)).map(|_| ())
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <build [--no-ebpf] | build-ebpf | test [-- cargo test args] | demo [--out DIR] | deps | fuzz [--minutes M] [--dev] [TARGET..] | {} | {}>",
                eval::USAGE,
                dist::USAGE
            );
            std::process::exit(2);
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Where the staged libraries and binaries live.
pub fn lib_dir(root: &Path) -> PathBuf {
    target_dir(root).join("debug").join("lib")
}

/// Where the test tools live (`target/test-tools`).
fn test_tools_dir(root: &Path) -> PathBuf {
    target_dir(root).join("test-tools")
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Build everything once (dev profile) and stage the libraries under the names NCCL and the
/// dynamic loader look for. Returns the lib dir.
pub(crate) fn build(root: &Path) -> Result<PathBuf> {
    embed_ebpf(root)?;
    run(cargo()
        .current_dir(root)
        .args(["build", "--workspace", "--lib", "--bins"]))?;
    let debug = target_dir(root).join("debug");
    let lib = lib_dir(root);
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for (from, to) in [
        (
            "libnccl_profiler_comminsight.so",
            "libnccl-profiler-comminsight.so",
        ),
        ("libcomminsight_preload.so", "libcomminsight-preload.so"),
        ("libnccl.so", "libnccl.so.2"),
        // The HCCL stand-in (tests/hccl-standin; also the AscendCL stream / event part).
        ("libhccl.so", "libhccl.so"),
    ] {
        let src = debug.join(from);
        let dst = lib.join(to);
        // Copy to a temporary name and rename, so a running job never sees a half-written library.
        let tmp = lib.join(format!(".{to}.tmp"));
        std::fs::copy(&src, &tmp)
            .with_context(|| format!("staging {} (did the build produce it?)", src.display()))?;
        std::fs::rename(&tmp, &dst).with_context(|| format!("renaming into {}", dst.display()))?;
    }
    let so = lib.join("libnccl.so");
    if std::fs::symlink_metadata(&so).is_err() {
        std::os::unix::fs::symlink("libnccl.so.2", &so)
            .with_context(|| format!("linking {}", so.display()))?;
    }
    stage_python(&root.join("preload").join("python"), &lib.join("python"))?;
    stage_gpu_standins(root, &lib.join("gpu-standin"))?;
    eprintln!("xtask: libraries staged in {}", lib.display());
    Ok(lib)
}

/// Build the test bed's GPU stand-ins (`tests/gpu-standin`, C, with the system `cc`) into
/// `dir`: the CUDA runtime and driver the rank processes load, and the NVML library the agent's
/// tests point `[gpu] library` at. Each is written under a temporary name and renamed.
fn stage_gpu_standins(root: &Path, dir: &Path) -> Result<()> {
    let src = root.join("tests").join("gpu-standin");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, so, args) in [
        ("cuda_standin.c", "libcuda.so.1", &["-DSTANDIN_DRIVER"][..]),
        (
            "cuda_standin.c",
            "libcudart.so.12",
            &["-DSTANDIN_RUNTIME", "-ldl"][..],
        ),
        ("nvml_standin.c", "libnvidia-ml.so.1", &[][..]),
    ] {
        let tmp = dir.join(format!(".{so}.tmp"));
        run(Command::new("cc")
            .args([
                "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(&tmp)
            .arg(format!("-Wl,-soname,{so}"))
            .arg(src.join(file))
            .args(args)
            .arg("-lpthread"))?;
        std::fs::rename(&tmp, dir.join(so))
            .with_context(|| format!("renaming into {}", dir.display()))?;
    }
    Ok(())
}

/// Build the BPF object (unless `COMMINSIGHT_NO_EBPF` is set) and point the agent's build at it
/// through `COMMINSIGHT_BPF_OBJECT`, which every later cargo command of this process inherits
/// (build, clippy and test see the same value, so none of them rebuilds the agent).
fn embed_ebpf(root: &Path) -> Result<()> {
    if std::env::var_os("COMMINSIGHT_NO_EBPF").is_some_and(|v| !v.is_empty()) {
        eprintln!("xtask: COMMINSIGHT_NO_EBPF set: building the agent without eBPF");
        std::env::remove_var("COMMINSIGHT_BPF_OBJECT");
        return Ok(());
    }
    let obj = ebpf::build(root).context(
        "the eBPF build failed (to build everything else: `cargo xtask build --no-ebpf` or \
         COMMINSIGHT_NO_EBPF=1)",
    )?;
    std::env::set_var("COMMINSIGHT_BPF_OBJECT", obj);
    Ok(())
}

/// Copy the Python inject (`preload/python/`, if present) to `lib/python/`: into a temporary
/// directory first, then renamed over the old copy, so stale files go and no job sees half a tree.
fn stage_python(src: &Path, dst: &Path) -> Result<()> {
    let parent = dst.parent().context("python staging dir has a parent")?;
    let tmp = parent.join(".python.tmp");
    let old = parent.join(".python.old");
    for d in [&tmp, &old] {
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    if !src.is_dir() {
        if dst.exists() {
            std::fs::remove_dir_all(dst).with_context(|| format!("removing {}", dst.display()))?;
        }
        return Ok(());
    }
    copy_tree(src, &tmp)?;
    if dst.exists() {
        std::fs::rename(dst, &old).with_context(|| format!("moving {} aside", dst.display()))?;
    }
    std::fs::rename(&tmp, dst).with_context(|| format!("renaming into {}", dst.display()))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

/// Copy a directory tree (files and directories; `__pycache__` left out).
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    for e in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let e = e.with_context(|| format!("reading {}", src.display()))?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        if e.file_name() == "__pycache__" {
            continue;
        }
        if e.file_type()?.is_dir() {
            copy_tree(&from, &to)?;
        } else {
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
    }
    Ok(())
}

fn test(root: &Path, extra: &[String]) -> Result<()> {
    deps::ensure()?;
    let tools = tools::ensure(&test_tools_dir(root))?;
    run(cargo()
        .current_dir(root)
        .args(["fmt", "--all", "--", "--check"]))?;
    deny::check(root)?;
    let lib = build(root)?;
    run(cargo().current_dir(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let mut cmd = cargo();
    cmd.current_dir(root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(extra)
        .env("COMMINSIGHT_LIB_DIR", &lib)
        .env("COMMINSIGHT_BIN_DIR", target_dir(root).join("debug"))
        .env("COMMINSIGHT_TEST_TOOLS", &tools)
        // Tests run many daemons at once: each takes any free port for its HTTP endpoint
        // instead of all racing for the default 127.0.0.1:9464 (the tests of the endpoint
        // itself set their own address).
        .env("COMMINSIGHT_HTTP_LISTEN", "127.0.0.1:0");
    run(&mut cmd)?;
    // A short fuzz run of every target (COMMINSIGHT_SKIP_FUZZ=1 leaves it out).
    if std::env::var_os("COMMINSIGHT_SKIP_FUZZ").is_none() {
        fuzz::run_targets(root, &fuzz::TARGETS, fuzz::SHORT_S, fuzz::Build::Dev)?;
    }
    Ok(())
}

pub(crate) fn count_files(dir: &Path, suffix: &str) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                count_files(&p, suffix)
            } else {
                usize::from(p.to_string_lossy().ends_with(suffix))
            }
        })
        .sum()
}

//! `cargo xtask build-ebpf`: the BPF object `target/bpf/comminsight-probes.bpf.o`, which the
//! agent embeds (agent/build.rs reads `COMMINSIGHT_BPF_OBJECT`).
//!
//! Prerequisites (installed idempotently; `shared/research/ebpf-nic.md`, "Recommended build
//! recipe"): a nightly with `rust-src` whose LLVM major is 22 (pinned: [`NIGHTLY`]; the
//! machine's `nightly` is taken when it is that build), Debian's LLVM 22 (`llvm-22-dev`, from
//! bookworm-security) and `bpf-linker` 0.13.0 built against it (`LLVM_PREFIX`, feature
//! `llvm-22`) into `$CARGO_HOME/bin`, where it survives clean clones. A second run costs
//! seconds: every step first checks what is there.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The nightly the BPF programs are built with: LLVM 22, like `bpf-linker` and Debian's LLVM.
pub const NIGHTLY: &str = "nightly-2026-05-19";
/// Its commit date, to recognise the same build installed as plain `nightly`.
const NIGHTLY_DATE: &str = "2026-05-19";
/// The `bpf-linker` release and the LLVM it is built against.
const BPF_LINKER: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_PACKAGES: [&str; 4] = [
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];

/// Where the object lands (and what the agent's build embeds).
pub fn object_path(root: &Path) -> PathBuf {
    crate::target_dir(root)
        .join("bpf")
        .join("comminsight-probes.bpf.o")
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The toolchain name to build with: the pinned nightly if installed, else the machine's
/// `nightly` when it is the same build, else the pinned one installed now.
fn toolchain() -> Result<String> {
    let installed = |tc: &str| output(Command::new("rustc").arg(format!("+{tc}")).arg("-vV"));
    if installed(NIGHTLY).is_some() {
        return Ok(NIGHTLY.to_string());
    }
    if let Some(v) = installed("nightly") {
        if v.contains(&format!("commit-date: {NIGHTLY_DATE}")) && v.contains("LLVM version: 22.") {
            return Ok("nightly".to_string());
        }
    }
    eprintln!("xtask: installing Rust {NIGHTLY} (the BPF programs' toolchain)");
    let st = Command::new("rustup")
        .args(["toolchain", "install", NIGHTLY, "--profile", "minimal"])
        .args(["--component", "rust-src"])
        .status()
        .context("running rustup")?;
    if !st.success() {
        bail!(
            "cannot install Rust {NIGHTLY}: the eBPF build needs it (fix: `rustup toolchain install \
             {NIGHTLY} --component rust-src`, or build without eBPF: `cargo xtask build --no-ebpf`)"
        );
    }
    Ok(NIGHTLY.to_string())
}

fn ensure_rust_src(tc: &str) -> Result<()> {
    let list = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        tc,
    ]))
    .unwrap_or_default();
    if list.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!("xtask: adding rust-src to {tc}");
    let st = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", tc])
        .status()
        .context("running rustup")?;
    if !st.success() {
        bail!(
            "cannot add rust-src to {tc} (fix: `rustup component add rust-src --toolchain {tc}`)"
        );
    }
    Ok(())
}

/// `$CARGO_HOME/bin`.
fn cargo_bin() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        });
    home.join("bin")
}

/// A `bpf-linker` of the pinned release that runs (its libLLVM present).
fn linker_ok(bin: &Path) -> bool {
    output(Command::new(bin.join("bpf-linker")).arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER))
}

fn ensure_linker() -> Result<PathBuf> {
    let bin = cargo_bin();
    let missing: Vec<&str> = LLVM_PACKAGES
        .into_iter()
        .filter(|p| !crate::deps::have_deb(p))
        .collect();
    if !missing.is_empty() {
        crate::deps::apt_install(&missing).with_context(|| {
            "the eBPF build needs Debian's LLVM 22 (from bookworm-security); build without eBPF: \
             `cargo xtask build --no-ebpf`"
        })?;
    }
    if linker_ok(&bin) {
        return Ok(bin);
    }
    eprintln!("xtask: building bpf-linker {BPF_LINKER} against LLVM 22 (about 2-3 minutes)");
    let st = Command::new("cargo")
        .args(["install", "bpf-linker", "--version", BPF_LINKER, "--locked"])
        .args(["--no-default-features", "--features", "llvm-22", "--force"])
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .status()
        .context("running cargo install")?;
    if !st.success() || !linker_ok(&bin) {
        bail!(
            "cannot build bpf-linker {BPF_LINKER} (fix: `LLVM_PREFIX={LLVM_PREFIX} cargo install \
             bpf-linker --version {BPF_LINKER} --locked --no-default-features --features llvm-22`)"
        );
    }
    Ok(bin)
}

/// Install what the eBPF build needs, build the programs, and return the object's path.
pub fn build(root: &Path) -> Result<PathBuf> {
    let tc = toolchain()?;
    ensure_rust_src(&tc)?;
    let bin = ensure_linker()?;
    let manifest = root.join("ebpf").join("probes").join("Cargo.toml");
    let target = crate::target_dir(root).join("bpf").join("cargo");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(&path));
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &tc, "cargo", "build", "--release", "--bins"])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .env("PATH", std::env::join_paths(paths)?)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
        )
        // The outer cargo's settings must not leak into the nested build.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTDOC");
    crate::run(&mut cmd).context("building the BPF programs (ebpf/probes)")?;
    let built = target
        .join("bpfel-unknown-none")
        .join("release")
        .join("comminsight-probes");
    let obj = object_path(root);
    let tmp = obj.with_extension("o.tmp");
    std::fs::copy(&built, &tmp).with_context(|| format!("copying {}", built.display()))?;
    // Only a changed object makes the agent rebuild (the build script watches the file).
    if std::fs::read(&obj).ok() == std::fs::read(&tmp).ok() {
        std::fs::remove_file(&tmp).ok();
    } else {
        std::fs::rename(&tmp, &obj).with_context(|| format!("writing {}", obj.display()))?;
    }
    eprintln!("xtask: BPF object {}", obj.display());
    Ok(obj)
}

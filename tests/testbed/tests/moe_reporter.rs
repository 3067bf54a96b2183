//! The MoE reporter (`preload/python/comminsight_moe`): `tests/testbed/python/moe_tests/
//! test_moe_reporter.py` with the pinned venv's python (numpy, no torch): DeepXTrace's detector
//! against the spec's S1-S11, the sync / async windows, ids, bounded retries, swallowed errors,
//! and the real plugin's `comminsight_ep_stats_push` found in /proc/self/maps (with
//! `COMMINSIGHT_LIB_DIR`, as `cargo xtask build` stages it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `$COMMINSIGHT_TEST_TOOLS/venv/bin/python` (default `<workspace>/target/test-tools`).
fn venv_python() -> PathBuf {
    let root = std::env::var_os("COMMINSIGHT_TEST_TOOLS").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/test-tools"
            ))
        },
        PathBuf::from,
    );
    let p = root.join("venv/bin/python");
    assert!(
        p.exists(),
        "missing test tool {}: run `cargo xtask deps`",
        p.display()
    );
    p
}

#[test]
fn python_moe_reporter_unit_tests_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = venv_python();
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root.join("python/moe_tests"))
        .env_remove("PYTHONPATH")
        .env_remove("LD_PRELOAD")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env(
            "COMMINSIGHT_PRELOAD_PYTHON",
            root.join("../../preload/python").canonicalize().unwrap(),
        )
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let ran: usize = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert!(
        ran >= 16,
        "expected the reporter tests to run, got {ran}:\n{text}"
    );
    if std::env::var_os("COMMINSIGHT_LIB_DIR").is_some() {
        assert!(
            !text.contains("skipped 'COMMINSIGHT_LIB_DIR"),
            "the real-plugin test was skipped:\n{text}"
        );
    }
}

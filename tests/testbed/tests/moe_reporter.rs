//! The MoE reporter (`preload/python/comminsight_moe`): `tests/testbed/python/moe_tests/
//! test_moe_reporter.py` with the pinned venv's python (numpy, no torch): DeepXTrace's detector
//! against the spec's S1-S11, the sync / async windows, ids, bounded retries, swallowed errors,
//! and the real plugin's `comminsight_ep_stats_push` found in /proc/self/maps (with
//! `COMMINSIGHT_LIB_DIR`, as `cargo xtask build` stages it).

use std::path::PathBuf;

#[path = "support/pyunit.rs"]
mod pyunit;

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
    let (text, ran) = pyunit::run_unittests(venv_python().as_os_str(), "python/moe_tests");
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

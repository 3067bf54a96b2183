//! What the benches share: a temporary directory removed on drop, sizes from the environment,
//! and the CPU test bed's synthetic jobs.

#![allow(dead_code, reason = "each bench uses a part of it")]

use std::path::{Path, PathBuf};

use comminsight_testbed::cli::RunArgs;

/// A directory under the system temp dir, removed on drop (also on panic).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `$TMPDIR/comminsight-<what>-bench-<pid>`, fresh.
    pub fn new(what: &str) -> TempDir {
        let d =
            std::env::temp_dir().join(format!("comminsight-{what}-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The environment variable `name` as a number, else `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A synthetic test-bed job of the scenario `tests/scenarios/<scenario>` under `root`.
pub fn synthetic_job(root: &Path, scenario: &str, ranks: usize, steps: u32) {
    let args = RunArgs::synthetic(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/scenarios")
            .join(scenario),
        root.to_path_buf(),
        ranks,
        steps,
    );
    let s = comminsight_testbed::cli::run(&args).expect("synthetic test-bed job");
    assert!(s.ok, "synthetic job did not complete");
}

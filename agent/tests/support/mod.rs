//! Helpers shared by the agent's integration tests (a folder, so cargo does not build it as a
//! test target of its own).

#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "ciagent-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run the built `comminsight-agent` with `args`.
pub fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .args(args)
        // A host's own overrides must not change what the tests see.
        .env_remove("COMMINSIGHT_OTLP_ENABLED")
        .output()
        .expect("run comminsight-agent")
}

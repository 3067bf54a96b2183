//! Run a folder of Python unit tests (`python -m unittest discover`) the way the test bed's
//! Python tests run: no inherited `PYTHONPATH` / `LD_PRELOAD`, the preload's Python tree in
//! `COMMINSIGHT_PRELOAD_PYTHON`. Asserts they passed; returns their output and how many ran.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

pub fn run_unittests(python: &OsStr, dir: &str) -> (String, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root.join(dir))
        .env_remove("PYTHONPATH")
        .env_remove("LD_PRELOAD")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env(
            "COMMINSIGHT_PRELOAD_PYTHON",
            root.join("../../preload/python").canonicalize().unwrap(),
        )
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.to_string_lossy()));
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{text}");
    let ran = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    (text, ran)
}

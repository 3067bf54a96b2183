//! The Python inject (`preload/python/comminsight_inject`, `sitecustomize.py`) against the fake
//! `torch.distributed` (`tests/testbed/python/fake_torch`), with stand-ins of the preload's ABI and
//! of NCCL: `tests/testbed/python/tests/test_inject.py`, run with the system `python3`
//! (`COMMINSIGHT_PYTHON` overrides).

use std::path::Path;
use std::process::Command;

#[test]
fn python_inject_unit_tests_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("COMMINSIGHT_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root.join("python/tests"))
        .env_remove("PYTHONPATH")
        .env_remove("LD_PRELOAD")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env(
            "COMMINSIGHT_PRELOAD_PYTHON",
            root.join("../../preload/python").canonicalize().unwrap(),
        )
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
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
        ran >= 13,
        "expected the inject tests to run, got {ran}:\n{text}"
    );
}

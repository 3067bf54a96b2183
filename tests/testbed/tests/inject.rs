//! The Python inject (`preload/python/comminsight_inject`, `sitecustomize.py`) against the fake
//! `torch.distributed` (`tests/testbed/python/fake_torch`), with stand-ins of the preload's ABI and
//! of NCCL: `tests/testbed/python/tests/test_inject.py`, run with the system `python3`
//! (`COMMINSIGHT_PYTHON` overrides).

#[path = "support/pyunit.rs"]
mod pyunit;

#[test]
fn python_inject_unit_tests_pass() {
    let python = std::env::var_os("COMMINSIGHT_PYTHON").unwrap_or_else(|| "python3".into());
    let (text, ran) = pyunit::run_unittests(&python, "python/tests");
    assert!(
        ran >= 13,
        "expected the inject tests to run, got {ran}:\n{text}"
    );
}

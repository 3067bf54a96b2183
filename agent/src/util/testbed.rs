//! Test support: the CPU test bed's synthetic jobs (lib unit tests only).

use std::path::Path;

use comminsight_testbed::cli::RunArgs;

/// A synthetic job of the scenario `tests/scenarios/<scenario>` under `root`.
pub(crate) fn synthetic(root: &Path, scenario: &str, ranks: usize, steps: u32) {
    let args = RunArgs::synthetic(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/scenarios")
            .join(scenario),
        root.to_path_buf(),
        ranks,
        steps,
    );
    let s = comminsight_testbed::cli::run(&args).expect("synthetic test-bed job");
    assert!(s.ok);
}

//! `--help` is part of the contract: snapshot it. Regenerate with `COMMINSIGHT_UPDATE_SNAPSHOTS=1`.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_comminsight-testbed");

fn check(args: &[&str], snapshot: &str) {
    let out = Command::new(BIN).args(args).output().expect("run --help");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8 help");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(snapshot);
    if std::env::var_os("COMMINSIGHT_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &text).expect("write snapshot");
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        text,
        want,
        "{} changed; rerun with COMMINSIGHT_UPDATE_SNAPSHOTS=1 if intended",
        path.display()
    );
}

#[test]
fn run_help_matches_the_snapshot() {
    check(&["run", "--help"], "run-help.txt");
}

#[test]
fn top_level_help_matches_the_snapshot() {
    check(&["--help"], "help.txt");
}

#[test]
fn eval_hang_help_matches_the_snapshot() {
    check(&["eval", "hang", "--help"], "eval-hang-help.txt");
}

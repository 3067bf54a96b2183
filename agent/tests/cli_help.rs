//! `--help` of every command is part of the CLI contract: snapshot it.
//! Regenerate with `COMMINSIGHT_UPDATE_SNAPSHOTS=1 cargo test -p comminsight-agent --test cli_help`.

use std::path::Path;
use std::process::Command;

fn check(args: &[&str], snapshot: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_comminsight-agent"))
        .args(args)
        .output()
        .expect("run --help");
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
fn top_level_help_matches_the_snapshot() {
    check(&["--help"], "help.txt");
}

#[test]
fn dump_help_matches_the_snapshot() {
    check(&["dump", "--help"], "dump-help.txt");
}

#[test]
fn encode_help_matches_the_snapshot() {
    check(&["encode", "--help"], "encode-help.txt");
}

#[test]
fn run_help_matches_the_snapshot() {
    check(&["run", "--help"], "run-help.txt");
}

#[test]
fn replay_help_matches_the_snapshot() {
    check(&["replay", "--help"], "replay-help.txt");
}

#[test]
fn doctor_help_matches_the_snapshot() {
    check(&["doctor", "--help"], "doctor-help.txt");
}

#[test]
fn config_help_matches_the_snapshot() {
    check(&["config", "--help"], "config-help.txt");
}

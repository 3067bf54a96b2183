//! `tests/gpu/check.sh` on a machine without a GPU: it says so, checks nothing, exits 0.

use std::path::Path;
use std::process::Command;

#[test]
fn the_gpu_check_dry_runs_without_a_gpu() {
    if Path::new("/dev/nvidia0").exists() {
        eprintln!("a GPU is here: run tests/gpu/check.sh by hand");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("tests/gpu/check.sh"))
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("run check.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("no GPU"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

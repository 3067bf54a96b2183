//! `packaging/comminsight-agent.service` passes `systemd-analyze verify` without a single message,
//! and its `systemd-analyze security` exposure score is printed (and must not get worse).

use std::path::{Path, PathBuf};
use std::process::Command;

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../packaging/comminsight-agent.service"
);
const INSTALLED_BIN: &str = "/usr/bin/comminsight-agent";
/// Issue 23's bound (systemd 252 scores the unit 3.0); a change that raises it must justify the
/// new exposure in the unit's comments and docs/reliability.md.
const MAX_EXPOSURE: f64 = 3.0;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn systemd_analyze() -> &'static str {
    let ok = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "systemd-analyze not found: install systemd (apt-get install systemd) or run `cargo xtask deps`"
    );
    "systemd-analyze"
}

/// The unit with ExecStart pointing at the binary this build produced (verify requires it to exist).
fn unit_copy(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(UNIT).expect("read packaging/comminsight-agent.service");
    assert!(
        text.contains(&format!("ExecStart={INSTALLED_BIN} run --config /etc/comminsight/agent.toml")),
        "ExecStart changed: the README and this test expect `{INSTALLED_BIN} run --config /etc/comminsight/agent.toml`"
    );
    let text = text.replace(INSTALLED_BIN, env!("CARGO_BIN_EXE_comminsight-agent"));
    let p = dir.join("comminsight-agent.service");
    std::fs::write(&p, text).expect("write unit copy");
    p
}

fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("comminsight-systemd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    TempDir(d)
}

#[test]
fn unit_verifies_cleanly() {
    let tool = systemd_analyze();
    let dir = temp_dir("verify");
    let unit = unit_copy(&dir.0);
    let out = Command::new(tool)
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "systemd-analyze verify {}: {}\nstdout: {stdout}\nstderr: {stderr}",
        unit.display(),
        out.status
    );
}

#[test]
fn unit_keeps_its_hardening_and_exposure_score() {
    let text = std::fs::read_to_string(UNIT).expect("read unit");
    for line in [
        "Type=notify",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_SYS_PTRACE CAP_DAC_READ_SEARCH",
        "LimitMEMLOCK=infinity",
        "ProtectProc=invisible",
        "DeviceAllow=char-nvidia* rw",
        "StateDirectory=comminsight",
        "LogsDirectory=comminsight",
        "PrivateTmp=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "LockPersonality=yes",
        "MemoryMax=512M",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "the unit lost `{line}`"
        );
    }
    let tool = systemd_analyze();
    let dir = temp_dir("security");
    let unit = unit_copy(&dir.0);
    let out = Command::new(tool)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze security");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| {
            panic!(
                "no exposure line in: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the score in `{line}`"));
    println!(
        "systemd-analyze security exposure: {score} ({})",
        line.trim()
    );
    assert!(
        score <= MAX_EXPOSURE,
        "exposure {score} > {MAX_EXPOSURE}: a change loosened the sandbox ({line})"
    );
}

//! Idempotent installation of what tests and the demo need on a fresh machine of this kind.

use std::process::Command;

use anyhow::{bail, Context, Result};

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

/// The Debian package is installed (`dpkg-query` says `install ok installed`).
pub(crate) fn have_deb(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b"install ok installed"))
}

/// Packages without a command on `PATH` to probe: `libunwind-dev`, which the build links for
/// py-spy's native unwinding (agent `stacks`, feature `unwind`), and `chromium-headless-shell`,
/// the headless Chromium the HTML report's tests render the report in.
/// Debian packages the build and tests need: libunwind (py-spy), headless Chromium (report test),
/// libibverbs with its headers and providers (the eBPF ibverbs tests call the real library and
/// build the provider stand-in in tests/ibverbs-standin).
const DEV_PACKAGES: [&str; 4] = [
    "libunwind-dev",
    "chromium-headless-shell",
    "libibverbs-dev",
    "ibverbs-providers",
];

/// `apt-get install` these Debian packages (after an index update).
pub fn apt_install(pkgs: &[&str]) -> Result<()> {
    eprintln!("xtask: installing Debian packages {pkgs:?}");
    let update = Command::new("apt-get")
        .args(["update", "-qq"])
        .status()
        .context("running apt-get update")?;
    if !update.success() {
        bail!("apt-get update failed; install {pkgs:?} by hand");
    }
    let st = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get install")?;
    if !st.success() {
        bail!("apt-get install {pkgs:?} failed");
    }
    Ok(())
}

/// Make sure the toolchain components and system tools exist.
pub fn ensure() -> Result<()> {
    let mut missing = Vec::new();
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("python3", "python3"),
        ("cc", "gcc"),
        ("systemd-analyze", "systemd"),
        // The OTLP TLS test makes its CA and server certificate with it.
        ("openssl", "openssl"),
        // The agent's /metrics test scrapes two daemons with a real Prometheus server.
        ("prometheus", "prometheus"),
        // The lossy-link TCP test drops packets with an nftables rule inside its namespace
        // where the kernel has no netem qdisc.
        ("nft", "nftables"),
    ] {
        if !have(tool) && !missing.contains(&pkg) {
            missing.push(pkg);
        }
    }
    for pkg in DEV_PACKAGES {
        if !have_deb(pkg) {
            missing.push(pkg);
        }
    }
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    if have("systemd-analyze") {
        println!("xtask: tool systemd-analyze: present");
    } else {
        bail!("systemd-analyze still missing after installing systemd");
    }
    for comp in ["rustfmt", "clippy"] {
        let probe = if comp == "rustfmt" {
            "cargo fmt --version"
        } else {
            "cargo clippy --version"
        };
        let ok = Command::new("sh")
            .args(["-c", &format!("{probe} >/dev/null 2>&1")])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let st = Command::new("rustup")
                .args(["component", "add", comp])
                .status()
                .context("running rustup")?;
            if !st.success() {
                bail!("rustup component add {comp} failed");
            }
        }
    }
    Ok(())
}

//! `cargo xtask dist [--profile dev|release] [--out DIR]`: the release tarball
//! `comminsight-<version>-<arch>-linux.tar.gz` and the Debian package
//! `comminsight_<version>_<debarch>.deb`, both from one staged tree:
//!
//! | path | what |
//! |---|---|
//! | `/usr/bin/comminsight-agent` | the agent |
//! | `/usr/lib/comminsight/libnccl-profiler-comminsight.so`, `libcomminsight-preload.so` | plugin, LD_PRELOAD shim |
//! | `/usr/lib/comminsight/python/` | the Python inject (found by the shim beside itself) |
//! | `/usr/share/comminsight/templates/` | the step templates (`templates/`) |
//! | `/lib/systemd/system/comminsight-agent.service` | the unit (`packaging/`) |
//! | `/etc/comminsight/agent.toml` | the example configuration, a conffile |
//! | `/usr/share/man/man1/comminsight-agent*.1.gz` | man pages (`comminsight-agent generate man`) |
//! | bash, zsh, fish completions | in each shell's vendor directory |
//!
//! The default profile is `release`; `--profile dev` packages what `cargo xtask build` builds (the
//! tests use it, so CI builds one profile only). The test-bed `libnccl.so.2` stand-in is never
//! shipped. The Dockerfile (`packaging/Dockerfile`) is copied beside the packages: `DIR` is its
//! build context. Timestamps come from `SOURCE_DATE_EPOCH`, else the commit's time.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

pub const USAGE: &str = "dist [--profile dev|release] [--out DIR]";

const BIN: &str = "comminsight-agent";
/// Built library name -> installed name under /usr/lib/comminsight.
const LIBS: [(&str, &str); 2] = [
    (
        "libnccl_profiler_comminsight.so",
        "libnccl-profiler-comminsight.so",
    ),
    ("libcomminsight_preload.so", "libcomminsight-preload.so"),
];
/// The packages the release profile builds (the agent, the plugin, the shim).
const PACKAGES: [&str; 3] = [
    "comminsight-agent",
    "comminsight-plugin",
    "comminsight-preload",
];
/// Shell -> completion file under the staged root (each shell's vendor directory).
const COMPLETIONS: [(&str, &str); 3] = [
    (
        "bash",
        "usr/share/bash-completion/completions/comminsight-agent",
    ),
    ("zsh", "usr/share/zsh/vendor-completions/_comminsight-agent"),
    (
        "fish",
        "usr/share/fish/vendor_completions.d/comminsight-agent.fish",
    ),
];
const CONFIG: &str = "etc/comminsight/agent.toml";
const MAINTAINER: &str = "CommInsight maintainers <maintainers@comminsight.invalid>";
/// Debian packages the ELF files need besides libc6 (py-spy's native unwinder).
const DEPENDS: &str = "libunwind8";
/// postinst (`configure`) and postrm (`remove|purge`): reload systemd's units only where systemd
/// runs, and not when installing into another root (`dpkg --root`, image builds).
const MAINT_SCRIPT: &str = r#"#!/bin/sh
set -e
case "$1" in
  WHEN)
    if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
      systemctl daemon-reload >/dev/null || true
    fi
    ;;
esac
exit 0
"#;

struct Opts {
    release: bool,
    out: PathBuf,
}

/// What `dist` wrote.
pub struct Dist {
    pub tarball: PathBuf,
    pub deb: PathBuf,
}

fn parse(root: &Path, args: &[String]) -> Result<Opts> {
    let mut opts = Opts {
        release: true,
        out: super::target_dir(root).join("dist"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--profile" => match it.next().map(String::as_str) {
                Some("release") => opts.release = true,
                Some("dev") => opts.release = false,
                other => bail!(
                    "--profile {}: use `--profile dev` or `--profile release`",
                    other.unwrap_or("without a value")
                ),
            },
            "--out" => {
                opts.out = it
                    .next()
                    .map(PathBuf::from)
                    .context("--out needs a directory: `--out DIR`")?;
            }
            other => bail!("dist: unknown argument {other:?}; usage: cargo xtask {USAGE}"),
        }
    }
    Ok(opts)
}

pub fn dist(root: &Path, args: &[String]) -> Result<()> {
    let opts = parse(root, args)?;
    let started = std::time::Instant::now();
    let built = build(root, opts.release)?;
    let build_s = started.elapsed().as_secs_f64();
    let d = package(root, &built, opts.release, &opts.out)?;
    for p in [&d.tarball, &d.deb] {
        let size = std::fs::metadata(p).map_or(0, |m| m.len());
        println!("xtask: wrote {} ({:.1} MiB)", p.display(), mib(size));
    }
    let total = started.elapsed().as_secs_f64();
    println!(
        "xtask: dist took {total:.1} s (build {build_s:.1} s, packaging {:.1} s)",
        total - build_s
    );
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    // Sizes of packages: far below 2^52, exact in an f64.
    bytes as f64 / (1024.0 * 1024.0)
}

/// Build the profile; returns its output directory (`target/debug` or `target/release`).
fn build(root: &Path, release: bool) -> Result<PathBuf> {
    if !release {
        // Exactly `cargo xtask build`: nothing is built twice when it ran before.
        super::build(root)?;
        return Ok(super::target_dir(root).join("debug"));
    }
    let mut cmd = super::cargo();
    cmd.current_dir(root)
        .args(["build", "--release", "--lib", "--bins"]);
    for p in PACKAGES {
        cmd.args(["-p", p]);
    }
    super::run(&mut cmd)?;
    Ok(super::target_dir(root).join("release"))
}

/// Stage the tree from a built profile directory and write both packages into `out`.
pub fn package(root: &Path, built: &Path, release: bool, out: &Path) -> Result<Dist> {
    std::fs::create_dir_all(out).with_context(|| format!("creating --out {}", out.display()))?;
    let bin = built.join(BIN);
    let version = agent_version(&bin)?;
    let (arch, debarch) = arches()?;
    let epoch = source_date_epoch(root);
    let stage = out.join(format!(".stage-comminsight_{version}_{debarch}"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)
            .with_context(|| format!("removing the old {}", stage.display()))?;
    }
    stage_tree(root, built, &stage)?;
    generate_docs(&bin, &stage)?;
    strip_debug(&stage)?;
    normalize_modes(&stage)?;
    let tarball = out.join(format!("comminsight-{version}-{arch}-linux.tar.gz"));
    write_tarball(
        &stage,
        &tarball,
        &format!("comminsight-{version}-{arch}-linux"),
        epoch,
    )?;
    debian_dir(&stage, &version, &debarch)?;
    let deb = out.join(format!("comminsight_{version}_{debarch}.deb"));
    // xz for a release; gzip for the tests' dev package (xz takes half a minute there).
    let z = if release { "-Zxz" } else { "-Zgzip" };
    super::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", z, "--build"])
            .arg(&stage)
            .arg(&deb)
            .env("SOURCE_DATE_EPOCH", epoch.to_string()),
    )?;
    let docker = root.join("packaging/Dockerfile");
    std::fs::copy(&docker, out.join("Dockerfile"))
        .with_context(|| format!("copying {} into {}", docker.display(), out.display()))?;
    std::fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    Ok(Dist { tarball, deb })
}

/// `0.1.0` from `comminsight-agent 0.1.0 (commit ..., built ...)`.
fn agent_version(bin: &Path) -> Result<String> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {} --version (was it built?)", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.split_whitespace().nth(1).unwrap_or_default();
    if !out.status.success() || !version.starts_with(|c: char| c.is_ascii_digit()) {
        bail!(
            "{} --version printed {:?}: expected `{BIN} <version> ...`",
            bin.display(),
            text.trim()
        );
    }
    Ok(version.to_string())
}

/// (`x86_64`, `amd64`) and the like: the machine's and Debian's names of this architecture.
fn arches() -> Result<(String, String)> {
    let arch = std::env::consts::ARCH.to_string();
    let deb = match arch.as_str() {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64el",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        other => bail!("no Debian architecture known for {other}; add it to xtask/src/dist.rs"),
    };
    Ok((arch, deb.to_string()))
}

/// `SOURCE_DATE_EPOCH`, else the time of the commit checked out, else 0.
fn source_date_epoch(root: &Path) -> i64 {
    if let Some(v) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return v;
    }
    Command::new("git")
        .args(["--no-optional-locks", "log", "-1", "--format=%ct"])
        .current_dir(root)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(d) = to.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    std::fs::copy(from, to).with_context(|| {
        format!(
            "copying {} (was it built?) to {}",
            from.display(),
            to.display()
        )
    })?;
    Ok(())
}

/// Everything but the generated docs and `DEBIAN/`.
fn stage_tree(root: &Path, built: &Path, stage: &Path) -> Result<()> {
    copy_file(&built.join(BIN), &stage.join("usr/bin").join(BIN))?;
    let lib = stage.join("usr/lib/comminsight");
    for (from, to) in LIBS {
        copy_file(&built.join(from), &lib.join(to))?;
    }
    super::copy_tree(&root.join("preload/python"), &lib.join("python"))?;
    super::copy_tree(
        &root.join("templates"),
        &stage.join("usr/share/comminsight/templates"),
    )?;
    copy_file(
        &root.join("packaging/comminsight-agent.service"),
        &stage.join("lib/systemd/system/comminsight-agent.service"),
    )?;
    copy_file(&root.join("agent/config.example.toml"), &stage.join(CONFIG))?;
    let doc = stage.join("usr/share/doc/comminsight");
    copy_file(&root.join("README.md"), &doc.join("README.md"))?;
    std::fs::write(
        doc.join("copyright"),
        "CommInsight\nLicense: Apache-2.0\n \
         On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n",
    )?;
    Ok(())
}

fn run_capture(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Man pages (gzip -9n, as Debian ships them) and completions, from the binary itself.
fn generate_docs(bin: &Path, stage: &Path) -> Result<()> {
    let man = stage.join("usr/share/man/man1");
    run_capture(
        Command::new(bin)
            .args(["generate", "man", "--out"])
            .arg(&man),
    )?;
    let mut pages = Vec::new();
    for e in std::fs::read_dir(&man).with_context(|| format!("reading {}", man.display()))? {
        pages.push(e?.path());
    }
    if !pages.iter().any(|p| p.ends_with(format!("{BIN}.1"))) {
        bail!(
            "{bin:?} generate man wrote no {BIN}.1 into {}",
            man.display()
        );
    }
    run_capture(Command::new("gzip").args(["-9n", "--"]).args(&pages))?;
    for (shell, path) in COMPLETIONS {
        let text = run_capture(Command::new(bin).args(["generate", "completions", shell]))?;
        if text.is_empty() {
            bail!(
                "{} generate completions {shell} printed nothing",
                bin.display()
            );
        }
        let to = stage.join(path);
        std::fs::create_dir_all(to.parent().context("completion path has a parent")?)?;
        std::fs::write(&to, text).with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(())
}

/// `strip --strip-debug` on the binary and the libraries: the symbol table stays (backtraces keep
/// their function names), the DWARF goes (the dev agent: 179 MB -> 36 MB).
fn strip_debug(stage: &Path) -> Result<()> {
    let mut files = vec![stage.join("usr/bin").join(BIN)];
    files.extend(
        LIBS.iter()
            .map(|(_, to)| stage.join("usr/lib/comminsight").join(to)),
    );
    super::run(Command::new("strip").arg("--strip-debug").args(&files))
}

/// 0755 for directories, the binary and the libraries; 0644 for every other file.
fn normalize_modes(dir: &Path) -> Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            normalize_modes(&p)?;
            continue;
        }
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let exec = p.parent().is_some_and(|d| d.ends_with("usr/bin")) || name.ends_with(".so");
        let mode = if exec { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {}", p.display()))?;
    }
    Ok(())
}

fn write_tarball(stage: &Path, tarball: &Path, top: &str, epoch: i64) -> Result<()> {
    super::run(
        Command::new("tar")
            .arg("-C")
            .arg(stage)
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
            .arg(format!("--mtime=@{epoch}"))
            .arg(format!("--transform=s,^,{top}/,"))
            .args(["--use-compress-program=gzip -9n", "-cf"])
            .arg(tarball)
            .args(["etc", "lib", "usr"]),
    )
}

/// The highest `GLIBC_2.N` symbol version any staged ELF file needs (`libc6 (>= 2.N)`).
fn glibc_floor(dir: &Path, best: &mut (u32, u32)) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            glibc_floor(&p, best)?;
            continue;
        }
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        if !bytes.starts_with(b"\x7fELF") {
            continue;
        }
        for (i, w) in bytes.windows(6).enumerate() {
            if w != b"GLIBC_" {
                continue;
            }
            let rest = &bytes[i + 6..bytes.len().min(i + 16)];
            let text: String = rest
                .iter()
                .take_while(|b| b.is_ascii_digit() || **b == b'.')
                .map(|&b| char::from(b))
                .collect();
            let mut parts = text.split('.').map(|s| s.parse::<u32>().ok());
            if let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) {
                *best = (*best).max((major, minor));
            }
        }
    }
    Ok(())
}

fn dir_kib(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        total += if e.file_type()?.is_dir() {
            dir_kib(&e.path())? + 4
        } else {
            e.metadata()?.len().div_ceil(1024)
        };
    }
    Ok(total)
}

/// `DEBIAN/`: control, conffiles, and the maintainer scripts that reload systemd.
fn debian_dir(stage: &Path, version: &str, debarch: &str) -> Result<()> {
    let mut glibc = (2, 17);
    glibc_floor(stage, &mut glibc)?;
    let kib = dir_kib(stage)?;
    let d = stage.join("DEBIAN");
    std::fs::create_dir_all(&d)?;
    let control = format!(
        "Package: comminsight\n\
         Version: {version}\n\
         Architecture: {debarch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {kib}\n\
         Depends: libc6 (>= {}.{}), {DEPENDS}\n\
         Section: admin\n\
         Priority: optional\n\
         Description: communication-centric observability for NCCL training jobs\n \
         The CommInsight host agent (comminsight-agent, a systemd service), the NCCL\n \
         profiler plugin, the LD_PRELOAD shim with its Python inject, the step templates,\n \
         man pages and shell completions.\n",
        glibc.0, glibc.1
    );
    std::fs::write(d.join("control"), control)?;
    std::fs::write(d.join("conffiles"), format!("/{CONFIG}\n"))?;
    for (script, when) in [("postinst", "configure"), ("postrm", "remove|purge")] {
        let p = d.join(script);
        std::fs::write(&p, MAINT_SCRIPT.replace("WHEN", when))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    }
    for f in ["control", "conffiles"] {
        std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

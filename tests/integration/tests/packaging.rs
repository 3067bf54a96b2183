//! Packages and deployment files (issue 18):
//! * `dist_packages_install_and_run`: `cargo xtask dist --profile dev` (the profile `cargo xtask
//!   build` built: nothing is built twice) writes the `.deb` and the tarball; `dpkg-deb -c` lists
//!   every shipped file (and no test-bed `libnccl`), the control file depends on libc6 and
//!   libunwind8 and every library the ELF files need comes from those (or libgcc-s1), the example
//!   configuration is a conffile; the tarball holds the same files; `dpkg -i` into a scratch root
//!   installs it, the installed `comminsight-agent --version` names the commit checked out, the
//!   unit's `ExecStartPre=` check passes on the installed configuration, `systemd-analyze verify`
//!   passes on the installed unit, the man page and the bash completion are sound; `dpkg -r`
//!   keeps the configuration and `dpkg -P` removes it. The Dockerfile copied beside the packages
//!   only COPYs what dist wrote, from Debian bookworm-slim, and runs the installed agent.
//! * `dockerfile_passes_hadolint`: no finding at all, info level included (one justified ignore).
//! * `kubernetes_manifests_validate_offline`: `packaging/kubernetes/*.yaml` against the Kubernetes
//!   schemas with kubernetes-validate, without a network, and against the unit and the settings
//!   (`py/k8s_manifests.py`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use comminsight_tests::{bin_dir, test_tool, walk, OutDir};

const UNIT: &str = "lib/systemd/system/comminsight-agent.service";
const CONFIG: &str = "etc/comminsight/agent.toml";
const BIN: &str = "usr/bin/comminsight-agent";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run `cmd`; its standard output, or a panic with its standard error.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}:\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one file in `dir` whose name starts with `prefix` and ends with `suffix`.
fn one_file(dir: &Path, prefix: &str, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dist output")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            n.starts_with(prefix) && n.ends_with(suffix)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "want one {prefix}*{suffix} in {}: {found:?}",
        dir.display()
    );
    found[0].clone()
}

/// Every file the package must hold (paths without the leading `/`).
fn expected_files() -> BTreeSet<String> {
    let mut want: BTreeSet<String> = [
        BIN,
        "usr/lib/comminsight/libnccl-profiler-comminsight.so",
        "usr/lib/comminsight/libcomminsight-preload.so",
        UNIT,
        CONFIG,
        "usr/share/man/man1/comminsight-agent.1.gz",
        "usr/share/man/man1/comminsight-agent-run.1.gz",
        "usr/share/man/man1/comminsight-agent-config-check.1.gz",
        "usr/share/bash-completion/completions/comminsight-agent",
        "usr/share/zsh/vendor-completions/_comminsight-agent",
        "usr/share/fish/vendor_completions.d/comminsight-agent.fish",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for (src, dst) in [
        ("preload/python", "usr/lib/comminsight/python"),
        ("templates", "usr/share/comminsight/templates"),
    ] {
        let root = repo().join(src);
        let mut files = Vec::new();
        walk(&root, &mut files);
        for f in files {
            let rel = f
                .strip_prefix(&root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            if !rel.contains("__pycache__") {
                want.insert(format!("{dst}/{rel}"));
            }
        }
    }
    assert!(
        want.contains("usr/lib/comminsight/python/sitecustomize.py"),
        "{want:?}"
    );
    want
}

/// `dpkg-deb -c`: regular files (path -> `mode owner`).
fn deb_listing(deb: &Path) -> Vec<(String, String)> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f[5].trim_start_matches("./").to_string();
            (path, format!("{} {}", f[0], f[1]))
        })
        .collect()
}

fn check_deb(deb: &Path) -> BTreeSet<String> {
    let listing = deb_listing(deb);
    let files: BTreeSet<String> = listing.iter().map(|(p, _)| p.clone()).collect();
    let want = expected_files();
    let missing: Vec<&String> = want.iter().filter(|f| !files.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "{} lacks {missing:?}; it has {files:?}",
        deb.display()
    );
    assert!(
        !files.iter().any(|f| f.contains("libnccl.so")),
        "the test-bed libnccl stand-in is shipped: {files:?}"
    );
    let mode = |p: &str| {
        listing
            .iter()
            .find(|(f, _)| f == p)
            .map(|(_, m)| m.as_str())
    };
    assert_eq!(mode(BIN), Some("-rwxr-xr-x root/root"));
    assert_eq!(mode(CONFIG), Some("-rw-r--r-- root/root"));
    let field = |f: &str| {
        run(Command::new("dpkg-deb").arg("-f").arg(deb).arg(f))
            .trim()
            .to_string()
    };
    assert_eq!(field("Package"), "comminsight");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    let depends = field("Depends");
    assert!(
        depends.contains("libc6 (>= 2.") && depends.contains("libunwind8"),
        "Depends: {depends}"
    );
    let ctrl = OutDir::new("packaging-ctrl");
    run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(ctrl.path()));
    let conffiles = std::fs::read_to_string(ctrl.path().join("conffiles")).expect("conffiles");
    assert_eq!(conffiles, format!("/{CONFIG}\n"));
    let postinst = std::fs::read_to_string(ctrl.path().join("postinst")).expect("postinst");
    assert!(
        postinst.contains("[ -d /run/systemd/system ]")
            && postinst.contains("systemctl daemon-reload"),
        "postinst reloads systemd only where it runs:\n{postinst}"
    );
    files
}

fn check_tarball(tarball: &Path, deb_files: &BTreeSet<String>) {
    let name = tarball.file_name().and_then(|n| n.to_str()).expect("name");
    let top = name.strip_suffix(".tar.gz").expect("a .tar.gz");
    assert!(
        top.ends_with("-linux") && top.contains(std::env::consts::ARCH),
        "{name}"
    );
    let files: BTreeSet<String> = run(Command::new("tar").arg("-tzf").arg(tarball))
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| {
            l.strip_prefix(&format!("{top}/"))
                .unwrap_or_else(|| panic!("{l} is outside {top}/"))
                .to_string()
        })
        .collect();
    assert_eq!(
        &files, deb_files,
        "the tarball and the .deb ship different files"
    );
}

/// Install into a scratch root with dpkg (maintainer scripts outside a chroot, `DPKG_ROOT` set).
fn dpkg(root: &Path, args: &[&str]) -> String {
    run(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args([
            "--force-not-root",
            "--force-script-chrootless",
            "--log=/dev/null",
        ])
        .args(args))
}

fn check_needed_libraries(root: &Path, depends: &[&str]) {
    for f in [
        BIN,
        "usr/lib/comminsight/libnccl-profiler-comminsight.so",
        "usr/lib/comminsight/libcomminsight-preload.so",
    ] {
        let text = run(Command::new("readelf").arg("-d").arg(root.join(f)));
        for lib in text.lines().filter(|l| l.contains("(NEEDED)")) {
            let so = lib
                .rsplit('[')
                .next()
                .unwrap_or_default()
                .trim_end_matches(']');
            let owner = run(Command::new("dpkg").args(["-S", &format!("*/{so}")]));
            let pkg = owner.split(':').next().unwrap_or_default();
            assert!(
                depends.contains(&pkg),
                "{f} needs {so} from {pkg}, which the package does not depend on ({depends:?})"
            );
        }
    }
}

fn head_commit() -> String {
    run(Command::new("git")
        .current_dir(repo())
        .args(["rev-parse", "--short", "HEAD"]))
    .trim()
    .to_string()
}

/// `commits`: HEAD before and after the build (a commit made meanwhile may or may not be in it).
fn check_installed(root: &Path, commits: &[String]) {
    let version = run(Command::new(root.join(BIN)).arg("--version"));
    println!("installed: {}", version.trim());
    let named = commits.iter().any(|c| {
        version.starts_with(&format!(
            "comminsight-agent {} (commit {c}",
            env!("CARGO_PKG_VERSION")
        ))
    });
    assert!(
        named && version.contains(", built 20"),
        "--version `{}` does not name the commit {commits:?} (git rev-parse --short HEAD)",
        version.trim()
    );
    // The unit's ExecStartPre, on the installed configuration, with the installed binary.
    let unit = std::fs::read_to_string(root.join(UNIT)).expect("installed unit");
    let pre = "ExecStartPre=/usr/bin/comminsight-agent config check /etc/comminsight/agent.toml";
    assert!(unit.lines().any(|l| l == pre), "the unit lost `{pre}`");
    let mut check = Command::new(root.join(BIN));
    check.args(["config", "check"]).arg(root.join(CONFIG));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COMMINSIGHT_")) {
        check.env_remove(k);
    }
    run(&mut check);
    // systemd-analyze verify needs the executables at their paths: point them into the root.
    let local = root.join("verify/comminsight-agent.service");
    std::fs::create_dir_all(local.parent().expect("parent")).expect("mkdir");
    let bin = root.join(BIN);
    std::fs::write(
        &local,
        unit.replace("/usr/bin/comminsight-agent", &bin.to_string_lossy()),
    )
    .expect("write unit");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&local)
        .output()
        .expect("systemd-analyze (apt-get install systemd; cargo xtask deps)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
    let man = run(Command::new("gzip")
        .arg("-dc")
        .arg(root.join("usr/share/man/man1/comminsight-agent.1.gz")));
    assert!(
        man.contains("\n.TH comminsight-agent 1 "),
        "not a section 1 page:\n{man}"
    );
    assert!(
        man.contains("comminsight\\-agent\\-run(1)"),
        "the man page lists no subcommand pages:\n{man}"
    );
    run(Command::new("bash")
        .arg("-n")
        .arg(root.join("usr/share/bash-completion/completions/comminsight-agent")));
}

fn check_dockerfile(out: &Path, deb_files: &BTreeSet<String>) {
    let text = std::fs::read_to_string(out.join("Dockerfile")).expect("dist copies the Dockerfile");
    let ours =
        std::fs::read_to_string(repo().join("packaging/Dockerfile")).expect("packaging/Dockerfile");
    assert_eq!(text, ours, "dist copied another Dockerfile");
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut from = Vec::new();
    let mut exec = Vec::new();
    for line in joined.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (op, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        match op.to_ascii_uppercase().as_str() {
            "FROM" => from.push(rest.trim().to_string()),
            "COPY" | "ADD" => {
                let args: Vec<&str> = rest
                    .split_whitespace()
                    .filter(|a| !a.starts_with("--"))
                    .collect();
                assert!(
                    !rest.contains("--from="),
                    "no multi-stage COPY expected: {line}"
                );
                let (dest, srcs) = args.split_last().expect("COPY SRC.. DEST");
                assert!(!srcs.is_empty(), "{line}: no source before {dest}");
                for s in srcs {
                    let hit = std::fs::read_dir(out)
                        .expect("read out")
                        .flatten()
                        .any(|e| glob(s, &e.file_name().to_string_lossy()));
                    assert!(hit, "{line}: {s} matches nothing `cargo xtask dist` writes");
                }
            }
            "ENTRYPOINT" | "CMD" => {
                let v: Vec<String> =
                    serde_json::from_str(rest.trim()).expect("exec form JSON array");
                exec.extend(v);
            }
            "RUN" => assert!(
                !rest.contains("curl") && !rest.contains("wget"),
                "{line}: fetches from outside"
            ),
            _ => {}
        }
    }
    assert_eq!(from, ["debian:bookworm-slim"]);
    assert!(
        joined.contains("libunwind8"),
        "the image installs libunwind8"
    );
    assert_eq!(
        exec,
        [
            "/usr/bin/comminsight-agent",
            "run",
            "--config",
            "/etc/comminsight/agent.toml"
        ]
    );
    assert!(deb_files.contains(&exec[0][1..]) && deb_files.contains(&exec[3][1..]));
}

/// Shell-style `*` and `?` against one name.
fn glob(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    fn m(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => m(&p[1..], n) || (!n.is_empty() && m(p, &n[1..])),
            (Some('?'), Some(_)) => m(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &n[1..]),
            _ => false,
        }
    }
    m(&p, &n)
}

#[test]
fn dist_packages_install_and_run() {
    let out = OutDir::new("packaging-dist");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let before = head_commit();
    run(Command::new(cargo)
        .current_dir(repo())
        .args([
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--",
            "dist",
            "--profile",
            "dev",
            "--out",
        ])
        .arg(out.path()));
    let deb = one_file(out.path(), "comminsight_", ".deb");
    let tarball = one_file(out.path(), "comminsight-", "-linux.tar.gz");
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len()) / 1024;
    println!(
        "dist --profile dev: {:.1} s; {} {} KiB; {} {} KiB",
        started.elapsed().as_secs_f64(),
        deb.display(),
        size(&deb),
        tarball.display(),
        size(&tarball)
    );
    let files = check_deb(&deb);
    check_tarball(&tarball, &files);
    check_dockerfile(out.path(), &files);

    let root = out.path().join("root");
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir dpkg db");
    }
    for f in ["status", "available"] {
        std::fs::write(root.join("var/lib/dpkg").join(f), "").expect("dpkg db file");
    }
    // The scratch root has no libc6 / libunwind8 of its own: the host's are used to run it.
    dpkg(&root, &["--force-depends", "-i", &deb.to_string_lossy()]);
    let status = dpkg(&root, &["-s", "comminsight"]);
    assert!(status.contains("Status: install ok installed"), "{status}");
    check_needed_libraries(&root, &["libc6", "libgcc-s1", "libunwind8"]);
    check_installed(&root, &[before, head_commit()]);
    dpkg(&root, &["-r", "comminsight"]);
    assert!(
        root.join(CONFIG).exists(),
        "dpkg -r removed the conffile {CONFIG}"
    );
    assert!(!root.join(BIN).exists(), "dpkg -r left {BIN}");
    dpkg(&root, &["-P", "comminsight"]);
    assert!(!root.join(CONFIG).exists(), "dpkg -P kept {CONFIG}");
}

#[test]
fn kubernetes_manifests_validate_offline() {
    let python = test_tool("venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/k8s_manifests.py");
    let r = repo();
    let args = [
        python.into_os_string(),
        script.into_os_string(),
        r.join("packaging/kubernetes").into_os_string(),
        r.join("packaging/comminsight-agent.service")
            .into_os_string(),
        r.join("agent/config.example.toml").into_os_string(),
        bin_dir().join("comminsight-agent").into_os_string(),
    ];
    // Without a network namespace of its own where that is allowed (root): proof it is offline.
    let isolated = Command::new("unshare")
        .args(["--net", "true"])
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = if isolated {
        let mut c = Command::new("unshare");
        c.args(["--net", "--"]).args(&args);
        c
    } else {
        let mut c = Command::new(&args[0]);
        c.args(&args[1..]);
        c
    };
    let text = run(&mut cmd);
    println!("{text}(network namespace of its own: {isolated})");
}

#[test]
fn dockerfile_passes_hadolint() {
    let hadolint = test_tool("venv/bin/hadolint");
    let dockerfile = repo().join("packaging/Dockerfile");
    let out = Command::new(&hadolint)
        .args(["--no-color", "--failure-threshold", "info"])
        .arg(&dockerfile)
        .output()
        .expect("run hadolint");
    assert!(
        out.status.success(),
        "hadolint {}:\n{}{}",
        dockerfile.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

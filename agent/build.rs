//! Build information for `comminsight-agent --version`:
//! * `COMMINSIGHT_GIT_COMMIT`: `git rev-parse --short HEAD`, with `+dirty` when tracked files
//!   differ from it; `unknown` when not built from a git checkout (a source tarball, no git);
//! * `COMMINSIGHT_BUILD_DATE`: the build time in UTC (`YYYY-MM-DDTHH:MM:SSZ`), taken from
//!   `SOURCE_DATE_EPOCH` when set (reproducible builds), else the clock.
//!
//! Rebuild triggers stay narrow: the script reruns when HEAD moves (`.git/HEAD`, the branch's ref
//! file, `packed-refs`) or when the sources of this crate and of `wire/` change (those rebuild the
//! agent anyway, and are what makes a build `+dirty`); never on a change elsewhere in the tree.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    for p in [
        "build.rs",
        "Cargo.toml",
        "src",
        "../wire/src",
        "../wire/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", manifest.join(p).display());
    }
    let commit = match git_commit(&manifest) {
        Some((commit, watched)) => {
            for w in watched {
                println!("cargo:rerun-if-changed={}", w.display());
            }
            commit
        }
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=COMMINSIGHT_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=COMMINSIGHT_BUILD_DATE={}", build_date());
    bpf_object();
}

/// The BPF object (`cargo xtask build-ebpf`) to embed: `COMMINSIGHT_BPF_OBJECT` names it (the
/// xtask sets it for every cargo command it runs). Embedded, the crate is built with
/// `--cfg comminsight_bpf` and `env!("COMMINSIGHT_BPF_OBJECT")`; without it the agent says
/// "eBPF not built in" and everything else works.
fn bpf_object() {
    println!("cargo::rustc-check-cfg=cfg(comminsight_bpf)");
    println!("cargo:rerun-if-env-changed=COMMINSIGHT_BPF_OBJECT");
    let Some(path) = std::env::var_os("COMMINSIGHT_BPF_OBJECT").filter(|p| !p.is_empty()) else {
        return;
    };
    let path = PathBuf::from(path);
    if !path.is_file() {
        panic!(
            "COMMINSIGHT_BPF_OBJECT={} is not a file (fix: `cargo xtask build-ebpf`, or unset it \
             to build without eBPF)",
            path.display()
        );
    }
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rustc-cfg=comminsight_bpf");
    println!("cargo:rustc-env=COMMINSIGHT_BPF_OBJECT={}", path.display());
}

/// `git` in `dir`: its trimmed standard output when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        // Never take index.lock: a build must not make a concurrent `git add` fail.
        .arg("--no-optional-locks")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The short commit (`+dirty` when tracked files changed) and the files whose change moves HEAD.
fn git_commit(dir: &Path) -> Option<(String, Vec<PathBuf>)> {
    let short = git(dir, &["rev-parse", "--short", "HEAD"]).filter(|s| !s.is_empty())?;
    let dirty =
        git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let path = |p: &str| {
        git(
            dir,
            &["rev-parse", "--path-format=absolute", "--git-path", p],
        )
        .map(PathBuf::from)
    };
    let mut watched: Vec<PathBuf> = ["HEAD", "packed-refs"]
        .into_iter()
        .filter_map(path)
        .collect();
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]).and_then(|r| path(&r)) {
        watched.push(r);
    }
    let suffix = if dirty { "+dirty" } else { "" };
    Some((format!("{short}{suffix}"), watched))
}

fn build_date() -> String {
    let secs = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v.trim().parse::<i64>().unwrap_or_else(|_| {
            panic!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds; unset it or set it to e.g. $(git log -1 --format=%ct)")
        }),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
    };
    utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian, UTC).
fn utc(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

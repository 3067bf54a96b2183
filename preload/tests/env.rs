//! The shim's constructor: `NCCL_PROFILER_PLUGIN`, `PYTHONPATH` for the inject,
//! `COMMINSIGHT_DISABLE`, seen by a Python process started with `LD_PRELOAD`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{lib_dir, TempDir};

const SHOW: &str = "import os, sys\n\
for k in ('NCCL_PROFILER_PLUGIN', 'PYTHONPATH'):\n    print(k + '=' + os.environ.get(k, '<unset>'))\n\
print('SITE=' + str(getattr(sys.modules.get('sitecustomize'), 'MARK', None)))\n";

/// Environment a Python process sees with `LD_PRELOAD=preload`.
fn seen(preload: &Path, ld_path: Option<&Path>, env: &[(&str, &str)]) -> (String, String, String) {
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(SHOW)
        .env("LD_PRELOAD", preload)
        .env_remove("NCCL_PROFILER_PLUGIN")
        .env_remove("PYTHONPATH")
        .env_remove("COMMINSIGHT_DISABLE")
        .env_remove("COMMINSIGHT_INJECT");
    match ld_path {
        Some(p) => cmd.env("LD_LIBRARY_PATH", p),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("start python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let get = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} missing in {out}"))
            .to_string()
    };
    (
        get("NCCL_PROFILER_PLUGIN="),
        get("PYTHONPATH="),
        get("SITE="),
    )
}

/// A private install: the shim and the plugin copied into a temp dir with a `python/` inject.
fn install(with_inject: bool) -> TempDir {
    let lib = lib_dir();
    let d = TempDir::new("install");
    for f in [
        "libcomminsight-preload.so",
        "libnccl-profiler-comminsight.so",
    ] {
        std::fs::copy(lib.join(f), d.path().join(f)).expect("copy library");
    }
    if with_inject {
        let py = d.path().join("python");
        std::fs::create_dir_all(&py).expect("mkdir");
        std::fs::write(py.join("sitecustomize.py"), "MARK = 'inject-loaded'\n").expect("write");
    }
    d
}

#[test]
fn profiler_plugin_set_only_when_unset_and_installed() {
    let lib = lib_dir();
    let shim = lib.join("libcomminsight-preload.so");
    // On the loader path: the short name.
    assert_eq!(seen(&shim, Some(&lib), &[]).0, "comminsight");
    // Not on the loader path: the absolute path next to the shim.
    let inst = install(false);
    let shim2 = inst.path().join("libcomminsight-preload.so");
    let want = inst.path().join("libnccl-profiler-comminsight.so");
    assert_eq!(seen(&shim2, None, &[]).0, want.to_string_lossy());
    // Set by the user: kept.
    assert_eq!(
        seen(&shim, Some(&lib), &[("NCCL_PROFILER_PLUGIN", "none")]).0,
        "none"
    );
    // Not installed (no plugin next to the shim, none on the path): left unset.
    std::fs::remove_file(&want).expect("rm plugin");
    assert_eq!(seen(&shim2, None, &[]).0, "<unset>");
    // Disabled: nothing at all.
    assert_eq!(
        seen(&shim, Some(&lib), &[("COMMINSIGHT_DISABLE", "1")]).0,
        "<unset>"
    );
}

#[test]
fn python_inject_on_the_path() {
    let inst = install(true);
    let shim = inst.path().join("libcomminsight-preload.so");
    let py = inst.path().join("python");
    let py = py.to_string_lossy();
    let (_, path, site) = seen(&shim, None, &[]);
    assert_eq!(path, py);
    assert_eq!(
        site, "inject-loaded",
        "Python imported the inject's sitecustomize"
    );
    let (_, path, _) = seen(&shim, None, &[("PYTHONPATH", "/x")]);
    assert_eq!(path, format!("{py}:/x"));
    let (_, path, site) = seen(&shim, None, &[("COMMINSIGHT_INJECT", "0")]);
    assert_eq!((path.as_str(), site.as_str()), ("<unset>", "None"));
    let (_, path, _) = seen(&shim, None, &[("COMMINSIGHT_DISABLE", "1")]);
    assert_eq!(path, "<unset>");
}

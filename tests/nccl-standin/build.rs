//! Build script: soname, NCCL's C-variadic logger (C), and the recording profiler plugins used by the tests.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=csrc/logger.c");
    println!("cargo:rerun-if-changed=csrc/rec_plugin.c");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    cc::Build::new()
        .file("csrc/logger.c")
        .warnings(true)
        .compile("nccl_standin_logger");

    // Test-only recording plugins (one per exported ABI set), built as real shared objects so the
    // tests exercise dlopen/dlsym/dlclose exactly as NCCL does.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let plugdir = out.join("plugins");
    std::fs::create_dir_all(&plugdir).expect("create plugin dir");
    let compiler = cc::Build::new().get_compiler();
    for (name, defs) in [
        ("rec6", &["-DREC_V6", "-DREC_V5", "-DREC_V4"][..]),
        ("rec5", &["-DREC_V5", "-DREC_V4"][..]),
        ("rec4", &["-DREC_V4"][..]),
        ("rec3", &["-DREC_V3"][..]),
    ] {
        let so = plugdir.join(format!("libnccl-profiler-{name}.so"));
        let status = Command::new(compiler.path())
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&so)
            .args(defs)
            .arg("csrc/rec_plugin.c")
            .arg("-lpthread")
            .status()
            .expect("run C compiler");
        assert!(status.success(), "building {name} failed");
    }
    println!(
        "cargo:rustc-env=NCCL_STANDIN_TEST_PLUGIN_DIR={}",
        plugdir.display()
    );
}

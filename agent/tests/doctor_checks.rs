//! `doctor::run_checks` against fixture trees (injectable /proc, /sys and library dirs) and once
//! against the real host.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use comminsight_agent::config::AgentConfig;
use comminsight_agent::doctor::{self, DoctorEnv, DoctorReport, Status};

struct Fixture {
    root: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn write(p: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A healthy host: root's capabilities, BTF, Yama 1, plugin + NCCL 2.28.3 + NVML, shm 1777.
fn fixture(tag: &str) -> (Fixture, AgentConfig, DoctorEnv) {
    let root =
        std::env::temp_dir().join(format!("comminsight-doctor-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let proc_root = root.join("proc");
    let sys_root = root.join("sys");
    write(
        &proc_root.join("self/status"),
        b"Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\n",
    );
    write(&proc_root.join("sys/kernel/yama/ptrace_scope"), b"1\n");
    write(&proc_root.join("sys/kernel/perf_event_paranoid"), b"2\n");
    write(
        &proc_root.join("sys/kernel/unprivileged_bpf_disabled"),
        b"2\n",
    );
    write(&sys_root.join("kernel/btf/vmlinux"), b"BTF");
    let lib = root.join("lib");
    write(&lib.join(doctor::PLUGIN_FILE), b"\x7fELF plugin");
    // The version lives only in the bytes (the file name has just the soname's major).
    let mut nccl = vec![0u8; 3 << 20];
    let at = (1 << 20) - 5; // straddles the 1 MiB read boundary
    let s = b"NCCL version 2.28.3+cuda12.9";
    nccl[at..at + s.len()].copy_from_slice(s);
    write(&lib.join("libnccl.so.2"), &nccl);
    // The test bed's NVML stand-in: doctor loads it for real.
    let nvml_src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu-standin/nvml_standin.c");
    let cc = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(lib.join("libnvidia-ml.so.1"))
        .arg(&nvml_src)
        .arg("-lpthread")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let shm = root.join("shm/comminsight");
    std::fs::create_dir_all(&shm).unwrap();
    chmod(&shm, 0o1777);
    let seg = root.join("log/inspector_logs");
    std::fs::create_dir_all(&seg).unwrap();
    chmod(&seg, 0o1777);
    let state = root.join("state");
    std::fs::create_dir_all(&state).unwrap();

    let mut cfg = AgentConfig::default();
    cfg.sources.shm_dir = shm;
    cfg.sources.segment_dirs = vec![seg];
    cfg.agent.state_dir = state.clone();
    cfg.archive.dir = state.join("archive");
    let env = DoctorEnv {
        proc_root,
        sys_root,
        lib_dirs: vec![root.join("no-such-dir"), lib],
        nccl_profiler_plugin: Some("comminsight".into()),
        ranks_per_host: 8,
        ring_bytes: 4096,
        connect_timeout: Duration::from_secs(1),
    };
    (Fixture { root }, cfg, env)
}

fn status(r: &DoctorReport, name: &str) -> Status {
    r.get(name)
        .unwrap_or_else(|| panic!("no check {name} in {}", r.render_text()))
        .status
}

fn assert_fixes(r: &DoctorReport) {
    for c in &r.checks {
        assert_eq!(
            c.fix.is_some(),
            c.status != Status::Ok,
            "{}: a non-ok check needs a fix, an ok one none",
            c.name
        );
    }
}

#[test]
fn healthy_fixture_host() {
    let (_f, cfg, env) = fixture("healthy");
    let r = doctor::run_checks(&cfg, &env);
    let text = r.render_text();
    for name in [
        "kernel_btf",
        "capabilities",
        "ptrace_scope",
        "perf_event_paranoid",
        "unprivileged_bpf",
        "shm_space",
        "shm_dir",
        "segment_dir",
        "state_dir",
        "plugin",
        "nccl",
        "nvml",
    ] {
        assert_eq!(status(&r, name), Status::Ok, "{name}:\n{text}");
    }
    let nvml = &r.get("nvml").unwrap().detail;
    assert!(
        nvml.contains("(driver 570.133.20): 8 GPUs: 0 0000:18:00.0 (18 NVLinks)"),
        "{nvml}"
    );
    // The archive dir does not exist yet: a warning with the command that creates it.
    assert_eq!(status(&r, "archive_dir"), Status::Warn, "{text}");
    assert!(
        r.get("nccl").unwrap().detail.contains("NCCL 2.28.3"),
        "{text}"
    );
    assert_eq!(r.exit_code(), 0);
    assert_fixes(&r);
    assert!(text.ends_with("0 failures\n"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["checks"][0]["name"], "kernel_btf");
    assert_eq!(json["checks"][0]["status"], "ok");
}

#[test]
fn unprivileged_restricted_host() {
    let (f, mut cfg, mut env) = fixture("restricted");
    write(
        &env.proc_root.join("self/status"),
        b"CapEff:\t0000000000000000\n",
    );
    write(&env.proc_root.join("sys/kernel/yama/ptrace_scope"), b"3\n");
    std::fs::remove_file(env.sys_root.join("kernel/btf/vmlinux")).unwrap();
    chmod(&cfg.sources.shm_dir, 0o755);
    chmod(&cfg.sources.segment_dirs[0], 0o755);
    std::fs::remove_file(f.root.join("lib").join(doctor::PLUGIN_FILE)).unwrap();
    std::fs::remove_file(f.root.join("lib/libnvidia-ml.so.1")).unwrap();
    write(&f.root.join("lib/libnccl.so.2"), b"no version here");
    write(&f.root.join("lib2/libnccl.so.2.19.3"), b"");
    env.lib_dirs = vec![f.root.join("lib2")];
    env.nccl_profiler_plugin = None;
    env.ring_bytes = u64::MAX / 16;
    cfg.sources
        .segment_dirs
        .push(f.root.join("missing-segments"));
    let r = doctor::run_checks(&cfg, &env);
    let text = r.render_text();
    assert_eq!(status(&r, "kernel_btf"), Status::Warn, "{text}");
    assert_eq!(status(&r, "capabilities"), Status::Warn, "{text}");
    assert!(
        r.get("capabilities")
            .unwrap()
            .detail
            .contains("CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE"),
        "{text}"
    );
    assert_eq!(status(&r, "ptrace_scope"), Status::Warn, "{text}");
    assert_eq!(status(&r, "perf_event_paranoid"), Status::Warn, "{text}");
    assert_eq!(status(&r, "unprivileged_bpf"), Status::Warn, "{text}");
    assert_eq!(status(&r, "shm_space"), Status::Fail, "{text}");
    assert_eq!(status(&r, "shm_dir"), Status::Fail, "{text}");
    assert!(
        r.get("shm_dir")
            .unwrap()
            .fix
            .as_deref()
            .unwrap()
            .starts_with("chmod 1777"),
        "{text}"
    );
    let seg: Vec<_> = r
        .checks
        .iter()
        .filter(|c| c.name == "segment_dir")
        .collect();
    assert_eq!(seg.len(), 2, "{text}");
    assert!(seg.iter().all(|c| c.status == Status::Warn), "{text}");
    assert_eq!(status(&r, "plugin"), Status::Fail, "{text}");
    assert!(
        r.get("plugin")
            .unwrap()
            .detail
            .contains("NCCL_PROFILER_PLUGIN is not set"),
        "{text}"
    );
    assert_eq!(status(&r, "nccl"), Status::Fail, "{text}");
    assert!(r.get("nccl").unwrap().detail.contains("2.19.3"), "{text}");
    assert_eq!(status(&r, "nvml"), Status::Warn, "{text}");
    assert_eq!(r.exit_code(), 1);
    assert_fixes(&r);
    assert!(text.contains("[FAIL] shm_dir"), "{text}");
    assert!(text.contains("fix: chmod 1777"), "{text}");
}

#[test]
fn no_yama_and_explicit_plugin_path() {
    let (f, cfg, mut env) = fixture("noyama");
    std::fs::remove_dir_all(env.proc_root.join("sys/kernel/yama")).unwrap();
    env.nccl_profiler_plugin = Some(
        f.root
            .join("lib")
            .join(doctor::PLUGIN_FILE)
            .display()
            .to_string(),
    );
    let r = doctor::run_checks(&cfg, &env);
    assert_eq!(
        status(&r, "ptrace_scope"),
        Status::Ok,
        "{}",
        r.render_text()
    );
    assert_eq!(status(&r, "plugin"), Status::Ok, "{}", r.render_text());
    env.nccl_profiler_plugin = Some(f.root.join("nowhere.so").display().to_string());
    let r = doctor::run_checks(&cfg, &env);
    assert_eq!(status(&r, "plugin"), Status::Fail, "{}", r.render_text());
}

#[test]
fn state_dir_not_writable_fails() {
    let (_f, cfg, env) = fixture("ro");
    // A file where the directory should be fails for every user (root ignores file modes).
    std::fs::remove_dir_all(&cfg.agent.state_dir).unwrap();
    write(&cfg.agent.state_dir, b"a file, not a directory");
    let r = doctor::run_checks(&cfg, &env);
    assert_eq!(status(&r, "state_dir"), Status::Fail, "{}", r.render_text());
    std::fs::remove_file(&cfg.agent.state_dir).unwrap();
    std::fs::create_dir_all(&cfg.agent.state_dir).unwrap();
    chmod(&cfg.agent.state_dir, 0o555);
    let probe_ok = std::fs::write(cfg.agent.state_dir.join("p"), b"").is_ok();
    let r = doctor::run_checks(&cfg, &env);
    chmod(&cfg.agent.state_dir, 0o755);
    // Read-only for us unless we bypass modes (root): the check must agree with a real write.
    let want = if probe_ok { Status::Ok } else { Status::Fail };
    assert_eq!(status(&r, "state_dir"), want, "{}", r.render_text());
}

#[test]
fn reachability_of_otlp_and_master() {
    let (_f, mut cfg, env) = fixture("reach");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A port nobody listens on: bind one and drop it.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.otlp.enabled = true;
    cfg.otlp.endpoint = format!("http://127.0.0.1:{port}");
    cfg.otlp.metrics_endpoint = format!("http://127.0.0.1:{closed}/opentelemetry/v1/metrics");
    cfg.master.address = format!("127.0.0.1:{port}");
    let r = doctor::run_checks(&cfg, &env);
    let otlp: Vec<_> = r
        .checks
        .iter()
        .filter(|c| c.name == "otlp_endpoint")
        .collect();
    assert_eq!(otlp.len(), 2, "{}", r.render_text());
    assert!(
        otlp.iter()
            .any(|c| c.status == Status::Fail && c.detail.contains("otlp.metrics_endpoint")),
        "{}",
        r.render_text()
    );
    assert!(
        otlp.iter()
            .any(|c| c.status == Status::Ok && c.detail.contains("otlp.endpoint")),
        "{}",
        r.render_text()
    );
    assert_eq!(
        status(&r, "master_address"),
        Status::Ok,
        "{}",
        r.render_text()
    );
    assert_eq!(r.exit_code(), 1);
    cfg.otlp.enabled = false;
    cfg.master.address.clear();
    let r = doctor::run_checks(&cfg, &env);
    assert!(r.get("otlp_endpoint").is_none() && r.get("master_address").is_none());
    drop(listener);
}

#[test]
fn nccl_version_from_name_or_bytes() {
    let (f, _cfg, _env) = fixture("version");
    let named = f.root.join("libnccl.so.2.30.7");
    write(&named, b"");
    assert_eq!(doctor::nccl_version(&named), Some((2, 30, 7)));
    assert_eq!(
        doctor::nccl_version(&f.root.join("lib/libnccl.so.2")),
        Some((2, 28, 3))
    );
    let none = f.root.join("libnccl.so");
    write(&none, b"NCCL version x");
    assert_eq!(doctor::nccl_version(&none), None);
}

#[test]
fn real_host_report_is_complete() {
    let env = DoctorEnv::host(&[("LD_LIBRARY_PATH".to_string(), String::new())]);
    let r = doctor::run_checks(&AgentConfig::default(), &env);
    println!("{}", r.render_text());
    assert_fixes(&r);
    // This machine has /proc: the capabilities check reads CapEff (ok or warn, never unreadable).
    assert!(
        r.get("capabilities").unwrap().detail.starts_with("CapEff="),
        "{}",
        r.render_text()
    );
    for c in &r.checks {
        assert!(!c.detail.contains('\n'), "{}: multi-line detail", c.name);
    }
    assert!(r.exit_code() <= 1);
}

/// The ownership checks of issue 16: the shm directory must be root's (1777), per-user ring
/// directories owned by their uid with mode 0700, process directories private.
#[test]
fn ownership_of_shm_and_segment_directories() {
    let (_f, cfg, env) = fixture("ownership");
    let shm = cfg.sources.shm_dir.clone();
    let mk = |name: &str, uid: u32, mode: u32| {
        let d = shm.join(name);
        std::fs::create_dir_all(&d).unwrap();
        chmod(&d, mode);
        std::os::unix::fs::chown(&d, Some(uid), None).unwrap();
    };
    mk("1001", 1001, 0o700);
    let r = doctor::run_checks(&cfg, &env);
    let text = r.render_text();
    assert_eq!(status(&r, "shm_dir"), Status::Ok, "{text}");
    assert_eq!(status(&r, "shm_user_dirs"), Status::Ok, "{text}");
    mk("1002", 1003, 0o700); // pre-created by another user
    mk("1004", 1004, 0o755); // open to others
    let pid = cfg.sources.segment_dirs[0].join("j/h/77");
    std::fs::create_dir_all(&pid).unwrap();
    chmod(&pid, 0o755);
    let r = doctor::run_checks(&cfg, &env);
    let text = r.render_text();
    assert_eq!(status(&r, "shm_user_dirs"), Status::Warn, "{text}");
    let c = r.get("shm_user_dirs").unwrap();
    assert!(c.detail.contains("2 entries"), "{text}");
    assert!(
        c.detail.contains(&shm.join("1002").display().to_string()),
        "{text}"
    );
    assert!(c.detail.contains("owned by uid 1003"), "{text}");
    assert!(
        c.detail.contains(&shm.join("1004").display().to_string()),
        "{text}"
    );
    assert_eq!(status(&r, "segment_dir"), Status::Warn, "{text}");
    let seg = r.get("segment_dir").unwrap();
    assert!(seg.detail.contains("j/h/77 (0755)"), "{text}");
    assert!(seg.fix.as_deref().unwrap().contains("chmod 0700"), "{text}");
    // A shm directory owned by a job user: refused by other users' plugins.
    std::os::unix::fs::chown(&shm, Some(1001), None).unwrap();
    let r = doctor::run_checks(&cfg, &env);
    let text = r.render_text();
    assert_eq!(status(&r, "shm_dir"), Status::Fail, "{text}");
    let fix = r.get("shm_dir").unwrap().fix.clone().unwrap();
    assert!(
        fix.starts_with("remove it and let the agent create it"),
        "{text}"
    );
    // World-writable segment root without the sticky bit.
    chmod(&cfg.sources.segment_dirs[0], 0o777);
    let r = doctor::run_checks(&cfg, &env);
    assert_eq!(
        status(&r, "segment_dir"),
        Status::Fail,
        "{}",
        r.render_text()
    );
    assert_fixes(&r);
}

#[test]
fn dcgm_exporter_scraped_once_or_named_when_it_does_not_answer() {
    use std::io::{Read, Write};
    let (_f, mut cfg, env) = fixture("dcgm");
    let r = doctor::run_checks(&cfg, &env);
    assert!(r.get("dcgm").is_none(), "no [gpu] dcgm_url, no check");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let body = "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n\
            DCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-a\",pci_bus_id=\"00000000:18:00.0\"} 1980\n\
            DCGM_FI_DEV_SM_CLOCK{gpu=\"1\",UUID=\"GPU-b\",pci_bus_id=\"00000000:2A:00.0\"} 1980\n\
            # TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n\
            DCGM_FI_PROF_SM_ACTIVE{gpu=\"0\",UUID=\"GPU-a\",pci_bus_id=\"00000000:18:00.0\"} 0.5\n";
        if let Some(Ok(mut s)) = l.incoming().next() {
            let mut req = [0u8; 2048];
            let _ = s.read(&mut req);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    cfg.gpu.dcgm_url = format!("http://{addr}/metrics");
    let r = doctor::run_checks(&cfg, &env);
    assert_eq!(status(&r, "dcgm"), Status::Ok, "{}", r.render_text());
    let d = &r.get("dcgm").unwrap().detail;
    assert!(
        d.ends_with(": 2 GPUs, 2 of the 26 fields the agent reads"),
        "{d}"
    );
    // Nobody answers any more.
    let r = doctor::run_checks(&cfg, &env);
    assert_eq!(status(&r, "dcgm"), Status::Warn, "{}", r.render_text());
    assert!(
        r.get("dcgm").unwrap().detail.contains(&cfg.gpu.dcgm_url),
        "{}",
        r.render_text()
    );
    assert_fixes(&r);
}

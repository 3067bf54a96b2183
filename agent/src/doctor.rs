//! `comminsight-agent doctor`: what works on this host and what to fix.
//!
//! Every check reads through the injectable roots of [`DoctorEnv`] (`/proc`, `/sys`, library search
//! paths), so tests run them against fixture trees. A check that is not `ok` always carries a fix.

use std::fs;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod libs;
mod storage;

pub use libs::nccl_version;
use libs::{dcgm, nccl, nvml, plugin};
use storage::{segment_dir, shm_dir, shm_space, shm_user_dirs, writable_dir};

use crate::config::validate::parse_host_port;
use crate::config::AgentConfig;

/// The plugin's file name (NCCL_PROFILER_PLUGIN=comminsight resolves to it).
pub const PLUGIN_FILE: &str = "libnccl-profiler-comminsight.so";
/// The first NCCL release with profiler ABI v4, the oldest the plugin implements.
pub const MIN_NCCL: (u32, u32, u32) = (2, 27, 3);
/// Ring size the plugin uses without `COMMINSIGHT_RING_BYTES` (docs/contracts.md).
pub const DEFAULT_RING_BYTES: u64 = 8 << 20;

const CAP_SYS_PTRACE: u32 = 19;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Works.
    Ok,
    /// Works with less (a feature is off or degraded).
    Warn,
    /// Broken: the agent or the plugin cannot do its job here.
    Fail,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable identifier (`kernel_btf`, `capabilities`, ...).
    pub name: String,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it (always set unless the status is `ok`).
    pub fix: Option<String>,
}

/// All checks, in a fixed order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    /// The results.
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// Exit code: 0 when nothing failed (warnings allowed), 1 when a check failed.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.checks.iter().any(|c| c.status == Status::Fail))
    }

    /// The check with this name.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// One line per check (and its fix), then a count.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            out.push_str(&format!("[{tag}] {:<22} {}\n", c.name, c.detail));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("       {:<22} fix: {fix}\n", ""));
            }
        }
        let n = |s| self.checks.iter().filter(|c| c.status == s).count();
        out.push_str(&format!(
            "{} ok, {} warnings, {} failures\n",
            n(Status::Ok),
            n(Status::Warn),
            n(Status::Fail)
        ));
        out
    }
}

/// The host as the checks see it; tests point the roots at fixture trees.
#[derive(Clone, Debug)]
pub struct DoctorEnv {
    /// `/proc` (capabilities from `self/status`, sysctls under `sys/`).
    pub proc_root: PathBuf,
    /// `/sys` (`kernel/btf/vmlinux`).
    pub sys_root: PathBuf,
    /// Directories searched for the plugin, `libnccl.so*` and `libnvidia-ml.so.1`, in order.
    pub lib_dirs: Vec<PathBuf>,
    /// `NCCL_PROFILER_PLUGIN` as the jobs would set it (if known).
    pub nccl_profiler_plugin: Option<String>,
    /// Ranks per host to size `/dev/shm` for.
    pub ranks_per_host: u64,
    /// Ring size per rank (`COMMINSIGHT_RING_BYTES`).
    pub ring_bytes: u64,
    /// TCP connect timeout for the reachability checks.
    pub connect_timeout: Duration,
}

impl DoctorEnv {
    /// The real host, with the library search path and plugin variables of `env`.
    pub fn host(env: &[(String, String)]) -> DoctorEnv {
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let mut lib_dirs: Vec<PathBuf> = get("LD_LIBRARY_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        for d in [
            "/opt/comminsight/lib",
            "/usr/local/lib",
            "/usr/lib",
            "/usr/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/local/cuda/lib64",
        ] {
            lib_dirs.push(PathBuf::from(d));
        }
        DoctorEnv {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            lib_dirs,
            nccl_profiler_plugin: get("NCCL_PROFILER_PLUGIN"),
            ranks_per_host: 8,
            ring_bytes: get("COMMINSIGHT_RING_BYTES")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(DEFAULT_RING_BYTES),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

fn check(name: &str, status: Status, detail: String, fix: Option<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail,
        fix,
    }
}

fn ok(name: &str, detail: String) -> Check {
    check(name, Status::Ok, detail, None)
}

fn warn(name: &str, detail: String, fix: impl Into<String>) -> Check {
    check(name, Status::Warn, detail, Some(fix.into()))
}

fn fail(name: &str, detail: String, fix: impl Into<String>) -> Check {
    check(name, Status::Fail, detail, Some(fix.into()))
}

/// Run every check.
pub fn run_checks(cfg: &AgentConfig, env: &DoctorEnv) -> DoctorReport {
    let caps = effective_caps(&env.proc_root);
    let mut checks = vec![
        kernel_btf(env),
        ebpf_probes(),
        tracefs(env),
        capabilities(env, caps),
        ptrace_scope(env, caps),
        sysctl_needing_cap(
            env,
            caps,
            "perf_event_paranoid",
            "sys/kernel/perf_event_paranoid",
            CAP_PERFMON,
            |v| v <= 1,
        ),
        sysctl_needing_cap(
            env,
            caps,
            "unprivileged_bpf",
            "sys/kernel/unprivileged_bpf_disabled",
            CAP_BPF,
            |v| v == 0,
        ),
    ];
    if cfg.sources.shm_enabled {
        checks.push(shm_space(cfg, env));
        checks.push(shm_dir(&cfg.sources.shm_dir));
        checks.extend(shm_user_dirs(&cfg.sources.shm_dir));
    }
    for d in &cfg.sources.segment_dirs {
        checks.push(segment_dir(d));
    }
    checks.push(writable_dir("state_dir", &cfg.agent.state_dir));
    if cfg.archive.enabled {
        checks.push(writable_dir("archive_dir", &cfg.archive.dir));
    }
    checks.push(plugin(env));
    checks.push(nccl(env));
    checks.push(nvml(env, &cfg.gpu));
    checks.extend(dcgm(&cfg.gpu));
    if cfg.otlp.enabled {
        let mut targets = vec![];
        let base = &cfg.otlp.endpoint;
        for (key, url) in [
            ("otlp.metrics_endpoint", &cfg.otlp.metrics_endpoint),
            ("otlp.logs_endpoint", &cfg.otlp.logs_endpoint),
        ] {
            if url.is_empty() {
                targets.push(("otlp.endpoint", base.as_str()));
            } else {
                targets.push((key, url.as_str()));
            }
        }
        targets.dedup_by(|a, b| a.1 == b.1);
        for (key, url) in targets {
            checks.push(reachable("otlp_endpoint", key, url_authority(url), env));
        }
    }
    if !cfg.master.address.is_empty() {
        checks.push(reachable(
            "master_address",
            "master.address",
            Some(cfg.master.address.clone()),
            env,
        ));
    }
    DoctorReport { checks }
}

fn ebpf_probes() -> Check {
    if crate::probes::BUILT_IN {
        ok(
            "ebpf",
            format!(
                "BPF probes built in (event ABI {}): ibverbs uprobes, scheduler and TCP tracepoints",
                comminsight_ebpf_common::EVENT_ABI
            ),
        )
    } else {
        warn(
            "ebpf",
            "eBPF not built in: this agent carries no BPF object (no ibverbs, scheduler or TCP context)".into(),
            "build the agent with `cargo xtask build` (it runs `cargo xtask build-ebpf`); everything else works without it",
        )
    }
}

fn tracefs(env: &DoctorEnv) -> Check {
    let p = env.sys_root.join("kernel/tracing/events");
    if p.is_dir() {
        ok(
            "tracefs",
            format!("{} present (tracepoints attach)", p.display()),
        )
    } else {
        warn(
            "tracefs",
            format!("{} missing: tracefs is not mounted", p.display()),
            "the agent mounts it itself when it runs as root; else: mount -t tracefs nodev /sys/kernel/tracing",
        )
    }
}

fn kernel_btf(env: &DoctorEnv) -> Check {
    let p = env.sys_root.join("kernel/btf/vmlinux");
    if p.is_file() {
        ok(
            "kernel_btf",
            format!("{} present (eBPF CO-RE works)", p.display()),
        )
    } else {
        warn(
            "kernel_btf",
            format!("{} missing: eBPF sources cannot relocate against this kernel", p.display()),
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels >= 5.4); the plugin and the agent work without eBPF",
        )
    }
}

/// CapEff of this process as a bit set; `None` when unreadable.
fn effective_caps(proc_root: &Path) -> Option<u64> {
    let status = fs::read_to_string(proc_root.join("self/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

fn has(caps: Option<u64>, cap: u32) -> bool {
    caps.is_some_and(|c| c & (1u64 << cap) != 0)
}

fn capabilities(env: &DoctorEnv, caps: Option<u64>) -> Check {
    let Some(c) = caps else {
        return warn(
            "capabilities",
            format!(
                "cannot read CapEff from {}",
                env.proc_root.join("self/status").display()
            ),
            "run doctor on Linux with /proc mounted",
        );
    };
    let wanted = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(bit, _)| !has(Some(c), *bit))
        .map(|(_, n)| *n)
        .collect();
    if missing.is_empty() {
        ok(
            "capabilities",
            format!("CapEff={c:016x}: CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE held"),
        )
    } else {
        warn(
            "capabilities",
            format!("CapEff={c:016x}: missing {} (eBPF probes and rank stacks are off)", missing.join(", ")),
            "run the agent as the systemd unit (packaging/comminsight-agent.service grants them) or as root; doctor run by a user shows that user's rights",
        )
    }
}

fn read_sysctl(env: &DoctorEnv, rel: &str) -> Option<Result<i64, String>> {
    let p = env.proc_root.join(rel);
    let text = fs::read_to_string(&p).ok()?;
    Some(
        text.trim()
            .parse::<i64>()
            .map_err(|_| format!("{}: unexpected content {:?}", p.display(), text.trim())),
    )
}

fn ptrace_scope(env: &DoctorEnv, caps: Option<u64>) -> Check {
    let name = "ptrace_scope";
    match read_sysctl(env, "sys/kernel/yama/ptrace_scope") {
        None => ok(name, "no Yama LSM: classic ptrace permissions apply".into()),
        Some(Err(e)) => warn(name, e, "check the kernel's Yama settings by hand"),
        Some(Ok(3)) => warn(
            name,
            "kernel.yama.ptrace_scope=3: no process can be inspected (stacks of hung ranks are off)".into(),
            "reboot with kernel.yama.ptrace_scope=1 in /etc/sysctl.d (3 cannot be lowered at run time)",
        ),
        Some(Ok(v)) if v >= 1 && !has(caps, CAP_SYS_PTRACE) => warn(
            name,
            format!("kernel.yama.ptrace_scope={v} and no CAP_SYS_PTRACE: the ranks' stacks cannot be read"),
            "run the agent with CAP_SYS_PTRACE (the systemd unit grants it)",
        ),
        Some(Ok(v)) => ok(name, format!("kernel.yama.ptrace_scope={v}: ranks can be inspected")),
    }
}

fn sysctl_needing_cap(
    env: &DoctorEnv,
    caps: Option<u64>,
    name: &str,
    rel: &str,
    cap: u32,
    open: fn(i64) -> bool,
) -> Check {
    let key = rel.trim_start_matches("sys/").replace('/', ".");
    let cap_name = if cap == CAP_BPF {
        "CAP_BPF"
    } else {
        "CAP_PERFMON"
    };
    match read_sysctl(env, rel) {
        None => warn(
            name,
            format!("{} not found", env.proc_root.join(rel).display()),
            format!("a kernel without {key} has no eBPF/perf support for the agent; use a kernel >= 5.8"),
        ),
        Some(Err(e)) => warn(name, e, "check the sysctl by hand"),
        Some(Ok(v)) if open(v) || has(caps, cap) => ok(
            name,
            if open(v) {
                format!("{key}={v}")
            } else {
                format!("{key}={v} (restricted, but {cap_name} is held)")
            },
        ),
        Some(Ok(v)) => warn(
            name,
            format!("{key}={v} restricts unprivileged use and {cap_name} is not held"),
            format!("run the agent with {cap_name} (the systemd unit grants it)"),
        ),
    }
}

/// `host:port` of an http(s) URL (default ports 80/443).
fn url_authority(url: &str) -> Option<String> {
    let (rest, port) = if let Some(r) = url.strip_prefix("http://") {
        (r, 80)
    } else {
        (url.strip_prefix("https://")?, 443)
    };
    let auth = rest.split(['/', '?', '#']).next()?;
    if auth.is_empty() {
        None
    } else if parse_host_port(auth).is_ok() {
        Some(auth.to_string())
    } else {
        Some(format!("{auth}:{port}"))
    }
}

fn reachable(name: &str, key: &str, addr: Option<String>, env: &DoctorEnv) -> Check {
    let Some(addr) = addr else {
        return fail(
            name,
            format!("`{key}` is not a valid URL"),
            format!("fix `{key}` (comminsight-agent config check)"),
        );
    };
    let resolved: Vec<_> = match addr.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            return fail(
                name,
                format!("`{key}` {addr}: cannot resolve: {e}"),
                format!("fix the host name in `{key}` or the resolver"),
            )
        }
    };
    let mut last = String::from("no address");
    for sa in &resolved {
        match TcpStream::connect_timeout(sa, env.connect_timeout) {
            Ok(_) => return ok(name, format!("`{key}` {addr} accepts TCP connections")),
            Err(e) => last = e.to_string(),
        }
    }
    fail(
        name,
        format!(
            "`{key}` {addr}: no TCP connection within {:?}: {last}",
            env.connect_timeout
        ),
        format!("start the service at {addr}, open the firewall, or fix `{key}`"),
    )
}

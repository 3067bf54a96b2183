//! Doctor checks of the shared libraries: the plugin, NCCL (and its version) and NVML.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{fail, ok, warn, Check, DoctorEnv, MIN_NCCL, PLUGIN_FILE};

fn find_lib(env: &DoctorEnv, pred: impl Fn(&str) -> bool) -> Option<PathBuf> {
    for d in &env.lib_dirs {
        let Ok(rd) = fs::read_dir(d) else { continue };
        let mut names: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&pred))
            .collect();
        names.sort();
        if let Some(p) = names.into_iter().next() {
            return Some(p);
        }
    }
    None
}

fn dirs_text(env: &DoctorEnv) -> String {
    env.lib_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

pub(super) fn plugin(env: &DoctorEnv) -> Check {
    let name = "plugin";
    let explicit = env
        .nccl_profiler_plugin
        .as_deref()
        .filter(|v| v.contains('/'));
    let found = match explicit {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => find_lib(env, |n| n == PLUGIN_FILE),
    };
    let hint = match env.nccl_profiler_plugin.as_deref() {
        None => " (NCCL_PROFILER_PLUGIN is not set here: jobs must export NCCL_PROFILER_PLUGIN=comminsight)",
        Some("comminsight") => " (NCCL_PROFILER_PLUGIN=comminsight)",
        Some(_) => "",
    };
    match (found, explicit) {
        (Some(p), _) => ok(name, format!("{}{hint}", p.display())),
        (None, Some(p)) => fail(name, format!("NCCL_PROFILER_PLUGIN={p} does not exist"), "point NCCL_PROFILER_PLUGIN at the installed libnccl-profiler-comminsight.so"),
        (None, None) => fail(
            name,
            format!("{PLUGIN_FILE} not found in {}{hint}", dirs_text(env)),
            "install it into /opt/comminsight/lib (`cargo xtask build` stages it in target/debug/lib) and add that directory to the jobs' LD_LIBRARY_PATH",
        ),
    }
}

/// `(major, minor, patch)` from `NCCL version 2.21.5` bytes or a `libnccl.so.2.21.5` name.
pub fn nccl_version(lib: &Path) -> Option<(u32, u32, u32)> {
    let from_name = lib
        .file_name()?
        .to_str()?
        .strip_prefix("libnccl.so.")
        .and_then(parse_version);
    from_name.or_else(|| scan_version(lib))
}

fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty());
    let v = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    Some(v)
}

/// Stream the file looking for the `NCCL version X.Y.Z` string NCCL prints at init.
fn scan_version(lib: &Path) -> Option<(u32, u32, u32)> {
    const NEEDLE: &[u8] = b"NCCL version ";
    let mut f = fs::File::open(lib).ok()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        carry.extend_from_slice(&buf[..n]);
        let mut from = 0;
        while let Some(i) = carry[from..]
            .windows(NEEDLE.len())
            .position(|w| w == NEEDLE)
        {
            let start = from + i + NEEDLE.len();
            let tail: Vec<u8> = carry[start..].iter().take(24).copied().collect();
            let text: String = tail
                .iter()
                .take_while(|b| b.is_ascii_graphic())
                .map(|&b| b as char)
                .collect();
            if let Some(v) = parse_version(&text) {
                return Some(v);
            }
            from = start;
        }
        let keep = carry.len().saturating_sub(NEEDLE.len() + 24);
        carry.drain(..keep);
    }
}

pub(super) fn nccl(env: &DoctorEnv) -> Check {
    let name = "nccl";
    let Some(lib) = find_lib(env, |n| n.starts_with("libnccl.so")) else {
        return warn(
            name,
            format!("no libnccl.so* in {}", dirs_text(env)),
            "fine if the jobs bring NCCL themselves (e.g. the nvidia-nccl wheel); the plugin needs NCCL >= 2.27.3",
        );
    };
    match nccl_version(&lib) {
        Some(v) if v >= MIN_NCCL => ok(
            name,
            format!("{} is NCCL {}.{}.{}", lib.display(), v.0, v.1, v.2),
        ),
        Some(v) => fail(
            name,
            format!(
                "{} is NCCL {}.{}.{}: older than 2.27.3 (profiler ABI v4)",
                lib.display(),
                v.0,
                v.1,
                v.2
            ),
            "upgrade NCCL to >= 2.27.3; older releases do not load the plugin",
        ),
        None => warn(
            name,
            format!(
                "{}: version not found in the file name or its bytes",
                lib.display()
            ),
            "check with NCCL_DEBUG=VERSION in a job",
        ),
    }
}

/// NVML: the library the agent would load (`[gpu] library`, else `libnvidia-ml.so.1` on the
/// search path), loaded for real: the GPUs and driver it reports, or why it cannot.
pub(super) fn nvml(env: &DoctorEnv, gpu: &crate::host::gpu::GpuConfig) -> Check {
    let name = "nvml";
    if !gpu.enabled {
        return ok(name, "GPU sampling off ([gpu] enabled = false)".into());
    }
    let lib = if gpu.library.as_os_str().is_empty() {
        find_lib(env, |n| n == "libnvidia-ml.so.1")
    } else {
        Some(gpu.library.clone())
    };
    let Some(lib) = lib else {
        return warn(
            name,
            format!(
                "NVML absent: libnvidia-ml.so.1 not found in {}; no GPU metrics",
                dirs_text(env)
            ),
            "install the NVIDIA driver (it ships NVML) or set [gpu] library; fine on hosts without NVIDIA GPUs",
        );
    };
    let cfg = crate::host::gpu::GpuConfig {
        library: lib.clone(),
        ..gpu.clone()
    };
    match crate::host::gpu::nvml::NvmlSource::open(&cfg) {
        Ok(n) => {
            let gpus: Vec<String> = n
                .devices()
                .iter()
                .map(|d| format!("{} {} ({} NVLinks)", d.index, d.pci, d.nvlinks))
                .collect();
            ok(
                name,
                format!(
                    "NVML {} (driver {}): {} GPUs: {}",
                    lib.display(),
                    n.driver(),
                    gpus.len(),
                    gpus.join(", ")
                ),
            )
        }
        Err(e) => warn(
            name,
            format!("NVML unusable: {e}"),
            "check the NVIDIA driver (nvidia-smi) or [gpu] library; GPU metrics stay off",
        ),
    }
}

/// The dcgm-exporter `[gpu] dcgm_url` names, scraped once: its GPUs and the fields the agent
/// reads, or why not. `None` when no URL is set.
pub(super) fn dcgm(gpu: &crate::host::gpu::GpuConfig) -> Option<Check> {
    if gpu.dcgm_url.is_empty() || !gpu.enabled {
        return None;
    }
    let t = std::time::Duration::from_millis(gpu.dcgm_timeout_ms.max(10));
    Some(match crate::host::gpu::dcgm::probe(&gpu.dcgm_url, t) {
        Ok(d) => ok("dcgm", format!("dcgm-exporter {d}")),
        Err(e) => warn(
            "dcgm",
            format!("dcgm-exporter {e}"),
            "start dcgm-exporter (it listens on :9400) or fix [gpu] dcgm_url; DCGM fields stay off",
        ),
    })
}

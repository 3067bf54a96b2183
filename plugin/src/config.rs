//! Plugin configuration: read from the environment once (docs/contracts.md "Plugin environment").
//! A malformed value yields one warning (logged through NCCL's logger by the caller) and the default.

use std::path::PathBuf;

use crate::abi::{
    EV_COLL, EV_COLL_API, EV_GROUP, EV_GROUP_API, EV_KERNEL_CH, EV_KERNEL_LAUNCH, EV_NET_PLUGIN,
    EV_P2P, EV_P2P_API, EV_PROXY_CTRL, EV_PROXY_OP, EV_PROXY_STEP,
};
use crate::handle::MAX_INDEX;

/// Default activation mask: GroupApi, CollApi, P2pApi, Group, Coll, P2p, KernelCh.
pub const DEFAULT_EVENT_MASK: u32 = 0x747;
/// Bits we accept in a mask (copy-engine bits 12–14 are not supported and kept clear).
pub const SUPPORTED_MASK: u32 = 0xfff;
pub const DEFAULT_LOG_DIR: &str = "./inspector_logs";
pub const DEFAULT_SHM_DIR: &str = "/dev/shm/comminsight";
pub const DEFAULT_RING_BYTES: u64 = 8 << 20;
pub const DEFAULT_OVERDUE_MS: u64 = 30_000;
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
pub const DEFAULT_SEGMENT_SECS: u64 = 300;
pub const DEFAULT_RETENTION_BYTES: u64 = 1 << 30;
pub const DEFAULT_FLUSH_MS: u64 = 200;
pub const DEFAULT_MAX_INFLIGHT: u32 = 16_384;
/// Inspector's `NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES` default.
pub const DEFAULT_INSPECTOR_MIN_SIZE: u64 = 8192;

/// Event names accepted in masks (NCCL's names without the `ncclProfile` prefix).
pub const MASK_NAMES: &[(&str, u64)] = &[
    ("Group", EV_GROUP),
    ("Coll", EV_COLL),
    ("P2p", EV_P2P),
    ("ProxyOp", EV_PROXY_OP),
    ("ProxyStep", EV_PROXY_STEP),
    ("ProxyCtrl", EV_PROXY_CTRL),
    ("KernelCh", EV_KERNEL_CH),
    ("NetPlugin", EV_NET_PLUGIN),
    ("GroupApi", EV_GROUP_API),
    ("CollApi", EV_COLL_API),
    ("P2pApi", EV_P2P_API),
    ("KernelLaunch", EV_KERNEL_LAUNCH),
];

/// Everything the plugin reads from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `COMMINSIGHT_DISABLE=1`: every init opts out.
    pub disable: bool,
    /// Job id (`COMMINSIGHT_JOB_ID`, `SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID`, `nojob`), path-safe.
    pub job: String,
    /// Host name (`COMMINSIGHT_HOSTNAME` or gethostname), path-safe.
    pub host: String,
    /// Segment root (`COMMINSIGHT_LOG_DIR`).
    pub log_dir: PathBuf,
    /// Ring directory (`COMMINSIGHT_SHM_DIR`).
    pub shm_dir: PathBuf,
    /// Ring size in bytes (`COMMINSIGHT_RING_BYTES`).
    pub ring_bytes: u64,
    /// Overdue threshold (`COMMINSIGHT_OVERDUE_MS`).
    pub overdue_ms: u64,
    /// Activation mask (`COMMINSIGHT_EVENT_MASK`).
    pub event_mask: u32,
    /// Also write NCCL Inspector JSON lines (`COMMINSIGHT_INSPECTOR_COMPAT=1`).
    pub inspector_compat: bool,
    /// `COMMINSIGHT_SEGMENT_BYTES`.
    pub segment_bytes: u64,
    /// `COMMINSIGHT_SEGMENT_SECS`.
    pub segment_secs: u64,
    /// `COMMINSIGHT_RETENTION_BYTES`.
    pub retention_bytes: u64,
    /// `COMMINSIGHT_FLUSH_MS`.
    pub flush_ms: u64,
    /// `COMMINSIGHT_MAX_INFLIGHT` (1 ..= 2 Mi).
    pub max_inflight: u32,
    /// Inspector output directory (`NCCL_INSPECTOR_DUMP_DIR`, else `nccl-inspector-<job>`).
    pub inspector_dir: PathBuf,
    /// `NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES`.
    pub inspector_min_size: u64,
    /// `NCCL_INSPECTOR_ENABLE_P2P` (default 1).
    pub inspector_p2p: bool,
    /// `NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING` (default 1): only `kernel_gpu` timings are written.
    pub inspector_require_kernel: bool,
    /// `RANK`, `LOCAL_RANK`, `WORLD_SIZE` (-1 when absent).
    pub rank_env: i32,
    pub local_rank_env: i32,
    pub world_size_env: i32,
}

impl Config {
    /// From the process environment. Returns the warnings to log.
    pub fn from_env() -> (Config, Vec<String>) {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// From any key lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut warn = Vec::new();
        let nonempty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut num = |k: &str, def: u64, min: u64, max: u64| -> u64 {
            match nonempty(k) {
                None => def,
                Some(v) => match parse_u64(v.trim()) {
                    Some(n) if (min..=max).contains(&n) => n,
                    _ => {
                        warn.push(format!(
                            "CommInsight: ignoring {k}={v:?} (expected an integer in {min}..={max}); using {def}"
                        ));
                        def
                    }
                },
            }
        };
        let ring_bytes = num(
            "COMMINSIGHT_RING_BYTES",
            DEFAULT_RING_BYTES,
            64 * 128,
            1 << 31,
        );
        let overdue_ms = num("COMMINSIGHT_OVERDUE_MS", DEFAULT_OVERDUE_MS, 1, 1 << 32);
        let segment_bytes = num(
            "COMMINSIGHT_SEGMENT_BYTES",
            DEFAULT_SEGMENT_BYTES,
            4096,
            u64::MAX,
        );
        let segment_secs = num("COMMINSIGHT_SEGMENT_SECS", DEFAULT_SEGMENT_SECS, 1, 1 << 32);
        let retention_bytes = num(
            "COMMINSIGHT_RETENTION_BYTES",
            DEFAULT_RETENTION_BYTES,
            0,
            u64::MAX,
        );
        let flush_ms = num("COMMINSIGHT_FLUSH_MS", DEFAULT_FLUSH_MS, 1, 3_600_000);
        let max_inflight = num(
            "COMMINSIGHT_MAX_INFLIGHT",
            u64::from(DEFAULT_MAX_INFLIGHT),
            1,
            u64::from(MAX_INDEX) + 1,
        ) as u32;
        let inspector_min_size = num(
            "NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES",
            DEFAULT_INSPECTOR_MIN_SIZE,
            0,
            u64::MAX,
        );
        let mut flag = |k: &str, def: bool| -> bool {
            match nonempty(k).as_deref().map(str::trim) {
                None => def,
                Some("1") | Some("true") | Some("yes") | Some("on") => true,
                Some("0") | Some("false") | Some("no") | Some("off") => false,
                Some(v) => {
                    warn.push(format!(
                        "CommInsight: ignoring {k}={v:?} (expected 0 or 1); using {}",
                        u8::from(def)
                    ));
                    def
                }
            }
        };
        let disable = flag("COMMINSIGHT_DISABLE", false);
        let inspector_compat = flag("COMMINSIGHT_INSPECTOR_COMPAT", false);
        let inspector_p2p = flag("NCCL_INSPECTOR_ENABLE_P2P", true);
        let inspector_require_kernel = flag("NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING", true);
        let event_mask = match nonempty("COMMINSIGHT_EVENT_MASK") {
            None => DEFAULT_EVENT_MASK,
            Some(v) => match parse_mask(&v) {
                Ok(m) => m,
                Err(e) => {
                    warn.push(format!(
                        "CommInsight: ignoring COMMINSIGHT_EVENT_MASK={v:?} ({e}); using 0x{DEFAULT_EVENT_MASK:x}"
                    ));
                    DEFAULT_EVENT_MASK
                }
            },
        };
        let job = nonempty("COMMINSIGHT_JOB_ID")
            .or_else(|| nonempty("SLURM_JOB_ID"))
            .or_else(|| nonempty("TORCHELASTIC_RUN_ID"))
            .unwrap_or_else(|| "nojob".into());
        let host = nonempty("COMMINSIGHT_HOSTNAME").unwrap_or_else(crate::sys::hostname);
        let inspector_dir = nonempty("NCCL_INSPECTOR_DUMP_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let jid = nonempty("SLURM_JOB_ID")
                    .or_else(|| nonempty("SLURM_JOBID"))
                    .unwrap_or_else(|| "unknown-jobid".into());
                PathBuf::from(format!("nccl-inspector-{jid}"))
            });
        let env_i32 = |k: &str| {
            nonempty(k)
                .and_then(|v| v.trim().parse::<i32>().ok())
                .unwrap_or(-1)
        };
        let cfg = Config {
            disable,
            job: path_safe(&job),
            host: path_safe(&host),
            log_dir: nonempty("COMMINSIGHT_LOG_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| DEFAULT_LOG_DIR.into()),
            shm_dir: nonempty("COMMINSIGHT_SHM_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| DEFAULT_SHM_DIR.into()),
            ring_bytes,
            overdue_ms,
            event_mask,
            inspector_compat,
            segment_bytes,
            segment_secs,
            retention_bytes,
            flush_ms,
            max_inflight,
            inspector_dir,
            inspector_min_size,
            inspector_p2p,
            inspector_require_kernel,
            rank_env: env_i32("RANK"),
            local_rank_env: env_i32("LOCAL_RANK"),
            world_size_env: env_i32("WORLD_SIZE"),
        };
        (cfg, warn)
    }

    /// Defaults, no environment (tests).
    pub fn defaults() -> Config {
        Config::from_lookup(|_| None).0
    }

    /// Drain period: min(flush, overdue/4), at least 1 ms.
    pub fn drain_period_ms(&self) -> u64 {
        self.flush_ms.min(self.overdue_ms / 4).max(1)
    }

    /// `<log_dir>/<job>/<host>/<pid>`.
    pub fn segment_dir(&self, pid: u32) -> PathBuf {
        self.log_dir
            .join(&self.job)
            .join(&self.host)
            .join(pid.to_string())
    }

    /// `<job>.<host>.<pid>.ring`: the ring's name in the per-user ring directory.
    pub fn ring_name(&self, pid: u32) -> String {
        format!("{}.{}.{}.ring", self.job, self.host, pid)
    }

    /// `<shm_dir>/<uid>/<job>.<host>.<pid>.ring` (see [`crate::shm`]).
    pub fn ring_path(&self, pid: u32, uid: u32) -> PathBuf {
        self.shm_dir.join(uid.to_string()).join(self.ring_name(pid))
    }
}

/// Decimal or `0x` hex.
pub fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// A mask: a number (decimal or 0x hex) or event names joined by `,` or `|` (case-insensitive,
/// optional `ncclProfile` prefix), or a mix. Copy-engine and unknown bits are errors.
pub fn parse_mask(s: &str) -> Result<u32, String> {
    let mut mask: u64 = 0;
    let mut any = false;
    for part in s.split([',', '|']) {
        let p = part.trim();
        if p.is_empty() {
            continue;
        }
        any = true;
        if let Some(n) = parse_u64(p) {
            mask |= n;
            continue;
        }
        let name = p
            .strip_prefix("ncclProfile")
            .or_else(|| p.strip_prefix("NCCLPROFILE"))
            .unwrap_or(p);
        match MASK_NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            Some((_, bit)) => mask |= bit,
            None => return Err(format!("unknown event name {p:?}")),
        }
    }
    if !any {
        return Err("empty mask".into());
    }
    if mask & !u64::from(SUPPORTED_MASK) != 0 {
        return Err(format!(
            "bits 0x{:x} are not supported (copy-engine or unknown events)",
            mask & !u64::from(SUPPORTED_MASK)
        ));
    }
    Ok(mask as u32)
}

/// Replace characters that cannot be part of one path component.
pub fn path_safe(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c == '/' || c == '\0' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    match t.as_str() {
        "" | "." | ".." => "_".into(),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn masks_parse_numbers_hex_and_names() {
        assert_eq!(parse_mask("0x747"), Ok(0x747));
        assert_eq!(parse_mask("1863"), Ok(0x747));
        assert_eq!(parse_mask("Coll|KernelCh"), Ok(0x42));
        assert_eq!(parse_mask("coll, p2p ,kernelch"), Ok(0x46));
        assert_eq!(parse_mask("ncclProfileProxyOp|0x10"), Ok(0x18));
        assert!(parse_mask("Coll|Bogus").is_err());
        assert!(
            parse_mask("0x1000").is_err(),
            "copy-engine bits are refused"
        );
        assert!(parse_mask("").is_err());
        assert!(parse_mask("-3").is_err());
    }

    #[test]
    fn bad_values_warn_once_each_and_fall_back_to_defaults() {
        let (c, w) = cfg(&[
            ("COMMINSIGHT_EVENT_MASK", "Coll|Nope"),
            ("COMMINSIGHT_OVERDUE_MS", "soon"),
            ("COMMINSIGHT_MAX_INFLIGHT", "0"),
            ("COMMINSIGHT_DISABLE", "maybe"),
        ]);
        assert_eq!(c.event_mask, DEFAULT_EVENT_MASK);
        assert_eq!(c.overdue_ms, DEFAULT_OVERDUE_MS);
        assert_eq!(c.max_inflight, DEFAULT_MAX_INFLIGHT);
        assert!(!c.disable);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].contains("COMMINSIGHT_") && w.iter().any(|l| l.contains("EVENT_MASK")));
    }

    #[test]
    fn good_values_are_used() {
        let (c, w) = cfg(&[
            ("COMMINSIGHT_EVENT_MASK", "0x46"),
            ("COMMINSIGHT_OVERDUE_MS", "1000"),
            ("COMMINSIGHT_JOB_ID", "j/1"),
            ("COMMINSIGHT_HOSTNAME", "node-1"),
            ("COMMINSIGHT_LOG_DIR", "/tmp/x"),
            ("COMMINSIGHT_INSPECTOR_COMPAT", "1"),
            ("SLURM_JOB_ID", "77"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.event_mask, 0x46);
        assert_eq!(c.overdue_ms, 1000);
        assert_eq!(c.job, "j_1");
        assert!(c.inspector_compat);
        assert_eq!(c.inspector_dir, PathBuf::from("nccl-inspector-77"));
        assert_eq!(c.segment_dir(42), PathBuf::from("/tmp/x/j_1/node-1/42"));
        assert_eq!(c.drain_period_ms(), 200);
        assert_eq!(
            c.ring_path(42, 1000),
            PathBuf::from("/dev/shm/comminsight/1000/j_1.node-1.42.ring")
        );
    }

    #[test]
    fn defaults_match_the_contract() {
        let (c, w) = cfg(&[]);
        assert!(w.is_empty());
        assert_eq!(c.event_mask, 0x747);
        assert_eq!(c.job, "nojob");
        assert_eq!(c.log_dir, PathBuf::from("./inspector_logs"));
        assert_eq!(
            c.inspector_dir,
            PathBuf::from("nccl-inspector-unknown-jobid")
        );
        assert_eq!(c.max_inflight, 16_384);
        assert_eq!(c.inspector_min_size, 8192);
    }
}

//! The stand-in's environment knobs (docs/contracts.md "CPU test bed"), read once.

use std::sync::OnceLock;

/// Emulated NCCL release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// 2.27.3: profiler ABI v4 only, `lib*.so` name rule.
    V2_27,
    /// 2.28.3: v5→v4 probe, verbatim-then-prefix names, logs init errors.
    V2_28,
    /// 2.30.7: v6→v5→v4 probe, unloads on init error.
    V2_30,
}

impl Release {
    /// Parses `COMMINSIGHT_TESTBED_NCCL_VERSION` (`None`/unknown → 2.30).
    pub fn parse(v: Option<&str>) -> Self {
        match v.map(str::trim) {
            Some("2.27") => Self::V2_27,
            Some("2.28") => Self::V2_28,
            _ => Self::V2_30,
        }
    }

    /// `ncclGetVersion` value.
    pub fn version_code(self) -> i32 {
        match self {
            Self::V2_27 => 22703,
            Self::V2_28 => 22803,
            Self::V2_30 => 23007,
        }
    }
}

/// All knobs.
#[derive(Debug)]
pub struct Env {
    /// `COMMINSIGHT_TESTBED_NCCL_VERSION`.
    pub release: Release,
    /// `COMMINSIGHT_TESTBED_HOST` (default hostname).
    pub host: String,
    /// `COMMINSIGHT_TESTBED_BIND_ADDR` (default 127.0.0.1).
    pub bind_addr: String,
    /// `COMMINSIGHT_TESTBED_LOSS_PCT` (0..=100).
    pub loss_pct: f64,
    /// `COMMINSIGHT_TESTBED_SEED`.
    pub seed: u64,
    /// `NCCL_PROFILER_PLUGIN`.
    pub profiler_plugin: Option<String>,
    /// `NCCL_COMM_BLOCKING`.
    pub comm_blocking: Option<i32>,
    /// `NCCL_ALLGATHERV_ENABLE` (default 1; 2.30 only): Broadcast through NCCL's AllGatherV path.
    pub allgatherv_enable: bool,
}

/// `gethostname()`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Parses a loss percentage; bad values → 0 with a warning.
pub fn parse_loss(v: Option<&str>) -> f64 {
    match v.map(|s| s.trim().parse::<f64>()) {
        None => 0.0,
        Some(Ok(p)) if (0.0..=100.0).contains(&p) => p,
        Some(_) => {
            crate::log::warn("COMMINSIGHT_TESTBED_LOSS_PCT must be a number in 0..=100; using 0");
            0.0
        }
    }
}

static E: OnceLock<Env> = OnceLock::new();

/// The process' settings.
pub fn get() -> &'static Env {
    E.get_or_init(from_env)
}

/// Settle the settings with no profiler plugin, whatever `NCCL_PROFILER_PLUGIN` says (the HCCL
/// stand-in, which reuses this crate's communicators and transport: HCCL has no profiler ABI).
/// Returns false when the settings were read before (then they stay as they are).
pub fn without_profiler() -> bool {
    let mut set = false;
    E.get_or_init(|| {
        set = true;
        Env {
            // NCCL's "disabled" value (2.28+; 2.27 finds no `libnccl-profiler-none.so`).
            profiler_plugin: Some("none".into()),
            ..from_env()
        }
    });
    set
}

fn from_env() -> Env {
    Env {
        release: Release::parse(var("COMMINSIGHT_TESTBED_NCCL_VERSION").as_deref()),
        host: var("COMMINSIGHT_TESTBED_HOST")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(hostname),
        bind_addr: var("COMMINSIGHT_TESTBED_BIND_ADDR")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "127.0.0.1".into()),
        loss_pct: parse_loss(var("COMMINSIGHT_TESTBED_LOSS_PCT").as_deref()),
        seed: var("COMMINSIGHT_TESTBED_SEED")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
        profiler_plugin: var("NCCL_PROFILER_PLUGIN"),
        comm_blocking: var("NCCL_COMM_BLOCKING").and_then(|s| s.trim().parse().ok()),
        allgatherv_enable: var("NCCL_ALLGATHERV_ENABLE")
            .map(|s| s.trim() != "0")
            .unwrap_or(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_parsing_and_codes() {
        assert_eq!(Release::parse(None), Release::V2_30);
        assert_eq!(Release::parse(Some("2.27")).version_code(), 22703);
        assert_eq!(Release::parse(Some("2.28")).version_code(), 22803);
        assert_eq!(Release::parse(Some("2.30")).version_code(), 23007);
    }

    #[test]
    fn loss_parsing() {
        assert_eq!(parse_loss(Some("25")), 25.0);
        assert_eq!(parse_loss(Some("abc")), 0.0);
        assert_eq!(parse_loss(Some("101")), 0.0);
    }
}

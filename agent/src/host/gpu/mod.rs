//! GPU telemetry (issue 20): the daemon samples the GPUs of the rank processes it follows —
//! [`nvml`] through `nvml-wrapper` (NVML loaded at run time, every symbol resolved lazily) —
//! and the [`super::recorder`] writes
//! what they read as `gpu` / `nvlink` / `xid` records (`comminsight_wire::gpu`) into the jobs'
//! host streams, beside the host context. A rank is bound to its GPU by the PCI address its
//! plugin recorded (`comm_device`); [`context`] is the engine's analysis of those records: each
//! device's windows, and the rank -> device binding the straggler and hang evidence read.
//!
//! Everything degrades alone: no NVML library, no driver, no GPU — one line at start, `doctor`
//! says so, nothing else changes; a missing NVML symbol or a NOT_SUPPORTED metric disables that
//! metric alone, with one line.

pub mod context;
pub mod counter;
pub mod nvml;
pub(crate) mod raw;
pub mod sampler;
pub mod xid;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The `[gpu]` configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Sample the GPUs at all.
    pub enabled: bool,
    /// The NVML library to load; empty (the default): `libnvidia-ml.so.1` as the dynamic loader
    /// finds it (the driver installs it).
    pub library: PathBuf,
    /// Sampling period (milliseconds, >= 10); 1000 by default.
    pub interval_ms: u64,
    /// Period while a hang or a straggler is under analysis (milliseconds, >= 10); 100.
    pub fast_interval_ms: u64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            library: PathBuf::new(),
            interval_ms: 1000,
            fast_interval_ms: 100,
        }
    }
}

/// What the GPU sources run, for `/status`, `doctor` and the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// `on (N GPUs, driver V)`, `off: why`.
    pub nvml: String,
    /// Metrics switched off, each with why (`pcie_throughput on GPU 1: not supported`).
    pub metrics_off: Vec<String>,
    /// GPUs sampled in the last period.
    pub sampled: usize,
    /// NVML calls that failed transiently (counted, skipped).
    pub errors: u64,
    /// XID events seen.
    pub xids: u64,
}

/// What one sampling period read: the records for the host streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuReadings {
    pub gpus: Vec<comminsight_wire::gpu::GpuSample>,
    pub links: Vec<comminsight_wire::gpu::GpuLink>,
    pub xids: Vec<comminsight_wire::gpu::GpuXid>,
}

#[cfg(test)]
pub(crate) mod tests;

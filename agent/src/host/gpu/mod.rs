//! GPU telemetry (issue 20): the daemon samples the GPUs of the rank processes it follows —
//! [`nvml`] through `nvml-wrapper` (NVML loaded at run time, every symbol resolved lazily) —
//! and the [`super::recorder`] writes
//! what they read as `gpu` / `nvlink` / `xid` records (`comminsight_wire::gpu`) into the jobs'
//! host streams, beside the host context. A rank is bound to its GPU by the PCI address its
//! plugin recorded (`comm_device`); [`context`] is the engine's analysis of those records: each
//! device's windows, and the rank -> device binding the straggler and hang evidence read.
//!
//! Where a site runs dcgm-exporter, [`dcgm`] scrapes it (`[gpu] dcgm_url`) for the fields NVML
//! cannot read (DCGM's profiling fields) and for the GPUs NVML does not sample.
//!
//! Everything degrades alone: no NVML library, no driver, no GPU — one line at start, `doctor`
//! says so, nothing else changes; a missing NVML symbol or a NOT_SUPPORTED metric disables that
//! metric alone, with one line; an exporter that does not answer is one line and a count.

pub mod context;
pub mod counter;
pub mod dcgm;
pub mod nvml;
pub(crate) mod raw;
pub mod sampler;
pub mod xid;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use comminsight_wire::gpu::{throttle, GpuSample, SHARE_SCALE};

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
    /// A dcgm-exporter `/metrics` URL to scrape (`http://127.0.0.1:9400/metrics`); empty (the
    /// default): no DCGM source.
    pub dcgm_url: String,
    /// How often to scrape it (milliseconds, >= 100); 5000. dcgm-exporter refreshes its values
    /// every `-c` ms (30000 by default): scraping faster reads the same values again.
    pub dcgm_interval_ms: u64,
    /// The whole request's time limit (milliseconds, >= 10); 2000.
    pub dcgm_timeout_ms: u64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            library: PathBuf::new(),
            interval_ms: 1000,
            fast_interval_ms: 100,
            dcgm_url: String::new(),
            dcgm_interval_ms: 5000,
            dcgm_timeout_ms: 2000,
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
    /// The DCGM source: `off`, `on (URL): N GPUs`, `failing (URL): why`.
    #[serde(default)]
    pub dcgm: String,
    /// Scrapes that failed, and series of GPUs neither bound nor known by PCI address or UUID.
    #[serde(default)]
    pub dcgm_failed: u64,
    #[serde(default)]
    pub dcgm_unmapped: u64,
}

/// The GPUs the jobs' ranks on one host are bound to: what the sampler samples and how each
/// job's records are chosen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundGpus {
    /// Job -> PCI addresses.
    pub jobs: BTreeMap<String, BTreeSet<u64>>,
    /// UUID (`GPU-...`) -> PCI address, for sources that name a GPU by UUID alone.
    pub uuids: BTreeMap<String, u64>,
}

/// Without measured durations: a reason active at the sample counts for the whole period (the
/// NVML source without NVML's duration counters, and DCGM).
pub(crate) fn bitmask_shares(s: &mut GpuSample) {
    if s.valid & comminsight_wire::gpu::gpu_valid::THROTTLE_REASONS == 0 {
        return;
    }
    let full = |bit: u64| {
        if s.throttle_reasons & bit != 0 {
            SHARE_SCALE
        } else {
            0
        }
    };
    s.sw_power_share = full(throttle::SW_POWER_CAP);
    s.sw_thermal_share = full(throttle::SW_THERMAL_SLOWDOWN);
    s.hw_thermal_share = full(throttle::HW_THERMAL_SLOWDOWN);
    s.hw_power_brake_share = full(throttle::HW_POWER_BRAKE_SLOWDOWN);
    s.hw_slowdown_share = full(throttle::HW_SLOWDOWN);
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

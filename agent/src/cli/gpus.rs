//! `comminsight-agent gpus`: the GPUs of this host as the agent's NVML source reads them — each
//! device (index, PCI address, UUID, NVLinks) and, sampled every second for `--duration-s`, its
//! latest values and which metrics are off and why. How an operator (and `tests/gpu/check.sh`)
//! sees what the daemon would record, without a job.

use std::path::PathBuf;
use std::time::Duration;

use comminsight_wire::gpu::pci;
use serde_json::json;

use super::exit;
use crate::host::gpu::nvml::NvmlSource;
use crate::host::gpu::GpuConfig;
use crate::probes::threads::monotonic_ns;

#[derive(Debug, clap::Args)]
pub struct GpusArgs {
    /// Sample for this long (seconds; 0: list the devices only).
    #[arg(long, value_name = "S", default_value_t = 3.0)]
    pub duration_s: f64,
    /// The NVML library (default: [gpu] library, else libnvidia-ml.so.1).
    #[arg(long, value_name = "FILE")]
    pub library: Option<PathBuf>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &GpusArgs) -> anyhow::Result<u8> {
    let cfg = GpuConfig {
        library: a.library.clone().unwrap_or_default(),
        ..GpuConfig::default()
    };
    let mut n = match NvmlSource::open(&cfg) {
        Ok(n) => n,
        Err(e) => {
            if a.json {
                println!("{}", json!({"nvml": format!("off: {e}"), "gpus": []}));
            } else {
                println!("NVML off: {e}");
            }
            return Ok(exit::INPUT);
        }
    };
    let mut last = Vec::new();
    let mut links = Vec::new();
    let rounds = (a.duration_s.max(0.0)).ceil() as u64;
    for k in 0..=rounds {
        if k > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let now = monotonic_ns();
        (last, links) = n.sample(None, now, now);
    }
    let devices = n.devices();
    let report = json!({
        "nvml": format!("on (driver {})", n.driver()),
        "devices": devices,
        "samples": last.iter().map(|g| json!({
            "index": g.index, "pci": pci::format(g.pci), "valid": g.valid,
            "sm_util": g.sm_util, "memory_util": g.memory_util,
            "sm_clock_mhz": g.sm_clock_mhz, "memory_clock_mhz": g.memory_clock_mhz,
            "power_w": f64::from(g.power_mw) / 1000.0, "energy_mj": g.energy_mj,
            "temperature_c": g.temperature_c, "memory_used_bytes": g.memory_used_bytes,
            "throttle_reasons": comminsight_wire::gpu::throttle::names(g.throttle_reasons),
            "hw_slowdown_share": g.hw_slowdown_share, "interval_ns": g.interval_ns,
        })).collect::<Vec<_>>(),
        "nvlinks": links.iter().map(|l| json!({
            "index": l.index, "link": l.link, "up": l.up, "tx_bytes": l.tx_bytes,
            "rx_bytes": l.rx_bytes, "errors": l.errors(), "valid": l.valid,
        })).collect::<Vec<_>>(),
        "metrics_off": n.off_lines,
        "errors": n.errors,
    });
    if a.json {
        println!("{report}");
        return Ok(exit::OK);
    }
    println!("NVML on (driver {}): {} GPUs", n.driver(), devices.len());
    for (d, g) in devices.iter().zip(&last) {
        println!(
            "  {} {} {}: {} NVLinks, SM {} % at {} MHz, {:.0} W, {} C, {} MiB used",
            d.index,
            d.pci,
            d.uuid,
            d.nvlinks,
            g.sm_util,
            g.sm_clock_mhz,
            f64::from(g.power_mw) / 1000.0,
            g.temperature_c,
            g.memory_used_bytes >> 20
        );
    }
    for l in &n.off_lines {
        println!("  off: {l}");
    }
    Ok(exit::OK)
}

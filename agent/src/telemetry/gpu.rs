//! The GPU instruments (issue 20): OpenTelemetry's `hw.*` hardware conventions where they
//! exist (`hw.gpu.utilization`, `hw.gpu.memory.utilization`, `hw.gpu.memory.usage`, `hw.power`,
//! `hw.energy`, `hw.errors`, with `hw.type` = `gpu` and `hw.id` = the GPU's UUID), and
//! `comminsight.gpu.*` for what they do not cover (clocks, throttle time, temperature, PCIe
//! throughput, NVLink traffic / errors / state, the last XID, as DCGM reports it). Every point
//! carries the job, the rank bound to the GPU (its lowest global rank; -1 unknown), the host
//! and the GPU's PCI address. Bounded: [`MAX_GPUS`] devices, [`MAX_LINKS`] links each. The
//! instruments themselves are in the catalogue.

use comminsight_wire::gpu::{gpu_valid, ALL_LINKS, SHARE_SCALE};

use super::catalogue::*;
use super::{Attr, Point, Value};
use crate::host::gpu::context::{GpuLatest, LinkView};

/// GPUs exported per collection.
pub const MAX_GPUS: usize = 1024;
/// NVLinks exported per GPU.
pub const MAX_LINKS: usize = 18;

/// One GPU's values for one collection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuValues {
    pub job: String,
    /// Lowest global rank bound to it (-1 unknown).
    pub rank: i64,
    /// `dddd:bb:dd.f` and UUID (empty unknown).
    pub pci: String,
    pub uuid: String,
    pub latest: GpuLatest,
    pub links: Vec<LinkView>,
    /// The latest XID (0: none).
    pub xid: u64,
}

/// The points of a GPU instrument (`None`: another instrument).
pub fn gpu_points(i: &Instrument, gpus: &[GpuValues], host: &str) -> Option<Vec<Point>> {
    if !i.name.starts_with("hw.") && !i.name.starts_with("comminsight.gpu.") {
        return None;
    }
    let mut out = Vec::new();
    for g in gpus.iter().take(MAX_GPUS) {
        let base = vec![
            (JOB, Attr::Str(g.job.clone())),
            (RANK, Attr::Int(g.rank)),
            (HOST, Attr::Str(host.to_owned())),
            (
                HW_ID,
                Attr::Str(if g.uuid.is_empty() {
                    g.pci.clone()
                } else {
                    g.uuid.clone()
                }),
            ),
            (HW_TYPE, Attr::Str("gpu".into())),
            (GPU_PCI, Attr::Str(g.pci.clone())),
        ];
        let mut push = |extra: Vec<(&'static str, Attr)>, value: Value| {
            let mut attrs = base.clone();
            attrs.extend(extra);
            out.push(Point { attrs, value });
        };
        if i.name.starts_with("comminsight.gpu.nvlink.") {
            link_points(i, g, &mut push);
        } else {
            device_points(i, g, &mut push);
        }
    }
    Some(out)
}

type Push<'a> = dyn FnMut(Vec<(&'static str, Attr)>, Value) + 'a;

fn s(v: &str) -> Attr {
    Attr::Str(v.into())
}

/// The per-device instruments' points of `g` (only metrics its latest sample carries).
fn device_points(i: &Instrument, g: &GpuValues, push: &mut Push<'_>) {
    let l = &g.latest;
    let has = |bit: u32| l.valid & bit != 0;
    let real = |v: f64| Value::Real(v);
    match i.name {
        n if n == GPU_UTILIZATION.name && has(gpu_valid::UTIL) => {
            push(vec![], real(f64::from(l.sm_util) / 100.0))
        }
        n if n == GPU_MEMORY_UTILIZATION.name && has(gpu_valid::UTIL) => {
            push(vec![], real(f64::from(l.memory_util) / 100.0))
        }
        n if n == GPU_MEMORY_USAGE.name && has(gpu_valid::MEMORY) => {
            push(vec![], real(l.memory_used_bytes as f64))
        }
        n if n == GPU_POWER.name && has(gpu_valid::POWER) => {
            push(vec![], real(f64::from(l.power_mw) / 1000.0))
        }
        n if n == GPU_ENERGY.name && has(gpu_valid::ENERGY) => {
            push(vec![], real(l.energy_mj as f64 / 1000.0))
        }
        n if n == GPU_ERRORS.name => {
            if has(gpu_valid::ECC) {
                push(
                    vec![(ERROR_TYPE, s("ecc_corrected"))],
                    Value::Count(l.ecc_corrected),
                );
                push(
                    vec![(ERROR_TYPE, s("ecc_uncorrected"))],
                    Value::Count(l.ecc_uncorrected),
                );
            }
            if has(gpu_valid::PCIE_REPLAYS) {
                push(
                    vec![(ERROR_TYPE, s("pcie_replay"))],
                    Value::Count(l.pcie_replays),
                );
            }
        }
        n if n == GPU_CLOCK.name && has(gpu_valid::CLOCKS) => {
            push(vec![(CLOCK, s("sm"))], real(f64::from(l.sm_clock_mhz)));
            push(
                vec![(CLOCK, s("memory"))],
                real(f64::from(l.memory_clock_mhz)),
            );
        }
        n if n == GPU_THROTTLE_TIME.name
            && has(gpu_valid::THROTTLE_REASONS | gpu_valid::THROTTLE_TIMES) =>
        {
            let names = [
                "sw_power_cap",
                "hw_slowdown",
                "hw_thermal",
                "hw_power_brake",
                "sw_thermal",
            ];
            for (name, ns) in names.into_iter().zip(l.throttle_ns) {
                push(vec![(REASON, s(name))], real(ns as f64 / 1e9));
            }
        }
        n if n == GPU_TEMPERATURE.name && has(gpu_valid::TEMPERATURE) => {
            push(vec![], real(f64::from(l.temperature_c)))
        }
        n if n == GPU_PCIE_THROUGHPUT.name && has(gpu_valid::PCIE_THROUGHPUT) => {
            push(
                vec![(DIRECTION, s("transmit"))],
                real(f64::from(l.pcie_tx_kbps) * 1000.0),
            );
            push(
                vec![(DIRECTION, s("receive"))],
                real(f64::from(l.pcie_rx_kbps) * 1000.0),
            );
        }
        n if n == GPU_SM_ACTIVE.name && has(gpu_valid::SM_ACTIVE) => push(
            vec![],
            real(f64::from(l.sm_active_share) / f64::from(SHARE_SCALE)),
        ),
        n if n == GPU_RETIRED_PAGES.name && has(gpu_valid::RETIRED_PAGES) => {
            push(vec![], real(f64::from(l.retired_pages)))
        }
        n if n == GPU_REMAPPED_ROWS.name && has(gpu_valid::REMAPPED_ROWS) => {
            push(vec![], real(f64::from(l.remapped_rows)))
        }
        n if n == GPU_XID.name => push(vec![], real(g.xid as f64)),
        _ => {}
    }
}

/// The per-NVLink instruments' points of `g`.
fn link_points(i: &Instrument, g: &GpuValues, push: &mut Push<'_>) {
    for k in g.links.iter().take(MAX_LINKS) {
        // DCGM's totals over all links: `comminsight.gpu.nvlink` = -1.
        let id = if k.link == ALL_LINKS {
            -1
        } else {
            i64::from(k.link)
        };
        let link = (LINK, Attr::Int(id));
        if i.name == GPU_NVLINK_IO.name {
            push(
                vec![link.clone(), (DIRECTION, s("transmit"))],
                Value::Count(k.tx_bytes),
            );
            push(
                vec![link, (DIRECTION, s("receive"))],
                Value::Count(k.rx_bytes),
            );
        } else if i.name == GPU_NVLINK_ERRORS.name {
            let kinds = [
                ("crc_flit", k.crc_flit),
                ("crc_data", k.crc_data),
                ("replay", k.replay),
                ("recovery", k.recovery),
            ];
            for (t, v) in kinds {
                push(vec![link.clone(), (ERROR_TYPE, s(t))], Value::Count(v));
            }
        } else if i.name == GPU_NVLINK_UP.name && k.up != 255 {
            push(vec![link], Value::Real(f64::from(k.up)));
        }
    }
}

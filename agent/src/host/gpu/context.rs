//! [`GpuContext`]: the engine's analysis of the GPU records. From the rank streams it keeps
//! which GPU each process' communicators run on (`comm_device`: the rank -> device binding, by
//! PCI address); from the host streams each device's latest sample, its NVLinks' totals and
//! its [`GpuWindows`] (`gpu`, `nvlink`, `xid`). A rank's GPU evidence is read through the
//! binding at query time ([`GpuContext::window`], [`GpuContext::view`]), so it does not depend
//! on the order the streams are read in (offline); live, each sample of a bound device also
//! goes to the processes bound to it ([`crate::host::windows::HostSample`]), for the job
//! master. Bounded ([`MAX_DEVICES`], [`MAX_BINDINGS`], [`MAX_PERIODS`]) and checkpointed.

use std::collections::{BTreeMap, BTreeSet};

use comminsight_wire::gpu::{gpu_valid, pci, throttle, CommDevice, GpuLink, GpuSample, GpuXid};
use comminsight_wire::record::Body;
use serde::{Deserialize, Serialize};

use crate::host::windows::{GpuPeriod, GpuWindow, GpuWindows, HostSample, SampleKind};
use crate::stream::{Alignment, StreamId};

/// Devices kept (per job and host).
pub const MAX_DEVICES: usize = 4096;
/// Devices bound per process.
pub const MAX_BINDINGS: usize = 16;
/// Periods, NVLink error records and XIDs kept per device (an hour at 1 s).
pub const MAX_PERIODS: usize = 3600;
/// NVLinks kept per device.
pub const MAX_LINKS: usize = 64;

/// One device a process' communicators run on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// CUDA ordinal in the process.
    pub ordinal: i32,
    /// `GPU-xxxxxxxx-...` (empty unknown).
    pub uuid: String,
    /// The communicator ranks on it.
    pub ranks: BTreeSet<i32>,
}

/// One NVLink's totals since first seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkView {
    pub link: u8,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub crc_flit: u64,
    pub crc_data: u64,
    pub replay: u64,
    pub recovery: u64,
    /// 1 active, 0 inactive, 255 unknown.
    pub up: u8,
}

/// A device's latest values and its counters' totals since first seen (the exporters).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLatest {
    pub index: u8,
    /// Host ns of the latest sample.
    pub time_ns: u64,
    /// `comminsight_wire::gpu::gpu_valid` of the latest sample.
    pub valid: u32,
    pub sm_util: u8,
    pub memory_util: u8,
    pub sm_clock_mhz: u16,
    pub memory_clock_mhz: u16,
    pub temperature_c: u8,
    pub power_mw: u32,
    pub memory_used_bytes: u64,
    pub throttle_reasons: u64,
    pub pcie_tx_kbps: u32,
    pub pcie_rx_kbps: u32,
    pub retired_pages: u16,
    pub remapped_rows: u16,
    /// Totals of the deltas.
    pub energy_mj: u64,
    pub pcie_replays: u64,
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
    /// Time the clocks were held down per reason (ns): sw power cap, hw slowdown, hw thermal,
    /// hw power brake, sw thermal.
    pub throttle_ns: [u64; 5],
    /// SM activity at the latest DCGM sample (basis points; `valid` has SM_ACTIVE).
    #[serde(default)]
    pub sm_active_share: u16,
}

impl GpuLatest {
    fn add(&mut self, g: &GpuSample) {
        if g.valid == gpu_valid::SM_ACTIVE {
            // A DCGM sample of a GPU NVML samples: it adds its SM activity alone.
            self.sm_active_share = g.sm_active_share;
            self.valid |= gpu_valid::SM_ACTIVE;
            return;
        }
        self.add_all(g);
    }

    /// Every metric of `g`; the SM activity a DCGM sample gave stays when `g` has none.
    fn add_all(&mut self, g: &GpuSample) {
        self.index = g.index;
        self.time_ns = g.time_ns;
        self.valid = g.valid | (self.valid & gpu_valid::SM_ACTIVE);
        if g.valid & gpu_valid::SM_ACTIVE != 0 {
            self.sm_active_share = g.sm_active_share;
        }
        self.sm_util = g.sm_util;
        self.memory_util = g.memory_util;
        self.sm_clock_mhz = g.sm_clock_mhz;
        self.memory_clock_mhz = g.memory_clock_mhz;
        self.temperature_c = g.temperature_c;
        self.power_mw = g.power_mw;
        self.memory_used_bytes = g.memory_used_bytes;
        self.throttle_reasons = g.throttle_reasons;
        self.pcie_tx_kbps = g.pcie_tx_kbps;
        self.pcie_rx_kbps = g.pcie_rx_kbps;
        self.retired_pages = g.retired_pages;
        self.remapped_rows = g.remapped_rows;
        self.energy_mj = self.energy_mj.saturating_add(g.energy_mj);
        self.pcie_replays = self.pcie_replays.saturating_add(u64::from(g.pcie_replays));
        self.ecc_corrected = self
            .ecc_corrected
            .saturating_add(u64::from(g.ecc_corrected));
        self.ecc_uncorrected = self
            .ecc_uncorrected
            .saturating_add(u64::from(g.ecc_uncorrected));
        let shares = [
            g.sw_power_share,
            g.hw_slowdown_share,
            g.hw_thermal_share,
            g.hw_power_brake_share,
            g.sw_thermal_share,
        ];
        for (t, s) in self.throttle_ns.iter_mut().zip(shares) {
            // u128: crafted records carry any interval.
            let ns = u128::from(g.interval_ns) * u128::from(s)
                / u128::from(comminsight_wire::gpu::SHARE_SCALE);
            *t = t.saturating_add(ns.min(u128::from(u64::MAX)) as u64);
        }
    }
}

/// One device, as the views and exporters read it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct DeviceState {
    latest: Option<GpuLatest>,
    #[serde(with = "crate::util::serde_pairs")]
    links: BTreeMap<u8, LinkView>,
    windows: GpuWindows,
}

/// A rank's GPU in a hang snapshot's evidence.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    /// `dddd:bb:dd.f`.
    pub pci: String,
    pub uuid: String,
    /// CUDA ordinal in the process, NVML index.
    pub ordinal: i32,
    pub index: u8,
    pub sm_clock_mhz: u16,
    pub sm_util: u8,
    pub temperature_c: u8,
    pub power_mw: u32,
    /// Slowdown reasons at the latest sample.
    pub reasons: Vec<String>,
    /// XIDs raised, `(job timeline µs, xid)`, oldest first.
    pub xids: Vec<(u64, u64)>,
    /// NVLink error totals since first seen.
    pub nvlink_errors: u64,
    /// When the latest sample was taken (job timeline µs).
    pub sampled_us: u64,
}

type ProcKey = (String, String, u32);
type DevKey = (String, String, u64);

/// The analysis. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuContext {
    #[serde(with = "crate::util::serde_pairs")]
    bindings: BTreeMap<ProcKey, BTreeMap<u64, Binding>>,
    #[serde(with = "crate::util::serde_pairs")]
    devices: BTreeMap<DevKey, DeviceState>,
    dropped: u64,
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of CUDA's 16 bytes (NVML's form); empty for
/// all zero.
pub fn uuid_string(u: &[u8; 16]) -> String {
    if u.iter().all(|b| *b == 0) {
        return String::new();
    }
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn us(a: &Alignment, ns: u64) -> u64 {
    a.apply(ns) / 1000
}

impl GpuContext {
    /// Records dropped at a bound.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// A `comm_device` record of rank stream `id` (the plugin's).
    pub fn comm_device(&mut self, id: &StreamId, d: &CommDevice) {
        let Ok(pid) = id.pid.parse::<u32>() else {
            return;
        };
        if d.pci == 0 {
            return;
        }
        let b = self
            .bindings
            .entry((id.job.clone(), id.host.clone(), pid))
            .or_default();
        if !b.contains_key(&d.pci) && b.len() >= MAX_BINDINGS {
            self.dropped += 1;
            return;
        }
        let e = b.entry(d.pci).or_default();
        e.ordinal = d.device;
        if e.uuid.is_empty() {
            e.uuid = uuid_string(&d.uuid);
        }
        e.ranks.insert(d.rank);
    }

    /// The processes of `job` on `host` bound to device `pci`.
    pub fn users(&self, job: &str, host: &str, p: u64) -> Vec<u32> {
        let lo = (job.to_string(), host.to_string(), 0);
        let hi = (job.to_string(), host.to_string(), u32::MAX);
        self.bindings
            .range(lo..=hi)
            .filter(|(_, b)| b.contains_key(&p))
            .map(|((_, _, pid), _)| *pid)
            .collect()
    }

    fn device_mut(&mut self, id: &StreamId, p: u64) -> Option<&mut DeviceState> {
        let key = (id.job.clone(), id.host.clone(), p);
        if !self.devices.contains_key(&key) && self.devices.len() >= MAX_DEVICES {
            self.dropped += 1;
            return None;
        }
        Some(self.devices.entry(key).or_default())
    }

    /// One record of host stream `id`; the samples it made for the processes bound to its
    /// device go to `out`.
    pub fn apply(
        &mut self,
        id: &StreamId,
        body: &Body,
        a: &Alignment,
        out: &mut Vec<(u32, HostSample)>,
    ) {
        let (p, sample) = match body {
            Body::Gpu(g) => (g.pci, self.gpu(id, g, a)),
            Body::GpuLink(l) => (l.pci, self.link(id, l, a)),
            Body::Xid(x) => (x.pci, self.xid(id, x, a)),
            _ => return,
        };
        if let Some(s) = sample {
            for pid in self.users(&id.job, &id.host, p) {
                out.push((pid, s.clone()));
            }
        }
    }

    fn gpu(&mut self, id: &StreamId, g: &GpuSample, a: &Alignment) -> Option<HostSample> {
        let at = us(a, g.time_ns);
        let d = self.device_mut(id, g.pci)?;
        d.latest.get_or_insert_with(GpuLatest::default).add(g);
        let period = GpuPeriod::of(g)?;
        d.windows.push_period(at, period, MAX_PERIODS);
        Some(HostSample {
            at_us: at,
            what: SampleKind::Gpu { period },
        })
    }

    fn link(&mut self, id: &StreamId, l: &GpuLink, a: &Alignment) -> Option<HostSample> {
        let at = us(a, l.time_ns);
        let d = self.device_mut(id, l.pci)?;
        if !d.links.contains_key(&l.link) && d.links.len() >= MAX_LINKS {
            self.dropped += 1;
            return None;
        }
        let v = d.links.entry(l.link).or_default();
        v.link = l.link;
        v.tx_bytes = v.tx_bytes.saturating_add(l.tx_bytes);
        v.rx_bytes = v.rx_bytes.saturating_add(l.rx_bytes);
        v.crc_flit = v.crc_flit.saturating_add(u64::from(l.crc_flit));
        v.crc_data = v.crc_data.saturating_add(u64::from(l.crc_data));
        v.replay = v.replay.saturating_add(u64::from(l.replay));
        v.recovery = v.recovery.saturating_add(u64::from(l.recovery));
        if l.up != 255 {
            v.up = l.up;
        }
        d.windows.push_link(at, l, MAX_PERIODS);
        let errors = l.errors().min(u64::from(u32::MAX)) as u32;
        (errors > 0).then_some(HostSample {
            at_us: at,
            what: SampleKind::NvlinkErrors {
                pci: l.pci,
                link: l.link,
                errors,
            },
        })
    }

    fn xid(&mut self, id: &StreamId, x: &GpuXid, a: &Alignment) -> Option<HostSample> {
        let at = us(a, x.time_ns);
        let d = self.device_mut(id, x.pci)?;
        d.windows.push_xid_record(at, x, MAX_PERIODS);
        Some(HostSample {
            at_us: at,
            what: SampleKind::Xid {
                pci: x.pci,
                xid: x.xid,
            },
        })
    }

    /// The devices the processes of each job on `host` are bound to (what the recorder samples
    /// and writes into each job's host stream).
    pub fn bound(&self, host: &str) -> BTreeMap<String, BTreeSet<u64>> {
        let mut out: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        for ((job, h, _), b) in &self.bindings {
            if h == host {
                out.entry(job.clone()).or_default().extend(b.keys());
            }
        }
        out
    }

    /// What the recorder of `host` samples: [`Self::bound`], and the UUIDs the plugins
    /// recorded for those devices.
    pub fn bound_gpus(&self, host: &str) -> crate::host::gpu::BoundGpus {
        let mut uuids = BTreeMap::new();
        for ((_, h, _), b) in &self.bindings {
            if h == host {
                for (p, d) in b.iter().filter(|(_, d)| !d.uuid.is_empty()) {
                    uuids.insert(d.uuid.clone(), *p);
                }
            }
        }
        crate::host::gpu::BoundGpus {
            jobs: self.bound(host),
            uuids,
        }
    }

    /// The devices of process `pid` of `job` on `host`.
    pub fn devices_of(&self, job: &str, host: &str, pid: u32) -> Vec<(u64, Binding)> {
        self.bindings
            .get(&(job.to_string(), host.to_string(), pid))
            .map(|b| b.iter().map(|(p, v)| (*p, v.clone())).collect())
            .unwrap_or_default()
    }

    /// The process' GPUs over `[from_us, to_us]` (the rank's process clock, as the host
    /// windows); `None` when it is bound to no device with records there.
    pub fn window(
        &self,
        job: &str,
        host: &str,
        pid: u32,
        from_us: u64,
        to_us: u64,
    ) -> Option<GpuWindow> {
        let mut out: Option<GpuWindow> = None;
        for (p, _) in self.devices_of(job, host, pid) {
            let Some(d) = self.devices.get(&(job.to_string(), host.to_string(), p)) else {
                continue;
            };
            if let Some(w) = d.windows.window(from_us, to_us) {
                match out.as_mut() {
                    Some(o) => o.merge(w),
                    None => out = Some(w),
                }
            }
        }
        out
    }

    /// The process' GPUs as a hang snapshot shows them, times moved by `shift_us`; empty when
    /// it is bound to none.
    pub fn view(&self, job: &str, host: &str, pid: u32, shift_us: i64) -> Vec<GpuView> {
        let shift = |t: u64| t.saturating_add_signed(shift_us);
        let mut out = Vec::new();
        for (p, b) in self.devices_of(job, host, pid) {
            let d = self.devices.get(&(job.to_string(), host.to_string(), p));
            let mut v = GpuView {
                pci: pci::format(p),
                uuid: b.uuid.clone(),
                ordinal: b.ordinal,
                ..GpuView::default()
            };
            if let Some(d) = d {
                if let Some(g) = &d.latest {
                    v.index = g.index;
                    v.sm_clock_mhz = g.sm_clock_mhz;
                    v.sm_util = g.sm_util;
                    v.temperature_c = g.temperature_c;
                    v.power_mw = g.power_mw;
                    v.reasons = throttle::names(g.throttle_reasons & throttle::SLOWDOWN)
                        .into_iter()
                        .map(String::from)
                        .collect();
                }
                v.xids = d
                    .windows
                    .xids()
                    .map(|(at, _, x)| (shift(*at), *x))
                    .collect();
                v.nvlink_errors = d
                    .links
                    .values()
                    .map(|l| l.crc_flit + l.crc_data + l.replay + l.recovery)
                    .sum();
                v.sampled_us = d.windows.last_us().map_or(0, shift);
            }
            out.push(v);
        }
        out
    }

    /// Every device of `host` with its latest sample and NVLink totals, per job (the
    /// exporters).
    pub fn latest(&self, host: &str) -> Vec<(&str, u64, &GpuLatest, Vec<&LinkView>)> {
        self.devices
            .iter()
            .filter(|((_, h, _), _)| h == host)
            .filter_map(|((job, _, p), d)| {
                Some((
                    job.as_str(),
                    *p,
                    d.latest.as_ref()?,
                    d.links.values().collect(),
                ))
            })
            .collect()
    }

    /// The latest XID device `pci` of `job` on `host` raised (0: none).
    pub fn last_xid(&self, job: &str, host: &str, p: u64) -> u64 {
        self.devices
            .get(&(job.to_string(), host.to_string(), p))
            .and_then(|d| d.windows.xids().last().map(|x| x.2))
            .unwrap_or(0)
    }

    /// The UUID a process bound to device `pci` of `job` on `host` recorded (empty unknown).
    pub fn uuid_of(&self, job: &str, host: &str, p: u64) -> String {
        let lo = (job.to_string(), host.to_string(), 0);
        let hi = (job.to_string(), host.to_string(), u32::MAX);
        self.bindings
            .range(lo..=hi)
            .find_map(|(_, b)| b.get(&p).map(|x| x.uuid.clone()).filter(|u| !u.is_empty()))
            .unwrap_or_default()
    }

    /// Forget process `pid` of `job` on `host` (its stream is gone); a device no process of
    /// the job is bound to any more goes too.
    pub fn forget_proc(&mut self, job: &str, host: &str, pid: u32) {
        self.bindings
            .remove(&(job.to_string(), host.to_string(), pid));
        let bound = self.bound(host).remove(job).unwrap_or_default();
        self.devices
            .retain(|(j, h, p), _| j != job || h != host || bound.contains(p));
    }
}

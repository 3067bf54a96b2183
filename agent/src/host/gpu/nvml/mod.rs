//! [`NvmlSource`]: the GPUs of this host through NVML (`nvml-wrapper`, the library loaded at
//! run time). Per device and period: SM / memory utilisation, SM and memory clocks, clock-event
//! (throttle) reasons and the share of the period each held the clocks down (NVML's duration
//! counters), power, energy, temperature, memory used, PCIe throughput and replays, ECC counts,
//! retired pages and remapped rows; per NVLink: state, data throughput (field values scoped to
//! the link) and the DL CRC / replay / recovery counters. Counters become deltas
//! ([`super::counter`]).
//!
//! A metric whose symbol the library lacks is switched off on every device, one NOT_SUPPORTED
//! on one device, each with one log line ([`super::GpuStatus::metrics_off`]); other failures
//! are counted and the value is skipped for that period.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::Arc;

use comminsight_wire::gpu::{
    gpu_flags, gpu_source, gpu_valid, pci, throttle, GpuLink, GpuSample, SHARE_SCALE,
};
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::counter::Counter;
use super::GpuConfig;

mod links;
pub mod trust;
use links::links_of;

/// NVLinks asked about per device (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_LINKS: u32 = 18;
/// Devices sampled at most.
pub const MAX_GPUS: usize = 64;

/// The clock-event duration fields (ns, cumulative; v12 numbering, which `nvml-wrapper`
/// translates for CUDA 13.0 Update 1 drivers) and the reason bit each counts.
const REASON_FIELDS: [(u32, u64); 5] = [
    (74, throttle::SW_POWER_CAP),
    (76, throttle::SYNC_BOOST),
    (251, throttle::SW_THERMAL_SLOWDOWN),
    (252, throttle::HW_THERMAL_SLOWDOWN),
    (253, throttle::HW_POWER_BRAKE_SLOWDOWN),
];
/// `NVML_FI_DEV_REMAPPED_COR` / `_UNC`.
const REMAPPED_FIELDS: [u32; 2] = [142, 143];
/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX` (KiB, cumulative), scoped to a link.
const LINK_TX: u32 = 138;
const LINK_RX: u32 = 139;

/// The metrics that switch off alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Metric {
    Util,
    Clocks,
    ThrottleReasons,
    ThrottleTimes,
    Power,
    Energy,
    Temperature,
    Memory,
    PcieThroughput,
    PcieReplays,
    Ecc,
    RetiredPages,
    RemappedRows,
    NvlinkState,
    NvlinkThroughput,
    NvlinkErrors,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::Util => "utilization",
            Metric::Clocks => "clocks",
            Metric::ThrottleReasons => "throttle_reasons",
            Metric::ThrottleTimes => "throttle_times",
            Metric::Power => "power",
            Metric::Energy => "energy",
            Metric::Temperature => "temperature",
            Metric::Memory => "memory",
            Metric::PcieThroughput => "pcie_throughput",
            Metric::PcieReplays => "pcie_replays",
            Metric::Ecc => "ecc",
            Metric::RetiredPages => "retired_pages",
            Metric::RemappedRows => "remapped_rows",
            Metric::NvlinkState => "nvlink_state",
            Metric::NvlinkThroughput => "nvlink_throughput",
            Metric::NvlinkErrors => "nvlink_errors",
        }
    }
}

#[derive(Debug, Default)]
struct LinkPrev {
    tx: Counter,
    rx: Counter,
    errors: [Counter; 4],
}

/// One device: its identity, what is off on it, and its counters' last readings.
#[derive(Debug)]
struct Dev {
    index: u32,
    pci: u64,
    uuid: String,
    links: Vec<u32>,
    off: BTreeSet<Metric>,
    energy: Counter,
    replays: Counter,
    ecc: [Counter; 2],
    reasons: [Counter; 5],
    link_prev: BTreeMap<u32, LinkPrev>,
    /// Monotonic ns of the last sample.
    last_ns: Option<u64>,
}

/// A device as `doctor` and `/status` list it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    /// `dddd:bb:dd.f`.
    pub pci: String,
    pub uuid: String,
    pub nvlinks: usize,
}

/// The source. See the module docs.
pub struct NvmlSource {
    nvml: Arc<Nvml>,
    driver: String,
    devs: Vec<Dev>,
    /// Metrics whose symbol is missing: off everywhere.
    missing: BTreeSet<Metric>,
    pub(crate) off_lines: Vec<String>,
    pub(crate) errors: u64,
}

/// Why NVML could not start, one line (the library path or the driver named).
pub fn open_error(cfg: &GpuConfig, e: &NvmlError) -> String {
    let lib = if cfg.library.as_os_str().is_empty() {
        "libnvidia-ml.so.1".to_string()
    } else {
        cfg.library.display().to_string()
    };
    match e {
        NvmlError::LibloadingError(l) => {
            format!("cannot load {lib} ({l}): no NVIDIA driver here, or set [gpu] library")
        }
        NvmlError::DriverNotLoaded => format!("{lib} loaded but the NVIDIA kernel driver is not"),
        NvmlError::NoPermission => format!("{lib}: no permission to use NVML"),
        other => format!("{lib}: nvmlInit failed: {other}"),
    }
}

impl NvmlSource {
    /// Load NVML (`[gpu] library`, else the driver's) and list the devices; one line on why
    /// not.
    pub fn open(cfg: &GpuConfig) -> Result<NvmlSource, String> {
        let nvml = if cfg.library.as_os_str().is_empty() {
            Nvml::init()
        } else {
            // Only a library no one but root can have written or can swap (see `trust`).
            let lib = trust::trusted_path(&cfg.library)?;
            Nvml::builder().lib_path(OsStr::new(lib.as_os_str())).init()
        }
        .map_err(|e| open_error(cfg, &e))?;
        let driver = nvml.sys_driver_version().unwrap_or_default();
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML: cannot count the GPUs: {e}"))?;
        let mut devs = Vec::new();
        for index in 0..count.min(MAX_GPUS as u32) {
            let Ok(d) = nvml.device_by_index(index) else {
                continue;
            };
            let Some(p) = d.pci_info().ok().and_then(|p| pci::parse(&p.bus_id)) else {
                continue;
            };
            devs.push(Dev {
                index,
                pci: p,
                uuid: d.uuid().unwrap_or_default(),
                links: links_of(&d),
                off: BTreeSet::new(),
                energy: Counter::default(),
                replays: Counter::default(),
                ecc: Default::default(),
                reasons: Default::default(),
                link_prev: BTreeMap::new(),
                last_ns: None,
            });
        }
        Ok(NvmlSource {
            nvml: Arc::new(nvml),
            driver,
            devs,
            missing: BTreeSet::new(),
            off_lines: Vec::new(),
            errors: 0,
        })
    }

    /// The library, for the XID thread.
    pub fn nvml(&self) -> Arc<Nvml> {
        Arc::clone(&self.nvml)
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The devices found.
    pub fn devices(&self) -> Vec<GpuInfo> {
        self.devs
            .iter()
            .map(|d| GpuInfo {
                index: d.index,
                pci: pci::format(d.pci),
                uuid: d.uuid.clone(),
                nvlinks: d.links.len(),
            })
            .collect()
    }

    /// The devices' PCI addresses.
    pub fn pcis(&self) -> BTreeSet<u64> {
        self.devs.iter().map(|d| d.pci).collect()
    }

    /// One period of the devices whose PCI address is in `wanted` (all when `None`), at
    /// monotonic `now_ns`, their records stamped `host_ns`.
    pub fn sample(
        &mut self,
        wanted: Option<&BTreeSet<u64>>,
        now_ns: u64,
        host_ns: u64,
    ) -> (Vec<GpuSample>, Vec<GpuLink>) {
        let nvml = Arc::clone(&self.nvml);
        let mut gpus = Vec::new();
        let mut links = Vec::new();
        for i in 0..self.devs.len() {
            if wanted.is_some_and(|w| !w.contains(&self.devs[i].pci)) {
                continue;
            }
            let Ok(d) = nvml.device_by_index(self.devs[i].index) else {
                self.errors += 1;
                continue;
            };
            let interval = self.devs[i].last_ns.map_or(0, |l| now_ns.saturating_sub(l));
            self.devs[i].last_ns = Some(now_ns);
            let mut s = GpuSample {
                time_ns: host_ns,
                interval_ns: interval,
                pci: self.devs[i].pci,
                index: self.devs[i].index.min(255) as u8,
                source: gpu_source::NVML,
                ..GpuSample::default()
            };
            self.device_values(i, &d, &mut s);
            self.throttle_values(i, &d, &mut s);
            self.counter_values(i, &d, &mut s);
            links.extend(self.link_values(i, &d, &nvml, host_ns, interval));
            gpus.push(s);
        }
        (gpus, links)
    }

    /// `Some(v)` on success; on failure the metric goes off (missing symbol: everywhere;
    /// NOT_SUPPORTED: on this device), with one line, or the failure is counted.
    fn take<T>(&mut self, i: usize, m: Metric, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(NvmlError::FailedToLoadSymbol(sym)) => {
                if self.missing.insert(m) {
                    // libloading says `<path>: undefined symbol: <name>`.
                    let name = sym.rsplit("undefined symbol: ").next().unwrap_or(&sym);
                    let line = format!("{}: the NVML library has no {name}", m.name());
                    tracing::warn!("GPU metric off: {line}");
                    self.off_lines.push(line);
                }
                None
            }
            Err(NvmlError::NotSupported) => {
                let d = &mut self.devs[i];
                if d.off.insert(m) {
                    let line = format!(
                        "{} on GPU {} ({}): not supported",
                        m.name(),
                        d.index,
                        pci::format(d.pci)
                    );
                    tracing::warn!("GPU metric off: {line}");
                    self.off_lines.push(line);
                }
                None
            }
            Err(_) => {
                self.errors += 1;
                None
            }
        }
    }

    fn on(&self, i: usize, m: Metric) -> bool {
        !self.missing.contains(&m) && !self.devs[i].off.contains(&m)
    }

    /// Instantaneous values: utilisation, clocks, power, temperature, memory, PCIe throughput.
    fn device_values(&mut self, i: usize, d: &Device<'_>, s: &mut GpuSample) {
        if self.on(i, Metric::Util) {
            if let Some(u) = self.take(i, Metric::Util, d.utilization_rates()) {
                s.sm_util = u.gpu.min(100) as u8;
                s.memory_util = u.memory.min(100) as u8;
                s.valid |= gpu_valid::UTIL;
            }
        }
        if self.on(i, Metric::Clocks) {
            let sm = self.take(i, Metric::Clocks, d.clock_info(Clock::SM));
            let mem = sm.and_then(|_| self.take(i, Metric::Clocks, d.clock_info(Clock::Memory)));
            if let (Some(sm), Some(mem)) = (sm, mem) {
                s.sm_clock_mhz = sm.min(u32::from(u16::MAX)) as u16;
                s.memory_clock_mhz = mem.min(u32::from(u16::MAX)) as u16;
                s.valid |= gpu_valid::CLOCKS;
            }
        }
        if self.on(i, Metric::Power) {
            if let Some(p) = self.take(i, Metric::Power, d.power_usage()) {
                s.power_mw = p;
                s.valid |= gpu_valid::POWER;
            }
        }
        if self.on(i, Metric::Temperature) {
            let t = d.temperature(TemperatureSensor::Gpu);
            if let Some(t) = self.take(i, Metric::Temperature, t) {
                s.temperature_c = t.min(255) as u8;
                s.valid |= gpu_valid::TEMPERATURE;
            }
        }
        if self.on(i, Metric::Memory) {
            if let Some(m) = self.take(i, Metric::Memory, d.memory_info()) {
                s.memory_used_bytes = m.used;
                s.valid |= gpu_valid::MEMORY;
            }
        }
        if self.on(i, Metric::PcieThroughput) {
            let tx = self.take(
                i,
                Metric::PcieThroughput,
                d.pcie_throughput(PcieUtilCounter::Send),
            );
            let rx = tx.and_then(|_| {
                self.take(
                    i,
                    Metric::PcieThroughput,
                    d.pcie_throughput(PcieUtilCounter::Receive),
                )
            });
            if let (Some(tx), Some(rx)) = (tx, rx) {
                s.pcie_tx_kbps = tx;
                s.pcie_rx_kbps = rx;
                s.valid |= gpu_valid::PCIE_THROUGHPUT;
            }
        }
        if self.on(i, Metric::RetiredPages) {
            let single = d.retired_pages(RetirementCause::MultipleSingleBitEccErrors);
            let single = self.take(i, Metric::RetiredPages, single);
            let double = single.as_ref().and_then(|_| {
                self.take(
                    i,
                    Metric::RetiredPages,
                    d.retired_pages(RetirementCause::DoubleBitEccError),
                )
            });
            if let (Some(a), Some(b)) = (single, double) {
                s.retired_pages = (a.len() + b.len()).min(usize::from(u16::MAX)) as u16;
                s.valid |= gpu_valid::RETIRED_PAGES;
            }
        }
    }

    /// The reasons at the sample and each one's share of the period.
    fn throttle_values(&mut self, i: usize, d: &Device<'_>, s: &mut GpuSample) {
        if self.on(i, Metric::ThrottleReasons) {
            let r = d.current_throttle_reasons();
            if let Some(r) = self.take(i, Metric::ThrottleReasons, r) {
                s.throttle_reasons = r.bits();
                s.valid |= gpu_valid::THROTTLE_REASONS;
            }
        }
        let ids: Vec<nvml_wrapper::structs::device::FieldId> = REASON_FIELDS
            .iter()
            .map(|(f, _)| *f)
            .chain(REMAPPED_FIELDS)
            .map(nvml_wrapper::structs::device::FieldId)
            .collect();
        let want_times = self.on(i, Metric::ThrottleTimes);
        let want_rows = self.on(i, Metric::RemappedRows);
        if !want_times && !want_rows {
            return super::bitmask_shares(s);
        }
        let Some(vals) = self.take(i, Metric::ThrottleTimes, d.field_values_for(&ids)) else {
            return super::bitmask_shares(s);
        };
        let mut ns: Vec<Result<u64, NvmlError>> = vals
            .into_iter()
            .map(|v| v.and_then(|v| v.value).map(|v| as_u64(&v)))
            .collect();
        if want_times {
            let mut shares = [0u16; 5];
            let mut ok = true;
            for (k, r) in ns.iter().take(REASON_FIELDS.len()).enumerate() {
                match r {
                    Ok(v) => {
                        let dl = self.devs[i].reasons[k].delta(*v);
                        shares[k] = share(dl.value, s.interval_ns);
                    }
                    Err(NvmlError::NotSupported) | Err(NvmlError::InvalidArg) => ok = false,
                    Err(_) => ok = false,
                }
            }
            if ok {
                [
                    s.sw_power_share,
                    _,
                    s.sw_thermal_share,
                    s.hw_thermal_share,
                    s.hw_power_brake_share,
                ] = shares;
                s.hw_slowdown_share = shares[3].max(shares[4]);
                s.valid |= gpu_valid::THROTTLE_TIMES;
            } else {
                self.take::<()>(i, Metric::ThrottleTimes, Err(NvmlError::NotSupported));
                super::bitmask_shares(s);
            }
        } else {
            super::bitmask_shares(s);
        }
        if want_rows {
            let rows: Result<Vec<u64>, NvmlError> =
                ns.split_off(REASON_FIELDS.len()).into_iter().collect();
            if let Some(rows) = self.take(i, Metric::RemappedRows, rows) {
                s.remapped_rows = rows.iter().sum::<u64>().min(u64::from(u16::MAX)) as u16;
                s.valid |= gpu_valid::REMAPPED_ROWS;
            }
        }
    }

    /// Cumulative counters as deltas: energy, PCIe replays, ECC.
    fn counter_values(&mut self, i: usize, d: &Device<'_>, s: &mut GpuSample) {
        let mut flags = 0u8;
        if self.on(i, Metric::Energy) {
            if let Some(e) = self.take(i, Metric::Energy, d.total_energy_consumption()) {
                let dl = self.devs[i].energy.delta(e);
                s.energy_mj = dl.value;
                flags |= flag_of(dl);
                s.valid |= gpu_valid::ENERGY;
            }
        }
        if self.on(i, Metric::PcieReplays) {
            if let Some(r) = self.take(i, Metric::PcieReplays, d.pcie_replay_counter()) {
                let dl = self.devs[i].replays.delta(u64::from(r));
                s.pcie_replays = dl.value.min(u64::from(u32::MAX)) as u32;
                flags |= flag_of(dl);
                s.valid |= gpu_valid::PCIE_REPLAYS;
            }
        }
        if self.on(i, Metric::Ecc) {
            let c = d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile);
            let c = self.take(i, Metric::Ecc, c);
            let u = c.and_then(|_| {
                self.take(
                    i,
                    Metric::Ecc,
                    d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
                )
            });
            if let (Some(c), Some(u)) = (c, u) {
                let dc = self.devs[i].ecc[0].delta(c);
                let du = self.devs[i].ecc[1].delta(u);
                s.ecc_corrected = dc.value.min(u64::from(u32::MAX)) as u32;
                s.ecc_uncorrected = du.value.min(u64::from(u32::MAX)) as u32;
                flags |= flag_of(dc) | flag_of(du);
                s.valid |= gpu_valid::ECC;
            }
        }
        s.sample_flags = flags;
    }
}

pub(super) fn flag_of(d: super::counter::Delta) -> u8 {
    (if d.reset { gpu_flags::COUNTER_RESET } else { 0 })
        | (if d.first { gpu_flags::FIRST } else { 0 })
}

fn as_u64(v: &nvml_wrapper::enums::device::SampleValue) -> u64 {
    use nvml_wrapper::enums::device::SampleValue::*;
    match *v {
        U32(x) => u64::from(x),
        U64(x) => x,
        I64(x) => x.max(0) as u64,
        F64(x) => x.max(0.0) as u64,
    }
}

/// `part` ns of `whole` ns in basis points, at most [`SHARE_SCALE`].
fn share(part: u64, whole: u64) -> u16 {
    if whole == 0 {
        return 0;
    }
    ((u128::from(part) * u128::from(SHARE_SCALE) / u128::from(whole)) as u64)
        .min(u64::from(SHARE_SCALE)) as u16
}

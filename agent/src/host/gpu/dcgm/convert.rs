//! [`DcgmConverter`]: the fields of a dcgm-exporter scrape as the agent's `gpu` / `nvlink` /
//! `xid` records (source DCGM), per physical GPU, in the units the NVML source writes.
//!
//! * A series names its GPU by its `pci_bus_id` label, else by its `UUID` (or `uuid`) label
//!   through the UUIDs the ranks' plugins recorded; a series of neither is counted as
//!   unmapped. MIG instance series (`GPU_I_ID`) are left out: ranks bind to physical GPUs.
//! * Counters (energy, PCIe replays, volatile ECC, NVLink error totals) become deltas
//!   ([`super::super::counter`]: first reading 0, a drop is a reset); DCGM's byte *rates*
//!   (`DCGM_FI_PROF_*_BYTES`) become bytes over the interval.
//! * The clock-event reasons (`DCGM_FI_DEV_CLOCKS_EVENT_REASONS`, or the older
//!   `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`) are NVML's bits; a reason active at the scrape counts
//!   for the whole interval. DCGM's violation counters are not read: their unit changed (µs,
//!   then ns) between DCGM versions, and nothing in the body says which.
//! * `DCGM_FI_DEV_XID_ERRORS` is the last XID's value: a change to a new non-zero value is an
//!   `xid` record; the first scrape only learns the value (an XID from before the agent has no
//!   time).
//! * NVLink values are the device's totals over all links: one `nvlink` record, link
//!   [`ALL_LINKS`].

use std::collections::BTreeMap;

use comminsight_wire::gpu::{
    gpu_source, gpu_valid, link_valid, pci, GpuLink, GpuSample, GpuXid, ALL_LINKS, SHARE_SCALE,
};

use super::super::counter::Counter;
use super::super::nvml::flag_of;
use super::super::GpuReadings;
use super::exposition::Series;

/// The fields read, by dcgm-exporter name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum F {
    SmClock,
    MemClock,
    Temp,
    Power,
    Energy,
    PcieReplay,
    GpuUtil,
    MemCopyUtil,
    FbUsed,
    PcieTx,
    PcieRx,
    SmActive,
    Reasons,
    EccSbe,
    EccDbe,
    RetiredSbe,
    RetiredDbe,
    RemapCor,
    RemapUnc,
    Xid,
    NvTx,
    NvRx,
    NvCrcFlit,
    NvCrcData,
    NvReplay,
    NvRecovery,
}

const N: usize = F::NvRecovery as usize + 1;

/// The distinct DCGM fields the agent reads (two names share the clock-event reasons).
pub const N_FIELDS: usize = N;

/// The DCGM fields the agent keeps, by dcgm-exporter name (docs/contracts.md "GPU records").
const TABLE: [(&str, F); N + 1] = [
    ("DCGM_FI_DEV_SM_CLOCK", F::SmClock),
    ("DCGM_FI_DEV_MEM_CLOCK", F::MemClock),
    ("DCGM_FI_DEV_GPU_TEMP", F::Temp),
    ("DCGM_FI_DEV_POWER_USAGE", F::Power),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", F::Energy),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", F::PcieReplay),
    ("DCGM_FI_DEV_GPU_UTIL", F::GpuUtil),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", F::MemCopyUtil),
    ("DCGM_FI_DEV_FB_USED", F::FbUsed),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", F::PcieTx),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", F::PcieRx),
    ("DCGM_FI_PROF_SM_ACTIVE", F::SmActive),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", F::Reasons),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", F::EccSbe),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", F::EccDbe),
    ("DCGM_FI_DEV_RETIRED_SBE", F::RetiredSbe),
    ("DCGM_FI_DEV_RETIRED_DBE", F::RetiredDbe),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", F::RemapCor),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", F::RemapUnc),
    ("DCGM_FI_DEV_XID_ERRORS", F::Xid),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", F::NvTx),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", F::NvRx),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        F::NvCrcFlit,
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        F::NvCrcData,
    ),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", F::NvReplay),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        F::NvRecovery,
    ),
    // The older name of the clock-event reasons.
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", F::Reasons),
];

/// The names of [`TABLE`]: the lines `exposition::parse` reads.
pub const FIELDS: [&str; N + 1] = {
    let mut out = [""; N + 1];
    let mut i = 0;
    while i < TABLE.len() {
        out[i] = TABLE[i].0;
        i += 1;
    }
    out
};

fn field(name: &str) -> Option<F> {
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// One GPU's previous readings.
#[derive(Debug, Default)]
struct Prev {
    last_ns: Option<u64>,
    energy: Counter,
    replays: Counter,
    ecc: [Counter; 2],
    link_errors: [Counter; 4],
    xid: Option<u64>,
}

/// What one scrape's series gave, beside the records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvertStats {
    /// GPUs with records.
    pub gpus: usize,
    /// Series whose GPU has neither a PCI address nor a known UUID.
    pub unmapped: u64,
}

/// See the module docs. GPUs kept at most: [`MAX_GPUS`].
#[derive(Debug, Default)]
pub struct DcgmConverter {
    prev: BTreeMap<u64, Prev>,
}

/// GPUs a converter follows.
pub const MAX_GPUS: usize = 256;

type Fields = [Option<f64>; N];

/// Whole units of `v` (negative and NaN: 0; saturating).
fn whole<T: TryFrom<u64> + Copy>(v: f64, max: T) -> T {
    T::try_from(v.max(0.0) as u64).unwrap_or(max)
}

impl DcgmConverter {
    /// The records of one scrape taken at monotonic `now_ns`, stamped `host_ns`; `uuids` maps
    /// the UUIDs the plugins recorded to PCI addresses.
    pub fn convert(
        &mut self,
        series: &[Series],
        uuids: &BTreeMap<String, u64>,
        now_ns: u64,
        host_ns: u64,
    ) -> (GpuReadings, ConvertStats) {
        let mut stats = ConvertStats::default();
        let mut devs: BTreeMap<u64, (u8, Fields)> = BTreeMap::new();
        for s in series {
            let Some(f) = field(&s.name) else { continue };
            if s.labels.contains_key("GPU_I_ID") {
                continue;
            }
            let by_uuid = || {
                let u = s.labels.get("UUID").or_else(|| s.labels.get("uuid"))?;
                uuids.get(u).copied()
            };
            let Some(p) = s
                .labels
                .get("pci_bus_id")
                .and_then(|b| pci::parse(b))
                .or_else(by_uuid)
            else {
                stats.unmapped += 1;
                continue;
            };
            if !devs.contains_key(&p) && devs.len() >= MAX_GPUS {
                continue;
            }
            let index = s
                .labels
                .get("gpu")
                .and_then(|g| g.parse::<u8>().ok())
                .unwrap_or(255);
            let e = devs.entry(p).or_insert((index, [None; N]));
            e.1[f as usize] = s.value;
        }
        let mut out = GpuReadings::default();
        for (p, (index, v)) in devs {
            if !self.prev.contains_key(&p) && self.prev.len() >= MAX_GPUS {
                continue;
            }
            let prev = self.prev.entry(p).or_default();
            let interval = prev.last_ns.map_or(0, |l| now_ns.saturating_sub(l));
            prev.last_ns = Some(now_ns);
            let at = |l: &mut GpuSample| {
                l.time_ns = host_ns;
                l.interval_ns = interval;
                l.pci = p;
                l.index = index;
                l.source = gpu_source::DCGM;
            };
            let mut g = GpuSample::default();
            at(&mut g);
            gauges(&v, &mut g);
            counters(&v, prev, &mut g);
            out.gpus.push(g);
            if let Some(l) = link(&v, prev, host_ns, interval) {
                out.links.push(GpuLink { pci: p, index, ..l });
            }
            if let Some(x) = v[F::Xid as usize].map(|x| whole(x, u64::MAX)) {
                let before = prev.xid.replace(x);
                if before.is_some_and(|b| b != x) && x != 0 {
                    out.xids.push(GpuXid {
                        time_ns: host_ns,
                        xid: x,
                        pci: p,
                        index,
                        source: gpu_source::DCGM,
                    });
                }
            }
        }
        stats.gpus = out.gpus.len();
        (out, stats)
    }
}

/// The gauges of one GPU.
fn gauges(v: &Fields, g: &mut GpuSample) {
    let get = |f: F| v[f as usize];
    if let Some(c) = get(F::SmClock) {
        g.sm_clock_mhz = whole(c, u16::MAX);
        g.memory_clock_mhz = get(F::MemClock).map_or(0, |m| whole(m, u16::MAX));
        g.valid |= gpu_valid::CLOCKS;
    }
    if let Some(t) = get(F::Temp) {
        g.temperature_c = whole(t, u8::MAX);
        g.valid |= gpu_valid::TEMPERATURE;
    }
    if let Some(w) = get(F::Power) {
        g.power_mw = whole(w * 1000.0, u32::MAX);
        g.valid |= gpu_valid::POWER;
    }
    if let Some(u) = get(F::GpuUtil) {
        g.sm_util = whole(u, u8::MAX).min(100);
        g.memory_util = get(F::MemCopyUtil).map_or(0, |m| whole(m, u8::MAX).min(100));
        g.valid |= gpu_valid::UTIL;
    }
    if let Some(mib) = get(F::FbUsed) {
        g.memory_used_bytes = whole(mib, u64::MAX).saturating_mul(1 << 20);
        g.valid |= gpu_valid::MEMORY;
    }
    if get(F::PcieTx).is_some() || get(F::PcieRx).is_some() {
        g.pcie_tx_kbps = get(F::PcieTx).map_or(0, |b| whole(b / 1000.0, u32::MAX));
        g.pcie_rx_kbps = get(F::PcieRx).map_or(0, |b| whole(b / 1000.0, u32::MAX));
        g.valid |= gpu_valid::PCIE_THROUGHPUT;
    }
    if let Some(a) = get(F::SmActive) {
        g.sm_active_share =
            whole(a.min(1.0) * f64::from(SHARE_SCALE), SHARE_SCALE).min(SHARE_SCALE);
        g.valid |= gpu_valid::SM_ACTIVE;
    }
    if let Some(r) = get(F::Reasons) {
        g.throttle_reasons = whole(r, u64::MAX);
        g.valid |= gpu_valid::THROTTLE_REASONS;
        super::super::bitmask_shares(g);
    }
    if get(F::RetiredSbe).is_some() || get(F::RetiredDbe).is_some() {
        let n = get(F::RetiredSbe).unwrap_or(0.0) + get(F::RetiredDbe).unwrap_or(0.0);
        g.retired_pages = whole(n, u16::MAX);
        g.valid |= gpu_valid::RETIRED_PAGES;
    }
    if get(F::RemapCor).is_some() || get(F::RemapUnc).is_some() {
        let n = get(F::RemapCor).unwrap_or(0.0) + get(F::RemapUnc).unwrap_or(0.0);
        g.remapped_rows = whole(n, u16::MAX);
        g.valid |= gpu_valid::REMAPPED_ROWS;
    }
}

/// The cumulative counters of one GPU, as deltas.
fn counters(v: &Fields, prev: &mut Prev, g: &mut GpuSample) {
    let get = |f: F| v[f as usize].map(|x| whole(x, u64::MAX));
    let mut flags = 0;
    if let Some(e) = get(F::Energy) {
        let d = prev.energy.delta(e);
        g.energy_mj = d.value;
        flags |= flag_of(d);
        g.valid |= gpu_valid::ENERGY;
    }
    if let Some(r) = get(F::PcieReplay) {
        let d = prev.replays.delta(r);
        g.pcie_replays = d.value.min(u64::from(u32::MAX)) as u32;
        flags |= flag_of(d);
        g.valid |= gpu_valid::PCIE_REPLAYS;
    }
    if let (Some(c), Some(u)) = (get(F::EccSbe), get(F::EccDbe)) {
        let (dc, du) = (prev.ecc[0].delta(c), prev.ecc[1].delta(u));
        g.ecc_corrected = dc.value.min(u64::from(u32::MAX)) as u32;
        g.ecc_uncorrected = du.value.min(u64::from(u32::MAX)) as u32;
        flags |= flag_of(dc) | flag_of(du);
        g.valid |= gpu_valid::ECC;
    }
    g.sample_flags = flags;
}

/// The GPU's NVLink totals over all links, if the scrape has any.
fn link(v: &Fields, prev: &mut Prev, host_ns: u64, interval: u64) -> Option<GpuLink> {
    let get = |f: F| v[f as usize];
    let mut l = GpuLink {
        time_ns: host_ns,
        interval_ns: interval,
        link: ALL_LINKS,
        up: 255,
        source: gpu_source::DCGM,
        ..GpuLink::default()
    };
    if get(F::NvTx).is_some() || get(F::NvRx).is_some() {
        let secs = interval as f64 / 1e9;
        l.tx_bytes = get(F::NvTx).map_or(0, |r| whole(r * secs, u64::MAX));
        l.rx_bytes = get(F::NvRx).map_or(0, |r| whole(r * secs, u64::MAX));
        l.valid |= link_valid::THROUGHPUT;
    }
    let errs = [F::NvCrcFlit, F::NvCrcData, F::NvReplay, F::NvRecovery];
    if errs.iter().any(|f| get(*f).is_some()) {
        let mut d = [0u32; 4];
        for (k, f) in errs.iter().enumerate() {
            if let Some(x) = get(*f) {
                let dl = prev.link_errors[k].delta(whole(x, u64::MAX));
                d[k] = dl.value.min(u64::from(u32::MAX)) as u32;
                l.sample_flags |= flag_of(dl);
            }
        }
        [l.crc_flit, l.crc_data, l.replay, l.recovery] = d;
        l.valid |= link_valid::ERRORS;
    }
    (l.valid != 0).then_some(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use comminsight_wire::gpu::{gpu_flags, throttle};

    fn s(name: &str, labels: &[(&str, &str)], value: Option<f64>) -> Series {
        Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    fn gpu0(name: &str, v: f64) -> Series {
        s(
            name,
            &[
                ("gpu", "0"),
                ("UUID", "GPU-a"),
                ("pci_bus_id", "00000000:1B:00.0"),
            ],
            Some(v),
        )
    }

    fn scrape(energy: f64, crc: f64, xid: f64) -> Vec<Series> {
        vec![
            gpu0("DCGM_FI_DEV_SM_CLOCK", 1100.0),
            gpu0("DCGM_FI_DEV_MEM_CLOCK", 2619.0),
            gpu0("DCGM_FI_DEV_GPU_TEMP", 87.0),
            gpu0("DCGM_FI_DEV_POWER_USAGE", 612.5),
            gpu0("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy),
            gpu0("DCGM_FI_DEV_GPU_UTIL", 97.0),
            gpu0("DCGM_FI_DEV_MEM_COPY_UTIL", 41.0),
            gpu0("DCGM_FI_DEV_FB_USED", 1024.0),
            gpu0("DCGM_FI_PROF_PCIE_TX_BYTES", 2.5e6),
            gpu0("DCGM_FI_PROF_SM_ACTIVE", 0.875),
            gpu0("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 72.0),
            gpu0("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", crc),
            gpu0("DCGM_FI_PROF_NVLINK_TX_BYTES", 4.0e9),
            gpu0("DCGM_FI_DEV_XID_ERRORS", xid),
            // A MIG instance of GPU 0, a GPU known by its UUID alone, one known by nothing.
            s(
                "DCGM_FI_DEV_SM_CLOCK",
                &[
                    ("gpu", "0"),
                    ("pci_bus_id", "00000000:1B:00.0"),
                    ("GPU_I_ID", "1"),
                ],
                Some(5.0),
            ),
            s(
                "DCGM_FI_DEV_GPU_TEMP",
                &[("gpu", "1"), ("UUID", "GPU-b")],
                Some(40.0),
            ),
            s(
                "DCGM_FI_DEV_GPU_TEMP",
                &[("gpu", "2"), ("UUID", "GPU-z")],
                Some(41.0),
            ),
            s("DCGM_FI_DEV_ENC_UTIL", &[("gpu", "0")], Some(3.0)),
        ]
    }

    #[test]
    fn a_scrape_becomes_nvml_shaped_records_with_deltas_and_xid_changes() {
        let uuids = BTreeMap::from([("GPU-b".to_string(), pci::pack(0, 0x43, 0, 0))]);
        let mut c = DcgmConverter::default();
        let (r, st) = c.convert(&scrape(1_000_000.0, 7.0, 0.0), &uuids, 1_000, 5_000);
        assert_eq!(
            st,
            ConvertStats {
                gpus: 2,
                unmapped: 1
            }
        );
        let g = &r.gpus[0];
        assert_eq!(g.pci, pci::pack(0, 0x1b, 0, 0));
        assert_eq!((g.index, g.source, g.interval_ns), (0, gpu_source::DCGM, 0));
        assert_eq!(g.sample_flags, gpu_flags::FIRST);
        assert_eq!(r.gpus[1].temperature_c, 40, "GPU-b found by its UUID");
        assert!(r.xids.is_empty(), "the first scrape learns the XID");
        let (r, _) = c.convert(
            &scrape(1_600_000.0, 19.0, 79.0),
            &uuids,
            2_000_001_000,
            6_000,
        );
        let g = &r.gpus[0];
        assert_eq!(g.interval_ns, 2_000_000_000);
        assert_eq!((g.sm_clock_mhz, g.memory_clock_mhz), (1100, 2619));
        assert_eq!((g.temperature_c, g.power_mw), (87, 612_500));
        assert_eq!((g.energy_mj, g.sample_flags), (600_000, 0));
        assert_eq!((g.sm_util, g.memory_util), (97, 41));
        assert_eq!(g.memory_used_bytes, 1 << 30);
        assert_eq!((g.pcie_tx_kbps, g.pcie_rx_kbps), (2500, 0));
        assert_eq!(g.sm_active_share, 8750);
        assert_eq!(
            g.throttle_reasons,
            throttle::HW_SLOWDOWN | throttle::HW_THERMAL_SLOWDOWN
        );
        assert_eq!(
            (g.hw_slowdown_share, g.hw_thermal_share),
            (SHARE_SCALE, SHARE_SCALE)
        );
        assert_eq!(g.sw_power_share, 0);
        let want = gpu_valid::CLOCKS
            | gpu_valid::TEMPERATURE
            | gpu_valid::POWER
            | gpu_valid::ENERGY
            | gpu_valid::UTIL
            | gpu_valid::MEMORY
            | gpu_valid::PCIE_THROUGHPUT
            | gpu_valid::SM_ACTIVE
            | gpu_valid::THROTTLE_REASONS;
        assert_eq!(g.valid, want);
        let l = &r.links[0];
        assert_eq!((l.link, l.up, l.crc_flit), (ALL_LINKS, 255, 12));
        assert_eq!(l.tx_bytes, 8_000_000_000, "4 GB/s over 2 s");
        assert_eq!(l.valid, link_valid::THROUGHPUT | link_valid::ERRORS);
        assert_eq!(r.xids.len(), 1);
        assert_eq!((r.xids[0].xid, r.xids[0].time_ns), (79, 6_000));
        // A counter that goes back (a GPU reset) is a reset, not a negative delta; the same
        // XID again is no new event.
        let (r, _) = c.convert(&scrape(10.0, 19.0, 79.0), &uuids, 3_000_001_000, 7_000);
        assert_eq!(r.gpus[0].energy_mj, 0);
        assert_eq!(r.gpus[0].sample_flags, gpu_flags::COUNTER_RESET);
        assert!(r.xids.is_empty());
    }

    #[test]
    fn blank_fields_are_absent_not_zero() {
        let mut c = DcgmConverter::default();
        let mut v = scrape(1.0, 1.0, 0.0);
        for x in v.iter_mut().filter(|x| x.name == "DCGM_FI_DEV_POWER_USAGE") {
            x.value = None;
        }
        let (r, _) = c.convert(&v, &BTreeMap::new(), 1, 1);
        assert_eq!(r.gpus[0].valid & gpu_valid::POWER, 0);
        assert_eq!(r.gpus[0].power_mw, 0);
    }
}

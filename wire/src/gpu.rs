//! GPU record bodies (issue 20). One from the plugin: `comm_device` (which GPU a communicator's
//! rank runs on, asked of the CUDA runtime / driver in the process). Three from the agent's GPU
//! sources (NVML, or a dcgm-exporter scrape), written into its host streams like the host-context
//! records (docs/contracts.md "GPU records"): `gpu` (one device over one sampling interval),
//! `nvlink` (one NVLink of a device over one interval) and `xid` (one XID event).
//!
//! Devices are named by their PCI address ([`pci`]), the key both CUDA and NVML give: the agent
//! binds a rank to a device's samples by it. Counters are deltas over the interval; a counter
//! that went backwards (a driver reset) is flagged ([`gpu_flags::COUNTER_RESET`]) and its delta
//! is 0, never negative.

/// PCI addresses packed into a `u64`: `domain << 32 | bus << 16 | device << 8 | function`;
/// 0 is unknown.
pub mod pci {
    /// Pack the four parts.
    pub fn pack(domain: u32, bus: u8, device: u8, function: u8) -> u64 {
        (u64::from(domain) << 32)
            | (u64::from(bus) << 16)
            | (u64::from(device) << 8)
            | u64::from(function)
    }

    /// `dddd:bb:dd.f` in lower-case hex (CUDA's form; NVML writes 8 domain digits, [`parse`]
    /// takes both); empty for 0.
    pub fn format(p: u64) -> String {
        if p == 0 {
            return String::new();
        }
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            p >> 32,
            (p >> 16) & 0xff,
            (p >> 8) & 0xff,
            p & 0xff
        )
    }

    /// Parse `[domain:]bus:device.function` (hex, any case, 4 or 8 domain digits, NUL or
    /// spaces after it ignored); `None` when it is not one.
    pub fn parse(s: &str) -> Option<u64> {
        let s = s.trim_end_matches(['\0', ' ', '\n']).trim();
        let (head, function) = s.rsplit_once('.')?;
        let mut parts: Vec<&str> = head.split(':').collect();
        if parts.len() == 2 {
            parts.insert(0, "0");
        }
        let [domain, bus, device] = parts[..] else {
            return None;
        };
        let hex = |t: &str, max: u64| {
            u64::from_str_radix(t, 16)
                .ok()
                .filter(|v| *v <= max && !t.is_empty())
        };
        Some(pack(
            hex(domain, u64::from(u32::MAX))? as u32,
            hex(bus, 0xff)? as u8,
            hex(device, 0x1f)? as u8,
            hex(function, 0x7)? as u8,
        ))
    }
}

/// Where a `comm_device` record's answer came from ([`CommDevice::source`]).
pub mod device_source {
    /// CUDA was not loaded in the process, or did not answer: `device` is -1.
    pub const NONE: u8 = 0;
    /// The runtime's `cudaGetDevice` (and `cudaDeviceGetPCIBusId`).
    pub const RUNTIME: u8 = 1;
    /// The driver's `cuCtxGetDevice` (no runtime symbol was found).
    pub const DRIVER: u8 = 2;
}

/// The GPU of one communicator's rank, written by the plugin right after `comm_init` (and in
/// each segment's preamble with it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommDevice {
    pub comm_hash: u64,
    pub time_ns: u64,
    /// [`pci`]; 0 unknown.
    pub pci: u64,
    pub rank: i32,
    /// The CUDA device ordinal (as the process sees it, after `CUDA_VISIBLE_DEVICES`); -1
    /// unknown.
    pub device: i32,
    /// [`device_source`].
    pub source: u8,
    /// The device UUID (`cuDeviceGetUuid`); all zero unknown.
    pub uuid: [u8; 16],
}

/// Where a `gpu`, `nvlink` or `xid` record came from.
pub mod gpu_source {
    pub const NVML: u8 = 1;
    /// A dcgm-exporter `/metrics` scrape.
    pub const DCGM: u8 = 2;
}

/// Bits of [`GpuSample::valid`]: which metrics the record carries (a metric whose NVML call is
/// missing or NOT_SUPPORTED on the device is absent, not 0).
pub mod gpu_valid {
    pub const UTIL: u32 = 1 << 0;
    pub const CLOCKS: u32 = 1 << 1;
    pub const THROTTLE_REASONS: u32 = 1 << 2;
    /// The throttle shares are measured (NVML's clock-event duration counters).
    pub const THROTTLE_TIMES: u32 = 1 << 3;
    pub const POWER: u32 = 1 << 4;
    pub const ENERGY: u32 = 1 << 5;
    pub const TEMPERATURE: u32 = 1 << 6;
    pub const MEMORY: u32 = 1 << 7;
    pub const PCIE_THROUGHPUT: u32 = 1 << 8;
    pub const PCIE_REPLAYS: u32 = 1 << 9;
    pub const ECC: u32 = 1 << 10;
    pub const RETIRED_PAGES: u32 = 1 << 11;
    pub const REMAPPED_ROWS: u32 = 1 << 12;
    /// SM activity (DCGM's profiling field).
    pub const SM_ACTIVE: u32 = 1 << 13;
}

/// Bits of [`GpuSample::sample_flags`] and [`GpuLink::sample_flags`].
pub mod gpu_flags {
    /// A counter went backwards (driver reset); its delta is 0.
    pub const COUNTER_RESET: u8 = 1 << 0;
    /// The first sample of the device: counters have no previous value, deltas are 0.
    pub const FIRST: u8 = 1 << 1;
}

/// NVML's clock-event (throttle) reason bits (`nvmlClocksEventReason*`).
pub mod throttle {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// Reasons that slow a busy GPU below the clocks it was asked for (not idle, not a
    /// setting).
    pub const SLOWDOWN: u64 = SW_POWER_CAP
        | HW_SLOWDOWN
        | SW_THERMAL_SLOWDOWN
        | HW_THERMAL_SLOWDOWN
        | HW_POWER_BRAKE_SLOWDOWN;

    /// The names of the bits set in `mask`, in bit order (`hw_slowdown`, ...).
    pub fn names(mask: u64) -> Vec<&'static str> {
        [
            (GPU_IDLE, "gpu_idle"),
            (APPLICATIONS_CLOCKS_SETTING, "applications_clocks"),
            (SW_POWER_CAP, "sw_power_cap"),
            (HW_SLOWDOWN, "hw_slowdown"),
            (SYNC_BOOST, "sync_boost"),
            (SW_THERMAL_SLOWDOWN, "sw_thermal"),
            (HW_THERMAL_SLOWDOWN, "hw_thermal"),
            (HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
            (DISPLAY_CLOCK_SETTING, "display_clock"),
        ]
        .into_iter()
        .filter(|(b, _)| mask & b != 0)
        .map(|(_, n)| n)
        .collect()
    }
}

/// Shares are in basis points of the interval (10000 = all of it).
pub const SHARE_SCALE: u16 = 10_000;

/// One GPU over one sampling interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// End of the interval (host time).
    pub time_ns: u64,
    pub interval_ns: u64,
    /// Energy used in the interval (mJ).
    pub energy_mj: u64,
    pub memory_used_bytes: u64,
    /// Clock-event reasons active at the sample ([`throttle`]).
    pub throttle_reasons: u64,
    /// [`pci`].
    pub pci: u64,
    /// ECC errors in the interval (volatile counters).
    pub ecc_corrected: u32,
    pub ecc_uncorrected: u32,
    /// PCIe throughput at the sample (KB/s, NVML's 20 ms window) or over the interval (DCGM).
    pub pcie_tx_kbps: u32,
    pub pcie_rx_kbps: u32,
    /// PCIe replays in the interval.
    pub pcie_replays: u32,
    pub power_mw: u32,
    /// [`gpu_valid`].
    pub valid: u32,
    pub sm_clock_mhz: u16,
    pub memory_clock_mhz: u16,
    /// Shares of the interval the clocks were held down for each reason ([`SHARE_SCALE`]):
    /// measured from NVML's duration counters when [`gpu_valid::THROTTLE_TIMES`], else the
    /// reasons active at the sample count for the whole interval.
    pub sw_power_share: u16,
    pub hw_slowdown_share: u16,
    pub hw_thermal_share: u16,
    pub hw_power_brake_share: u16,
    pub sw_thermal_share: u16,
    /// SM activity share (DCGM `DCGM_FI_PROF_SM_ACTIVE`).
    pub sm_active_share: u16,
    /// Retired pages (all causes) and remapped rows (correctable + uncorrectable), totals.
    pub retired_pages: u16,
    pub remapped_rows: u16,
    /// Utilisation at the sample (%).
    pub sm_util: u8,
    pub memory_util: u8,
    pub temperature_c: u8,
    /// The source's device index (NVML index, DCGM `gpu` label).
    pub index: u8,
    /// [`gpu_source`].
    pub source: u8,
    /// [`gpu_flags`] (not `flags`: that is the record header's).
    pub sample_flags: u8,
}

/// Bits of [`GpuLink::valid`].
pub mod link_valid {
    pub const STATE: u8 = 1 << 0;
    pub const THROUGHPUT: u8 = 1 << 1;
    pub const ERRORS: u8 = 1 << 2;
}

/// The link index of a [`GpuLink`] that stands for all links of the device (DCGM totals).
pub const ALL_LINKS: u8 = 255;

/// One NVLink of a GPU over one interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuLink {
    pub time_ns: u64,
    pub interval_ns: u64,
    /// Data bytes in the interval.
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub pci: u64,
    /// Error counter deltas in the interval (DL CRC flit / data, replay, recovery).
    pub crc_flit: u32,
    pub crc_data: u32,
    pub replay: u32,
    pub recovery: u32,
    pub index: u8,
    /// Link number, or [`ALL_LINKS`].
    pub link: u8,
    /// 1 active, 0 inactive, 255 unknown.
    pub up: u8,
    /// [`link_valid`].
    pub valid: u8,
    /// [`gpu_flags`] (not `flags`: that is the record header's).
    pub sample_flags: u8,
    pub source: u8,
}

impl GpuLink {
    /// All error increments of the interval.
    pub fn errors(&self) -> u64 {
        u64::from(self.crc_flit)
            + u64::from(self.crc_data)
            + u64::from(self.replay)
            + u64::from(self.recovery)
    }
}

/// One XID event of a GPU (NVML `nvmlEventTypeXidCriticalError`, or a change of DCGM's
/// last-XID gauge).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuXid {
    pub time_ns: u64,
    /// The XID (NVML's event data).
    pub xid: u64,
    pub pci: u64,
    pub index: u8,
    pub source: u8,
}

#[cfg(test)]
mod tests {
    use super::pci;

    #[test]
    fn pci_addresses_of_cuda_and_nvml_parse_to_one_key() {
        let cuda = pci::parse("0000:3B:00.0").unwrap();
        let nvml = pci::parse("00000000:3b:00.0\0\0").unwrap();
        assert_eq!(cuda, nvml);
        assert_eq!(cuda, pci::pack(0, 0x3b, 0, 0));
        assert_eq!(pci::format(cuda), "0000:3b:00.0");
        assert_eq!(pci::parse("3b:1f.7"), Some(pci::pack(0, 0x3b, 0x1f, 7)));
        for bad in [
            "",
            "3b:00",
            "zz:00.0",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "1:2:3:4.0",
            ":00.0",
        ] {
            assert_eq!(pci::parse(bad), None, "{bad:?}");
        }
    }
}

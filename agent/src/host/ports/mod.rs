//! NIC / RDMA port counters sampled from sysfs.
//!
//! [`PortSampler`] lists `<root>/class/infiniband/<dev>/ports/<n>/` (metadata, `counters/*`,
//! `hw_counters/*`) and `<root>/class/net/<if>/statistics/*` on every [`PortSampler::sample`],
//! and turns each counter into a value, a delta and a rate per second against the previous sample.
//!
//! Semantics (see the kernel's Documentation/ABI/stable/sysfs-class-infiniband):
//! * `port_xmit_data` / `port_rcv_data` count units of 4 octets; they are reported in bytes (x4).
//! * IB `counters/` saturate rather than wrap: error counters at their IBA width (8, 16 or 4 bits),
//!   legacy 32-bit data/packet counters at 4294967295. A saturated reading has no delta and sets
//!   [`CounterReading::saturated`].
//! * Any counter that goes backwards (driver reset, or a 64-bit Ethernet counter cleared) gives a
//!   [`PortEvent::CounterReset`] and becomes the new baseline, with no delta for that interval.
//! * An IB port leaving ACTIVE, or its `link_downed` increasing, gives [`PortEvent::LinkDown`];
//!   returning to ACTIVE gives [`PortEvent::LinkUp`].
//! * Unreadable or non-numeric files land in [`PortSample::read_errors`]; nothing panics.

mod read;
mod track;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod veth_test;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use read::{list_dir, read_text, read_u64};
use track::{ib_saturation_max, is_ib_data, Tracker};

/// The `[ports]` configuration: where sysfs lives and how often to sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortsConfig {
    /// Sample the ports at all.
    pub enabled: bool,
    /// Root of the sysfs tree to read (`<root>/class/infiniband`, `<root>/class/net`); "/sys" by
    /// default, a fixture directory in tests.
    pub sysfs_root: PathBuf,
    /// Sampling interval in milliseconds; 1000 by default.
    pub interval_ms: u64,
    /// The devices (`mlx5_0`, `eth0`) the jobs' traffic uses; empty (the default) = every
    /// device. Only these are sampled, and where no queue pair names a rank's port, their
    /// errors count for every rank process of the host (the port -> rank fallback).
    pub devices: Vec<String>,
}

impl Default for PortsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sysfs_root: PathBuf::from("/sys"),
            interval_ms: 1000,
            devices: Vec::new(),
        }
    }
}

/// Which sysfs class a port comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortKind {
    /// An RDMA port under `class/infiniband` (InfiniBand or RoCE).
    Ib,
    /// A network interface under `class/net`.
    Net,
}

/// Which directory a counter was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterGroup {
    /// IB `ports/<n>/counters/` (IBA PortCounters / PortCountersExtended).
    Counters,
    /// IB `ports/<n>/hw_counters/` (driver-specific, 64-bit).
    HwCounters,
    /// Net `statistics/` (64-bit wrapping).
    Statistics,
}

impl CounterGroup {
    fn dir(self) -> &'static str {
        match self {
            Self::Counters => "counters",
            Self::HwCounters => "hw_counters",
            Self::Statistics => "statistics",
        }
    }
}

/// One counter of one port in one sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CounterReading {
    /// The sysfs file name, e.g. `port_xmit_data` or `tx_bytes`.
    pub name: String,
    /// The directory the file is in.
    pub group: CounterGroup,
    /// The current value; in bytes for `port_xmit_data` / `port_rcv_data` (raw x4).
    pub value: u64,
    /// Increase since the previous sample, same unit as `value`; `None` on the first sample, at
    /// saturation and after a reset.
    pub delta: Option<u64>,
    /// `delta` per second over the interval since the previous sample.
    pub rate_per_s: Option<f64>,
    /// The counter sits at its saturation maximum and no longer counts.
    pub saturated: bool,
}

/// One port (IB) or interface (net) in one sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortReading {
    /// Where the port was found.
    pub kind: PortKind,
    /// RDMA device (`mlx5_0`) or interface name (`eth0`).
    pub device: String,
    /// IB port number; `None` for interfaces.
    pub port: Option<u32>,
    /// IB `state` ("4: ACTIVE") or net `operstate` ("up").
    pub state: Option<String>,
    /// IB `phys_state` ("5: LinkUp").
    pub phys_state: Option<String>,
    /// IB `link_layer` ("InfiniBand" or "Ethernet").
    pub link_layer: Option<String>,
    /// IB `rate` ("200 Gb/sec (4X HDR)").
    pub rate: Option<String>,
    /// Counters sorted by group, then name.
    pub counters: Vec<CounterReading>,
}

/// Something that happened between two samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PortEvent {
    /// An IB port left ACTIVE and/or its `link_downed` counter increased.
    LinkDown {
        /// RDMA device.
        device: String,
        /// Port number.
        port: Option<u32>,
        /// The state in the previous sample, when it was read.
        previous_state: Option<String>,
        /// The state now, when read.
        state: Option<String>,
        /// Increase of `link_downed`, when it increased.
        link_downed_increase: Option<u64>,
    },
    /// An IB port came back to ACTIVE.
    LinkUp {
        /// RDMA device.
        device: String,
        /// Port number.
        port: Option<u32>,
        /// The state in the previous sample.
        previous_state: Option<String>,
        /// The state now.
        state: Option<String>,
    },
    /// A counter went backwards (driver reset); its new value is the baseline.
    CounterReset {
        /// Where the port was found.
        kind: PortKind,
        /// Device or interface.
        device: String,
        /// IB port number; `None` for interfaces.
        port: Option<u32>,
        /// Counter file name.
        counter: String,
        /// Previous value (same unit as [`CounterReading::value`]).
        previous: u64,
        /// New value.
        value: u64,
    },
}

/// A file or directory that could not be read or parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadError {
    /// The path, lossily as text.
    pub path: String,
    /// What went wrong.
    pub error: String,
}

/// All ports at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortSample {
    /// The caller's timestamp of this sample, nanoseconds.
    pub ts_ns: u64,
    /// Ports sorted by kind, device, port.
    pub ports: Vec<PortReading>,
    /// Link changes and counter resets since the previous sample.
    pub events: Vec<PortEvent>,
    /// Files that failed; the other counters are unaffected.
    pub read_errors: Vec<ReadError>,
}

/// What is remembered of an IB port between samples.
#[derive(Debug, Clone, Default)]
struct PortMemory {
    state: Option<String>,
    link_downed: Option<u64>,
}

/// Samples port counters under one sysfs root, remembering the previous values.
#[derive(Debug)]
pub struct PortSampler {
    root: PathBuf,
    counters: Tracker,
    ports: HashMap<(String, u32), PortMemory>,
    /// `[ports] devices` (empty: all).
    devices: Vec<String>,
}

/// Whether an IB `state` text ("4: ACTIVE") means ACTIVE.
fn is_active(state: &str) -> bool {
    let (code, name) = state.split_once(':').unwrap_or(("", state));
    code.trim() == "4" || name.trim().eq_ignore_ascii_case("ACTIVE")
}

/// The sample being built.
struct Builder {
    now_ns: u64,
    events: Vec<PortEvent>,
    errors: Vec<ReadError>,
}

impl PortSampler {
    /// A sampler reading `<root>/class/...`; the first sample has no deltas.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            counters: Tracker::default(),
            ports: HashMap::new(),
            devices: Vec::new(),
        }
    }

    /// A sampler for `config.sysfs_root`, of `config.devices` only when it names some.
    pub fn from_config(config: &PortsConfig) -> Self {
        let mut s = Self::new(config.sysfs_root.clone());
        s.devices.clone_from(&config.devices);
        s
    }

    /// Whether `device` is sampled.
    fn wanted(&self, device: &str) -> bool {
        self.devices.is_empty() || self.devices.iter().any(|d| d == device)
    }

    /// The sysfs root this sampler reads.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads every port now; `now_ns` is the caller's clock (monotonic) for rates.
    pub fn sample(&mut self, now_ns: u64) -> PortSample {
        let mut b = Builder {
            now_ns,
            events: Vec::new(),
            errors: Vec::new(),
        };
        self.counters.begin();
        let mut ports = self.sample_ib(&mut b);
        ports.extend(self.sample_net(&mut b));
        self.counters.end();
        PortSample {
            ts_ns: now_ns,
            ports,
            events: b.events,
            read_errors: b.errors,
        }
    }

    fn sample_ib(&mut self, b: &mut Builder) -> Vec<PortReading> {
        let class = self.root.join("class/infiniband");
        let mut readings = Vec::new();
        let mut seen = Vec::new();
        for device in list_dir(&class, &mut b.errors) {
            if !self.wanted(&device) {
                continue;
            }
            let ports_dir = class.join(&device).join("ports");
            let mut numbers: Vec<u32> = list_dir(&ports_dir, &mut b.errors)
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect();
            numbers.sort_unstable();
            for port in numbers {
                let dir = ports_dir.join(port.to_string());
                readings.push(self.read_ib_port(b, &device, port, &dir));
                seen.push((device.clone(), port));
            }
        }
        self.ports.retain(|key, _| seen.contains(key));
        readings
    }

    fn read_ib_port(
        &mut self,
        b: &mut Builder,
        device: &str,
        port: u32,
        dir: &Path,
    ) -> PortReading {
        let meta =
            |name: &str, errors: &mut Vec<ReadError>| read_text(&dir.join(name), true, errors);
        let mut reading = PortReading {
            kind: PortKind::Ib,
            device: device.to_owned(),
            port: Some(port),
            state: meta("state", &mut b.errors),
            phys_state: meta("phys_state", &mut b.errors),
            link_layer: meta("link_layer", &mut b.errors),
            rate: meta("rate", &mut b.errors),
            counters: Vec::new(),
        };
        let mut link_downed = None;
        for group in [CounterGroup::Counters, CounterGroup::HwCounters] {
            let gdir = dir.join(group.dir());
            for name in list_dir(&gdir, &mut b.errors) {
                if group == CounterGroup::HwCounters && name == "lifespan" {
                    continue; // the refresh period in ms, not a counter
                }
                let path = gdir.join(&name);
                let Some(raw) = read_u64(&path, &mut b.errors) else {
                    continue;
                };
                if group == CounterGroup::Counters && name == "link_downed" {
                    link_downed = Some(raw);
                }
                let (sat, scale) = match group {
                    CounterGroup::Counters => (
                        Some(ib_saturation_max(&name)),
                        if is_ib_data(&name) { 4 } else { 1 },
                    ),
                    _ => (None, 1),
                };
                let c = self.counter(b, &reading, &path, name, group, raw, sat, scale);
                reading.counters.push(c);
            }
        }
        self.link_events(b, &reading, link_downed);
        reading
    }

    /// Compares the port with the previous sample and emits LinkDown / LinkUp.
    fn link_events(&mut self, b: &mut Builder, reading: &PortReading, link_downed: Option<u64>) {
        let port = reading.port.unwrap_or_default();
        let key = (reading.device.clone(), port);
        let now = PortMemory {
            state: reading.state.clone(),
            link_downed,
        };
        let Some(prev) = self.ports.insert(key, now) else {
            return;
        };
        let was_active = prev.state.as_deref().map(is_active);
        let is_now_active = reading.state.as_deref().map(is_active);
        let increase = match (prev.link_downed, link_downed) {
            (Some(p), Some(n)) if n > p => Some(n - p),
            _ => None,
        };
        if (was_active == Some(true) && is_now_active == Some(false)) || increase.is_some() {
            b.events.push(PortEvent::LinkDown {
                device: reading.device.clone(),
                port: reading.port,
                previous_state: prev.state,
                state: reading.state.clone(),
                link_downed_increase: increase,
            });
        } else if was_active == Some(false) && is_now_active == Some(true) {
            b.events.push(PortEvent::LinkUp {
                device: reading.device.clone(),
                port: reading.port,
                previous_state: prev.state,
                state: reading.state.clone(),
            });
        }
    }

    fn sample_net(&mut self, b: &mut Builder) -> Vec<PortReading> {
        let class = self.root.join("class/net");
        let mut readings = Vec::new();
        for device in list_dir(&class, &mut b.errors) {
            let dir = class.join(&device);
            if !self.wanted(&device) || !dir.is_dir() {
                continue; // e.g. bonding_masters
            }
            let stats = dir.join(CounterGroup::Statistics.dir());
            if !stats.is_dir() {
                continue;
            }
            let mut reading = PortReading {
                kind: PortKind::Net,
                device: device.clone(),
                port: None,
                state: read_text(&dir.join("operstate"), true, &mut b.errors),
                phys_state: None,
                link_layer: None,
                rate: None,
                counters: Vec::new(),
            };
            for name in list_dir(&stats, &mut b.errors) {
                let path = stats.join(&name);
                let Some(raw) = read_u64(&path, &mut b.errors) else {
                    continue;
                };
                let group = CounterGroup::Statistics;
                let c = self.counter(b, &reading, &path, name, group, raw, None, 1);
                reading.counters.push(c);
            }
            readings.push(reading);
        }
        readings
    }

    /// Turns one raw value into a reading, emitting a reset event when it went backwards.
    #[expect(
        clippy::too_many_arguments,
        reason = "one private call shape for both kinds"
    )]
    fn counter(
        &mut self,
        b: &mut Builder,
        port: &PortReading,
        path: &Path,
        name: String,
        group: CounterGroup,
        raw: u64,
        sat_max: Option<u64>,
        scale: u64,
    ) -> CounterReading {
        let obs = self
            .counters
            .observe(&path.to_string_lossy(), raw, sat_max, b.now_ns);
        let value = raw.saturating_mul(scale);
        if let Some(previous) = obs.reset_from {
            b.events.push(PortEvent::CounterReset {
                kind: port.kind,
                device: port.device.clone(),
                port: port.port,
                counter: name.clone(),
                previous: previous.saturating_mul(scale),
                value,
            });
        }
        let delta = obs.delta.map(|d| d.saturating_mul(scale));
        let rate_per_s = match (delta, obs.elapsed_ns) {
            (Some(d), Some(ns)) => Some(d as f64 * 1e9 / ns as f64),
            _ => None,
        };
        CounterReading {
            name,
            group,
            value,
            delta,
            rate_per_s,
            saturated: obs.saturated,
        }
    }
}

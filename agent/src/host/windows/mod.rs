//! [`HostWindows`]: one rank process' main-thread intervals and TCP retransmits as they came,
//! bounded, and their sums over a window of time — what the straggler classes read over a
//! rank's analysed steps. The same type holds them in the engine's [`super::context`] (offline,
//! and the daemon's own straggler index) and on the job master, fed by the [`HostSample`]s the
//! agents push beside their step lines, so a rank gets the same shares live and offline.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use comminsight_wire::record::HostThread;

mod gpu;

pub use gpu::{pci_name, GpuPeriod, GpuWindow, GpuWindows};

/// Time in each scheduler state (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuTimes {
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub blocked_io_ns: u64,
}

impl CpuTimes {
    pub(crate) fn add(&mut self, o: &CpuTimes) {
        self.on_cpu_ns = self.on_cpu_ns.saturating_add(o.on_cpu_ns);
        self.runnable_ns = self.runnable_ns.saturating_add(o.runnable_ns);
        self.blocked_ns = self.blocked_ns.saturating_add(o.blocked_ns);
        self.blocked_io_ns = self.blocked_io_ns.saturating_add(o.blocked_io_ns);
    }

    pub(crate) fn of(t: &HostThread) -> CpuTimes {
        CpuTimes {
            on_cpu_ns: t.on_cpu_ns,
            runnable_ns: t.runnable_ns,
            blocked_ns: t.blocked_ns,
            blocked_io_ns: t.blocked_io_ns,
        }
    }

    /// Shares of the total, in percent (on-CPU, runnable, blocked), rounded to 0.1.
    pub fn shares(&self) -> Shares {
        let total = self.on_cpu_ns + self.runnable_ns + self.blocked_ns;
        let pct = |v: u64| {
            if total == 0 {
                0.0
            } else {
                (v as f64 * 1000.0 / total as f64).round() / 10.0
            }
        };
        Shares {
            on_cpu_pct: pct(self.on_cpu_ns),
            runnable_pct: pct(self.runnable_ns),
            blocked_pct: pct(self.blocked_ns),
            blocked_io_pct: pct(self.blocked_io_ns),
        }
    }
}

/// [`CpuTimes`] as percentages of their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Shares {
    pub on_cpu_pct: f64,
    pub runnable_pct: f64,
    pub blocked_pct: f64,
    /// The part of `blocked_pct` spent uninterruptible (I/O).
    pub blocked_io_pct: f64,
}

/// One sample of a rank process' host context, as the engine emits it
/// ([`crate::engine::Output::HostSample`]) and the agents push it to the master.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSample {
    /// End of the interval, or when the retransmits were counted (µs; the process clock in
    /// the engine, the job timeline once pushed).
    pub at_us: u64,
    #[serde(flatten)]
    pub what: SampleKind,
}

/// What a [`HostSample`] holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleKind {
    /// The main thread's times over one sampling interval.
    Main { len_ns: u64, times: CpuTimes },
    /// One connection's retransmits since its previous record (`ip:port` each end).
    Retransmits {
        local: String,
        remote: String,
        count: u32,
    },
    /// Errors and link-downs a port under the process' traffic added since its previous
    /// record (only records with some).
    PortErrors {
        device: String,
        port: u8,
        errors: u64,
        link_downed: u32,
    },
    /// One period of a GPU the process runs on (issue 20).
    Gpu { period: GpuPeriod },
    /// Errors an NVLink of its GPU added in a period (only records with some).
    NvlinkErrors { pci: u64, link: u8, errors: u32 },
    /// An XID its GPU raised.
    Xid { pci: u64, xid: u64 },
}

/// A port's errors over a window ([`HostWindows::port_errors_window`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortErrors {
    pub device: String,
    /// IB port number (Ethernet: 0).
    pub port: u8,
    pub errors: u64,
    pub link_downed: u64,
}

/// See the module docs. Serialized as three fields (`main`, `tcp_retransmits`,
/// `port_errors`), part of the engine's checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostWindows {
    /// The main thread's intervals: `(end µs, length ns, times)`, oldest first.
    #[serde(default)]
    main: VecDeque<(u64, u64, CpuTimes)>,
    /// Retransmits as they came: `(µs, local, remote, count)`, oldest first, only records
    /// with some.
    #[serde(default)]
    tcp_retransmits: VecDeque<(u64, String, String, u32)>,
    /// Port errors as they came: `(µs, device, port, errors, link_downed)`, oldest first.
    #[serde(default)]
    port_errors: VecDeque<(u64, String, u8, u64, u32)>,
    /// The process' GPUs (`gpu` in the checkpoint).
    #[serde(default, skip_serializing_if = "GpuWindows::is_empty")]
    gpu: GpuWindows,
}

impl HostWindows {
    /// Keep `s`, dropping the oldest of its kind beyond `cap`.
    pub fn push(&mut self, s: &HostSample, cap: usize) {
        match &s.what {
            SampleKind::Main { len_ns, times } => {
                while self.main.len() >= cap.max(1) {
                    self.main.pop_front();
                }
                self.main.push_back((s.at_us, *len_ns, *times));
            }
            SampleKind::Retransmits {
                local,
                remote,
                count,
            } => {
                while self.tcp_retransmits.len() >= cap.max(1) {
                    self.tcp_retransmits.pop_front();
                }
                self.tcp_retransmits
                    .push_back((s.at_us, local.clone(), remote.clone(), *count));
            }
            SampleKind::PortErrors {
                device,
                port,
                errors,
                link_downed,
            } => {
                while self.port_errors.len() >= cap.max(1) {
                    self.port_errors.pop_front();
                }
                self.port_errors
                    .push_back((s.at_us, device.clone(), *port, *errors, *link_downed));
            }
            SampleKind::Gpu { period } => self.gpu.push_period(s.at_us, *period, cap),
            SampleKind::NvlinkErrors { pci, link, errors } => self
                .gpu
                .push_link_errors(s.at_us, *pci, *link, *errors, cap),
            SampleKind::Xid { pci, xid } => self.gpu.push_xid(s.at_us, *pci, *xid, cap),
        }
    }

    /// The process' GPUs over `[from_us, to_us]` (see [`GpuWindows::window`]).
    pub fn gpu_window(&self, from_us: u64, to_us: u64) -> Option<GpuWindow> {
        self.gpu.window(from_us, to_us)
    }

    /// Forget what came before `us`.
    pub fn forget_before(&mut self, us: u64) {
        while self.main.front().is_some_and(|m| m.0 < us) {
            self.main.pop_front();
        }
        while self.tcp_retransmits.front().is_some_and(|t| t.0 < us) {
            self.tcp_retransmits.pop_front();
        }
        while self.port_errors.front().is_some_and(|t| t.0 < us) {
            self.port_errors.pop_front();
        }
        self.gpu.forget_before(us);
    }

    /// The main thread's times over the intervals ending in `[from_us, to_us]`, and the time
    /// they cover (ns); `None` when there is none.
    pub fn main_window(&self, from_us: u64, to_us: u64) -> Option<(CpuTimes, u64)> {
        let mut sum = CpuTimes::default();
        let mut covered = 0u64;
        for (end, len, t) in &self.main {
            if (from_us..=to_us).contains(end) {
                sum.add(t);
                covered += len;
            }
        }
        (covered > 0).then_some((sum, covered))
    }

    /// The retransmits counted in `[from_us, to_us]` per connection `(local, remote, count)`,
    /// most first.
    pub fn retransmits_window(&self, from_us: u64, to_us: u64) -> Vec<(String, String, u64)> {
        let mut per: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for (at, local, remote, n) in &self.tcp_retransmits {
            if (from_us..=to_us).contains(at) {
                *per.entry((local, remote)).or_default() += u64::from(*n);
            }
        }
        let mut v: Vec<(String, String, u64)> = per
            .into_iter()
            .map(|((l, r), n)| (l.to_string(), r.to_string(), n))
            .collect();
        v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
        v
    }

    /// The errors and link-downs of the process' ports counted in `[from_us, to_us]`, per
    /// port, link-downs then errors most first.
    pub fn port_errors_window(&self, from_us: u64, to_us: u64) -> Vec<PortErrors> {
        let mut per: BTreeMap<(&str, u8), (u64, u64)> = BTreeMap::new();
        for (at, device, port, errors, downs) in &self.port_errors {
            if (from_us..=to_us).contains(at) {
                let e = per.entry((device, *port)).or_default();
                e.0 = e.0.saturating_add(*errors);
                e.1 += u64::from(*downs);
            }
        }
        let mut v: Vec<PortErrors> = per
            .into_iter()
            .map(|((device, port), (errors, link_downed))| PortErrors {
                device: device.to_string(),
                port,
                errors,
                link_downed,
            })
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse((p.link_downed, p.errors)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn main(at_us: u64, on: u64, runnable: u64) -> HostSample {
        HostSample {
            at_us,
            what: SampleKind::Main {
                len_ns: (on + runnable) * 1000,
                times: CpuTimes {
                    on_cpu_ns: on * 1000,
                    runnable_ns: runnable * 1000,
                    ..CpuTimes::default()
                },
            },
        }
    }

    fn rtx(at_us: u64, remote: &str, count: u32) -> HostSample {
        HostSample {
            at_us,
            what: SampleKind::Retransmits {
                local: "10.0.0.1:1".into(),
                remote: remote.into(),
                count,
            },
        }
    }

    #[test]
    fn windows_sum_what_ends_inside_and_stay_bounded() {
        let mut w = HostWindows::default();
        for i in 1..=5 {
            w.push(&main(i * 100, 60, 40), 4);
        }
        // The first interval fell off the bound of 4.
        let (t, covered) = w.main_window(0, 1000).unwrap();
        assert_eq!(covered, 4 * 100_000);
        assert_eq!(t.shares().runnable_pct, 40.0);
        let (_, one) = w.main_window(250, 349).unwrap();
        assert_eq!(one, 100_000);
        assert_eq!(w.main_window(501, 900), None);
        w.push(&rtx(10, "b:2", 3), 8);
        w.push(&rtx(20, "c:3", 5), 8);
        w.push(&rtx(30, "b:2", 4), 8);
        assert_eq!(
            w.retransmits_window(0, 30),
            vec![
                ("10.0.0.1:1".into(), "b:2".into(), 7),
                ("10.0.0.1:1".into(), "c:3".into(), 5)
            ]
        );
        w.forget_before(25);
        assert_eq!(w.retransmits_window(0, 30).len(), 1);
        assert_eq!(w.main_window(0, 1000).unwrap().1, 4 * 100_000);
    }

    #[test]
    fn port_errors_sum_per_port_link_downs_first() {
        let mut w = HostWindows::default();
        let err = |at_us, device: &str, errors, link_downed| HostSample {
            at_us,
            what: SampleKind::PortErrors {
                device: device.into(),
                port: 1,
                errors,
                link_downed,
            },
        };
        w.push(&err(10, "mlx5_0", 30, 0), 8);
        w.push(&err(20, "mlx5_1", 2, 1), 8);
        w.push(&err(30, "mlx5_0", 12, 0), 8);
        w.push(&err(90, "mlx5_0", 1000, 0), 8);
        let v = w.port_errors_window(0, 50);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].device.as_str(), v[0].link_downed, v[0].errors),
            ("mlx5_1", 1, 2)
        );
        assert_eq!((v[1].device.as_str(), v[1].errors), ("mlx5_0", 42));
        w.forget_before(25);
        assert_eq!(w.port_errors_window(0, 100)[0].errors, 1012);
        let json = serde_json::to_value(err(5, "eth0", 3, 0)).unwrap();
        assert_eq!(json["port_errors"]["device"], "eth0");
    }

    #[test]
    fn a_sample_round_trips_as_one_flat_json_object() {
        let s = main(7, 1, 2);
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["at_us"], 7);
        assert_eq!(j["main"]["len_ns"], 3000);
        assert_eq!(serde_json::from_value::<HostSample>(j).unwrap(), s);
        let r = rtx(9, "x:1", 2);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["retransmits"]["count"], 2);
        assert_eq!(serde_json::from_value::<HostSample>(j).unwrap(), r);
    }
}

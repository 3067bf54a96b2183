//! [`GpuWindows`]: one GPU's periods (clocks, utilisation, how long slowdown reasons held its
//! clocks down), its NVLinks' error increments and its XIDs as they came, bounded, and their
//! sums over a window of time ([`GpuWindow`]) — what the straggler classes and the hang
//! evidence read over a rank's analysed steps. The engine's `GpuContext` (`crate::host::gpu::context`) keeps
//! one per device (offline and the daemon); a rank's [`super::HostWindows`] on the job master holds
//! the same, fed by the samples the agents push, so a rank reads the same live
//! and offline.

use std::collections::{BTreeMap, VecDeque};

use comminsight_wire::gpu::{gpu_valid, pci, throttle, GpuLink, GpuSample, GpuXid, SHARE_SCALE};
use serde::{Deserialize, Serialize};

/// One period of a GPU, as the straggler windows keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPeriod {
    pub pci: u64,
    pub len_ns: u64,
    /// The largest share of the period one slowdown reason held the clocks down
    /// (basis points: [`SHARE_SCALE`]).
    pub slowdown_share: u16,
    /// The slowdown reasons active at the sample, or measured in the period
    /// (`comminsight_wire::gpu::throttle` bits).
    pub reasons: u64,
    pub sm_clock_mhz: u16,
    pub sm_util: u8,
}

impl GpuPeriod {
    /// The period of sample `g` (`None` for a first sample: no length; and for a sample with
    /// neither clocks nor clock-event reasons, such as DCGM's SM activity beside NVML's).
    pub fn of(g: &GpuSample) -> Option<GpuPeriod> {
        let timed = gpu_valid::CLOCKS | gpu_valid::THROTTLE_REASONS | gpu_valid::THROTTLE_TIMES;
        if g.interval_ns == 0 || g.valid & timed == 0 {
            return None;
        }
        let shares = [
            (g.sw_power_share, throttle::SW_POWER_CAP),
            (g.hw_slowdown_share, throttle::HW_SLOWDOWN),
            (g.hw_thermal_share, throttle::HW_THERMAL_SLOWDOWN),
            (g.hw_power_brake_share, throttle::HW_POWER_BRAKE_SLOWDOWN),
            (g.sw_thermal_share, throttle::SW_THERMAL_SLOWDOWN),
        ];
        let measured = shares
            .iter()
            .filter(|(s, _)| *s > 0)
            .fold(0, |m, (_, b)| m | b);
        Some(GpuPeriod {
            pci: g.pci,
            len_ns: g.interval_ns,
            slowdown_share: shares.iter().map(|(s, _)| *s).max().unwrap_or(0),
            reasons: (g.throttle_reasons & throttle::SLOWDOWN) | measured,
            sm_clock_mhz: g.sm_clock_mhz,
            sm_util: g.sm_util,
        })
    }
}

/// A GPU's sums over a window ([`GpuWindows::window`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuWindow {
    /// Time the periods in the window cover (ns), and how much of it the clocks were held down.
    pub covered_ns: u64,
    pub slowdown_ns: u64,
    /// Slowdown reasons seen in the window.
    pub reasons: u64,
    /// Lowest SM clock sampled in the window (MHz; 0: none).
    pub min_sm_clock_mhz: u16,
    /// NVLink error increments per `(pci, link)`, most first.
    pub nvlink: Vec<(u64, u8, u64)>,
    /// XIDs raised in the window: `(µs, pci, xid)`.
    pub xids: Vec<(u64, u64, u64)>,
}

impl GpuWindow {
    /// NVLink errors over all links.
    pub fn nvlink_errors(&self) -> u64 {
        self.nvlink.iter().map(|l| l.2).fold(0, u64::saturating_add)
    }

    /// Merge `o` (another device of the same rank).
    pub fn merge(&mut self, o: GpuWindow) {
        self.covered_ns = self.covered_ns.max(o.covered_ns);
        self.slowdown_ns = self.slowdown_ns.max(o.slowdown_ns);
        self.reasons |= o.reasons;
        if o.min_sm_clock_mhz > 0
            && (self.min_sm_clock_mhz == 0 || o.min_sm_clock_mhz < self.min_sm_clock_mhz)
        {
            self.min_sm_clock_mhz = o.min_sm_clock_mhz;
        }
        self.nvlink.extend(o.nvlink);
        self.nvlink
            .sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        self.xids.extend(o.xids);
        self.xids.sort_unstable();
    }
}

/// See the module docs. Bounded by the cap each push gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuWindows {
    /// `(end µs, period)`, oldest first.
    #[serde(default)]
    periods: VecDeque<(u64, GpuPeriod)>,
    /// `(µs, pci, link, errors)`, only records with some.
    #[serde(default)]
    nvlink_errors: VecDeque<(u64, u64, u8, u32)>,
    /// `(µs, pci, xid)`.
    #[serde(default)]
    xids: VecDeque<(u64, u64, u64)>,
}

fn push_capped<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    while q.len() >= cap.max(1) {
        q.pop_front();
    }
    q.push_back(v);
}

impl GpuWindows {
    pub fn push_period(&mut self, at_us: u64, p: GpuPeriod, cap: usize) {
        push_capped(&mut self.periods, (at_us, p), cap);
    }

    pub fn push_link_errors(&mut self, at_us: u64, pci: u64, link: u8, errors: u32, cap: usize) {
        push_capped(&mut self.nvlink_errors, (at_us, pci, link, errors), cap);
    }

    pub fn push_xid(&mut self, at_us: u64, pci: u64, xid: u64, cap: usize) {
        push_capped(&mut self.xids, (at_us, pci, xid), cap);
    }

    /// Keep `l`'s errors, if it has some.
    pub fn push_link(&mut self, at_us: u64, l: &GpuLink, cap: usize) {
        let e = l.errors().min(u64::from(u32::MAX)) as u32;
        if e > 0 {
            self.push_link_errors(at_us, l.pci, l.link, e, cap);
        }
    }

    pub fn push_xid_record(&mut self, at_us: u64, x: &GpuXid, cap: usize) {
        self.push_xid(at_us, x.pci, x.xid, cap);
    }

    /// Forget what came before `us`.
    pub fn forget_before(&mut self, us: u64) {
        while self.periods.front().is_some_and(|p| p.0 < us) {
            self.periods.pop_front();
        }
        while self.nvlink_errors.front().is_some_and(|p| p.0 < us) {
            self.nvlink_errors.pop_front();
        }
        while self.xids.front().is_some_and(|p| p.0 < us) {
            self.xids.pop_front();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.periods.is_empty() && self.nvlink_errors.is_empty() && self.xids.is_empty()
    }

    /// The sums over what came in `[from_us, to_us]`; `None` when nothing did.
    pub fn window(&self, from_us: u64, to_us: u64) -> Option<GpuWindow> {
        let r = from_us..=to_us;
        let mut w = GpuWindow::default();
        let mut any = false;
        for (at, p) in self.periods.iter().filter(|(at, _)| r.contains(at)) {
            let _ = at;
            any = true;
            w.covered_ns = w.covered_ns.saturating_add(p.len_ns);
            let held =
                u128::from(p.len_ns) * u128::from(p.slowdown_share) / u128::from(SHARE_SCALE);
            w.slowdown_ns = w
                .slowdown_ns
                .saturating_add(held.min(u128::from(u64::MAX)) as u64);
            w.reasons |= p.reasons;
            if p.sm_clock_mhz > 0
                && (w.min_sm_clock_mhz == 0 || p.sm_clock_mhz < w.min_sm_clock_mhz)
            {
                w.min_sm_clock_mhz = p.sm_clock_mhz;
            }
        }
        let mut per: BTreeMap<(u64, u8), u64> = BTreeMap::new();
        for (_, pci, link, n) in self.nvlink_errors.iter().filter(|e| r.contains(&e.0)) {
            any = true;
            *per.entry((*pci, *link)).or_default() += u64::from(*n);
        }
        w.nvlink = per.into_iter().map(|((p, l), n)| (p, l, n)).collect();
        w.nvlink
            .sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        w.xids = self
            .xids
            .iter()
            .filter(|x| r.contains(&x.0))
            .copied()
            .collect();
        any |= !w.xids.is_empty();
        any.then_some(w)
    }

    /// When the latest period ended (µs).
    pub fn last_us(&self) -> Option<u64> {
        self.periods.back().map(|p| p.0)
    }

    /// Every XID kept: `(µs, pci, xid)`.
    pub fn xids(&self) -> impl Iterator<Item = &(u64, u64, u64)> {
        self.xids.iter()
    }
}

/// `pci` for people (`dddd:bb:dd.f`).
pub fn pci_name(p: u64) -> String {
    pci::format(p)
}

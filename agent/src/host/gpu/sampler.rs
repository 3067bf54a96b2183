//! [`GpuSampler`]: what the host recorder runs for the GPUs — the NVML source and its XID
//! watcher, at `[gpu] interval_ms` (or `fast_interval_ms` while a hang is suspected), over the
//! devices the jobs' ranks are bound to; each job's host stream gets the records of its own
//! devices only (a GPU of another tenant's job never lands in this job's stream).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use comminsight_wire::record::Body;

use super::nvml::NvmlSource;
use super::xid::XidWatcher;
use super::{GpuConfig, GpuReadings, GpuStatus};
use crate::probes::threads::monotonic_ns;

/// The sampler. See the module docs.
pub struct GpuSampler {
    nvml: Option<NvmlSource>,
    xid: Option<XidWatcher>,
    interval: Duration,
    fast_interval: Duration,
    fast: bool,
    last: Option<Instant>,
    offset_ns: i64,
    status: GpuStatus,
}

impl GpuSampler {
    /// Open NVML as `cfg` says; host times are monotonic + `offset_ns` (the recorder's).
    /// Without NVML: one line, and a sampler that writes nothing.
    pub fn start(cfg: &GpuConfig, offset_ns: i64) -> GpuSampler {
        let mut s = GpuSampler {
            nvml: None,
            xid: None,
            interval: Duration::from_millis(cfg.interval_ms.max(10)),
            fast_interval: Duration::from_millis(cfg.fast_interval_ms.max(10)),
            fast: false,
            last: None,
            offset_ns,
            status: GpuStatus::default(),
        };
        if !cfg.enabled {
            s.status.nvml = "off ([gpu] enabled = false)".into();
            return s;
        }
        match NvmlSource::open(cfg) {
            Ok(n) => {
                s.status.nvml = format!("on ({} GPUs, driver {})", n.devices().len(), n.driver());
                tracing::info!("GPU metrics: NVML {}", s.status.nvml);
                let clock = move || monotonic_ns().saturating_add_signed(offset_ns);
                match XidWatcher::start(n.nvml(), Box::new(clock)) {
                    Ok(w) => s.xid = Some(w),
                    Err(e) => {
                        tracing::warn!("GPU XID events off: {e}");
                        s.status.metrics_off.push(format!("xid: {e}"));
                    }
                }
                s.nvml = Some(n);
            }
            Err(e) => {
                tracing::info!("GPU metrics off: {e}");
                s.status.nvml = format!("off: {e}");
            }
        }
        s
    }

    /// Sample at the fast period (a hang or straggler is under analysis) or the normal one.
    pub fn set_fast(&mut self, on: bool) {
        self.fast = on;
    }

    /// XIDs every call; every period the devices in `bound` (job -> PCI addresses). Returns
    /// the records for each job's host stream.
    pub fn tick(
        &mut self,
        bound: &BTreeMap<String, BTreeSet<u64>>,
        now: Instant,
    ) -> BTreeMap<String, Vec<Body>> {
        let mut r = GpuReadings::default();
        if let Some(x) = &self.xid {
            r.xids = x.take();
            self.status.xids += r.xids.len() as u64;
        }
        let period = if self.fast {
            self.fast_interval
        } else {
            self.interval
        };
        let due = self.last.is_none_or(|t| now.duration_since(t) >= period);
        if let Some(n) = self.nvml.as_mut().filter(|_| due) {
            self.last = Some(now);
            let wanted: BTreeSet<u64> = bound.values().flatten().copied().collect();
            let mono = monotonic_ns();
            let (gpus, links) = n.sample(
                Some(&wanted),
                mono,
                mono.saturating_add_signed(self.offset_ns),
            );
            self.status.sampled = gpus.len();
            r.gpus = gpus;
            r.links = links;
            self.status.errors = n.errors;
            self.status.metrics_off.retain(|l| l.starts_with("xid:"));
            self.status.metrics_off.extend(n.off_lines.iter().cloned());
        }
        by_job(r, bound)
    }

    pub fn status(&self) -> GpuStatus {
        self.status.clone()
    }
}

/// Each job's records: those of its bound devices (an XID of an unknown device goes to every
/// job of the host).
pub fn by_job(
    r: GpuReadings,
    bound: &BTreeMap<String, BTreeSet<u64>>,
) -> BTreeMap<String, Vec<Body>> {
    let mut out: BTreeMap<String, Vec<Body>> = BTreeMap::new();
    for (job, pcis) in bound {
        let mut v: Vec<Body> = Vec::new();
        v.extend(
            r.gpus
                .iter()
                .filter(|g| pcis.contains(&g.pci))
                .cloned()
                .map(Body::Gpu),
        );
        v.extend(
            r.links
                .iter()
                .filter(|l| pcis.contains(&l.pci))
                .cloned()
                .map(Body::GpuLink),
        );
        v.extend(
            r.xids
                .iter()
                .filter(|x| x.pci == 0 || pcis.contains(&x.pci))
                .cloned()
                .map(Body::Xid),
        );
        if !v.is_empty() {
            out.insert(job.clone(), v);
        }
    }
    out
}

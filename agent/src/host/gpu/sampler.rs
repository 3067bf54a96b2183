//! [`GpuSampler`]: what the host recorder runs for the GPUs — the NVML source and its XID
//! watcher, at `[gpu] interval_ms` (or `fast_interval_ms` while a hang is suspected), over the
//! devices the jobs' ranks are bound to, and the DCGM source's scrapes as they come; each
//! job's host stream gets the records of its own devices only (a GPU of another tenant's job
//! never lands in this job's stream).
//!
//! NVML is a device's primary source: for a GPU NVML samples, a DCGM scrape adds only what
//! NVML cannot measure (SM activity), so no value is counted twice; DCGM is the whole source of
//! a GPU NVML does not sample (and of XIDs when NVML's event thread is not running).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use comminsight_wire::gpu::{gpu_valid, GpuSample};
use comminsight_wire::record::Body;

use super::dcgm::convert::DcgmConverter;
use super::dcgm::DcgmScraper;
use super::nvml::NvmlSource;
use super::xid::XidWatcher;
use super::{BoundGpus, GpuConfig, GpuReadings, GpuStatus};
use crate::probes::threads::monotonic_ns;

/// The sampler. See the module docs.
pub struct GpuSampler {
    nvml: Option<NvmlSource>,
    xid: Option<XidWatcher>,
    dcgm: Option<DcgmScraper>,
    dcgm_conv: DcgmConverter,
    /// The first unparsable dcgm-exporter line was logged.
    dcgm_line_logged: bool,
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
            dcgm: None,
            dcgm_conv: DcgmConverter::default(),
            dcgm_line_logged: false,
            interval: Duration::from_millis(cfg.interval_ms.max(10)),
            fast_interval: Duration::from_millis(cfg.fast_interval_ms.max(10)),
            fast: false,
            last: None,
            offset_ns,
            status: GpuStatus::default(),
        };
        s.status.dcgm = "off".into();
        if !cfg.enabled {
            s.status.nvml = "off ([gpu] enabled = false)".into();
            return s;
        }
        s.start_dcgm(cfg);
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
                if e.starts_with("refused") {
                    // `[gpu] library` names a file the agent must not run (see `nvml::trust`).
                    tracing::warn!("GPU metrics off: {e}");
                } else {
                    tracing::info!("GPU metrics off: {e}");
                }
                s.status.nvml = format!("off: {e}");
            }
        }
        s
    }

    fn start_dcgm(&mut self, cfg: &GpuConfig) {
        if cfg.dcgm_url.is_empty() {
            return;
        }
        let offset_ns = self.offset_ns;
        let clock = move || {
            let m = monotonic_ns();
            (m, m.saturating_add_signed(offset_ns))
        };
        match DcgmScraper::start(
            &cfg.dcgm_url,
            Duration::from_millis(cfg.dcgm_interval_ms.max(100)),
            Duration::from_millis(cfg.dcgm_timeout_ms.max(10)),
            Box::new(clock),
        ) {
            Ok(d) => {
                tracing::info!(
                    "GPU metrics: scraping dcgm-exporter {} every {} ms",
                    cfg.dcgm_url,
                    cfg.dcgm_interval_ms
                );
                self.status.dcgm = format!("on ({})", cfg.dcgm_url);
                self.dcgm = Some(d);
            }
            Err(e) => {
                tracing::warn!("GPU metrics from DCGM off: {e}");
                self.status.dcgm = format!("off: {e}");
            }
        }
    }

    /// Sample at the fast period (a hang or straggler is under analysis) or the normal one.
    pub fn set_fast(&mut self, on: bool) {
        self.fast = on;
    }

    /// XIDs and DCGM scrapes every call; every period the devices in `bound`. Returns the
    /// records for each job's host stream.
    pub fn tick(&mut self, bound: &BoundGpus, now: Instant) -> BTreeMap<String, Vec<Body>> {
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
            let wanted: BTreeSet<u64> = bound.jobs.values().flatten().copied().collect();
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
        self.take_dcgm(bound, &mut r);
        by_job(r, &bound.jobs)
    }

    /// The DCGM scrapes since the last tick, as records (see the module docs for what a GPU
    /// NVML samples keeps of them).
    fn take_dcgm(&mut self, bound: &BoundGpus, r: &mut GpuReadings) {
        let Some(d) = &self.dcgm else { return };
        let nvml = self.nvml.as_ref().map(NvmlSource::pcis).unwrap_or_default();
        let mut gpus = None;
        for sc in d.take() {
            let e = &sc.exposition;
            if e.skipped > 0 && !self.dcgm_line_logged {
                self.dcgm_line_logged = true;
                tracing::warn!(
                    "dcgm-exporter {}: {} lines not understood, the first: {}",
                    d.url(),
                    e.skipped,
                    e.first_skipped
                );
            }
            let (mut got, st) =
                self.dcgm_conv
                    .convert(&e.series, &bound.uuids, sc.mono_ns, sc.host_ns);
            gpus = Some(st.gpus);
            self.status.dcgm_unmapped += st.unmapped;
            for g in got.gpus.iter_mut().filter(|g| nvml.contains(&g.pci)) {
                *g = dcgm_only(g);
            }
            got.gpus.retain(|g| g.valid != 0);
            got.links.retain(|l| !nvml.contains(&l.pci));
            let nvml_xids = self.xid.is_some();
            got.xids.retain(|x| !(nvml_xids && nvml.contains(&x.pci)));
            r.gpus.extend(got.gpus);
            r.links.extend(got.links);
            self.status.xids += got.xids.len() as u64;
            r.xids.extend(got.xids);
        }
        let st = d.state();
        self.status.dcgm_failed = st.failed;
        self.status.dcgm = if st.last_error.is_empty() {
            match gpus {
                Some(n) if st.lost > 0 => format!(
                    "on ({}): {n} GPUs, {} scrapes dropped (not taken in time)",
                    d.url(),
                    st.lost
                ),
                Some(n) => format!("on ({}): {n} GPUs", d.url()),
                None => std::mem::take(&mut self.status.dcgm),
            }
        } else {
            format!("failing: {}", st.last_error)
        };
    }

    pub fn status(&self) -> GpuStatus {
        self.status.clone()
    }
}

/// What a DCGM sample of a GPU NVML samples keeps: the metrics NVML cannot read.
fn dcgm_only(g: &GpuSample) -> GpuSample {
    GpuSample {
        time_ns: g.time_ns,
        interval_ns: g.interval_ns,
        pci: g.pci,
        index: g.index,
        source: g.source,
        sm_active_share: g.sm_active_share,
        valid: g.valid & gpu_valid::SM_ACTIVE,
        ..GpuSample::default()
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

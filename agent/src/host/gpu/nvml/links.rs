//! The NVLink part of [`NvmlSource`]: which links a device has, and per period each link's
//! state, data throughput (field values scoped to the link, in one call) and DL error
//! counters.

use std::collections::BTreeMap;

use comminsight_wire::gpu::{gpu_source, link_valid, GpuLink};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{flag_of, Metric, NvmlSource, LINK_RX, LINK_TX, MAX_LINKS};

impl NvmlSource {
    /// Each NVLink's state, data throughput and error counters.
    pub(super) fn link_values(
        &mut self,
        i: usize,
        d: &Device<'_>,
        nvml: &Nvml,
        host_ns: u64,
        interval: u64,
    ) -> Vec<GpuLink> {
        let links = self.devs[i].links.clone();
        let tput = if self.on(i, Metric::NvlinkThroughput) && !links.is_empty() {
            self.link_throughput(i, d, nvml, &links)
        } else {
            BTreeMap::new()
        };
        let mut out = Vec::new();
        for l in links {
            let mut g = GpuLink {
                time_ns: host_ns,
                interval_ns: interval,
                pci: self.devs[i].pci,
                index: self.devs[i].index.min(255) as u8,
                link: l as u8,
                up: 255,
                source: gpu_source::NVML,
                ..GpuLink::default()
            };
            let w = d.link_wrapper_for(l);
            if self.on(i, Metric::NvlinkState) {
                if let Some(a) = self.take(i, Metric::NvlinkState, w.is_active()) {
                    g.up = u8::from(a);
                    g.valid |= link_valid::STATE;
                }
            }
            let prev = self.devs[i].link_prev.entry(l).or_default();
            if let Some((tx, rx)) = tput.get(&l) {
                let (dt, dr) = (prev.tx.delta(*tx), prev.rx.delta(*rx));
                g.tx_bytes = dt.value.saturating_mul(1024);
                g.rx_bytes = dr.value.saturating_mul(1024);
                g.sample_flags |= flag_of(dt) | flag_of(dr);
                g.valid |= link_valid::THROUGHPUT;
            }
            if self.on(i, Metric::NvlinkErrors) {
                self.link_errors(i, &w, l, &mut g);
            }
            out.push(g);
        }
        out
    }

    fn link_errors(&mut self, i: usize, w: &nvml_wrapper::NvLink<'_, '_>, l: u32, g: &mut GpuLink) {
        let kinds = [
            ErrorCounter::DlCrcFlit,
            ErrorCounter::DlCrcData,
            ErrorCounter::DlReplay,
            ErrorCounter::DlRecovery,
        ];
        let mut vals = [0u64; 4];
        for (k, c) in kinds.into_iter().enumerate() {
            match self.take(i, Metric::NvlinkErrors, w.error_counter(c)) {
                Some(v) => vals[k] = v,
                None => return,
            }
        }
        let prev = self.devs[i].link_prev.entry(l).or_default();
        let mut d = [0u32; 4];
        for k in 0..4 {
            let dl = prev.errors[k].delta(vals[k]);
            d[k] = dl.value.min(u64::from(u32::MAX)) as u32;
            g.sample_flags |= flag_of(dl);
        }
        [g.crc_flit, g.crc_data, g.replay, g.recovery] = d;
        g.valid |= link_valid::ERRORS;
    }

    /// The data TX / RX KiB counters of every link, in one call (field values scoped to the
    /// link: `nvml-wrapper`'s `field_values_for` leaves the scope at 0).
    fn link_throughput(
        &mut self,
        i: usize,
        d: &Device<'_>,
        nvml: &Nvml,
        links: &[u32],
    ) -> BTreeMap<u32, (u64, u64)> {
        let got = match nvml.lib().nvmlDeviceGetFieldValues.as_ref() {
            Ok(f) => crate::host::gpu::raw::scoped_fields(*f, d, links, [LINK_TX, LINK_RX]),
            Err(e) => Err(NvmlError::FailedToLoadSymbol(e.to_string())),
        };
        let Some(per) = self.take(i, Metric::NvlinkThroughput, got) else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (link, tx, rx) in per {
            match (tx, rx) {
                (Ok(tx), Ok(rx)) => {
                    out.insert(link, (tx, rx));
                }
                (Err(e), _) | (_, Err(e)) => {
                    let _ = self.take::<()>(i, Metric::NvlinkThroughput, Err(e));
                    return BTreeMap::new();
                }
            }
        }
        out
    }
}

/// The NVLinks a device has: those whose state NVML answers for (a link beyond the device's
/// count answers INVALID_ARGUMENT; a GPU without NVLink NOT_SUPPORTED).
pub(super) fn links_of(d: &Device<'_>) -> Vec<u32> {
    let mut out = Vec::new();
    for l in 0..MAX_LINKS {
        match d.link_wrapper_for(l).is_active() {
            Ok(_) => out.push(l),
            Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => break,
            Err(_) => {}
        }
    }
    out
}

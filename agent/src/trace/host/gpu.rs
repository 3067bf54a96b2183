//! The GPUs in a trace (issue 20): per drawn rank, the counters of the GPU it is bound to (its
//! `comm_device` records, in the first segment of its stream and every preamble) — "GPU SM
//! clock" (MHz), "GPU clocks held down" (% of each period), "GPU SM active" (DCGM, %), "NVLink N
//! tx" (GB/s), "NVLink N errors" (per period) — and its XIDs as instants on a "GPU" track.

use std::collections::HashMap;
use std::io::Write;

use comminsight_wire::gpu::{
    gpu_valid, link_valid, GpuLink, GpuSample, GpuXid, ALL_LINKS, SHARE_SCALE,
};
use comminsight_wire::record::Body;

use super::{Drawer, DrawnRank};
use crate::clock::ProcessClock;
use crate::offline::Input;
use crate::stream::StreamId;
use crate::trace::writer::ArgValue;

const CLOCK_UUID: u64 = 9 << 48;
const THROTTLE_UUID: u64 = 10 << 48;
const NVLINK_UUID: u64 = 11 << 48;
const NVLINK_ERR_UUID: u64 = 12 << 48;
const XID_UUID: u64 = 13 << 48;
const SM_ACTIVE_UUID: u64 = 14 << 48;

/// `(host index, PCI address)` -> the drawn ranks bound to that GPU, from the `comm_device`
/// records of each rank's first segment.
pub(super) fn bindings(
    input: &Input,
    job: &str,
    hosts: &[String],
    ranks: &[DrawnRank],
) -> HashMap<(usize, u64), Vec<i64>> {
    let mut out: HashMap<(usize, u64), Vec<i64>> = HashMap::new();
    for r in ranks {
        let Some(host) = hosts.get(r.host) else {
            continue;
        };
        let id = StreamId::new(job, host, &r.pid.to_string());
        let Some(first) = input.segment_files(&id).first().map(|f| f.0) else {
            continue;
        };
        let mut pcis = Vec::new();
        input.read_segments(&id, first, first, ProcessClock::default(), &mut |_, d| {
            if let Body::CommDevice(c) = &d.rec.body {
                if c.pci != 0 && !pcis.contains(&c.pci) {
                    pcis.push(c.pci);
                }
            }
        });
        for p in pcis {
            let v = out.entry((r.host, p)).or_default();
            if !v.contains(&r.rank) {
                v.push(r.rank);
            }
        }
    }
    out
}

impl<W: Write> Drawer<'_, W> {
    fn bound(&self, hi: usize, pci: u64) -> Vec<i64> {
        self.gpu_ranks.get(&(hi, pci)).cloned().unwrap_or_default()
    }

    /// A GPU period: the SM clock, the share of the period the clocks were held down, and
    /// DCGM's SM activity (each only when the record carries it).
    pub(super) fn gpu(&mut self, hi: usize, at: u64, g: &GpuSample) -> std::io::Result<()> {
        let held = [
            g.sw_power_share,
            g.hw_slowdown_share,
            g.hw_thermal_share,
            g.hw_power_brake_share,
            g.sw_thermal_share,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let has = |bits: u32| g.valid & bits != 0;
        let reasons = gpu_valid::THROTTLE_REASONS | gpu_valid::THROTTLE_TIMES;
        for rank in self.bound(hi, g.pci) {
            if has(gpu_valid::CLOCKS) {
                let clock = self.rank_track(CLOCK_UUID, rank, "GPU SM clock", Some("MHz"))?;
                self.w
                    .counter(clock, at * 1000, f64::from(g.sm_clock_mhz))?;
                self.drawn.gpu_values += 1;
            }
            if has(reasons) && g.interval_ns > 0 {
                let t = self.rank_track(THROTTLE_UUID, rank, "GPU clocks held down", Some("%"))?;
                let pct = f64::from(held) * 100.0 / f64::from(SHARE_SCALE);
                self.w.counter(t, at * 1000, pct)?;
                self.drawn.gpu_values += 1;
            }
            if has(gpu_valid::SM_ACTIVE) {
                let a = self.rank_track(SM_ACTIVE_UUID, rank, "GPU SM active", Some("%"))?;
                let pct = f64::from(g.sm_active_share) * 100.0 / f64::from(SHARE_SCALE);
                self.w.counter(a, at * 1000, pct)?;
                self.drawn.gpu_values += 1;
            }
        }
        Ok(())
    }

    /// One NVLink's period: its throughput and errors (each link its own value at the same
    /// time: the counter shows the last, so links are summed per record time by the reader).
    /// DCGM's totals over all links are drawn as "NVLinks (all)".
    pub(super) fn link(&mut self, hi: usize, at: u64, l: &GpuLink) -> std::io::Result<()> {
        if l.interval_ns == 0 {
            // A link's first sample: no period to show a rate or a count over.
            return Ok(());
        }
        let secs = l.interval_ns as f64 / 1e9;
        let label = if l.link == ALL_LINKS {
            "NVLinks (all)".to_string()
        } else {
            format!("NVLink {}", l.link)
        };
        for rank in self.bound(hi, l.pci) {
            if l.valid & link_valid::THROUGHPUT != 0 {
                let base = NVLINK_UUID + (u64::from(l.link) << 40);
                let tx = self.rank_track(base, rank, &format!("{label} tx"), Some("GB/s"))?;
                self.w
                    .counter(tx, at * 1000, l.tx_bytes as f64 / secs / 1e9)?;
                self.drawn.gpu_values += 1;
            }
            if l.valid & link_valid::ERRORS != 0 {
                let base = NVLINK_ERR_UUID + (u64::from(l.link) << 40);
                let e = self.rank_track(base, rank, &format!("{label} errors"), Some("errors"))?;
                self.w.counter(e, at * 1000, l.errors() as f64)?;
                self.drawn.gpu_values += 1;
            }
        }
        Ok(())
    }

    /// An XID as an instant on the rank's "GPU" track.
    pub(super) fn xid(&mut self, hi: usize, at: u64, x: &GpuXid) -> std::io::Result<()> {
        for rank in self.bound(hi, x.pci) {
            let track = self.rank_track(XID_UUID, rank, "GPU", None)?;
            let args = [
                ("xid", ArgValue::Uint(x.xid)),
                (
                    "pci",
                    ArgValue::Str(comminsight_wire::gpu::pci::format(x.pci)),
                ),
            ];
            self.w
                .instant(track, at * 1000, &format!("XID {}", x.xid), &args)?;
            self.drawn.gpu_values += 1;
        }
        Ok(())
    }
}

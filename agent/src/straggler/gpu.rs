//! GPU evidence in the straggler classes (issue 20), read over a rank's analysed steps from
//! the GPUs it is bound to (`comm_device` -> NVML / DCGM samples), applied before the CPU
//! rules of [`super::host`]:
//!
//! * **gpu-throttled**: a compute-slow rank, or a rank the others waited for, whose GPU clocks
//!   were held down by a slowdown reason (HW slowdown / thermal / power brake, SW power cap or
//!   thermal) at least [`THROTTLED_PCT`] % of the time and at least [`OVER_PEERS`] times its
//!   peers' median — the rank computed late because its GPU ran slow;
//! * **nvlink-errors**: a comm-slow rank, or a rank waited for, whose GPU's NVLinks counted
//!   at least [`NVLINK_ERRORS_MIN`] CRC / replay / recovery errors over the analysed steps
//!   and at least [`OVER_PEERS`] times its peers' median.
//!
//! Every rank with GPU data gets its [`HostGpuEvidence`] in the report.

use std::collections::BTreeMap;

use super::model::{median, StragglerClass, StragglerReport};
pub use super::model::{HostGpuEvidence, NvlinkErrors};

/// Share of the time (%) the clocks were held down from which a compute-slow rank is
/// gpu-throttled.
pub const THROTTLED_PCT: f64 = 20.0;
/// NVLink errors over the analysed steps from which a comm-slow rank is nvlink-errors.
pub const NVLINK_ERRORS_MIN: u64 = 10;
/// ... and how many times its peers' median either must be (as the host rules').
pub const OVER_PEERS: f64 = 2.0;

/// The gpu-throttled and nvlink-errors rules (see the module docs); `gpu` by rank.
pub fn refine_gpu(report: &mut StragglerReport, gpu: &BTreeMap<i64, HostGpuEvidence>) {
    let peers = |rank: i64, f: fn(&HostGpuEvidence) -> f64| {
        median(
            gpu.iter()
                .filter(|(r, _)| **r != rank)
                .map(|(_, e)| f(e))
                .collect(),
        )
    };
    let threshold = report.threshold;
    for r in &mut report.ranks {
        r.host_gpu = gpu.get(&r.rank).cloned();
        let Some(g) = r.host_gpu.clone() else {
            continue;
        };
        let waited_for = r.class == StragglerClass::None && r.index > threshold;
        let slow_peers = peers(r.rank, |e| e.slowdown_pct);
        let link_peers = peers(r.rank, |e| e.nvlink_errors as f64);
        if (r.class == StragglerClass::ComputeSlow || waited_for)
            && g.slowdown_pct >= THROTTLED_PCT
            && g.slowdown_pct >= OVER_PEERS * slow_peers
        {
            r.class = StragglerClass::GpuThrottled;
            r.class_reason = format!(
                "{}; {} (peers' median {slow_peers:.1} %)",
                r.class_reason,
                g.clocks_line()
            );
        } else if (r.class == StragglerClass::CommSlow || waited_for)
            && g.nvlink_errors >= NVLINK_ERRORS_MIN
            && g.nvlink_errors as f64 >= OVER_PEERS * link_peers
        {
            r.class = StragglerClass::NvlinkErrors;
            r.class_reason = format!(
                "{}; {} NVLink errors over the analysed steps: {} (peers' median {link_peers:.0})",
                r.class_reason,
                g.nvlink_errors,
                g.links_line()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::straggler::RankSummary;

    fn report(class_of: impl Fn(i64) -> StragglerClass) -> StragglerReport {
        StragglerReport {
            job: "j".into(),
            threshold: 10.0,
            root_threshold: 10.0,
            root_min_delay: 1.0,
            steps: vec![],
            ranks: (0..8)
                .map(|rank| RankSummary {
                    rank,
                    index: if rank == 3 { 25.0 } else { 1.0 },
                    class: class_of(rank),
                    class_reason: "late".into(),
                    ..RankSummary::default()
                })
                .collect(),
        }
    }

    fn ev(slowdown_pct: f64, nvlink_errors: u64) -> HostGpuEvidence {
        HostGpuEvidence {
            covered_s: 10.0,
            slowdown_pct,
            reasons: if slowdown_pct > 0.0 {
                vec!["hw_slowdown".into(), "hw_thermal".into()]
            } else {
                vec![]
            },
            min_sm_clock_mhz: if slowdown_pct > 0.0 { 1100 } else { 1980 },
            nvlink_errors,
            links: (nvlink_errors > 0)
                .then(|| NvlinkErrors {
                    gpu: "0000:2a:00.0".into(),
                    link: 3,
                    errors: nvlink_errors,
                })
                .into_iter()
                .collect(),
            xids: vec![],
        }
    }

    #[test]
    fn a_throttled_gpu_and_erroring_nvlinks_name_their_ranks_others_keep_their_class() {
        let mut r = report(|rank| match rank {
            1 | 2 => StragglerClass::ComputeSlow,
            5 | 6 => StragglerClass::CommSlow,
            _ => StragglerClass::None,
        });
        let gpu: BTreeMap<i64, HostGpuEvidence> = (0..8)
            .map(|rank| {
                let e = match rank {
                    1 => ev(38.0, 0),
                    2 => ev(1.0, 0),
                    5 => ev(0.0, 1204),
                    6 => ev(0.0, 3),
                    3 => ev(60.0, 0),
                    _ => ev(0.0, 0),
                };
                (rank, e)
            })
            .collect();
        refine_gpu(&mut r, &gpu);
        let class = |k: usize| r.ranks[k].class;
        assert_eq!(class(1), StragglerClass::GpuThrottled);
        assert_eq!(
            r.ranks[1].class_reason,
            "late; GPU clocks held down 38.0 % of 10.0 s (hw_slowdown, hw_thermal), SM clock \
             down to 1100 MHz (peers' median 0.0 %)"
        );
        assert_eq!(
            class(2),
            StragglerClass::ComputeSlow,
            "1 % is no throttling"
        );
        assert_eq!(
            class(3),
            StragglerClass::GpuThrottled,
            "waited for, and throttled"
        );
        assert_eq!(class(5), StragglerClass::NvlinkErrors);
        assert!(
            r.ranks[5]
                .class_reason
                .ends_with("1204 NVLink errors over the analysed steps: NVLink 3 of 0000:2a:00.0 +1204 errors (peers' median 0)"),
            "{}",
            r.ranks[5].class_reason
        );
        assert_eq!(
            class(6),
            StragglerClass::CommSlow,
            "3 errors are under the floor"
        );
        assert_eq!(class(0), StragglerClass::None);
        assert!(r.ranks.iter().all(|x| x.host_gpu.is_some()));
    }
}

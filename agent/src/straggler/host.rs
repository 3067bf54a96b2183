//! Host context in the straggler classes (issue 19): a **compute-slow** or **comm-slow**
//! culprit, or a rank the others waited for (seed index over the threshold) whose own time the
//! root rule found normal, is refined by what its main thread did over the analysed steps,
//! from the host streams:
//!
//! * **cpu-starved**: runnable (waiting for a CPU: run-queue contention, cgroup `cpu.max`
//!   throttling) at least [`STARVED_RUNNABLE_PCT`] % of the time and at least
//!   [`OVER_PEERS`] times its peers' median — the rank was ready to compute and got no CPU;
//! * **blocked-io**: in uninterruptible (I/O) sleep at least [`BLOCKED_IO_PCT`] % of the time
//!   and at least [`OVER_PEERS`] times its peers' median;
//! * **link-errors** (a comm-slow culprit, or a rank waited for, that neither rule above
//!   took): a port under its traffic (its queue pairs' device and port; for the socket
//!   transport, every sampled data port of its host) went down at least once, or counted at
//!   least [`LINK_ERRORS_MIN`] errors, over the analysed steps;
//! * **retransmits** (a comm-slow culprit, or a rank waited for, that no rule above took): its TCP connections retransmitted at least [`RETRANSMITS_MIN`] segments over the
//!   analysed steps and at least [`OVER_PEERS`] times its peers' median — a lossy link or an
//!   overloaded peer under its operations;
//! * the GPU rules (**gpu-throttled**, **nvlink-errors**, [`super::gpu`]) run before all of
//!   these;
//! * otherwise a culprit keeps its class, its shares in the reason (a sleeping or computing
//!   rank), and any other rank its class.
//!
//! Every rank with host data gets its shares ([`HostShares`]), retransmits
//! ([`HostTcpEvidence`]) and port errors ([`HostLinkEvidence`]) in the report; no other class
//! changes, and no index.

use std::collections::BTreeMap;

use super::model::{median, StragglerClass, StragglerReport};
pub use super::model::{HostLinkEvidence, HostShares, HostTcpEvidence, RanksHost};

/// Runnable share (%) from which a compute-slow rank is cpu-starved.
pub const STARVED_RUNNABLE_PCT: f64 = 20.0;
/// I/O-sleep share (%) from which a compute-slow rank is blocked-io.
pub const BLOCKED_IO_PCT: f64 = 20.0;
/// ... and how many times its peers' median share it must be.
pub const OVER_PEERS: f64 = 2.0;
/// TCP retransmits over the analysed steps from which a comm-slow rank is `retransmits`.
pub const RETRANSMITS_MIN: u64 = 5;
/// Port errors over the analysed steps from which a comm-slow rank is `link-errors` (one
/// link-down is enough).
pub const LINK_ERRORS_MIN: u64 = 10;

/// Give every rank of `report` its shares, retransmits and port errors from `host` (by rank),
/// and refine its culprits (see the module docs).
pub fn refine(report: &mut StragglerReport, host: &RanksHost) {
    for r in &mut report.ranks {
        r.host_shares = host.shares.get(&r.rank).cloned();
        r.host_tcp = host.tcp.get(&r.rank).cloned();
        r.host_links = host.links.get(&r.rank).cloned();
    }
    super::gpu::refine_gpu(report, &host.gpu);
    refine_cpu(report, &host.shares);
    refine_links(report);
    refine_tcp(report, &host.tcp);
}

/// The link-errors rule (see the module docs); runs after the CPU rules.
fn refine_links(report: &mut StragglerReport) {
    let threshold = report.threshold;
    for r in &mut report.ranks {
        let Some(l) = r.host_links.clone() else {
            continue;
        };
        // Culprits the CPU rules took have their class already.
        if r.class != StragglerClass::CommSlow && !waited_for(r, threshold) {
            continue;
        }
        if l.link_downed == 0 && l.errors < LINK_ERRORS_MIN {
            continue;
        }
        r.class = StragglerClass::LinkErrors;
        r.class_reason = format!(
            "{}; its ports over the analysed steps: {}",
            r.class_reason,
            l.ports_line()
        );
    }
}

/// A rank the others waited for (seed index over the threshold) whose own time the root rule
/// found normal.
fn waited_for(r: &super::RankSummary, threshold: f64) -> bool {
    r.class == StragglerClass::None && r.index > threshold
}

/// The retransmits rule (see the module docs); runs after the CPU rules.
fn refine_tcp(report: &mut StragglerReport, tcp: &BTreeMap<i64, HostTcpEvidence>) {
    let threshold = report.threshold;
    for r in &mut report.ranks {
        let Some(t) = r.host_tcp.clone() else {
            continue;
        };
        if r.class != StragglerClass::CommSlow && !waited_for(r, threshold) {
            continue;
        }
        let peers = median(
            tcp.iter()
                .filter(|(rank, _)| **rank != r.rank)
                .map(|(_, t)| t.retransmits as f64)
                .collect(),
        );
        if t.retransmits >= RETRANSMITS_MIN && t.retransmits as f64 >= OVER_PEERS * peers {
            let top = t
                .connections
                .first()
                .map(|c| format!(" ({} on {} -> {})", c.retransmits, c.local, c.remote))
                .unwrap_or_default();
            r.class = StragglerClass::Retransmits;
            r.class_reason = format!(
                "{}; {} TCP retransmits over the analysed steps{top} (peers' median {peers:.0})",
                r.class_reason, t.retransmits
            );
        }
    }
}

/// The cpu-starved and blocked-io rules (see the module docs).
fn refine_cpu(report: &mut StragglerReport, shares: &BTreeMap<i64, HostShares>) {
    let peers = |rank: i64, f: fn(&HostShares) -> f64| {
        median(
            shares
                .iter()
                .filter(|(r, _)| **r != rank)
                .map(|(_, s)| f(s))
                .collect(),
        )
    };
    for r in &mut report.ranks {
        let Some(s) = r.host_shares.clone() else {
            continue;
        };
        // Culprits by either rule, and ranks the others waited for (seed index over the
        // threshold) whose own time the root rule found normal: a rank starved of CPU slows
        // its collectives for every member alike, so its excess self time can be nil while
        // everyone waits for it.
        let waited_for = waited_for(r, report.threshold);
        if !matches!(
            r.class,
            StragglerClass::ComputeSlow | StragglerClass::CommSlow
        ) && !waited_for
        {
            continue;
        }
        let run_peers = peers(r.rank, |s| s.runnable_pct);
        let io_peers = peers(r.rank, |s| s.blocked_io_pct);
        let nums = format!(
            "main thread on-CPU {:.1} %, runnable {:.1} %, blocked {:.1} % (I/O {:.1} %) over {:.1} s",
            s.on_cpu_pct, s.runnable_pct, s.blocked_pct, s.blocked_io_pct, s.covered_s
        );
        if s.runnable_pct >= STARVED_RUNNABLE_PCT && s.runnable_pct >= OVER_PEERS * run_peers {
            r.class = StragglerClass::CpuStarved;
            r.class_reason = format!(
                "{}; {nums}: waiting for a CPU (peers' median runnable {run_peers:.1} %)",
                r.class_reason
            );
        } else if s.blocked_io_pct >= BLOCKED_IO_PCT && s.blocked_io_pct >= OVER_PEERS * io_peers {
            r.class = StragglerClass::BlockedIo;
            r.class_reason = format!(
                "{}; {nums}: in I/O sleep (peers' median {io_peers:.1} %)",
                r.class_reason
            );
        } else if !waited_for {
            r.class_reason = format!("{}; {nums}", r.class_reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::straggler::RankSummary;

    fn shares(on: f64, run: f64, blk: f64, io: f64) -> HostShares {
        HostShares {
            on_cpu_pct: on,
            runnable_pct: run,
            blocked_pct: blk,
            blocked_io_pct: io,
            covered_s: 10.0,
        }
    }

    /// Eight ranks of job `j`, rank 3 waited for (seed index 25), each of class `class_of`.
    fn report(class_of: impl Fn(i64) -> StragglerClass, reason: &str) -> StragglerReport {
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
                    class_reason: reason.into(),
                    ..RankSummary::default()
                })
                .collect(),
        }
    }

    #[test]
    fn compute_slow_ranks_are_refined_by_their_main_thread() {
        let mut report = report(
            |rank| match rank {
                2 | 5 | 6 => StragglerClass::ComputeSlow,
                _ => StragglerClass::None,
            },
            "late arrival",
        );
        let mut m: BTreeMap<i64, HostShares> =
            (0..8).map(|r| (r, shares(20.0, 3.0, 77.0, 0.0))).collect();
        m.insert(2, shares(15.0, 45.0, 40.0, 0.0)); // starved
        m.insert(5, shares(5.0, 2.0, 93.0, 0.0)); // sleeps: compute-slow
        m.insert(6, shares(5.0, 2.0, 93.0, 60.0)); // D state
        m.insert(3, shares(2.0, 42.0, 56.0, 0.0)); // waited for, starved
        m.insert(4, shares(2.0, 42.0, 56.0, 0.0)); // starved, nobody waited: no class
        m.remove(&7);
        refine(
            &mut report,
            &RanksHost {
                shares: m,
                ..RanksHost::default()
            },
        );
        let class = |r: usize| report.ranks[r].class;
        assert_eq!(class(2), StragglerClass::CpuStarved);
        assert_eq!(class(5), StragglerClass::ComputeSlow);
        assert_eq!(class(6), StragglerClass::BlockedIo);
        assert_eq!(class(0), StragglerClass::None);
        assert_eq!(class(3), StragglerClass::CpuStarved);
        assert_eq!(class(4), StragglerClass::None);
        assert!(report.ranks[2].class_reason.contains("runnable 45.0 %"));
        assert!(report.ranks[5].class_reason.contains("blocked 93.0 %"));
        assert!(report.ranks[7].host_shares.is_none());
        assert_eq!(
            report.ranks[0].host_shares,
            Some(shares(20.0, 3.0, 77.0, 0.0))
        );
    }

    fn tcp(n: u64) -> HostTcpEvidence {
        HostTcpEvidence::of(&[("10.0.0.2:4000".into(), "10.0.0.1:5000".into(), n)])
    }

    #[test]
    fn comm_slow_ranks_with_retransmits_are_refined() {
        let class_of = |rank: i64| match rank {
            1 | 2 | 4 => StragglerClass::CommSlow,
            _ => StragglerClass::None,
        };
        let mut report = report(class_of, "slow operations");
        let mut t: BTreeMap<i64, HostTcpEvidence> = (0..8).map(|r| (r, tcp(0))).collect();
        t.insert(1, tcp(40)); // comm-slow over a lossy link
        t.insert(2, tcp(3)); // comm-slow, a few: under the minimum
        t.insert(3, tcp(100)); // waited for
        t.insert(5, tcp(50)); // retransmits, but no straggler: no class
        let mut cpu: BTreeMap<i64, HostShares> =
            (0..8).map(|r| (r, shares(20.0, 3.0, 77.0, 0.0))).collect();
        cpu.insert(4, shares(15.0, 45.0, 40.0, 0.0)); // starved first
        t.insert(4, tcp(40));
        refine(
            &mut report,
            &RanksHost {
                shares: cpu,
                tcp: t,
                ..RanksHost::default()
            },
        );
        let class = |r: usize| report.ranks[r].class;
        assert_eq!(class(1), StragglerClass::Retransmits);
        assert_eq!(class(2), StragglerClass::CommSlow);
        assert_eq!(class(3), StragglerClass::Retransmits);
        assert_eq!(class(4), StragglerClass::CpuStarved);
        assert_eq!(class(5), StragglerClass::None);
        let r1 = &report.ranks[1];
        assert!(
            r1.class_reason.contains(
                "40 TCP retransmits over the analysed steps (40 on 10.0.0.2:4000 -> 10.0.0.1:5000)"
            ),
            "{}",
            r1.class_reason
        );
        assert_eq!(r1.host_tcp.as_ref().map(|t| t.retransmits), Some(40));
    }

    fn links(device: &str, errors: u64, link_downed: u64) -> HostLinkEvidence {
        HostLinkEvidence::of(&[crate::host::windows::PortErrors {
            device: device.into(),
            port: 1,
            errors,
            link_downed,
        }])
    }

    #[test]
    fn comm_slow_ranks_over_erring_ports_are_link_errors_before_retransmits() {
        let class_of = |rank: i64| match rank {
            1 | 2 | 4 | 6 => StragglerClass::CommSlow,
            _ => StragglerClass::None,
        };
        let mut report = report(class_of, "slow operations");
        let mut l: BTreeMap<i64, HostLinkEvidence> =
            (0..8).map(|r| (r, links("mlx5_0", 0, 0))).collect();
        l.insert(1, links("mlx5_1", 0, 1)); // its port went down once
        l.insert(2, links("mlx5_1", 3, 0)); // a few errors: under the minimum
        l.insert(3, links("mlx5_1", 500, 0)); // waited for
        l.insert(5, links("mlx5_1", 500, 0)); // errors, but no straggler: no class
        l.insert(6, links("mlx5_1", 40, 0));
        let mut t: BTreeMap<i64, HostTcpEvidence> = (0..8).map(|r| (r, tcp(0))).collect();
        t.insert(6, tcp(80)); // link errors explain its retransmits
        t.insert(2, tcp(80));
        let mut cpu: BTreeMap<i64, HostShares> =
            (0..8).map(|r| (r, shares(20.0, 3.0, 77.0, 0.0))).collect();
        cpu.insert(4, shares(15.0, 45.0, 40.0, 0.0)); // starved first
        l.insert(4, links("mlx5_1", 0, 2));
        refine(
            &mut report,
            &RanksHost {
                shares: cpu,
                tcp: t,
                links: l,
                gpu: BTreeMap::new(),
            },
        );
        let class = |r: usize| report.ranks[r].class;
        assert_eq!(class(1), StragglerClass::LinkErrors);
        assert_eq!(class(2), StragglerClass::Retransmits);
        assert_eq!(class(3), StragglerClass::LinkErrors);
        assert_eq!(class(4), StragglerClass::CpuStarved);
        assert_eq!(class(5), StragglerClass::None);
        assert_eq!(class(6), StragglerClass::LinkErrors);
        assert!(
            report.ranks[1]
                .class_reason
                .ends_with("; its ports over the analysed steps: mlx5_1/1: 1 link-downs, 0 errors"),
            "{}",
            report.ranks[1].class_reason
        );
        assert_eq!(
            report.ranks[0].host_links.as_ref().map(|l| l.errors),
            Some(0)
        );
        let json = serde_json::to_value(StragglerClass::LinkErrors).unwrap();
        assert_eq!(json, "link-errors");
    }
}

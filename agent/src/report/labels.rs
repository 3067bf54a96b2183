//! Words of the report: a straggler class's name, a rank's host context as one line each.

use crate::straggler::gpu::HostGpuEvidence;
use crate::straggler::host::{HostLinkEvidence, HostShares, HostTcpEvidence};
use crate::straggler::StragglerClass;

/// The name of class `c` in the report (as in the straggler JSON).
pub fn class_str(c: StragglerClass) -> &'static str {
    match c {
        StragglerClass::ComputeSlow => "compute-slow",
        StragglerClass::CommSlow => "comm-slow",
        StragglerClass::CpuStarved => "cpu-starved",
        StragglerClass::BlockedIo => "blocked-io",
        StragglerClass::Retransmits => "retransmits",
        StragglerClass::LinkErrors => "link-errors",
        StragglerClass::GpuThrottled => "gpu-throttled",
        StragglerClass::NvlinkErrors => "nvlink-errors",
        StragglerClass::Structural => "structural",
        StragglerClass::None => "none",
    }
}

/// A rank's main-thread shares, one line.
pub fn host_cpu_text(s: &HostShares) -> String {
    format!(
        "on-CPU {:.1} %, runnable {:.1} %, blocked {:.1} % (I/O {:.1} %) over {:.1} s",
        s.on_cpu_pct, s.runnable_pct, s.blocked_pct, s.blocked_io_pct, s.covered_s
    )
}

/// A rank's TCP retransmits, one line.
pub fn host_tcp_text(t: &HostTcpEvidence) -> String {
    let conns: Vec<String> = t
        .connections
        .iter()
        .map(|c| format!("{} on {} -> {}", c.retransmits, c.local, c.remote))
        .collect();
    if conns.is_empty() {
        format!("{} retransmits", t.retransmits)
    } else {
        format!("{} retransmits ({})", t.retransmits, conns.join("; "))
    }
}

/// The errors and link-downs of a rank's ports, one line; empty when there were none.
pub fn host_links_text(l: &HostLinkEvidence) -> String {
    if l.errors == 0 && l.link_downed == 0 {
        return String::new();
    }
    format!(
        "{} link-downs, {} errors ({})",
        l.link_downed,
        l.errors,
        l.ports_line()
    )
}

/// A rank's GPUs over its analysed steps, one line: the clocks, the NVLinks with errors, the
/// XIDs; empty when no GPU sample covers its steps.
pub fn host_gpu_text(g: &HostGpuEvidence) -> String {
    if g.covered_s == 0.0 && g.links.is_empty() && g.xids.is_empty() {
        return String::new();
    }
    let mut parts = vec![g.clocks_line()];
    if !g.links.is_empty() {
        parts.push(g.links_line());
    }
    if !g.xids.is_empty() {
        let x: Vec<String> = g.xids.iter().map(u64::to_string).collect();
        parts.push(format!("XID {}", x.join(", ")));
    }
    parts.join("; ")
}

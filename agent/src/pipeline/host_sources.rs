//! The daemon's host sources beside the ingest loop: the host recorder it runs (eBPF probes,
//! ports, GPUs), when its GPUs sample fast, and the host context's values for the exporters.

use std::collections::BTreeMap;

use crate::config::AgentConfig;
use crate::host::recorder::HostRecorder;
use crate::stream::StreamId;
use crate::util::time::unix_ms;

/// The host recorder, unless `[probes]`, `[ports]` and `[gpu]` leave it nothing to do.
pub(super) fn host_recorder(cfg: &AgentConfig, host: &str) -> Option<HostRecorder> {
    let p = &cfg.probes;
    if !p.sched && !(p.enabled && (p.verbs || p.tcp)) && !cfg.ports.enabled && !cfg.gpu.enabled {
        return None;
    }
    Some(HostRecorder::start(
        p,
        &cfg.ports,
        &cfg.gpu,
        &cfg.agent.state_dir,
        host,
    ))
}

/// An operation open this long makes the GPUs sample at `[gpu] fast_interval_ms`.
const HANG_SUSPECT_US: u64 = 5_000_000;

/// Whether some operation on this host has been open for [`HANG_SUSPECT_US`] (a hang may be
/// under way: its GPUs' evidence is sampled finely).
pub(super) fn hang_suspected(engine: &crate::engine::Engine) -> bool {
    let now_us = unix_ms().saturating_mul(1000);
    engine
        .hang()
        .jobs_with_open_ops()
        .values()
        .any(|first| now_us.saturating_sub(*first) >= HANG_SUSPECT_US)
}

/// The host context's values of this host's rank processes (by their streams' ranks) and ports.
pub(super) fn host_values(
    h: &crate::host::context::HostContext,
    ranks: &BTreeMap<StreamId, i64>,
    host_name: &str,
) -> crate::telemetry::HostValues {
    let mut v = crate::telemetry::HostValues {
        ports: h.ports(host_name),
        ..Default::default()
    };
    for (id, rank) in ranks.iter().filter(|(_, r)| **r >= 0) {
        let Ok(pid) = id.pid.parse::<u32>() else {
            continue;
        };
        if let Some(t) = h.proc_totals(&id.job, &id.host, pid) {
            v.ranks.insert((id.job.clone(), *rank), t);
        }
    }
    let g = h.gpu();
    for (job, p, latest, links) in g.latest(host_name) {
        let pids = g.users(job, host_name, p);
        let rank = ranks
            .iter()
            .filter(|(id, r)| {
                id.job == job && **r >= 0 && id.pid.parse::<u32>().is_ok_and(|x| pids.contains(&x))
            })
            .map(|(_, r)| *r)
            .min()
            .unwrap_or(-1);
        v.gpus.push(crate::telemetry::gpu::GpuValues {
            job: job.to_string(),
            rank,
            pci: comminsight_wire::gpu::pci::format(p),
            uuid: g.uuid_of(job, host_name, p),
            latest: latest.clone(),
            links: links.into_iter().cloned().collect(),
            xid: g.last_xid(job, host_name, p),
        });
    }
    v
}

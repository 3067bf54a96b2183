//! Several agents' snapshots of one job as one: the union of their ranks and communicators.

use std::collections::BTreeMap;

use super::model::{CommView, JobSnapshot, RankView, SNAPSHOT_VERSION};

/// One snapshot from several (hosts, or a raw-segment snapshot and archived bundles): per rank
/// the view heard from last, keeping process state and stacks from whichever view has them;
/// communicators with the union of their members; the largest learned gaps.
pub fn merge(snaps: &[JobSnapshot]) -> JobSnapshot {
    let mut out = JobSnapshot {
        v: SNAPSHOT_VERSION,
        ..JobSnapshot::default()
    };
    let mut ranks: BTreeMap<(i64, String), RankView> = BTreeMap::new();
    let mut comms: BTreeMap<u64, CommView> = BTreeMap::new();
    for s in snaps {
        if out.job.is_empty() {
            out.job = s.job.clone();
        }
        out.taken_us = out.taken_us.max(s.taken_us);
        out.world = out.world.max(s.world);
        out.hosts.extend(s.hosts.iter().cloned());
        out.gaps.max_op_us = out.gaps.max_op_us.max(s.gaps.max_op_us);
        out.gaps.max_idle_us = out.gaps.max_idle_us.max(s.gaps.max_idle_us);
        out.gaps.plugin_threshold_ms = out.gaps.plugin_threshold_ms.max(s.gaps.plugin_threshold_ms);
        for c in &s.comms {
            let e = comms.entry(c.hash).or_insert_with(|| CommView {
                members: vec![],
                ..c.clone()
            });
            if e.name.is_empty() {
                e.name = c.name.clone();
            }
            if e.role.is_empty() {
                e.role = c.role.clone();
            }
            e.nranks = e.nranks.max(c.nranks);
            e.members.extend(c.members.iter().copied());
        }
        for r in &s.ranks {
            // A rank is one process: key by rank and pid stream so a restarted rank is apart.
            let key = if r.rank >= 0 {
                (r.rank, String::new())
            } else {
                (r.rank, r.stream.clone())
            };
            let mut r = observed(r, s.taken_us);
            match ranks.get_mut(&key) {
                None => {
                    ranks.insert(key, r);
                }
                Some(cur) => {
                    let (proc_state, stacks) = (
                        r.proc_state.take().or(cur.proc_state.take()),
                        r.stacks.take().or(cur.stacks.take()),
                    );
                    if r.last_heard_us > cur.last_heard_us {
                        *cur = r;
                    }
                    cur.proc_state = cur.proc_state.take().or(proc_state);
                    cur.stacks = cur.stacks.take().or(stacks);
                }
            }
        }
    }
    out.hosts.sort();
    out.hosts.dedup();
    out.comms = comms
        .into_values()
        .map(|mut c| {
            c.members.sort_unstable();
            c.members.dedup();
            c
        })
        .collect();
    out.ranks = ranks.into_values().collect();
    out
}

/// `r` stamped with when it was seen (`taken_us` of its snapshot, unless already stamped).
fn observed(r: &RankView, taken_us: u64) -> RankView {
    let mut r = r.clone();
    if r.observed_us == 0 {
        r.observed_us = taken_us;
    }
    r
}

/// Add to `base` what only `extra` knows: ranks, communicator members, learned gaps.
pub fn fill_from(base: &mut JobSnapshot, extra: &JobSnapshot) {
    let known: std::collections::BTreeSet<i64> = base.ranks.iter().map(|r| r.rank).collect();
    base.ranks.extend(
        extra
            .ranks
            .iter()
            .filter(|r| r.rank >= 0 && !known.contains(&r.rank))
            .map(|r| observed(r, extra.taken_us)),
    );
    base.ranks.sort_by_key(|r| r.rank);
    let members = merge(&[base.clone(), extra.clone()]).comms;
    base.comms = members;
    base.hosts.extend(extra.hosts.iter().cloned());
    base.hosts.sort();
    base.hosts.dedup();
    base.world = base.world.max(extra.world);
    base.gaps.max_op_us = base.gaps.max_op_us.max(extra.gaps.max_op_us);
    base.gaps.max_idle_us = base.gaps.max_idle_us.max(extra.gaps.max_idle_us);
}

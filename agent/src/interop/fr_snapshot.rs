//! Flight Recorder dumps as hang evidence: every rank's dump turned into the [`JobSnapshot`] the
//! hang analysis reads (the same analysis as for the plugin's records and the agents' bundles).
//!
//! What a dump says, and how it maps:
//! * a process group (`pg_config`, keyed by its name, the same on every rank) is a communicator:
//!   hash `flight_recorder::comm_hash(name)`, name `"<desc>:<name>"` (PyTorch's own commName
//!   form, so the role comes from the description), members from its `ranks`;
//! * an entry not `completed` is an op the rank entered and has not finished ([`OpenOp`]):
//!   collectives by `collective_seq_id`, P2P by `p2p_seq_id` (the same number on both sides of a
//!   pair: each side counts its P2P ops on the group), phase 1 when the watchdog saw it start;
//! * `pg_status` (keyed by the rank's local `pg_id`, mapped to names through the entries of every
//!   dump: groups are created in the same order on every rank) says how far the rank finished:
//!   `last_completed_collective` is the sequence of the last finished op of the group, of the
//!   collective or the P2P counter, whichever the group's ops use (both when they mix);
//! * the call-site `frames` of the rank's oldest pending entry, when the dump has them, are its
//!   stacks (mode `flight_recorder`: where the op was issued, not a live sample).
//!
//! The dump does not say when it was written. PyTorch's watchdog writes it when the oldest
//! pending op passes its `timeout_ms`, so the snapshot is taken at the later of that moment and
//! the newest entry, and the timeout is the job's overdue threshold.

use std::collections::{BTreeMap, BTreeSet};

use comminsight_import::flight_recorder::{comm_hash, FrDump, FrEntry};
use comminsight_wire::roles::role_from_hint;

use crate::hang::model::{
    CollProgress, CommView, GapStats, JobSnapshot, OpenOp, P2pProgress, RankView, SNAPSHOT_VERSION,
};
use crate::stacks::{Frame, ProcessStacks, ThreadStack};

/// The `host` of an imported rank (a 2.x dump does not name its host): `rank<N>`, as the
/// importer's segment streams name it.
pub fn fr_host(rank: i64) -> String {
    format!("rank{rank}")
}

/// The group name of each of `dump`'s `pg_id`s (the keys of its `pg_status`). Its own entries
/// pair them; a `pg_id` it has no entry for takes the name other ranks' entries give that
/// `pg_id` *and* whose members include this rank (a `pg_id` is the group's creation slot, the
/// same kind of group on every rank, but each rank's own group of that kind: rank 1's tensor
/// group is not rank 9's).
fn pg_names(
    dump: &FrDump,
    all: &[FrDump],
    members: &BTreeMap<String, Vec<i64>>,
) -> BTreeMap<i64, String> {
    let mut names = dump.pg_names();
    for pg_id in dump.pg_status.keys() {
        if names.contains_key(pg_id) {
            continue;
        }
        let candidates: BTreeSet<&String> = all
            .iter()
            .flat_map(|d| &d.entries)
            .filter(|e| e.pg_id == *pg_id)
            .map(|e| &e.pg_name)
            .filter(|n| members.get(*n).is_some_and(|m| m.contains(&dump.rank)))
            .collect();
        if let [one] = candidates.into_iter().collect::<Vec<_>>()[..] {
            names.insert(*pg_id, one.clone());
        }
    }
    names
}

/// Members of every group name, from every dump's `pg_config`.
fn members(dumps: &[FrDump]) -> BTreeMap<String, Vec<i64>> {
    let mut out = BTreeMap::new();
    for d in dumps {
        for (name, pg) in &d.pg_config {
            out.entry(name.clone()).or_insert_with(|| pg.ranks.clone());
        }
    }
    out
}

/// Per group name: whether its entries (any rank's) hold collectives, P2P ops, and which
/// functions.
#[derive(Default)]
struct GroupKinds {
    coll: bool,
    p2p: bool,
    funcs: BTreeSet<String>,
}

fn group_kinds(dumps: &[FrDump]) -> BTreeMap<String, GroupKinds> {
    let mut out: BTreeMap<String, GroupKinds> = BTreeMap::new();
    for d in dumps {
        for e in &d.entries {
            let Some(f) = e.func() else { continue };
            let g = out.entry(e.pg_name.clone()).or_default();
            if e.is_p2p {
                g.p2p = true;
            } else {
                g.coll = true;
                g.funcs.insert(f.name().to_string());
            }
        }
    }
    out
}

/// The communicators: every group of every dump's `pg_config`.
fn comms(dumps: &[FrDump]) -> Vec<CommView> {
    let mut by_name: BTreeMap<String, CommView> = BTreeMap::new();
    for d in dumps {
        for (name, pg) in &d.pg_config {
            by_name.entry(name.clone()).or_insert_with(|| CommView {
                hash: comm_hash(name),
                name: format!("{}:{}", pg.desc, name),
                role: role_from_hint(&pg.desc)
                    .map(|r| r.as_str().to_string())
                    .unwrap_or_default(),
                nranks: pg.ranks.len() as u32,
                members: pg
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (i as i32, *g))
                    .collect(),
            });
        }
    }
    by_name.into_values().collect()
}

/// The group rank of global rank `global` in group `name`.
fn group_rank(dump: &FrDump, name: &str, global: i64) -> Option<i32> {
    let pg = dump.pg_config.get(name)?;
    pg.ranks.iter().position(|g| *g == global).map(|i| i as i32)
}

/// An entry not completed as an open op of `dump`'s rank.
fn open_op(dump: &FrDump, e: &FrEntry, seen_us: u64) -> Option<OpenOp> {
    let func = e.func()?;
    let me = group_rank(dump, &e.pg_name, dump.rank);
    let peer = match (e.is_p2p, e.p2p_pair(), me) {
        (true, Some((src, dst)), Some(me)) => {
            if i64::from(me) == src {
                dst as i32
            } else {
                src as i32
            }
        }
        (true, _, _) => return None,
        _ => -1,
    };
    let seq = if e.is_p2p {
        e.p2p_seq_id
    } else {
        e.collective_seq_id
    };
    Some(OpenOp {
        comm: comm_hash(&e.pg_name),
        func: func.name().to_string(),
        seq: seq.max(0) as u64,
        coll_local_sn: e.record_id.max(0) as u64,
        peer,
        p2p_ord: e.p2p_seq_id.max(0) as u64,
        count: e.count(),
        bytes: e.bytes(),
        enqueue_us: e.time_created_ns / 1000,
        start_us: e.time_started_ns.unwrap_or(0) / 1000,
        seen_us,
        phase: u8::from(e.time_started_ns.is_some() || e.state == "started"),
        dtype: e.datatype().name().to_string(),
    })
}

/// How far `dump`'s rank finished on each group: `pg_status`, plus its completed entries.
fn progress(
    dump: &FrDump,
    names: &BTreeMap<i64, String>,
    kinds: &BTreeMap<String, GroupKinds>,
) -> (Vec<CollProgress>, Vec<P2pProgress>) {
    let mut colls: BTreeMap<(u64, String), u64> = BTreeMap::new();
    let mut p2p: BTreeMap<(u64, i32, String), u64> = BTreeMap::new();
    let mut finish = |name: &str, last: i64, coll: bool, p2p_too: bool, funcs: &[String]| {
        if last < 0 {
            return;
        }
        let hash = comm_hash(name);
        if coll {
            for f in funcs {
                let e = colls.entry((hash, f.clone())).or_default();
                *e = (*e).max(last as u64);
            }
        }
        if p2p_too {
            let Some(pg) = dump.pg_config.get(name) else {
                return;
            };
            for peer in 0..pg.ranks.len() as i32 {
                for f in ["Send", "Recv"] {
                    let e = p2p.entry((hash, peer, f.to_string())).or_default();
                    *e = (*e).max(last as u64 + 1);
                }
            }
        }
    };
    for (pg_id, st) in &dump.pg_status {
        let Some(name) = names.get(pg_id) else {
            continue;
        };
        let Some(k) = kinds.get(name) else { continue };
        let funcs: Vec<String> = k.funcs.iter().cloned().collect();
        finish(name, st.last_completed, k.coll, k.p2p, &funcs);
    }
    for e in dump.entries.iter().filter(|e| e.state == "completed") {
        let Some(f) = e.func() else { continue };
        if e.is_p2p {
            finish(&e.pg_name, e.p2p_seq_id, false, true, &[]);
        } else {
            finish(
                &e.pg_name,
                e.collective_seq_id,
                true,
                false,
                &[f.name().to_string()],
            );
        }
    }
    let colls = colls
        .into_iter()
        .map(|((comm, func), last_seq)| CollProgress {
            comm,
            func,
            last_seq,
            last_count: 0,
        })
        .collect();
    let p2p = p2p
        .into_iter()
        .map(|((comm, peer, func), done)| P2pProgress {
            comm,
            peer,
            func,
            done,
        })
        .collect();
    (colls, p2p)
}

/// The call site of the rank's oldest pending entry, as its stacks (when the dump has frames).
fn stacks(dump: &FrDump, oldest: Option<&FrEntry>) -> Option<ProcessStacks> {
    let e = oldest.filter(|e| !e.frames.is_empty())?;
    Some(ProcessStacks {
        pid: dump.rank.max(0) as u32,
        captured_us: e.time_created_ns / 1000,
        elapsed_us: 0,
        mode: "flight_recorder".into(),
        python_version: None,
        threads: vec![ThreadStack {
            thread_id: e.thread_id,
            os_thread_id: None,
            name: (!e.thread_name.is_empty()).then(|| e.thread_name.clone()),
            active: true,
            owns_gil: false,
            frames: e
                .frames
                .iter()
                .map(|f| Frame {
                    name: f.name.clone(),
                    file: f.filename.clone(),
                    line: i32::try_from(f.line).unwrap_or(0),
                    native: false,
                })
                .collect(),
        }],
        error: None,
        permission_denied: false,
        warnings: Vec::new(),
    })
}

/// When the dumps were taken (aligned µs) and the watchdog timeout (ms) of the oldest pending op.
fn taken(dumps: &[FrDump]) -> (u64, u32) {
    let pending = || {
        dumps
            .iter()
            .flat_map(|d| &d.entries)
            .filter(|e| e.state != "completed")
    };
    let newest = dumps
        .iter()
        .flat_map(|d| &d.entries)
        .map(|e| e.time_created_ns / 1000)
        .max()
        .unwrap_or(0);
    let Some(oldest) = pending().min_by_key(|e| e.time_created_ns) else {
        return (newest, 0);
    };
    let timeout_ms = u32::try_from(oldest.timeout_ms).unwrap_or(u32::MAX);
    let fired = oldest.time_created_ns / 1000 + u64::from(timeout_ms) * 1000;
    (newest.max(fired), timeout_ms)
}

/// The snapshot of job `job` from its ranks' dumps.
pub fn snapshot(job: &str, dumps: &[FrDump]) -> JobSnapshot {
    let members = members(dumps);
    let kinds = group_kinds(dumps);
    let (taken_us, timeout_ms) = taken(dumps);
    let comms = comms(dumps);
    let world = comms.iter().map(|c| c.nranks).max().unwrap_or(0);
    let ranks = dumps
        .iter()
        .map(|d| {
            let pending: Vec<&FrEntry> = d
                .entries
                .iter()
                .filter(|e| e.state != "completed")
                .collect();
            let (colls, p2p) = progress(d, &pg_names(d, dumps, &members), &kinds);
            let last_heard_us = d
                .entries
                .iter()
                .map(|e| e.time_created_ns / 1000)
                .max()
                .unwrap_or(0);
            RankView {
                rank: d.rank,
                host: fr_host(d.rank),
                pid: d.rank.max(0) as u32,
                stream: format!("{job}/{}/{}", fr_host(d.rank), d.rank.max(0)),
                last_end_us: 0,
                last_heard_us,
                observed_us: 0,
                ended: false,
                colls,
                p2p,
                open: pending
                    .iter()
                    .filter_map(|e| open_op(d, e, taken_us))
                    .collect(),
                proc_state: None,
                stacks: stacks(d, pending.iter().copied().min_by_key(|e| e.time_created_ns)),
                host_context: None,
                gpus: Vec::new(),
            }
        })
        .collect();
    JobSnapshot {
        v: SNAPSHOT_VERSION,
        job: job.to_string(),
        hosts: dumps.iter().map(|d| fr_host(d.rank)).collect(),
        taken_us,
        world,
        comms,
        ranks,
        gaps: GapStats {
            max_op_us: 0,
            max_idle_us: 0,
            plugin_threshold_ms: timeout_ms,
        },
    }
}

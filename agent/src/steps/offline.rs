//! `comminsight-agent steps DIR`: steps rebuilt offline from segments (or an archive) with the
//! replay's stages: records per stream -> roles and features per job -> template -> one
//! [`RankSession`] per process (reorder, then the boundary machine).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use comminsight_wire::record::{Body, Record};
use comminsight_wire::roles::Role;
use serde::Serialize;

use super::fsm::{StepFsm, StepSummary};
use super::session::RankSession;
use super::template::{Features, TemplateSet};
use super::StepOp;
use crate::replay::{replay_visit, ReplayError, ReplayOptions};
use crate::stream::StreamId;

/// Default reorder window: operations may arrive this late (µs) without changing the result.
pub const SAFE_WINDOW_US: u64 = 2_000_000;

/// The template a job's steps were rebuilt with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TemplateRef {
    pub name: String,
    pub version: u32,
    pub file: String,
    pub file_version: u32,
}

/// One job's steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobSteps {
    pub job: String,
    /// `None`: no template matched the job's features (listed) — no steps.
    pub template: Option<TemplateRef>,
    pub features: Vec<String>,
    /// Every rank's steps, by rank then step.
    pub steps: Vec<StepSummary>,
    /// Operations of steps still open at the end of the input, per rank.
    pub open_ops: BTreeMap<i64, u64>,
}

#[derive(Default)]
struct StreamOps {
    rank: i64,
    ops: Vec<(StepOp, u64)>,
}

/// The features of a job from its roles and the (role, function) pairs of its operations on
/// communicators of at least two ranks (a 1-rank group is no parallel dimension; the same rule
/// as `Features::of_job`).
pub fn features(roles: &crate::roles::JobRoles, ops: &[(Option<Role>, &str)]) -> Features {
    let mut f = BTreeSet::new();
    for c in roles.comms.iter().filter(|c| c.nranks >= 2) {
        if let Some(r) = c.role {
            f.insert(r.as_str().to_string());
        }
    }
    for (r, func) in ops {
        if let Some(r) = r {
            f.insert(format!("{}.{func}", r.as_str()));
        }
    }
    Features(f)
}

/// Rebuild the steps of every job under `input`.
pub fn rebuild(input: &Path, templates: &TemplateSet) -> Result<Vec<JobSteps>, ReplayError> {
    let scratch = std::env::temp_dir().join(format!(
        "comminsight-steps-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let mut streams: BTreeMap<StreamId, StreamOps> = BTreeMap::new();
    let opts = ReplayOptions {
        progress: false,
        ..ReplayOptions::default()
    };
    let res = replay_visit(input, &scratch, &opts, &mut |id, batch| {
        let s = streams.entry(id.clone()).or_insert_with(|| StreamOps {
            rank: -1,
            ops: Vec::new(),
        });
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            match &rec.body {
                Body::ProcStart(p) => s.rank = i64::from(p.rank),
                Body::Coll(op) | Body::P2p(op) => s.ops.push((
                    StepOp {
                        comm_hash: op.comm_hash,
                        role: None,
                        func: op.func,
                        bytes: op.bytes,
                        coll_sn: op.coll_sn,
                        coll_local_sn: op.coll_local_sn,
                        start_us: op.start_ns / 1000,
                    },
                    op.end_ns / 1000,
                )),
                _ => {}
            }
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let summary = res?;
    let mut out = Vec::new();
    for roles in &summary.roles {
        let role_of: BTreeMap<u64, Role> = roles
            .comms
            .iter()
            .filter_map(|c| c.role.map(|r| (c.hash, r)))
            .collect();
        let job_streams: Vec<(&StreamId, &StreamOps)> = streams
            .iter()
            .filter(|(id, _)| id.job == roles.job)
            .collect();
        let multi: BTreeSet<u64> = roles
            .comms
            .iter()
            .filter(|c| c.nranks >= 2)
            .map(|c| c.hash)
            .collect();
        let mut pairs: BTreeSet<(Option<Role>, &str)> = BTreeSet::new();
        for (_, s) in &job_streams {
            for (op, _) in s.ops.iter().filter(|(op, _)| multi.contains(&op.comm_hash)) {
                pairs.insert((role_of.get(&op.comm_hash).copied(), op.func.name()));
            }
        }
        let pairs: Vec<(Option<Role>, &str)> = pairs.into_iter().collect();
        let feats = features(roles, &pairs);
        let template = templates.select(&feats);
        let mut steps = Vec::new();
        let mut open_ops = BTreeMap::new();
        if let Some(t) = template {
            for (id, s) in &job_streams {
                let align = summary.alignments.get(*id).copied().unwrap_or_default();
                let mut session = RankSession::new(StepFsm::new(t, s.rank), SAFE_WINDOW_US);
                for (op, end) in &s.ops {
                    let mut op = op.clone();
                    op.role = role_of.get(&op.comm_hash).copied();
                    op.start_us = align.apply(op.start_us * 1000) / 1000;
                    let end = align.apply(end * 1000) / 1000;
                    session.push(op, end, &mut steps);
                }
                session.drain(&mut steps);
                open_ops.insert(s.rank, session.fsm().pending_ops());
            }
        }
        steps.sort_by_key(|s| (s.rank, s.step));
        out.push(JobSteps {
            job: roles.job.clone(),
            template: template.map(|t| TemplateRef {
                name: t.name.clone(),
                version: t.version,
                file: t.file.clone(),
                file_version: t.file_version,
            }),
            features: feats.0.into_iter().collect(),
            steps,
            open_ops,
        });
    }
    Ok(out)
}

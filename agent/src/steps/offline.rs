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
use crate::replay::{read_streams, replay_visit, ReplayError, ReplayOptions};
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
    /// Ranks whose circuit breaker tripped (the template does not describe them).
    pub tripped: Vec<i64>,
}

/// What the first pass keeps per stream: its rank and which (communicator, function) pairs it
/// used (small: no operations are held).
#[derive(Default)]
struct StreamInfo {
    rank: i64,
    pairs: BTreeSet<(u64, u8)>,
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

/// Rebuild the steps of every job under `input`: a first pass (the replay's stages) gives the
/// roles, alignments and features; the second streams each process's operations through its
/// session, one process at a time (memory: one reorder window and one open step at a time, plus
/// the summaries).
pub fn rebuild(input: &Path, templates: &TemplateSet) -> Result<Vec<JobSteps>, ReplayError> {
    let scratch = crate::replay::scratch_dir("steps");
    let mut info: BTreeMap<StreamId, StreamInfo> = BTreeMap::new();
    let opts = ReplayOptions {
        progress: false,
        ..ReplayOptions::default()
    };
    let res = replay_visit(input, &scratch, &opts, &mut |id, batch| {
        let s = info.entry(id.clone()).or_insert_with(|| StreamInfo {
            rank: -1,
            pairs: BTreeSet::new(),
        });
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            match &rec.body {
                Body::ProcStart(p) => s.rank = i64::from(p.rank),
                Body::Coll(op) | Body::P2p(op) => {
                    s.pairs.insert((op.comm_hash, op.func.0));
                }
                _ => {}
            }
        }
    });
    let summary = match res {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(e);
        }
    };
    // Per job: roles by communicator, features, the template.
    struct JobPlan<'t> {
        role_of: BTreeMap<u64, Role>,
        features: Features,
        template: Option<&'t super::template::Template>,
    }
    let mut plans: BTreeMap<String, JobPlan> = BTreeMap::new();
    for roles in &summary.roles {
        let role_of: BTreeMap<u64, Role> = roles
            .comms
            .iter()
            .filter_map(|c| c.role.map(|r| (c.hash, r)))
            .collect();
        let multi: BTreeSet<u64> = roles
            .comms
            .iter()
            .filter(|c| c.nranks >= 2)
            .map(|c| c.hash)
            .collect();
        let mut pairs: BTreeSet<(Option<Role>, &str)> = BTreeSet::new();
        for (_, s) in info.iter().filter(|(id, _)| id.job == roles.job) {
            for (comm, func) in s.pairs.iter().filter(|(c, _)| multi.contains(c)) {
                pairs.insert((
                    role_of.get(comm).copied(),
                    comminsight_wire::Func(*func).name(),
                ));
            }
        }
        let pairs: Vec<(Option<Role>, &str)> = pairs.into_iter().collect();
        let feats = features(roles, &pairs);
        let template = templates.select(&feats);
        plans.insert(
            roles.job.clone(),
            JobPlan {
                role_of,
                features: feats,
                template,
            },
        );
    }
    let mut steps: BTreeMap<String, Vec<StepSummary>> = BTreeMap::new();
    let mut open_ops: BTreeMap<String, BTreeMap<i64, u64>> = BTreeMap::new();
    let mut tripped: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut current: Option<(StreamId, RankSession)> = None;
    let mut finish = |cur: Option<(StreamId, RankSession)>,
                      steps: &mut BTreeMap<String, Vec<StepSummary>>| {
        if let Some((id, mut session)) = cur {
            let out = steps.entry(id.job.clone()).or_default();
            session.drain(out);
            let rank = info.get(&id).map_or(-1, |s| s.rank);
            open_ops
                .entry(id.job.clone())
                .or_default()
                .insert(rank, session.fsm().pending_ops());
            if session.fsm().tripped() {
                tripped.entry(id.job.clone()).or_default().push(rank);
            }
        }
    };
    let res = read_streams(input, &scratch, &mut |id, batch| {
        let Some(plan) = plans.get(&id.job) else {
            return;
        };
        let Some(t) = plan.template else { return };
        if current.as_ref().is_none_or(|(c, _)| c != id) {
            finish(current.take(), &mut steps);
            let rank = info.get(id).map_or(-1, |s| s.rank);
            current = Some((
                id.clone(),
                RankSession::new(StepFsm::new(t, rank), SAFE_WINDOW_US),
            ));
        }
        let (_, session) = current.as_mut().expect("set above");
        let align = summary.alignments.get(id).copied().unwrap_or_default();
        let out = steps.entry(id.job.clone()).or_default();
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            if let Body::Coll(op) | Body::P2p(op) = &rec.body {
                let start_us = align.apply(op.start_ns) / 1000;
                let end_us = align.apply(op.end_ns) / 1000;
                session.push(
                    StepOp {
                        comm_hash: op.comm_hash,
                        role: plan.role_of.get(&op.comm_hash).copied(),
                        func: op.func,
                        bytes: op.bytes,
                        coll_sn: op.coll_sn,
                        coll_local_sn: op.coll_local_sn,
                        start_us,
                    },
                    end_us,
                    out,
                );
            }
        }
    });
    finish(current.take(), &mut steps);
    let _ = std::fs::remove_dir_all(&scratch);
    res?;
    let mut out = Vec::new();
    for (job, plan) in plans {
        let mut s = steps.remove(&job).unwrap_or_default();
        s.sort_by_key(|x| (x.rank, x.step));
        out.push(JobSteps {
            job: job.clone(),
            template: plan.template.map(|t| TemplateRef {
                name: t.name.clone(),
                version: t.version,
                file: t.file.clone(),
                file_version: t.file_version,
            }),
            features: plan.features.0.into_iter().collect(),
            steps: s,
            open_ops: open_ops.remove(&job).unwrap_or_default(),
            tripped: tripped.remove(&job).unwrap_or_default(),
        });
    }
    Ok(out)
}

//! The step engine of a set of streams (DESIGN.md §5), the same code online and offline (a
//! built-in analysis of [`crate::engine::Engine`]).
//!
//! Per job: while its template is not chosen, each stream's operations are **held** (in stream
//! order). The choice needs the communicators' roles, which the agent infers from traffic, so it
//! waits until the roles have settled: the candidate (template and role of every communicator) is
//! evaluated when the job's operation count doubles, and chosen once it is the same at two
//! evaluations in a row with at least `settle_ops` operations seen. It is forced when the held
//! operations reach `max_held_ops` or every stream of the job has ended; forced with no template
//! matching, the job's sessions are closed (circuit breaker), held operations freed, and raw
//! collection goes on. Offline, the template comes from the whole input's roles
//! ([`StepEngine::decide`]); both reach the same summaries when the roles did not change after the
//! online choice.
//!
//! Once chosen, every stream has a [`RankSession`] (reorder + boundary machine); completed steps
//! go to the outbox ([`StepEngine::take_output`]). A stream's end drains its session.
//! The whole state round-trips through serde (the agent's checkpoint); after loading,
//! [`StepEngine::configure`] binds the templates again.

use std::collections::{BTreeMap, VecDeque};

use comminsight_wire::record::{Body, Record, FLAG_INCOMPLETE};
use comminsight_wire::roles::Role;
use serde::{Deserialize, Serialize};

use super::fsm::{StepFsm, StepSummary};
use super::session::{pairs, RankSession};
use super::template::{Features, Template, TemplateSet};
use super::{role_code, role_of_code, StepOp, UNFINISHED_END};
use crate::stream::{Alignment, StreamId};

pub use super::config::StepSettings;

/// The template a job's steps are rebuilt with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRef {
    pub name: String,
    pub version: u32,
    pub file: String,
    pub file_version: u32,
}

impl TemplateRef {
    fn of(t: &Template) -> TemplateRef {
        TemplateRef {
            name: t.name.clone(),
            version: t.version,
            file: t.file.clone(),
            file_version: t.file_version,
        }
    }
}

/// A job's template choice: the template (none: no template matches the features) and the role
/// of each communicator it was made with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub template: Option<TemplateRef>,
    pub features: Vec<String>,
    /// Communicator hash -> role code (see [`super::role_code`]).
    #[serde(with = "pairs")]
    roles: BTreeMap<u64, u8>,
}

impl Decision {
    /// The choice for a job with these roles and observations (the highest-priority template
    /// whose features hold).
    pub fn of_job(
        roles: &crate::roles::JobRoles,
        obs: &crate::roles::JobObs,
        templates: &TemplateSet,
    ) -> Decision {
        let features = Features::of_job(roles, obs);
        let template = templates.select(&features).map(TemplateRef::of);
        Decision {
            template,
            features: features.0.into_iter().collect(),
            roles: roles
                .comms
                .iter()
                .filter_map(|c| c.role.map(|r| (c.hash, role_code(Some(r)))))
                .collect(),
        }
    }

    /// The role of communicator `hash` in this choice.
    /// Every communicator with a role: (hash, role).
    pub fn comm_roles(&self) -> impl Iterator<Item = (u64, Role)> + '_ {
        self.roles
            .iter()
            .filter_map(|(h, c)| role_of_code(*c).map(|r| (*h, r)))
    }

    pub fn role(&self, hash: u64) -> Option<Role> {
        self.roles.get(&hash).and_then(|c| role_of_code(*c))
    }
}

/// One job's engine state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct JobState {
    /// Operations seen.
    ops: u64,
    /// Operations held while the template is not chosen.
    held: u64,
    /// The operation count of the next evaluation.
    next_eval: u64,
    /// The candidate at the last evaluation.
    last: Option<Decision>,
    decision: Option<Decision>,
    /// The chosen template is no longer loaded (the agent restarted with other templates):
    /// the job's sessions are closed.
    #[serde(default)]
    unbound: bool,
}

/// One stream's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StreamState {
    rank: i64,
    /// Operations (with end times) held until the job's template is chosen.
    held: VecDeque<(StepOp, u64)>,
    session: Option<RankSession>,
    /// The stream ended (its session drained); more operations reopen it.
    ended: bool,
}

impl StreamState {
    fn new() -> StreamState {
        StreamState {
            rank: -1,
            held: VecDeque::new(),
            session: None,
            ended: false,
        }
    }
}

/// A job's result header (`steps/<job>/job.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobInfo {
    pub job: String,
    /// `None` until chosen (`decided = false`), or when no template matches.
    pub template: Option<TemplateRef>,
    pub features: Vec<String>,
    pub decided: bool,
    /// Per rank of the streams that ended: operations of the step still open (never emitted).
    pub open_ops: BTreeMap<i64, u64>,
    /// Ranks whose circuit breaker tripped.
    pub tripped: Vec<i64>,
    /// Operations that arrived behind the safe window (processed out of order), all streams.
    pub late: u64,
}

/// The step engine of every stream (see the module docs).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StepEngine {
    #[serde(skip)]
    templates: TemplateSet,
    #[serde(skip)]
    settings: StepSettings,
    jobs: BTreeMap<String, JobState>,
    #[serde(with = "pairs")]
    streams: BTreeMap<StreamId, StreamState>,
    /// Completed steps not taken yet (taken after every batch; empty in a checkpoint).
    #[serde(skip)]
    outbox: Vec<(StreamId, StepSummary)>,
    /// The reorder buffer of the last stream that ended, for the next session (offline, streams
    /// come one after another: no fresh allocation and page faults per stream).
    #[serde(skip)]
    spare: Option<super::session::OrderedOps>,
}

impl StepEngine {
    /// An engine with these templates and settings.
    pub fn new(templates: TemplateSet, settings: StepSettings) -> StepEngine {
        StepEngine {
            templates,
            settings,
            ..StepEngine::default()
        }
    }

    /// Bind templates and settings (after a checkpoint was loaded). A job whose template is
    /// no longer loaded (name and version) has its sessions closed, with a warning.
    pub fn configure(&mut self, templates: TemplateSet, settings: StepSettings) {
        self.templates = templates;
        self.settings = settings;
        for (job, st) in self.jobs.iter_mut() {
            let Some(t) = st.decision.as_ref().and_then(|d| d.template.as_ref()) else {
                continue;
            };
            let found = self
                .templates
                .templates
                .iter()
                .find(|x| x.name == t.name && x.version == t.version);
            match found {
                Some(tpl) => {
                    for (id, s) in self.streams.iter_mut() {
                        if &id.job == job {
                            if let Some(sess) = s.session.as_mut() {
                                sess.fsm_mut().rebind(tpl);
                            }
                        }
                    }
                }
                None => {
                    tracing::warn!(
                        job = %job,
                        "steps: template {} v{} is no longer loaded; this job's step sessions are closed (rebuild them offline with `comminsight-agent steps`)",
                        t.name,
                        t.version
                    );
                    st.unbound = true;
                    for (id, s) in self.streams.iter_mut() {
                        if &id.job == job {
                            s.session = None;
                        }
                    }
                }
            }
        }
    }

    /// Choose `job`'s template now (offline: from the whole input's roles).
    pub fn decide(&mut self, job: &str, d: Decision) {
        let st = self.jobs.entry(job.to_string()).or_default();
        if st.decision.is_some() {
            return;
        }
        self.apply_decision(job, d);
    }

    /// Feed one stream's decoded record (in the stream's order). `align` is the record's
    /// mapping onto the job timeline (the stream's clock after that record). For many records,
    /// [`StepEngine::op_of`] + [`StepEngine::feed`] look the stream up once per batch.
    pub fn observe(&mut self, id: &StreamId, rec: &Record, align: Alignment) {
        let rank = match &rec.body {
            Body::ProcStart(p) => Some(i64::from(p.rank)),
            _ => None,
        };
        let op = Self::op_of(rec, align);
        if rank.is_some() || op.is_some() {
            self.feed(id, rank, op);
        }
    }

    /// The step engine's view of an operation record (with its end time, [`UNFINISHED_END`]
    /// when it had not finished), or `None`.
    pub fn op_of(rec: &Record, align: Alignment) -> Option<(StepOp, u64)> {
        let (Body::Coll(op) | Body::P2p(op)) = &rec.body else {
            return None;
        };
        let unfinished = rec.flags & FLAG_INCOMPLETE != 0 || op.end_ns == 0;
        Some((
            StepOp {
                comm_hash: op.comm_hash,
                role: None,
                func: op.func,
                bytes: op.bytes,
                coll_sn: op.coll_sn,
                coll_local_sn: op.coll_local_sn,
                start_us: align.apply(op.start_ns) / 1000,
            },
            if unfinished {
                UNFINISHED_END
            } else {
                // A finished op ends at 1 µs or later on the timeline (0 means unfinished).
                (align.apply(op.end_ns) / 1000).max(1)
            },
        ))
    }

    /// Feed a stream's next operations (in the stream's order) and its rank when a
    /// `proc_start` came before them.
    pub fn feed(
        &mut self,
        id: &StreamId,
        rank: Option<i64>,
        ops: impl IntoIterator<Item = (StepOp, u64)>,
    ) {
        if !self.jobs.contains_key(&id.job) {
            self.jobs.insert(id.job.clone(), JobState::default());
        }
        if !self.streams.contains_key(id) {
            self.streams.insert(id.clone(), StreamState::new());
        }
        let job = self.jobs.get_mut(&id.job).expect("inserted above");
        let s = self.streams.get_mut(id).expect("inserted above");
        if let Some(r) = rank {
            s.rank = r;
        }
        let mut ops = ops.into_iter().peekable();
        if ops.peek().is_none() {
            return;
        }
        // An ended stream that goes on (segments only: its next segment came late).
        s.ended = false;
        let Some(d) = &job.decision else {
            let before = s.held.len();
            s.held.extend(ops);
            let n = (s.held.len() - before) as u64;
            job.ops += n;
            job.held += n;
            return;
        };
        if s.session.is_none() && !job.unbound {
            // A stream that appears after the choice gets its session now.
            let template = d.template.as_ref().and_then(|r| {
                self.templates
                    .templates
                    .iter()
                    .find(|t| t.name == r.name && t.version == r.version)
            });
            if let Some(t) = template {
                let fsm = StepFsm::new(t, s.rank).with_max_open_us(self.settings.breaker_us);
                let mut sess = RankSession::new(fsm, self.settings.safe_window_us);
                if let Some(b) = self.spare.take() {
                    sess.reuse_buffer(b);
                }
                s.session = Some(sess);
            }
        }
        let Some(sess) = s.session.as_mut() else {
            job.ops += ops.count() as u64;
            return;
        };
        let mut out = Vec::new();
        for (mut op, end_us) in ops {
            job.ops += 1;
            op.role = d.role(op.comm_hash);
            sess.push(op, end_us, &mut out);
        }
        self.outbox.extend(out.into_iter().map(|x| (id.clone(), x)));
    }

    /// Evaluate the template choice of the jobs that need it, with the roles inferred so far
    /// (`topology`): see the module docs. Call it when every stream has caught up with its
    /// input (the daemon: after each polling round), so that no single process's backlog decides.
    pub fn evaluate(&mut self, topology: &crate::roles::TopologyCollector) {
        let due: Vec<(String, bool)> = self
            .jobs
            .iter()
            .filter(|(_, st)| st.decision.is_none())
            .filter_map(|(job, st)| {
                let all_ended = self
                    .streams
                    .iter()
                    .filter(|(id, _)| &id.job == job)
                    .all(|(_, s)| s.ended);
                let forced = st.held >= self.settings.max_held_ops || (all_ended && st.ops > 0);
                (forced || st.ops >= st.next_eval).then(|| (job.clone(), forced))
            })
            .collect();
        for (job, forced) in due {
            let Some(obs) = topology.jobs().get(&job) else {
                continue;
            };
            let roles = crate::roles::infer(&job, obs);
            let cand = Decision::of_job(&roles, obs, &self.templates);
            let st = self.jobs.get_mut(&job).expect("due jobs exist");
            tracing::debug!(
                job = %job,
                ops = st.ops,
                forced,
                template = ?cand.template.as_ref().map(|t| &t.name),
                same = st.last.as_ref() == Some(&cand),
                "steps: template choice evaluated"
            );
            let settled = cand.template.is_some()
                && st.ops >= self.settings.settle_ops
                && st.last.as_ref() == Some(&cand);
            if forced || settled {
                if let Some(t) = &cand.template {
                    tracing::info!(
                        job = %job,
                        ops = st.ops,
                        "steps: template {} v{} chosen ({})",
                        t.name,
                        t.version,
                        if settled { "roles settled" } else { "forced" }
                    );
                }
                if cand.template.is_none() {
                    tracing::warn!(
                        job = %job,
                        "steps: no template matches this job's features [{}]; its step sessions are closed, raw records are kept (add a template, then `comminsight-agent steps`)",
                        cand.features.join(", ")
                    );
                }
                self.apply_decision(&job, cand);
            } else {
                st.next_eval = (st.ops.max(self.settings.settle_ops / 4).max(1)) * 2;
                st.last = Some(cand);
            }
        }
    }

    fn apply_decision(&mut self, job: &str, d: Decision) {
        let template = d.template.as_ref().and_then(|r| {
            self.templates
                .templates
                .iter()
                .find(|t| t.name == r.name && t.version == r.version)
        });
        let mut out = Vec::new();
        for (id, s) in self.streams.iter_mut().filter(|(id, _)| id.job == job) {
            let held = std::mem::take(&mut s.held);
            let Some(t) = template else { continue };
            let fsm = StepFsm::new(t, s.rank).with_max_open_us(self.settings.breaker_us);
            let mut sess = RankSession::new(fsm, self.settings.safe_window_us);
            let mut got = Vec::new();
            for (mut op, end) in held {
                op.role = d.role(op.comm_hash);
                sess.push(op, end, &mut got);
            }
            if s.ended {
                sess.drain(&mut got);
            }
            s.session = Some(sess);
            out.extend(got.into_iter().map(|x| (id.clone(), x)));
        }
        self.outbox.extend(out);
        let st = self.jobs.entry(job.to_string()).or_default();
        st.held = 0;
        st.last = None;
        st.decision = Some(d);
    }

    /// A stream ended (its process is gone, or the offline input ends): its session drains
    /// (the reorder buffer is released; the open step stays, never emitted half). More operations
    /// of the stream reopen it. Idempotent.
    pub fn end_stream(&mut self, id: &StreamId) {
        let Some(s) = self.streams.get_mut(id) else {
            return;
        };
        if s.ended {
            return;
        }
        s.ended = true;
        if let Some(sess) = s.session.as_mut() {
            let mut got = Vec::new();
            sess.drain(&mut got);
            // Its reorder buffer is empty now: its memory goes to the next session.
            self.spare = Some(sess.take_buffer());
            self.outbox.extend(got.into_iter().map(|x| (id.clone(), x)));
        }
    }

    /// Forget a stream (the daemon dropped it: finished and gone); a job without streams is
    /// forgotten too.
    pub fn forget_stream(&mut self, id: &StreamId) {
        self.streams.remove(id);
        if !self.streams.keys().any(|k| k.job == id.job) {
            self.jobs.remove(&id.job);
        }
    }

    /// Completed steps since the last call, in emission order.
    pub fn take_output(&mut self) -> Vec<(StreamId, StepSummary)> {
        std::mem::take(&mut self.outbox)
    }

    /// The result header of every job.
    pub fn jobs(&self) -> Vec<JobInfo> {
        self.jobs
            .iter()
            .map(|(job, st)| {
                let mut info = JobInfo {
                    job: job.clone(),
                    template: st.decision.as_ref().and_then(|d| d.template.clone()),
                    features: st
                        .decision
                        .as_ref()
                        .map(|d| d.features.clone())
                        .unwrap_or_default(),
                    decided: st.decision.is_some(),
                    open_ops: BTreeMap::new(),
                    tripped: Vec::new(),
                    late: 0,
                };
                for (_, s) in self.streams.iter().filter(|(id, _)| &id.job == job) {
                    let Some(sess) = &s.session else { continue };
                    if s.ended {
                        info.open_ops.insert(s.rank, sess.fsm().pending_ops());
                    }
                    if sess.fsm().tripped() {
                        info.tripped.push(s.rank);
                    }
                    info.late += sess.late;
                }
                info.tripped.sort_unstable();
                info
            })
            .collect()
    }

    /// Operations held by the engine now (held for a template choice + reorder buffers + open
    /// steps), for the agent's self-metrics and memory measurements.
    pub fn held_ops(&self) -> u64 {
        self.streams
            .values()
            .map(|s| {
                s.held.len() as u64
                    + s.session
                        .as_ref()
                        .map_or(0, |x| x.held() as u64 + x.fsm().pending_ops())
            })
            .sum()
    }
}

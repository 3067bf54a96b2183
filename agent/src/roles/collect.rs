//! What role inference needs from the record stream, per job: each process's global rank, each
//! communicator's members and name, and each communicator's operation mix. Order-independent
//! (sums, counts and ordered maps), so the daemon and `replay` reach the same state whatever the
//! interleaving of streams, and small enough to live in the checkpoint.

use std::collections::BTreeMap;

use comminsight_wire::record::{Body, OpRecord, Record};
use comminsight_wire::Func;
use serde::{Deserialize, Serialize};

use crate::stream::StreamId;

/// Distinct P2P peer distances kept per communicator; the rest are counted as "far".
const MAX_DELTAS: usize = 64;

/// Per-job topology observations (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopologyCollector {
    jobs: BTreeMap<String, JobObs>,
}

/// One job's observations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobObs {
    /// Per process stream (`host/pid`).
    pub procs: BTreeMap<String, ProcObs>,
    /// Per communicator hash: operation mix summed over every member.
    pub ops: BTreeMap<u64, OpMix>,
}

/// One process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcObs {
    pub host: String,
    /// `RANK` as the plugin read it (-1 when absent).
    pub global_rank: i32,
    /// `WORLD_SIZE` (-1 when absent).
    pub world_size: i32,
    /// Communicators this process is a member of, by hash.
    pub comms: BTreeMap<u64, Membership>,
}

/// A process's view of one communicator (its `comm_init`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    pub rank: i32,
    pub nranks: u32,
    pub nnodes: u32,
    pub name: String,
}

/// Operations seen on one communicator, over all of its members.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpMix {
    /// Function code -> (operations, bytes).
    pub funcs: BTreeMap<u8, (u64, u64)>,
    /// P2P peer distance in communicator ranks (`peer - rank`) -> operations.
    pub p2p_deltas: BTreeMap<i32, u64>,
    /// P2P operations whose distance was not kept (more than `MAX_DELTAS` distinct ones).
    pub p2p_far: u64,
}

impl OpMix {
    /// All operations.
    pub fn total(&self) -> u64 {
        self.funcs.values().map(|(n, _)| n).sum()
    }

    /// Operations of these functions.
    pub fn count(&self, funcs: &[Func]) -> u64 {
        funcs
            .iter()
            .filter_map(|f| self.funcs.get(&f.0))
            .map(|(n, _)| n)
            .sum()
    }

    /// All bytes.
    pub fn bytes(&self) -> u64 {
        self.funcs.values().map(|(_, b)| b).sum()
    }

    fn observe(&mut self, op: &OpRecord, p2p: bool) {
        let e = self.funcs.entry(op.func.0).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(op.bytes);
        if p2p && op.peer >= 0 && op.rank >= 0 {
            let d = op.peer - op.rank;
            if let Some(n) = self.p2p_deltas.get_mut(&d) {
                *n += 1;
            } else if self.p2p_deltas.len() < MAX_DELTAS {
                self.p2p_deltas.insert(d, 1);
            } else {
                self.p2p_far += 1;
            }
        }
    }
}

impl TopologyCollector {
    /// Take what matters from one record of `stream`.
    pub fn observe(&mut self, stream: &StreamId, rec: &Record) {
        let key = || format!("{}/{}", stream.host, stream.pid);
        match &rec.body {
            Body::ProcStart(p) => {
                let job = self.jobs.entry(stream.job.clone()).or_default();
                let proc = job.procs.entry(key()).or_default();
                proc.host = stream.host.clone();
                proc.global_rank = p.rank;
                proc.world_size = p.world_size;
            }
            Body::CommInit(c) => {
                let job = self.jobs.entry(stream.job.clone()).or_default();
                let proc = job.procs.entry(key()).or_default();
                if proc.host.is_empty() {
                    proc.host = stream.host.clone();
                    proc.global_rank = -1;
                    proc.world_size = -1;
                }
                proc.comms.insert(
                    c.comm_hash,
                    Membership {
                        rank: c.rank,
                        nranks: c.nranks,
                        nnodes: c.nnodes,
                        name: c.comm_name.as_str_lossy().into_owned(),
                    },
                );
            }
            Body::Coll(op) => self.op(stream, op, false),
            Body::P2p(op) => self.op(stream, op, true),
            _ => {}
        }
    }

    fn op(&mut self, stream: &StreamId, op: &OpRecord, p2p: bool) {
        // The hot path (every operation): no allocation once the job is known.
        let job = match self.jobs.get_mut(&stream.job) {
            Some(j) => j,
            None => self.jobs.entry(stream.job.clone()).or_default(),
        };
        job.ops.entry(op.comm_hash).or_default().observe(op, p2p);
    }

    /// Jobs seen, by id.
    pub fn jobs(&self) -> &BTreeMap<String, JobObs> {
        &self.jobs
    }

    /// Drop a job's observations (a finished job whose streams were pruned).
    pub fn forget_job(&mut self, job: &str) {
        self.jobs.remove(job);
    }
}

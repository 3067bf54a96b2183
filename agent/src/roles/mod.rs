//! Communicator roles: which communicator is DP, TP, PP, EP, CP or the world, and the parallel
//! grid (tp × cp × pp × dp, ep) — from the names the preload shim / frameworks gave them, and
//! inferred from membership and traffic where they have none ([`infer`]).
//!
//! The same [`TopologyCollector`] runs in the daemon (checkpointed with the other processor state)
//! and in `replay` / `roles`, so the results are identical for the same segments. Written as
//! `roles.json` next to `metrics.json` (daemon: `<state_dir>/results/`; replay: `OUT/`) and read by
//! every report.
//!
//! ```
//! use comminsight_agent::roles::{TopologyCollector, job_roles};
//! let c = TopologyCollector::default();
//! assert!(job_roles(&c).is_empty());
//! ```

mod collect;
mod infer;
#[cfg(test)]
mod tests;

use comminsight_wire::roles::Role;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

pub use collect::{JobObs, Membership, OpMix, ProcObs, TopologyCollector};
pub use infer::infer;

/// Where a communicator's role came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Its name carries the role.
    Named,
    /// Inferred from membership and traffic (or from named communicators of the same shape).
    Inferred,
}

/// One communicator and its role.
#[derive(Clone, Debug, PartialEq)]
pub struct CommRole {
    /// NCCL's commHash (`"0x%016x"` in JSON, as in `truth.json`).
    pub hash: u64,
    /// The name the plugin saw (empty when unnamed).
    pub name: String,
    /// `None` when neither the name nor the evidence gives one ("unknown" in JSON).
    pub role: Option<Role>,
    /// Global ranks in communicator-rank order (-1: a member whose records were not seen);
    /// empty when that table would be far larger than the members seen (a communicator that
    /// claims many more members than came: [`CommRole::is_sparse`]).
    pub ranks: Vec<i64>,
    /// The members seen: (communicator rank, global rank), by communicator rank.
    pub members: Vec<(u32, i64)>,
    pub nranks: u32,
    /// 0..=1, two decimals.
    pub confidence: f64,
    pub source: Source,
}

impl Serialize for CommRole {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("CommRole", 7)?;
        st.serialize_field("hash", &format!("0x{:016x}", self.hash))?;
        st.serialize_field("name", &self.name)?;
        st.serialize_field("role", self.role.map_or("unknown", Role::as_str))?;
        st.serialize_field("ranks", &self.ranks)?;
        if self.is_sparse() {
            // `[[comm_rank, global_rank], ...]`: only when `ranks` is not written dense.
            st.serialize_field("members", &self.members)?;
        }
        st.serialize_field("nranks", &self.nranks)?;
        st.serialize_field("confidence", &self.confidence)?;
        st.serialize_field("source", &self.source)?;
        st.end()
    }
}

impl CommRole {
    /// A communicator whose members are all known, in communicator-rank order.
    pub fn dense(hash: u64, name: &str, role: Option<Role>, ranks: Vec<i64>) -> Self {
        CommRole {
            hash,
            name: name.to_string(),
            role,
            members: (0u32..)
                .zip(ranks.iter().copied())
                .filter(|(_, g)| *g >= 0)
                .collect(),
            nranks: ranks.len() as u32,
            ranks,
            confidence: 1.0,
            source: Source::Named,
        }
    }

    /// `ranks` was left empty: the communicator claims far more members than were seen.
    pub fn is_sparse(&self) -> bool {
        self.ranks.is_empty() && self.nranks > 0
    }

    /// The global rank of communicator rank 0 (-1 when not seen; `None` for `nranks` 0).
    pub fn first_member(&self) -> Option<i64> {
        (self.nranks > 0).then(|| match self.members.first() {
            Some((0, g)) => *g,
            _ => -1,
        })
    }
}

/// The parallel grid: group size per dimension (1 when the job has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Grid {
    pub tp: u32,
    pub cp: u32,
    pub pp: u32,
    pub dp: u32,
    pub ep: u32,
}

/// One job's topology.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRoles {
    pub job: String,
    /// Ranks in the job (largest of `WORLD_SIZE`, the largest communicator, the ranks seen).
    pub world: u32,
    /// Every communicator, by role then lowest member.
    pub comms: Vec<CommRole>,
    pub grid: Grid,
    /// 0..=1: the lowest confidence of a non-global role, halved when the grid does not multiply
    /// out to the world.
    pub grid_confidence: f64,
}

impl Serialize for JobRoles {
    /// `{"job", "world", "topology": {role: [hash, ...]}, "grid", "grid_confidence", "comms"}`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let topology: std::collections::BTreeMap<&str, Vec<String>> = self
            .by_role()
            .into_iter()
            .map(|(r, hashes)| (r, hashes.iter().map(|h| format!("0x{h:016x}")).collect()))
            .collect();
        let mut st = s.serialize_struct("JobRoles", 6)?;
        st.serialize_field("job", &self.job)?;
        st.serialize_field("world", &self.world)?;
        st.serialize_field("topology", &topology)?;
        st.serialize_field("grid", &self.grid)?;
        st.serialize_field("grid_confidence", &self.grid_confidence)?;
        st.serialize_field("comms", &self.comms)?;
        st.end()
    }
}

impl JobRoles {
    /// Communicator hashes per role (`"unknown"` for those without one).
    pub fn by_role(&self) -> std::collections::BTreeMap<&'static str, Vec<u64>> {
        let mut m: std::collections::BTreeMap<&'static str, Vec<u64>> = Default::default();
        for c in &self.comms {
            m.entry(c.role.map_or("unknown", Role::as_str))
                .or_default()
                .push(c.hash);
        }
        m
    }

    /// The role of communicator `hash`, if known.
    pub fn role_of(&self, hash: u64) -> Option<Role> {
        self.comms
            .iter()
            .find(|c| c.hash == hash)
            .and_then(|c| c.role)
    }
}

/// Roles of every job the collector has seen, by job id.
pub fn job_roles(c: &TopologyCollector) -> Vec<JobRoles> {
    c.jobs().iter().map(|(id, job)| infer(id, job)).collect()
}

/// `roles.json`: `{"jobs": [...]}`, pretty, newline-terminated (deterministic).
pub fn render(jobs: &[JobRoles]) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        jobs: &'a [JobRoles],
    }
    let mut s = serde_json::to_string_pretty(&Doc { jobs }).expect("serialisable");
    s.push('\n');
    s
}

/// A human table of one job's topology.
pub fn render_human(j: &JobRoles) -> String {
    use std::fmt::Write;
    let g = j.grid;
    let mut s = format!(
        "job {}: {} ranks, grid tp={} cp={} pp={} dp={} ep={} (confidence {:.2})\n",
        j.job, j.world, g.tp, g.cp, g.pp, g.dp, g.ep, j.grid_confidence
    );
    let _ = writeln!(
        s,
        "{:<8} {:<18} {:>6} {:>5}  {:<9} {:<36} ranks",
        "role", "hash", "nranks", "conf", "source", "name"
    );
    for c in &j.comms {
        let ranks: Vec<String> = if c.is_sparse() {
            c.members
                .iter()
                .take(12)
                .map(|(r, g)| format!("{r}:{g}"))
                .collect()
        } else {
            c.ranks.iter().take(12).map(i64::to_string).collect()
        };
        let shown = if c.is_sparse() {
            c.members.len()
        } else {
            c.ranks.len()
        };
        let more = if shown > 12 { ",…" } else { "" };
        let name = if c.name.is_empty() { "-" } else { &c.name };
        let _ = writeln!(
            s,
            "{:<8} 0x{:016x} {:>6} {:>5.2}  {:<9} {:<36} [{}{}]",
            c.role.map_or("unknown", Role::as_str),
            c.hash,
            c.nranks,
            c.confidence,
            match c.source {
                Source::Named => "named",
                Source::Inferred => "inferred",
            },
            name,
            ranks.join(","),
            more
        );
    }
    s
}

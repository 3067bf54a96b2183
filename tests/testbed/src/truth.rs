//! `truth.json`: what really happened in a run, to score the analysis against.
//!
//! Rank processes append JSON lines to `DIR/run/rank-<r>.json` as they go (flushed per step, so a
//! killed rank's finished steps survive); [`merge`] turns them into one [`Truth`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fault::Fault;
use crate::layout::{Group, Layout, Role};

/// One communicator: hash as the plugin records it (`"0x%016x"`), name given to NCCL ("" =
/// unnamed), role and member ranks in communicator-rank order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TruthComm {
    pub hash: String,
    pub name: String,
    pub role: Role,
    pub ranks: Vec<usize>,
}

/// A step a rank started but did not finish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialStep {
    pub rank: usize,
    pub step: u32,
    /// `coll_local_sn` of the step's first operation (if any was issued).
    pub first_coll_local_sn: u64,
}

/// Per-rank facts beyond the step boundaries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo {
    pub host: String,
    pub pid: Option<u32>,
    /// `done`, `error: ...`, `killed`, `exit N`, `signal N`, `timeout` (set by the runner).
    pub status: String,
}

/// The whole truth file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Truth {
    pub ranks: usize,
    pub hosts: usize,
    pub job: String,
    pub scenario: String,
    pub seed: u64,
    pub nccl_version: String,
    pub synthetic: bool,
    pub layout: Layout,
    pub faults: Vec<Fault>,
    pub culprit_ranks: Vec<usize>,
    pub comms: Vec<TruthComm>,
    /// Rank -> per step `[first_coll_local_sn, last_coll_local_sn]` of its completed steps, in
    /// step order (`null` for a step whose operations were all lost).
    pub steps: BTreeMap<usize, Vec<Option<[u64; 2]>>>,
    pub partial_steps: Vec<PartialStep>,
    /// Rank -> per completed step `[start_ns, end_ns]` (CLOCK_REALTIME; the rank's host view:
    /// from before its first operation to after it synchronized).
    #[serde(default)]
    pub step_times_ns: BTreeMap<usize, Vec<[u64; 2]>>,
    pub rank_info: BTreeMap<usize, RankInfo>,
    /// Problems found while merging (a comm whose members disagree on its hash, unreadable lines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Fields of the truth file that do not come from the ranks.
#[derive(Clone, Debug)]
pub struct RunFacts {
    pub job: String,
    pub scenario: String,
    pub seed: u64,
    pub hosts: usize,
    pub synthetic: bool,
    pub layout: Layout,
    pub faults: Vec<Fault>,
    pub rank_hosts: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Culprits of a fault list: sorted, unique.
pub fn culprits(faults: &[Fault]) -> Vec<usize> {
    let mut c: Vec<usize> = faults.iter().flat_map(Fault::culprits).collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// `0x%016x`.
pub fn hex(hash: u64) -> String {
    format!("0x{hash:016x}")
}

/// `"2.30.7"` from NCCL's version code (23007).
pub fn version_string(code: u64) -> String {
    if code == 0 {
        return String::new();
    }
    format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
}

impl Truth {
    /// An empty truth for `facts` (no comms, no steps yet).
    pub fn new(facts: &RunFacts) -> Truth {
        Truth {
            ranks: facts.layout.world(),
            hosts: facts.hosts,
            job: facts.job.clone(),
            scenario: facts.scenario.clone(),
            seed: facts.seed,
            nccl_version: String::new(),
            synthetic: facts.synthetic,
            layout: facts.layout,
            faults: facts.faults.clone(),
            culprit_ranks: culprits(&facts.faults),
            comms: Vec::new(),
            steps: BTreeMap::new(),
            partial_steps: Vec::new(),
            step_times_ns: BTreeMap::new(),
            rank_info: (0..facts.layout.world())
                .map(|r| {
                    let host = facts.rank_hosts.get(r).cloned().unwrap_or_default();
                    (
                        r,
                        RankInfo {
                            host,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            warnings: Vec::new(),
        }
    }

    pub fn write(&self, path: &Path) -> Result<(), TruthError> {
        let text = serde_json::to_string_pretty(self).expect("truth serialises");
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text + "\n")
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| TruthError::Write {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Completed steps of `rank`.
    pub fn steps_done(&self, rank: usize) -> usize {
        self.steps.get(&rank).map_or(0, Vec::len)
    }
}

/// What one rank's file says.
#[derive(Debug, Default)]
struct RankFile {
    pid: Option<u32>,
    version_code: u64,
    comms: Vec<(Role, String, String)>,
    steps: Vec<Option<[u64; 2]>>,
    times: Vec<[u64; 2]>,
    /// (step, ops before, start time)
    open_step: Option<(u32, u64, u64)>,
    done: bool,
    error: Option<String>,
    bad_lines: usize,
}

fn read_rank_file(path: &Path) -> RankFile {
    let mut rf = RankFile::default();
    let Ok(text) = std::fs::read_to_string(path) else {
        return rf;
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            rf.bad_lines += 1; // a torn last line of a killed rank
            continue;
        };
        let u = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        match v.get("event").and_then(|e| e.as_str()) {
            Some("start") => {
                rf.pid = u("pid").map(|p| p as u32);
                rf.version_code = u("version_code").unwrap_or(0);
            }
            Some("comm") => {
                if let Ok(role) = serde_json::from_value::<Role>(v["role"].clone()) {
                    rf.comms.push((role, s("name"), s("hash")));
                }
            }
            Some("step_start") => {
                rf.open_step = Some((
                    u("step").unwrap_or(0) as u32,
                    u("ops").unwrap_or(0),
                    u("t_ns").unwrap_or(0),
                ));
            }
            Some("step_end") => {
                if let Some((_, first, t0)) = rf.open_step.take() {
                    let after = u("ops").unwrap_or(first);
                    rf.times.push([t0, u("t_ns").unwrap_or(t0)]);
                    rf.steps.push((after > first).then(|| [first, after - 1]));
                }
            }
            Some("done") => rf.done = true,
            Some("error") => rf.error = Some(s("message")),
            _ => {}
        }
    }
    rf
}

/// Merge the rank files of `run_dir` into a truth file for `facts` and `groups`.
pub fn merge(run_dir: &Path, facts: &RunFacts, groups: &[Group]) -> Truth {
    let mut t = Truth::new(facts);
    // comm name -> (role, hash -> reporting ranks)
    let mut hashes: BTreeMap<String, BTreeMap<String, Vec<usize>>> = BTreeMap::new();
    for r in 0..facts.layout.world() {
        let rf = read_rank_file(&run_dir.join(format!("rank-{r}.json")));
        if rf.version_code != 0 && t.nccl_version.is_empty() {
            t.nccl_version = version_string(rf.version_code);
        }
        if rf.bad_lines > 0 {
            t.warnings
                .push(format!("rank {r}: {} unreadable line(s)", rf.bad_lines));
        }
        for (role, name, hash) in &rf.comms {
            let key = if *role == Role::Global {
                "global:world".to_string()
            } else {
                name.clone()
            };
            hashes
                .entry(key)
                .or_default()
                .entry(hash.clone())
                .or_default()
                .push(r);
        }
        if let Some((step, first, _)) = rf.open_step {
            t.partial_steps.push(PartialStep {
                rank: r,
                step,
                first_coll_local_sn: first,
            });
        }
        let info = t.rank_info.entry(r).or_default();
        info.pid = rf.pid;
        info.status = match (&rf.error, rf.done) {
            (Some(e), _) => format!("error: {e}"),
            (None, true) => "done".into(),
            (None, false) => String::new(),
        };
        t.steps.insert(r, rf.steps);
        t.step_times_ns.insert(r, rf.times);
    }
    for g in groups {
        let Some(by_hash) = hashes.get(&g.name) else {
            continue;
        };
        if by_hash.len() > 1 {
            t.warnings.push(format!(
                "comm {} has different hashes on its members: {by_hash:?}",
                g.name
            ));
        }
        let hash = by_hash
            .iter()
            .max_by_key(|(_, rs)| rs.len())
            .map(|(h, _)| h.clone())
            .unwrap_or_default();
        let name = if g.role == Role::Global {
            String::new()
        } else {
            g.name.clone()
        };
        t.comms.push(TruthComm {
            hash,
            name,
            role: g.role,
            ranks: g.ranks.clone(),
        });
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(faults: &[&str]) -> RunFacts {
        RunFacts {
            job: "j".into(),
            scenario: "s".into(),
            seed: 1,
            hosts: 1,
            synthetic: false,
            layout: Layout::new(2, 1, 1, 1, 1),
            faults: faults.iter().map(|f| f.parse().unwrap()).collect(),
            rank_hosts: vec!["host0".into(); 2],
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cit-truth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn rank_files_merge_into_steps_partials_and_comms() {
        let d = scratch("merge");
        let r0 = r#"{"event":"start","rank":0,"pid":100,"version_code":23007}
{"event":"comm","role":"tp","name":"tp:pp0_dp0","hash":"0x00000000000000aa","ranks":[0,1]}
{"event":"comm","role":"global","name":"","hash":"0x00000000000000bb","ranks":[0,1]}
{"event":"step_start","step":0,"ops":1,"t_ns":100}
{"event":"step_end","step":0,"ops":5,"t_ns":250}
{"event":"step_start","step":1,"ops":5}
{"event":"step_end","step":1,"ops":5}
{"event":"step_start","step":2,"ops":5}
{"event":"done"}
"#;
        let r1 = r#"{"event":"start","rank":1,"pid":101,"version_code":23007}
{"event":"comm","role":"tp","name":"tp:pp0_dp0","hash":"0x00000000000000aa","ranks":[0,1]}
{"event":"comm","role":"global","name":"","hash":"0x00000000000000bb","ranks":[0,1]}
{"event":"step_start","step":0,"ops":1}
{"event":"step_end","step":0,"ops":4}
{"event":"step_st"#;
        std::fs::write(d.join("rank-0.json"), r0).unwrap();
        std::fs::write(d.join("rank-1.json"), r1).unwrap();
        let f = facts(&["kill:rank=1,step=1"]);
        let t = merge(&d, &f, &f.layout.all_groups());
        assert_eq!(t.nccl_version, "2.30.7");
        assert_eq!(t.culprit_ranks, vec![1]);
        assert_eq!(t.steps[&0], vec![Some([1, 4]), None]);
        assert_eq!(t.steps[&1], vec![Some([1, 3])]);
        assert_eq!(t.step_times_ns[&0][0], [100, 250]);
        assert_eq!(t.step_times_ns[&0].len(), 2);
        assert_eq!(
            t.partial_steps,
            vec![PartialStep {
                rank: 0,
                step: 2,
                first_coll_local_sn: 5
            }]
        );
        assert_eq!(t.comms.len(), 2);
        assert_eq!(t.comms[0].hash, "0x00000000000000aa");
        assert_eq!(t.comms[0].role, Role::Tp);
        assert_eq!(t.comms[1].name, "");
        assert_eq!(t.comms[1].role, Role::Global);
        assert_eq!(t.rank_info[&0].pid, Some(100));
        assert_eq!(t.warnings, vec!["rank 1: 1 unreadable line(s)".to_string()]);
        let p = d.join("truth.json");
        t.write(&p).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["steps"]["0"][0], serde_json::json!([1, 4]));
        assert_eq!(v["faults"][0]["kind"], "kill");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn slowlink_culprits_are_both_ends() {
        assert_eq!(
            culprits(&facts(&["slowlink:a=1,b=0,rate=1mbit", "slow:rank=1,ms=3"]).faults),
            vec![0, 1]
        );
        assert_eq!(version_string(22703), "2.27.3");
    }
}

use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record};
use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::*;
use crate::stream::StreamId;

/// A job built record by record: `groups` = (role, name, members in comm-rank order); per role the
/// ops each member issues: (func, count, bytes, p2p peer offsets in comm ranks).
struct Job {
    recs: Vec<(StreamId, Record)>,
}

type Profile = &'static [(Func, u64, u64)];

fn stream(rank: usize, ranks_per_host: usize) -> StreamId {
    StreamId::new(
        "j",
        &format!("h{}", rank / ranks_per_host),
        &(1000 + rank).to_string(),
    )
}

impl Job {
    fn new(world: usize) -> Job {
        let mut recs = Vec::new();
        for r in 0..world {
            recs.push((
                stream(r, 4),
                Record::new(Body::ProcStart(ProcStart {
                    rank: r as i32,
                    world_size: world as i32,
                    ..Default::default()
                })),
            ));
        }
        Job { recs }
    }

    fn collector(&self, reverse: bool) -> TopologyCollector {
        let mut c = TopologyCollector::default();
        let mut v: Vec<&(StreamId, Record)> = self.recs.iter().collect();
        if reverse {
            v.reverse();
        }
        for (s, r) in v {
            c.observe(s, r);
        }
        c
    }

    fn group(&mut self, hash: u64, name: &str, ranks: &[usize], profile: Profile, pp: bool) {
        for (cr, g) in ranks.iter().enumerate() {
            let s = stream(*g, 4);
            let hosts: std::collections::BTreeSet<usize> = ranks.iter().map(|r| r / 4).collect();
            self.recs.push((
                s.clone(),
                Record::new(Body::CommInit(CommInit {
                    comm_hash: hash,
                    nranks: ranks.len() as u32,
                    rank: cr as i32,
                    nnodes: hosts.len() as u32,
                    comm_name: name.into(),
                    ..Default::default()
                })),
            ));
            for (func, n, bytes) in profile {
                for _ in 0..*n {
                    let p2p = [Func::SEND, Func::RECV].contains(func);
                    let peer = if !p2p {
                        -1
                    } else if pp {
                        // neighbour stages only
                        if cr + 1 < ranks.len() {
                            cr as i32 + 1
                        } else {
                            cr as i32 - 1
                        }
                    } else {
                        ((cr + 1 + (*n as usize % ranks.len().max(1))) % ranks.len()) as i32
                    };
                    let op = OpRecord {
                        comm_hash: hash,
                        func: *func,
                        bytes: *bytes,
                        rank: cr as i32,
                        peer,
                        ..Default::default()
                    };
                    let body = if p2p { Body::P2p(op) } else { Body::Coll(op) };
                    self.recs.push((s.clone(), Record::new(body)));
                }
            }
        }
    }
}

const TP: Profile = &[(Func::ALL_REDUCE, 32, 65_536)];
const CP: Profile = &[
    (Func::ALL_GATHER, 8, 32_768),
    (Func::REDUCE_SCATTER, 8, 32_768),
];
const DP: Profile = &[(Func::ALL_REDUCE, 1, 1 << 20)];
const DP_ZERO: Profile = &[
    (Func::REDUCE_SCATTER, 1, 1 << 20),
    (Func::ALL_GATHER, 1, 1 << 20),
];
const PP: Profile = &[(Func::SEND, 8, 65_536), (Func::RECV, 8, 65_536)];
const EP: Profile = &[(Func::ALL_TO_ALL, 16, 131_072)];
const GLOBAL: Profile = &[(Func::ALL_REDUCE, 1, 8)];

/// Megatron order (tp fastest, then cp, dp, pp): the groups of each role.
fn megatron(tp: usize, cp: usize, dp: usize, pp: usize, ep: usize) -> Vec<(Role, Vec<usize>)> {
    let rank = |t: usize, c: usize, d: usize, p: usize| t + tp * (c + cp * (d + dp * p));
    let mut g = Vec::new();
    for p in 0..pp {
        for d in 0..dp {
            for c in 0..cp {
                if tp > 1 {
                    g.push((Role::Tp, (0..tp).map(|t| rank(t, c, d, p)).collect()));
                }
            }
        }
    }
    for p in 0..pp {
        for d in 0..dp {
            for t in 0..tp {
                if cp > 1 {
                    g.push((Role::Cp, (0..cp).map(|c| rank(t, c, d, p)).collect()));
                }
            }
        }
    }
    for p in 0..pp {
        for c in 0..cp {
            for t in 0..tp {
                if dp > 1 {
                    g.push((Role::Dp, (0..dp).map(|d| rank(t, c, d, p)).collect()));
                }
                if ep > 1 {
                    for blk in 0..dp / ep {
                        g.push((
                            Role::Ep,
                            (0..ep).map(|e| rank(t, c, blk * ep + e, p)).collect(),
                        ));
                    }
                }
            }
        }
    }
    for d in 0..dp {
        for c in 0..cp {
            for t in 0..tp {
                if pp > 1 {
                    g.push((Role::Pp, (0..pp).map(|p| rank(t, c, d, p)).collect()));
                }
            }
        }
    }
    g.push((Role::Global, (0..tp * cp * dp * pp).collect()));
    g
}

fn build(groups: &[(Role, Vec<usize>)], world: usize, named: bool, dp: Profile) -> Job {
    let mut j = Job::new(world);
    for (i, (role, ranks)) in groups.iter().enumerate() {
        let profile = match role {
            Role::Tp => TP,
            Role::Cp => CP,
            Role::Dp => dp,
            Role::Pp => PP,
            Role::Ep => EP,
            Role::Global => GLOBAL,
        };
        let name = if named {
            format!("{role}:g{i}")
        } else {
            String::new()
        };
        j.group(0x1000 + i as u64, &name, ranks, profile, *role == Role::Pp);
    }
    j
}

fn accuracy(groups: &[(Role, Vec<usize>)], roles: &JobRoles) -> f64 {
    let ok = groups
        .iter()
        .enumerate()
        .filter(|(i, (role, _))| roles.role_of(0x1000 + *i as u64) == Some(*role))
        .count();
    ok as f64 / groups.len() as f64
}

#[test]
fn unnamed_megatron_layouts_are_recovered() {
    for (tp, cp, dp, pp, ep, dp_prof) in [
        (2, 1, 4, 2, 1, DP),
        (2, 1, 4, 2, 4, DP_ZERO),
        (2, 2, 2, 2, 1, DP),
        (4, 1, 2, 2, 2, DP),
        (1, 1, 4, 2, 2, DP_ZERO),
        (2, 1, 8, 1, 1, DP),
        (1, 1, 4, 4, 1, DP), // no TP: the gradient all-reduce is rare next to the sends
    ] {
        let groups = megatron(tp, cp, dp, pp, ep);
        let world = tp * cp * dp * pp;
        let c = build(&groups, world, false, dp_prof).collector(false);
        let jobs = job_roles(&c);
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        let acc = accuracy(&groups, j);
        assert_eq!(
            acc,
            1.0,
            "tp{tp} cp{cp} dp{dp} pp{pp} ep{ep}:\n{}",
            render_human(j)
        );
        assert_eq!(
            j.grid,
            Grid {
                tp: tp as u32,
                cp: cp as u32,
                pp: pp as u32,
                dp: dp as u32,
                ep: ep as u32
            },
            "{}",
            render_human(j)
        );
        assert!(j.comms.iter().all(|c| c.source == Source::Inferred));
        assert!(j.grid_confidence > 0.3, "{}", render_human(j));
    }
}

#[test]
fn names_win_and_spread_to_unnamed_communicators_of_the_same_shape() {
    let groups = megatron(2, 1, 2, 2, 1);
    let mut j = Job::new(8);
    for (i, (role, ranks)) in groups.iter().enumerate() {
        // Only the first group of each role is named; a TP group is deliberately misnamed "dp"
        // on purpose to show the name wins over traffic.
        let name = match (i, role) {
            (0, _) => "dp:odd-one".to_string(),
            (_, Role::Pp) if ranks[0] == 0 => "PIPELINE_MODEL_PARALLEL_GROUP:7".into(),
            _ => String::new(),
        };
        let profile = match role {
            Role::Tp => TP,
            Role::Dp => DP,
            Role::Pp => PP,
            _ => GLOBAL,
        };
        j.group(0x1000 + i as u64, &name, ranks, profile, *role == Role::Pp);
    }
    let r = &job_roles(&j.collector(false))[0];
    let first = r.comms.iter().find(|c| c.hash == 0x1000).unwrap();
    assert_eq!((first.role, first.source), (Some(Role::Dp), Source::Named));
    assert_eq!(first.confidence, 1.0);
    // The other TP groups have the same shape and traffic: they follow the family's name.
    let tp_hashes: Vec<u64> = (1..groups.len())
        .filter(|i| groups[*i].0 == Role::Tp)
        .map(|i| 0x1000 + i as u64)
        .collect();
    for h in tp_hashes {
        let c = r.comms.iter().find(|c| c.hash == h).unwrap();
        assert_eq!(
            (c.role, c.source, c.confidence),
            (Some(Role::Dp), Source::Inferred, 0.9)
        );
    }
    let pp_named = r
        .comms
        .iter()
        .find(|c| c.name.starts_with("PIPELINE"))
        .unwrap();
    assert_eq!(
        (pp_named.role, pp_named.source),
        (Some(Role::Pp), Source::Named)
    );
}

#[test]
fn world_sized_dp_and_global_are_told_apart_by_message_size() {
    // dp = world: both communicators have every rank.
    let groups = vec![
        (Role::Dp, (0..4).collect()),
        (Role::Global, (0..4).collect()),
    ];
    let c = build(&groups, 4, false, DP).collector(false);
    let r = &job_roles(&c)[0];
    assert_eq!(accuracy(&groups, r), 1.0, "{}", render_human(r));
    assert_eq!(r.grid.dp, 4);
}

#[test]
fn communicators_without_traffic_get_structure_only_roles() {
    let mut j = Job::new(4);
    j.group(1, "", &[0, 1], &[], false);
    j.group(2, "", &[2, 3], &[], false);
    j.group(3, "", &[0, 2], &[], false);
    j.group(4, "", &[0, 1, 2, 3], &[], false);
    let r = &job_roles(&j.collector(false))[0];
    assert_eq!(r.role_of(4), Some(Role::Global));
    assert_eq!(r.role_of(1), Some(Role::Tp));
    assert_eq!(r.role_of(3), None, "{}", render_human(r));
    let c = r.comms.iter().find(|c| c.hash == 3).unwrap();
    assert_eq!(c.confidence, 0.0);
}

#[test]
fn json_shape_matches_the_issue() {
    let groups = megatron(2, 1, 2, 1, 1);
    let job = build(&groups, 4, true, DP);
    let jobs = job_roles(&job.collector(false));
    let v: serde_json::Value = serde_json::from_str(&render(&jobs)).unwrap();
    let j = &v["jobs"][0];
    for k in ["tp", "cp", "pp", "dp", "ep"] {
        assert!(j["grid"][k].is_u64(), "{k}");
    }
    assert_eq!(j["topology"]["tp"].as_array().unwrap().len(), 2);
    assert_eq!(j["topology"]["global"].as_array().unwrap().len(), 1);
    let c0 = &j["comms"][0];
    assert!(c0["hash"].as_str().unwrap().starts_with("0x"));
    assert_eq!(c0["hash"].as_str().unwrap().len(), 18);
    for k in ["name", "role", "ranks", "confidence", "source"] {
        assert!(!c0[k].is_null(), "{k}");
    }
    assert_eq!(c0["source"], "named");
    // Deterministic: the same records in another order give the same state and document.
    assert_eq!(job.collector(true), job.collector(false));
    assert_eq!(render(&job_roles(&job.collector(true))), render(&jobs));
}

#[test]
fn a_communicator_claiming_far_more_members_than_came_is_kept_sparse() {
    use comminsight_wire::bounds::MAX_RANKS;
    let mut j = Job::new(2);
    for (hash, nranks) in [(7u64, MAX_RANKS), (8, 4000)] {
        for r in 0..2usize {
            j.recs.push((
                stream(r, 4),
                Record::new(Body::CommInit(CommInit {
                    comm_hash: hash,
                    nranks,
                    rank: (nranks - 1 - r as u32) as i32,
                    nnodes: 1,
                    ..Default::default()
                })),
            ));
        }
    }
    let r = &job_roles(&j.collector(false))[0];
    let wide = r.comms.iter().find(|c| c.hash == 7).unwrap();
    assert!(wide.is_sparse(), "{wide:?}");
    assert!(wide.ranks.is_empty());
    assert_eq!(wide.members, vec![(MAX_RANKS - 2, 1), (MAX_RANKS - 1, 0)]);
    assert_eq!(wide.first_member(), Some(-1));
    // Within the slack: dense, as before.
    let small = r.comms.iter().find(|c| c.hash == 8).unwrap();
    assert!(!small.is_sparse());
    assert_eq!(small.ranks.len(), 4000);
    assert_eq!(&small.ranks[3998..], &[1, 0]);
    let doc = render(std::slice::from_ref(r));
    assert!(
        doc.len() < 200_000,
        "roles.json of 2 ranks: {} bytes",
        doc.len()
    );
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let c = v["jobs"][0]["comms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["hash"] == "0x0000000000000007")
        .unwrap();
    assert_eq!(
        c["members"],
        serde_json::json!([[MAX_RANKS - 2, 1], [MAX_RANKS - 1, 0]])
    );
    assert!(render_human(r).contains(&format!("{}:1", MAX_RANKS - 2)));
}

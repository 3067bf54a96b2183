//! The shipped templates against the ops the test bed really issues (its plans, per rank and
//! step, as the profiler would see them): the right template is selected from the job's
//! features, and every step of every rank reads as that step ([`check_rank`]).

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_testbed::layout::{Layout, Role as TbRole};
use comminsight_testbed::plan::{self, CollFunc};
use comminsight_testbed::scenario::{DpSync, Scenario};
use comminsight_testbed::sim::{op_events, EvFunc};
use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::super::{Features, Seq, Template, TemplateSet};
use crate::roles::{CommRole, Grid, JobObs, JobRoles, OpMix};
use crate::steps::StepOp;

const STEPS: u32 = 3;

fn scenario(name: &str) -> Scenario {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/scenarios/{name}.toml"));
    Scenario::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn role(r: TbRole) -> Role {
    match r {
        TbRole::Tp => Role::Tp,
        TbRole::Cp => Role::Cp,
        TbRole::Dp => Role::Dp,
        TbRole::Pp => Role::Pp,
        TbRole::Ep => Role::Ep,
        TbRole::Global => Role::Global,
    }
}

fn func(f: EvFunc) -> Func {
    match f {
        EvFunc::Send => Func::SEND,
        EvFunc::Recv => Func::RECV,
        EvFunc::Coll(CollFunc::AllReduce) => Func::ALL_REDUCE,
        EvFunc::Coll(CollFunc::AllGather) => Func::ALL_GATHER,
        EvFunc::Coll(CollFunc::ReduceScatter) => Func::REDUCE_SCATTER,
        EvFunc::Coll(CollFunc::AllToAll) => Func::ALL_TO_ALL,
    }
}

/// A communicator's hash: its role and lowest member.
fn hash(l: &Layout, rank: usize, r: TbRole) -> u64 {
    let g = l.group_of(rank, r);
    ((role(r) as u64 + 1) << 32) | g.ranks[0] as u64
}

/// One job: its topology as role inference reports it, its op mix, and every rank's steps.
struct Job {
    roles: JobRoles,
    obs: JobObs,
    /// rank -> step -> ops.
    steps: Vec<Vec<Vec<StepOp>>>,
}

fn job(s: &Scenario, l: &Layout) -> Job {
    let plans = plan::build(s, l, STEPS, &[]).unwrap();
    let mut comms: BTreeMap<u64, CommRole> = BTreeMap::new();
    for rank in 0..l.world() {
        // Every role gets communicators, also of one rank (frameworks create those for unused
        // dimensions): features must ignore them.
        for r in TbRole::ALL {
            let g = l.group_of(rank, r);
            comms.entry(hash(l, rank, r)).or_insert_with(|| {
                CommRole::dense(
                    hash(l, rank, r),
                    &g.name,
                    Some(role(r)),
                    g.ranks.iter().map(|&x| x as i64).collect(),
                )
            });
        }
    }
    let mut obs = JobObs::default();
    let mut steps = Vec::new();
    for p in &plans {
        let mut sn = 0;
        let mut rank_steps = Vec::new();
        for (i, ops) in p.steps.iter().enumerate() {
            let mut out = Vec::new();
            for o in ops {
                for ev in op_events(o, i as u32, l) {
                    sn += 1;
                    let h = hash(l, p.rank, ev.role);
                    let f = func(ev.func);
                    let e = obs.ops.entry(h).or_insert_with(OpMix::default);
                    let c = e.funcs.entry(f.0).or_default();
                    c.0 += 1;
                    c.1 += ev.bytes;
                    out.push(StepOp {
                        comm_hash: h,
                        role: Some(role(ev.role)),
                        func: f,
                        bytes: ev.bytes,
                        coll_sn: 0,
                        coll_local_sn: sn,
                        start_us: sn,
                    });
                }
            }
            rank_steps.push(out);
        }
        steps.push(rank_steps);
    }
    let roles = JobRoles {
        job: "t".into(),
        world: l.world() as u32,
        comms: comms.into_values().collect(),
        grid: Grid::default(),
        grid_confidence: 1.0,
    };
    Job { roles, obs, steps }
}

/// Whether `seq` matches `ops` starting at `at`.
fn matches_at(seq: &Seq, ops: &[StepOp], at: usize) -> bool {
    at + seq.len() <= ops.len() && seq.iter().zip(&ops[at..]).all(|(m, o)| m.matches(o))
}

/// Matches of `alts` in `ops`: (alternative, start, end), by start.
fn hits(alts: &[Seq], ops: &[StepOp]) -> Vec<(usize, usize, usize)> {
    (0..ops.len())
        .flat_map(|i| {
            alts.iter()
                .enumerate()
                .filter(move |(_, s)| matches_at(s, ops, i))
                .map(move |(k, s)| (k, i, i + s.len()))
        })
        .collect()
}

/// Checks one rank's stream against `t` the way the boundary machine reads it (DESIGN.md §5.3):
/// every step begins with an Open; its primary Anchor (alternative 0) matches once and no
/// Anchor alternative twice; walking its ops, a Close ends exactly at its last op and no Open
/// ends after an Anchor was seen (that would split the step early); a step without a Close ends
/// with its Anchor (the next step's Open then splits it). Returns the steps ended by a Close.
fn check_rank(t: &Template, rank: usize, steps: &[Vec<StepOp>]) -> usize {
    let stream: Vec<StepOp> = steps.concat();
    let mut starts = Vec::new();
    let mut at = 0;
    for s in steps {
        assert!(!s.is_empty(), "rank {rank}: a step without ops");
        starts.push(at);
        at += s.len();
    }
    let ends: Vec<usize> = starts.iter().skip(1).copied().chain([at]).collect();
    let anchors = hits(&t.anchor, &stream);
    let closes = hits(&t.close, &stream);
    let opens = hits(&t.open, &stream);
    let mut closed = 0;
    for (k, (&s, &e)) in starts.iter().zip(&ends).enumerate() {
        let what = format!("{} rank {rank} step {k} [{s}, {e})", t.name);
        assert!(
            opens.iter().any(|&(_, i, _)| i == s),
            "{what}: no Open matches its first ops {:?}",
            &stream[s..e.min(s + 3)]
        );
        let inside = |v: &[(usize, usize, usize)]| -> Vec<(usize, usize, usize)> {
            v.iter()
                .copied()
                .filter(|&(_, i, _)| (s..e).contains(&i))
                .collect()
        };
        let a = inside(&anchors);
        assert!(
            a.iter().all(|&(_, _, j)| j <= e),
            "{what}: an Anchor crosses the end: {a:?}"
        );
        for alt in 0..t.anchor.len() {
            let n = a.iter().filter(|h| h.0 == alt).count();
            let want = if alt == 0 { 1..=1 } else { 0..=1 };
            assert!(
                want.contains(&n),
                "{what}: Anchor alternative {alt} matches {n} times"
            );
        }
        let c = inside(&closes);
        let o = inside(&opens);
        let mut anchored = false;
        let mut by_close = false;
        for end in s + 1..=e {
            anchored |= a.iter().any(|h| h.2 == end);
            if c.iter().any(|h| h.2 == end) {
                assert_eq!(end, e, "{what}: a Close ends at {end}, inside the step");
                by_close = true;
            } else if anchored {
                let early: Vec<_> = o.iter().filter(|h| h.2 == end && h.1 > s).collect();
                assert!(
                    early.is_empty(),
                    "{what}: Open {early:?} after the Anchor splits it"
                );
            }
        }
        if by_close {
            closed += 1;
        } else {
            assert!(
                a.iter().any(|h| h.0 == 0 && h.2 == e),
                "{what}: neither a Close nor the Anchor ends the step"
            );
        }
    }
    closed
}

/// Selects the template of `s` on `l`, checks every rank, returns (template, steps closed by a
/// Close, steps).
fn check(s: &Scenario, l: &Layout) -> (String, usize, usize) {
    let set = TemplateSet::builtin();
    let j = job(s, l);
    let f = Features::of_job(&j.roles, &j.obs);
    let t = set
        .select(&f)
        .unwrap_or_else(|| panic!("{}: no template for {:?}", s.name, f.0));
    let mut closed = 0;
    for (rank, steps) in j.steps.iter().enumerate() {
        closed += check_rank(t, rank, steps);
    }
    (t.name.clone(), closed, l.world() * STEPS as usize)
}

#[test]
fn shipped_scenarios_select_their_template_and_every_step_matches() {
    for (name, want) in [
        ("megatron", "megatron-1f1b"),
        ("pipeline", "megatron-1f1b"),
        ("torch_megatron", "megatron-1f1b"),
        ("moe", "megatron-1f1b-moe"),
        ("torch_moe", "megatron-1f1b-moe"),
        ("fsdp", "fsdp"),
        ("ddp", "ddp"),
        ("decode", "decode"),
    ] {
        let s = scenario(name);
        for l in [s.layout(), s.layout().rescaled(16).unwrap()] {
            let (got, closed, steps) = check(&s, &l);
            assert_eq!(got, want, "{name} on {l:?}");
            assert_eq!(closed, steps, "{name}: every step ends with a Close");
        }
    }
}

#[test]
fn other_layouts_select_the_right_variant_and_every_step_matches() {
    let megatron = scenario("megatron");
    let mut distopt = megatron.clone();
    distopt.workload.dp_sync = DpSync::ReduceScatterAllGather;
    let mut one_mb = megatron.clone();
    one_mb.workload.microbatches = 1;
    let moe = scenario("moe");
    let mut moe_ar = moe.clone();
    moe_ar.workload.dp_sync = DpSync::AllReduce;
    let fsdp = scenario("fsdp");
    let decode = scenario("decode");
    let ddp = scenario("ddp");
    // (scenario, tp, cp, dp, pp, ep, template, every step closed by a Close)
    let cases: &[(&Scenario, [usize; 5], &str, bool)] = &[
        (&distopt, [2, 1, 2, 2, 1], "megatron-1f1b-distopt", true),
        (&distopt, [1, 1, 2, 4, 1], "megatron-1f1b-distopt", true),
        (&megatron, [2, 2, 2, 2, 1], "megatron-1f1b-cp", true),
        (&distopt, [1, 2, 2, 3, 1], "megatron-1f1b-cp", true),
        (&moe, [1, 2, 4, 2, 4], "megatron-1f1b-cp", true),
        (&moe, [2, 1, 4, 2, 2], "megatron-1f1b-moe", true),
        (&moe_ar, [1, 1, 4, 2, 4], "megatron-1f1b-moe", true),
        (&moe, [1, 1, 4, 1, 4], "megatron-1f1b-moe", true),
        (&megatron, [2, 1, 4, 1, 1], "megatron-1f1b", true),
        (&megatron, [1, 1, 2, 4, 1], "megatron-1f1b", true),
        (&one_mb, [1, 1, 2, 4, 1], "megatron-1f1b", true),
        (&megatron, [2, 1, 1, 2, 1], "megatron-1f1b", false),
        (&megatron, [1, 1, 1, 4, 1], "megatron-1f1b", false),
        // Megatron's distributed optimizer without a pipeline has FSDP's features.
        (&distopt, [2, 1, 4, 1, 1], "fsdp", true),
        (&distopt, [1, 1, 4, 1, 1], "fsdp", true),
        (&fsdp, [1, 1, 4, 1, 1], "fsdp", true),
        (&decode, [4, 1, 1, 1, 1], "decode", true),
        (&decode, [2, 1, 1, 3, 1], "decode", true),
        (&ddp, [1, 1, 2, 1, 1], "ddp", true),
        (&megatron, [1, 1, 8, 1, 1], "ddp", true),
    ];
    for &(s, [tp, cp, dp, pp, ep], want, all_closed) in cases {
        let l = Layout::new(tp, cp, dp, pp, ep);
        let (got, closed, steps) = check(s, &l);
        assert_eq!(got, want, "{} on {l:?}", s.name);
        if all_closed {
            assert_eq!(
                closed, steps,
                "{} on {l:?}: every step ends with a Close",
                s.name
            );
        } else {
            assert_eq!(
                closed, 0,
                "{} on {l:?}: no DP sync, the Anchor ends steps",
                s.name
            );
        }
    }
}

/// How the selected template's phases label the test bed's own compute (`plan::Phase`) inside
/// each step, every op taking 10 µs: (compute stretches in a labeled phase, ones labeled wrong
/// (a forward stretch in `backward`, ...), all stretches inside steps), per plan phase.
fn phase_accuracy(
    s: &Scenario,
    l: &Layout,
) -> (String, BTreeMap<&'static str, (usize, usize, usize)>) {
    use crate::steps::phase::{spans, Phase};
    use comminsight_testbed::plan::{Op, Phase as Tb};
    let set = TemplateSet::builtin();
    let j = job(s, l);
    let t = set
        .select(&Features::of_job(&j.roles, &j.obs))
        .expect("template")
        .clone();
    let mut acc: BTreeMap<&'static str, (usize, usize, usize)> = BTreeMap::new();
    for p in plan::build(s, l, STEPS, &[]).unwrap() {
        let mut clock = 0u64;
        let mut sn = 0u64;
        for (i, step) in p.steps.iter().enumerate() {
            let mut ops: Vec<(StepOp, u64)> = Vec::new();
            let mut compute: Vec<(u64, u64, Tb)> = Vec::new();
            for o in step {
                if let Op::Compute { us, phase } = o {
                    compute.push((clock, clock + us, *phase));
                    clock += us;
                }
                for ev in op_events(o, i as u32, l) {
                    let op = StepOp {
                        comm_hash: hash(l, p.rank, ev.role),
                        role: Some(role(ev.role)),
                        func: func(ev.func),
                        bytes: ev.bytes,
                        coll_sn: 0,
                        coll_local_sn: sn,
                        start_us: clock,
                    };
                    sn += 1;
                    clock += 10;
                    ops.push((op, clock));
                }
            }
            let (first, last) = (ops[0].0.start_us, ops[ops.len() - 1].1);
            let sp = spans(&t.phases, &ops, last);
            let total: u64 = sp.iter().map(|x| x.to_us - x.from_us).sum();
            assert!(total <= last - first, "{}: phases exceed the step", t.name);
            for &(a, b, ph) in &compute {
                let (want, name) = match ph {
                    Tb::Forward => (Phase::Forward, "forward"),
                    Tb::Backward => (Phase::Backward, "backward"),
                    Tb::Optimizer => (Phase::Optimizer, "optimizer"),
                    _ => continue,
                };
                if a < first || b > last {
                    continue;
                }
                let e = acc.entry(name).or_default();
                e.2 += 1;
                let mid = (a + b) / 2;
                if let Some(x) = sp.iter().find(|x| (x.from_us..x.to_us).contains(&mid)) {
                    e.0 += 1;
                    e.1 += usize::from(x.phase != want);
                }
            }
        }
    }
    (t.name, acc)
}

#[test]
fn phases_label_the_test_beds_compute_where_the_template_can_tell() {
    let megatron = scenario("megatron");
    let mut cp = megatron.clone();
    cp.workload.microbatches = 6;
    let moe = scenario("moe");
    let mut distopt = megatron.clone();
    distopt.workload.dp_sync = DpSync::ReduceScatterAllGather;
    // (scenario, layout, template, plan phases every stretch of which must be labeled). Not here:
    // CP with tp = 1, whose last stage computes a forward's tail and the backward's head between
    // the same two collectives (megatron.toml: labeled backward).
    let cases: &[(&Scenario, [usize; 5], &str, &[&str])] = &[
        (
            &scenario("fsdp"),
            [2, 1, 8, 1, 1],
            "fsdp",
            &["forward", "backward", "optimizer"],
        ),
        (
            &scenario("fsdp"),
            [1, 1, 4, 1, 1],
            "fsdp",
            &["forward", "backward", "optimizer"],
        ),
        (
            &cp,
            [2, 2, 2, 2, 1],
            "megatron-1f1b-cp",
            &["forward", "backward"],
        ),
        (
            &cp,
            [2, 2, 2, 3, 1],
            "megatron-1f1b-cp",
            &["forward", "backward"],
        ),
        (
            &moe,
            [2, 2, 4, 2, 4],
            "megatron-1f1b-cp",
            &["forward", "backward"],
        ),
        (
            &scenario("ddp"),
            [1, 1, 16, 1, 1],
            "ddp",
            &["backward", "optimizer"],
        ),
        (&megatron, [2, 1, 2, 4, 1], "megatron-1f1b", &[]),
        (&moe, [2, 1, 4, 2, 2], "megatron-1f1b-moe", &[]),
        (&distopt, [2, 1, 2, 2, 1], "megatron-1f1b-distopt", &[]),
        (&distopt, [2, 1, 4, 1, 1], "fsdp", &[]),
        (&scenario("decode"), [4, 1, 1, 4, 1], "decode", &[]),
    ];
    for &(s, [tp, cp, dp, pp, ep], want, full) in cases {
        let l = Layout::new(tp, cp, dp, pp, ep);
        let (got, acc) = phase_accuracy(s, &l);
        assert_eq!(got, want, "{} on {l:?}", s.name);
        for (name, (labeled, wrong, total)) in &acc {
            assert_eq!(*wrong, 0, "{want} on {l:?}: {name} labeled wrong: {acc:?}");
            if full.contains(name) {
                assert_eq!(
                    labeled, total,
                    "{want} on {l:?}: {name} not all labeled: {acc:?}"
                );
            }
        }
        for name in full {
            assert!(
                acc.get(name).is_some_and(|a| a.2 > 0),
                "{want}: no {name} in steps"
            );
        }
    }
}

//! `--synthetic`: no processes. Simulate every rank's timeline ([`crate::sim`]) and write the
//! records the plugin would have written, per rank, into the same
//! `DIR/inspector_logs/<job>/<host>/<pid>/` layout (fake distinct pids, `FLAG_SYNTHETIC`), with the
//! same `truth.json`. Hung ranks' peers get `overdue` records (and `FLAG_INCOMPLETE` op records at
//! exit) instead of completions; an op that lasts longer than the overdue threshold but ends (a
//! peer's `stall`) gets its `overdue` records (repeat 0 at enqueue + threshold, then the plugin's
//! backoff) and later its completion, in the order the plugin pushes them; `loss` drops records
//! and the truth boundaries reflect it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use comminsight_wire::record::{
    Body, CommFini, CommInit, OpRecord, Overdue, ProcStart, RawRecord, Record, Stats, Timing,
    FLAG_INCOMPLETE, FLAG_SYNTHETIC,
};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};
use comminsight_wire::{Algo, DataType, Func, Proto};

use crate::fault::{parse_rate, Fault};
use crate::layout::{host_of, Layout, Role};
use crate::plan::{CollFunc, Op, RankPlan};
use crate::runner::{prepare_out, rank_hosts, RunError};
use crate::sim::{
    op_events, simulate, uniform, EvFunc, OpEvent, RankState, RankTimeline, SimConfig,
};
use crate::truth::{self, PartialStep, RunFacts, Truth, TruthComm, TruthError};

/// First fake pid; rank r gets `FAKE_PID_BASE + r`.
pub const FAKE_PID_BASE: u32 = 1_000_000;
/// Profiler ABI the synthetic records claim.
pub const SYNTHETIC_ABI: u8 = 6;
/// Compute phases of synthetic ranks vary by ±2.5 % (seeded), so waits are never all zero.
pub const SYNTHETIC_JITTER: f64 = 0.05;
/// NCCL version the synthetic records claim.
pub const SYNTHETIC_NCCL_VERSION: &str = "2.30.7";

#[derive(Clone, Debug)]
pub struct SyntheticConfig {
    pub layout: Layout,
    pub hosts: usize,
    pub steps: u32,
    pub seed: u64,
    pub faults: Vec<Fault>,
    pub out: PathBuf,
    pub job: String,
    pub scenario: String,
    /// Age at which an unfinished operation is reported overdue.
    pub overdue_ms: u64,
    /// Write role-based `commName`s into the `comm_init` records (the scenario's `named_comms`,
    /// false with the torch frontend); `truth.json` names the groups either way.
    pub named_comms: bool,
}

#[derive(Debug)]
pub struct SyntheticOutcome {
    pub truth: Truth,
    pub wall: Duration,
    /// Records written, all ranks together (segment headers not counted).
    pub records: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SyntheticError {
    #[error(transparent)]
    Out(#[from] RunError),
    #[error(transparent)]
    Truth(#[from] TruthError),
    #[error("slowlink {a}->{b}: both ranks are on host{host}; use --hosts so they sit on different hosts")]
    SameHost { a: usize, b: usize, host: usize },
    #[error("{0}")]
    Rate(String),
    #[error("droplink loses real packets: run it with `run` (real processes), not `synthetic`")]
    Droplink,
}

/// Deterministic communicator hash (FNV-1a over job, seed and group name).
pub fn comm_hash(job: &str, seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes().chain(seed.to_le_bytes()).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn func_code(f: EvFunc) -> Func {
    match f {
        EvFunc::Coll(CollFunc::AllReduce) => Func::ALL_REDUCE,
        EvFunc::Coll(CollFunc::AllGather) => Func::ALL_GATHER,
        EvFunc::Coll(CollFunc::ReduceScatter) => Func::REDUCE_SCATTER,
        EvFunc::Coll(CollFunc::AllToAll) => Func::ALL_TO_ALL,
        EvFunc::Send => Func::SEND,
        EvFunc::Recv => Func::RECV,
    }
}

fn sim_config(cfg: &SyntheticConfig) -> Result<SimConfig, SyntheticError> {
    let world = cfg.layout.world();
    let mut sc = SimConfig {
        rank_host: (0..world).map(|r| host_of(r, world, cfg.hosts)).collect(),
        jitter: SYNTHETIC_JITTER,
        seed: cfg.seed,
        ..SimConfig::default()
    };
    for f in &cfg.faults {
        if matches!(f, Fault::Droplink { .. }) {
            return Err(SyntheticError::Droplink);
        }
        if let Fault::Slowlink { a, b, rate } = f {
            let (ha, hb) = (sc.rank_host[*a], sc.rank_host[*b]);
            if ha == hb {
                return Err(SyntheticError::SameHost {
                    a: *a,
                    b: *b,
                    host: ha,
                });
            }
            sc.slow_links
                .push((ha, hb, parse_rate(rate).map_err(SyntheticError::Rate)?));
        }
    }
    Ok(sc)
}

/// Events a blocked rank's host still enqueued after the op it waits on, up to its step's end
/// (the host runs ahead of the stream until it synchronizes).
fn enqueued_after_block(tl: &RankTimeline, plan: &RankPlan, layout: &Layout) -> Vec<OpEvent> {
    let Some((step, idx)) = tl.stopped_at else {
        return Vec::new();
    };
    let Some(ops) = plan.steps.get(step as usize) else {
        return Vec::new();
    };
    let mut t = tl.events.last().map_or(0, |e| e.start_ns);
    // The counters go on where the timeline stopped: NCCL numbers an op when it is enqueued.
    let mut next: std::collections::HashMap<(Role, EvFunc, Option<usize>), u64> =
        std::collections::HashMap::new();
    let key = |e: &OpEvent| match e.func {
        EvFunc::Coll(_) => (e.role, e.func, None),
        EvFunc::Send | EvFunc::Recv => (e.role, e.func, e.peer),
    };
    for e in &tl.events {
        let n = next.entry(key(e)).or_insert(0);
        *n = (*n).max(e.coll_sn + 1);
    }
    let mut out = Vec::new();
    for op in ops.iter().skip(idx + 1) {
        match op {
            Op::Compute { us, .. } => t += us * 1000,
            Op::Hang | Op::Pyhang | Op::Kill => break,
            _ => out.extend(op_events(op, step, layout).into_iter().map(|mut e| {
                e.start_ns = t;
                let n = next.entry(key(&e)).or_insert(0);
                e.coll_sn = *n;
                *n += 1;
                e
            })),
        }
    }
    out
}

/// Longest interval between two overdue reports of one op (the plugin's `OVERDUE_CAP_NS`).
const OVERDUE_CAP_NS: u64 = 600_000_000_000;

/// The plugin's overdue backoff (`next_overdue_age` in plugin/src/drain.rs): report `repeat + 1`
/// is due `threshold × 2^repeat` (at most the cap) after report `repeat`.
fn next_overdue_age(age_ns: u64, repeat: u32, threshold_ns: u64) -> u64 {
    let interval = if repeat >= 63 {
        OVERDUE_CAP_NS
    } else {
        threshold_ns
            .saturating_mul(1u64 << repeat)
            .min(OVERDUE_CAP_NS)
    };
    age_ns.saturating_add(interval.max(1))
}

/// Ages (ns) at which the plugin reports an op of `dur_ns` overdue: repeat 0 at the threshold,
/// then with its backoff while the op is still in flight. `None`: the op never ends (repeat 0 only).
fn overdue_ages(threshold_ms: u64, dur_ns: Option<u64>) -> Vec<u64> {
    let t = threshold_ms.saturating_mul(1_000_000);
    if t == 0 {
        return Vec::new();
    }
    let Some(dur) = dur_ns else {
        return vec![t];
    };
    let mut ages = Vec::new();
    let mut age = t;
    while age < dur {
        ages.push(age);
        age = next_overdue_age(age, ages.len() as u32 - 1, t);
    }
    ages
}

/// Emission time of a record that is written when the rank ends (incomplete ops at exit).
const AT_EXIT: u64 = u64::MAX;

struct RankWriter<'a> {
    cfg: &'a SyntheticConfig,
    pid: u32,
    seq: u64,
    recs: Vec<RawRecord>,
    /// Op and overdue records with the host time the plugin would push them, sorted (stably)
    /// before they are written: an overdue record when the drain finds the op late, an op record
    /// when the op ends (or at exit when it never does).
    timed: Vec<(u64, Body, u16)>,
}

impl RankWriter<'_> {
    fn push(&mut self, body: Body, extra_flags: u16) {
        let mut r = Record::new(body);
        r.seq = self.seq;
        r.flags = FLAG_SYNTHETIC | extra_flags;
        self.seq += 1;
        self.recs.push(r.encode());
    }

    /// Write the op and overdue records gathered by [`RankWriter::op`] in emission order.
    fn flush_timed(&mut self) {
        let mut timed = std::mem::take(&mut self.timed);
        timed.sort_by_key(|(t, _, _)| *t);
        for (_, body, flags) in timed {
            self.push(body, flags);
        }
    }

    fn op(&mut self, e: &OpEvent, sn: u64, comm: u64, comm_rank: i32, peer: i32) {
        let (end, flags) = match e.end_ns {
            Some(t) => (t, 0),
            None => (0, FLAG_INCOMPLETE),
        };
        let o = OpRecord {
            comm_hash: comm,
            coll_sn: e.coll_sn,
            coll_local_sn: sn,
            count: e.count,
            bytes: e.bytes,
            enqueue_ns: e.start_ns,
            start_ns: e.start_ns,
            end_ns: end,
            gpu_start_ns: if end > 0 { e.start_ns } else { 0 },
            gpu_end_ns: end,
            api_ns: e.start_ns,
            rank: comm_rank,
            root: -1,
            peer,
            func: func_code(e.func),
            datatype: DataType::from_name("ncclFloat32"),
            algo: Algo::from_name(if peer >= 0 { "Unknown" } else { "RING" }),
            proto: Proto::from_name("SIMPLE"),
            nchannels: 1,
            nwarps: 16,
            timing: if end > 0 {
                Timing::KernelGpu
            } else {
                Timing::Enqueue
            },
            channels_done: u8::from(end > 0),
        };
        let threshold = self.cfg.overdue_ms;
        let dur = e.end_ns.map(|t| t.saturating_sub(e.start_ns));
        for (repeat, age) in overdue_ages(threshold, dur).into_iter().enumerate() {
            let now_ns = e.start_ns + age;
            let body = Body::Overdue(Overdue {
                comm_hash: comm,
                coll_sn: e.coll_sn,
                coll_local_sn: sn,
                enqueue_ns: e.start_ns,
                start_ns: 0,
                now_ns,
                count: e.count,
                bytes: e.bytes,
                age_ms: (age / 1_000_000).min(u64::from(u32::MAX)) as u32,
                repeat: repeat as u32,
                threshold_ms: threshold.min(u64::from(u32::MAX)) as u32,
                rank: comm_rank,
                peer,
                func: o.func,
                phase: 0,
                channels_started: 0,
                channels_done: 0,
                is_p2p: u8::from(peer >= 0),
                nchannels: 1,
            });
            self.timed.push((now_ns, body, 0));
        }
        let body = if peer >= 0 {
            Body::P2p(o)
        } else {
            Body::Coll(o)
        };
        self.timed
            .push((if end > 0 { end } else { AT_EXIT }, body, flags));
    }
}

/// Write one rank's records; returns (truth steps, partial step, records written).
#[allow(
    clippy::type_complexity,
    reason = "a private triple, named at the one call site"
)]
fn write_rank(
    cfg: &SyntheticConfig,
    tl: &RankTimeline,
    plan: &RankPlan,
    loss_pct: f64,
    hashes: &[(Role, String, u64)],
    start_ns: u64,
) -> (Vec<Option<[u64; 2]>>, Option<PartialStep>, u64) {
    let l = &cfg.layout;
    let world = l.world();
    let host = format!("host{}", host_of(tl.rank, world, cfg.hosts));
    let per_host = (world / cfg.hosts).max(1);
    let mut w = RankWriter {
        cfg,
        pid: FAKE_PID_BASE + tl.rank as u32,
        seq: 0,
        recs: Vec::with_capacity(tl.events.len() + 16),
        timed: Vec::with_capacity(tl.events.len() + 16),
    };
    w.push(
        Body::ProcStart(ProcStart {
            pid: w.pid,
            rank: tl.rank as i32,
            local_rank: (tl.rank % per_host) as i32,
            world_size: world as i32,
            mono_ns: start_ns - 1_000_000_000,
            real_ns: start_ns - 1_000_000_000,
            abi_version: SYNTHETIC_ABI,
            host: host.as_str().into(),
            job: cfg.job.as_str().into(),
        }),
        0,
    );
    let mut comm_of = std::collections::HashMap::new();
    for (role, name, hash) in hashes {
        let g = l.group_of(tl.rank, *role);
        let hosts: std::collections::BTreeSet<usize> = g
            .ranks
            .iter()
            .map(|r| host_of(*r, world, cfg.hosts))
            .collect();
        let comm_rank = g.comm_rank(tl.rank).unwrap_or(0) as i32;
        comm_of.insert(*role, (*hash, comm_rank, g));
        w.push(
            Body::CommInit(CommInit {
                comm_hash: *hash,
                nranks: l.size(*role) as u32,
                rank: comm_rank,
                nnodes: hosts.len() as u32,
                local_rank: (tl.rank % per_host) as i32,
                device: (tl.rank % per_host) as i32,
                abi_version: SYNTHETIC_ABI,
                time_ns: start_ns - 500_000_000,
                comm_name: name.as_str().into(),
            }),
            0,
        );
    }
    let mut events: Vec<OpEvent> = tl.events.clone();
    if matches!(tl.state, RankState::Blocked { .. }) {
        events.extend(enqueued_after_block(tl, plan, l));
    }
    let mut sn = 0u64;
    let mut steps: Vec<Option<[u64; 2]>> = Vec::new();
    let mut step_first: Vec<Option<u64>> = vec![None; tl.step_start_ns.len().max(1)];
    let mut step_last: Vec<Option<u64>> = vec![None; tl.step_start_ns.len().max(1)];
    for (i, e) in events.iter().enumerate() {
        if loss_pct > 0.0 && uniform(cfg.seed, tl.rank, i as u64) * 100.0 < loss_pct {
            continue;
        }
        let (hash, comm_rank, g) = &comm_of[&e.role];
        let peer = e.peer.and_then(|p| g.comm_rank(p)).map_or(-1, |p| p as i32);
        w.op(e, sn, *hash, *comm_rank, peer);
        let s = e.step as usize;
        if s >= step_first.len() {
            step_first.resize(s + 1, None);
            step_last.resize(s + 1, None);
        }
        step_first[s].get_or_insert(sn);
        step_last[s] = Some(sn);
        sn += 1;
    }
    w.flush_timed();
    for s in 0..tl.step_end_ns.len() {
        steps.push(step_first[s].zip(step_last[s]).map(|(a, b)| [a, b]));
    }
    let partial = (tl.state != RankState::Done).then(|| {
        let step = tl.step_end_ns.len();
        // Next coll_local_sn at the step's start = ops delivered in earlier steps.
        let before: u64 = (0..step)
            .filter_map(|s| steps.get(s).copied().flatten())
            .map(|[a, b]| b - a + 1)
            .sum();
        PartialStep {
            rank: tl.rank,
            step: step as u32,
            first_coll_local_sn: step_first.get(step).copied().flatten().unwrap_or(before),
        }
    });
    let end = tl.step_end_ns.last().copied().unwrap_or(start_ns);
    if tl.state == RankState::Done {
        for (hash, comm_rank, _) in comm_of.values() {
            w.push(
                Body::CommFini(CommFini {
                    comm_hash: *hash,
                    rank: *comm_rank,
                    time_ns: end,
                    ops: 0,
                    open_ops: 0,
                }),
                0,
            );
        }
    }
    let n = w.seq + 1;
    w.push(
        Body::Stats(Stats {
            time_ns: end,
            real_ns: end,
            mono_ns: end,
            records_pushed: n,
            event_mask: 0x747,
            ..Default::default()
        }),
        0,
    );
    let dir = cfg
        .out
        .join("inspector_logs")
        .join(&cfg.job)
        .join(&host)
        .join(w.pid.to_string());
    let mut sw = SegmentWriter::new(
        SegmentConfig {
            dir,
            ..SegmentConfig::default()
        },
        w.pid,
    );
    sw.write(&w.recs);
    sw.seal();
    (steps, partial, w.recs.len() as u64)
}

/// Simulate `plans` and write every rank's segments and `DIR/truth.json`.
pub fn run(cfg: &SyntheticConfig, plans: &[RankPlan]) -> Result<SyntheticOutcome, SyntheticError> {
    let t0 = Instant::now();
    prepare_out(&cfg.out)?;
    let sc = sim_config(cfg)?;
    let timelines = simulate(plans, &cfg.layout, &sc);
    let loss_pct: f64 = cfg
        .faults
        .iter()
        .map(|f| match f {
            Fault::Loss { pct } => *pct,
            _ => 0.0,
        })
        .sum();
    let facts = RunFacts {
        job: cfg.job.clone(),
        scenario: cfg.scenario.clone(),
        seed: cfg.seed,
        hosts: cfg.hosts,
        synthetic: true,
        layout: cfg.layout,
        faults: cfg.faults.clone(),
        rank_hosts: rank_hosts(cfg.layout.world(), cfg.hosts),
    };
    let mut truth = Truth::new(&facts);
    truth.nccl_version = SYNTHETIC_NCCL_VERSION.into();
    for g in cfg.layout.all_groups() {
        let name = if g.role == Role::Global {
            String::new()
        } else {
            g.name.clone()
        };
        truth.comms.push(TruthComm {
            hash: truth::hex(comm_hash(&cfg.job, cfg.seed, &g.name)),
            name,
            role: g.role,
            ranks: g.ranks,
        });
    }
    let roles = cfg.layout.active_roles();
    let mut records = 0;
    for (tl, plan) in timelines.iter().zip(plans) {
        let hashes: Vec<(Role, String, u64)> = roles
            .iter()
            .map(|role| {
                let g = cfg.layout.group_of(tl.rank, *role);
                let name = if *role == Role::Global || !cfg.named_comms {
                    String::new()
                } else {
                    g.name.clone()
                };
                (*role, name, comm_hash(&cfg.job, cfg.seed, &g.name))
            })
            .collect();
        let (steps, partial, n) = write_rank(cfg, tl, plan, loss_pct, &hashes, sc.start_ns);
        records += n;
        truth.steps.insert(tl.rank, steps);
        truth.step_times_ns.insert(
            tl.rank,
            tl.step_start_ns
                .iter()
                .zip(&tl.step_end_ns)
                .map(|(a, b)| [*a, *b])
                .collect(),
        );
        truth.partial_steps.extend(partial);
        let info = truth.rank_info.entry(tl.rank).or_default();
        info.pid = Some(FAKE_PID_BASE + tl.rank as u32);
        info.status = match tl.state {
            RankState::Done => "done".into(),
            RankState::Hung { step } => format!("hung in step {step}"),
            RankState::Killed { step } => format!("killed in step {step}"),
            RankState::Blocked { step } => format!("blocked in step {step}"),
        };
    }
    truth.write(&cfg.out.join("truth.json"))?;
    Ok(SyntheticOutcome {
        truth,
        wall: t0.elapsed(),
        records,
    })
}

/// Segment directory of `rank` (for tests and docs).
pub fn rank_dir(out: &Path, job: &str, rank: usize, world: usize, hosts: usize) -> PathBuf {
    out.join("inspector_logs")
        .join(job)
        .join(format!("host{}", host_of(rank, world, hosts)))
        .join((FAKE_PID_BASE + rank as u32).to_string())
}

#[cfg(test)]
mod tests;

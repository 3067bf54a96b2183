//! The analyses over arbitrary *valid-shaped* records (every value within the wire bounds,
//! some at them): a job of up to four processes whose `proc_start`, `comm_init`, operation,
//! `overdue`, `stats` and `comm_fini` records are built from the fuzz input, fed in arbitrary
//! batches through the engine the daemon and the offline commands share (metrics, roles and
//! topology, hang tracker, steps, straggler arrivals), then the roles, the hang analysis and the
//! straggler analysis over what it produced. Nothing may panic (overflow checks are on).
#![no_main]

use arbitrary::Arbitrary;
use comminsight_agent::engine::{Builtins, Engine, Output};
use comminsight_agent::hang::{self, HangSettings};
use comminsight_agent::steps::engine::StepSettings;
use comminsight_agent::steps::template::TemplateSet;
use comminsight_agent::straggler::{self, StragglerSettings};
use comminsight_agent::StreamId;
use comminsight_wire::bounds::{MAX_BYTES, MAX_RANKS, MAX_SEQ, MAX_TIME_NS};
use comminsight_wire::names::Func;
use comminsight_wire::record::{
    Body, CommFini, CommInit, OpRecord, Overdue, ProcStart, RawRecord, Record, Stats, Timing,
    FLAG_INCOMPLETE,
};
use libfuzzer_sys::fuzz_target;

const STREAMS: usize = 4;
const T0: u64 = 1_764_425_999_000_000_000;

/// A 64-bit value: small (the usual), or anywhere below `bound` (the edges).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Val {
    Small(u16),
    Wild(u64),
    Edge,
}

impl Val {
    fn get(self, bound: u64) -> u64 {
        match self {
            Val::Small(v) => u64::from(v) % bound,
            Val::Wild(v) => v % bound,
            Val::Edge => bound - 1,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Rec {
    ProcStart {
        rank: u8,
        world: u8,
    },
    CommInit {
        comm: u8,
        nranks: Val,
        rank: Val,
    },
    Op {
        comm: u8,
        func: u8,
        p2p: bool,
        peer: u8,
        sn: Val,
        lsn: Option<Val>,
        dt: Val,
        dur: Val,
        gpu: bool,
        incomplete: bool,
        bytes: Val,
    },
    Overdue {
        comm: u8,
        sn: Val,
        age: Val,
    },
    Stats {
        dt: Val,
    },
    CommFini {
        comm: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// (stream, record) in arrival order.
    recs: Vec<(u8, Rec)>,
    /// Batch sizes the streams' records are applied in.
    batches: Vec<u8>,
}

/// Per stream: its clock and counters while building.
#[derive(Default, Clone)]
struct Gen {
    now: u64,
    lsn: u64,
    seq: u64,
    recs: Vec<RawRecord>,
}

fn build(g: &mut Gen, rec: &Rec) -> Record {
    let comm_hash = |c: &u8| 0x1000 + u64::from(*c % 4);
    let body = match rec {
        Rec::ProcStart { rank, world } => Body::ProcStart(ProcStart {
            pid: 1,
            rank: i32::from(*rank % 16),
            local_rank: 0,
            world_size: i32::from(*world % 16).max(i32::from(*rank % 16) + 1),
            mono_ns: 1_000,
            real_ns: T0,
            abi_version: 5,
            host: "h".into(),
            job: "fuzz".into(),
        }),
        Rec::CommInit { comm, nranks, rank } => {
            let n = nranks.get(u64::from(MAX_RANKS)) as u32 + 1;
            Body::CommInit(CommInit {
                comm_hash: comm_hash(comm),
                nranks: n,
                rank: rank.get(u64::from(n)) as i32,
                nnodes: 1,
                local_rank: 0,
                device: 0,
                abi_version: 5,
                time_ns: g.now,
                comm_name: "dp:fuzz".into(),
            })
        }
        Rec::Op {
            comm,
            func,
            p2p,
            peer,
            sn,
            lsn,
            dt,
            dur,
            gpu,
            incomplete,
            bytes,
        } => {
            g.now = (g.now + dt.get(1 << 40)).min(MAX_TIME_NS - (1 << 41));
            let end = if *incomplete {
                0
            } else {
                g.now + dur.get(1 << 40)
            };
            let coll_local_sn = lsn.map_or(g.lsn, |v| v.get(MAX_SEQ));
            g.lsn = coll_local_sn.saturating_add(1) % MAX_SEQ;
            let op = OpRecord {
                comm_hash: comm_hash(comm),
                coll_sn: sn.get(MAX_SEQ),
                coll_local_sn,
                count: bytes.get(MAX_BYTES) / 4,
                bytes: bytes.get(MAX_BYTES),
                enqueue_ns: g.now,
                start_ns: g.now,
                end_ns: end,
                gpu_start_ns: if *gpu { g.now } else { 0 },
                gpu_end_ns: if *gpu { end } else { 0 },
                rank: 0,
                root: -1,
                peer: if *p2p { i32::from(*peer % 16) } else { -1 },
                func: Func(*func % 13),
                nchannels: 2,
                timing: if *gpu {
                    Timing::KernelGpu
                } else {
                    Timing::KernelCpu
                },
                channels_done: 2,
                ..Default::default()
            };
            let mut r = Record::new(if *p2p { Body::P2p(op) } else { Body::Coll(op) });
            if *incomplete {
                r.flags = FLAG_INCOMPLETE;
            }
            return stamp(g, r);
        }
        Rec::Overdue { comm, sn, age } => Body::Overdue(Overdue {
            comm_hash: comm_hash(comm),
            coll_sn: sn.get(MAX_SEQ),
            coll_local_sn: g.lsn,
            enqueue_ns: g.now,
            now_ns: g.now + age.get(1 << 40),
            age_ms: 31_000,
            threshold_ms: 30_000,
            peer: -1,
            func: Func::ALL_REDUCE,
            ..Default::default()
        }),
        Rec::Stats { dt } => Body::Stats(Stats {
            time_ns: g.now,
            mono_ns: 1_000 + dt.get(1 << 50),
            real_ns: T0 + dt.get(1 << 50),
            ..Default::default()
        }),
        Rec::CommFini { comm } => Body::CommFini(CommFini {
            comm_hash: comm_hash(comm),
            rank: 0,
            time_ns: g.now,
            ops: g.lsn,
            open_ops: 0,
        }),
    };
    stamp(g, Record::new(body))
}

fn stamp(g: &mut Gen, mut r: Record) -> Record {
    r.seq = g.seq;
    g.seq += 1;
    r
}

/// The built-in templates, parsed once (parsing them is most of a small input's time).
fn templates() -> TemplateSet {
    static BUILTIN: std::sync::OnceLock<TemplateSet> = std::sync::OnceLock::new();
    BUILTIN.get_or_init(TemplateSet::builtin).clone()
}

fuzz_target!(|input: Input| {
    let mut gens = vec![
        Gen {
            now: T0,
            ..Default::default()
        };
        STREAMS
    ];
    for (s, rec) in input.recs.iter().take(4096) {
        let g = &mut gens[usize::from(*s) % STREAMS];
        let r = build(g, rec);
        let raw = r.encode();
        assert!(
            Record::decode(&raw).is_ok(),
            "valid-shaped record rejected: {r:?}"
        );
        g.recs.push(raw);
    }
    let mut engine = Engine::new(Builtins::daemon(64));
    engine.enable_steps(templates(), StepSettings::default());
    let ids: Vec<StreamId> = (0..STREAMS)
        .map(|i| StreamId::new("fuzz", "h", &(100 + i).to_string()))
        .collect();
    let mut out = Vec::new();
    let mut at = [0usize; STREAMS];
    let mut sizes = input.batches.iter().cycle();
    let mut left = true;
    while left {
        left = false;
        for (i, g) in gens.iter().enumerate() {
            let n = sizes.next().map_or(64, |b| usize::from(*b) + 1);
            let end = (at[i] + n).min(g.recs.len());
            if at[i] < end {
                engine.apply(&ids[i], &g.recs[at[i]..end], None, &mut [], &mut out);
                at[i] = end;
                left = true;
            }
        }
        engine.round(&mut out);
    }
    for id in &ids {
        engine.end_stream(id, &mut [], &mut out);
    }
    engine.round(&mut out);
    let _ = engine.roles();
    let _ = engine.snapshot();
    let now_us = gens.iter().map(|g| g.now).max().unwrap_or(T0) / 1000;
    let snap = engine.hang_snapshot("fuzz", now_us, 0);
    let _ = hang::analyze(&snap, &HangSettings::default(), &[]);
    let steps = out
        .into_iter()
        .filter_map(|o| match o {
            Output::Step(s) => s.arrivals,
            _ => None,
        })
        .collect();
    let _ = straggler::analyze("fuzz", steps, &StragglerSettings::default());
});

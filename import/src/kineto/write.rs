//! A read trace turned into one record stream (see the module documentation of `kineto`).

use std::collections::HashMap;
use std::path::Path;

use comminsight_wire::bounds::{MAX_BYTES, MAX_RANKS};
use comminsight_wire::names::Func;
use comminsight_wire::record::{Body, CommInit, OpRecord, Timing};

use super::{fnv1a64, CommKey, Kernel, KinetoTrace};
use crate::out::{StreamIdent, StreamOut};
use crate::{Format, ImportError, ImportSummary};

/// A Kineto GPU-event `pid` below this is a device index, not a process id.
const MIN_GPU_OS_PID: i64 = 1024;
/// Highest Linux pid.
const MAX_PID: i64 = 1 << 22;

/// The stream identity of a trace.
pub(super) fn ident(t: &KinetoTrace, job: &str) -> StreamIdent {
    let world = if t.world > 0 && (t.world as u32) <= MAX_RANKS {
        t.world
    } else {
        -1
    };
    let rank = if t.rank >= 0 && (world < 0 || t.rank < world) {
        t.rank
    } else {
        -1
    };
    let pid = t
        .cpu_pid
        .filter(|p| (2..=MAX_PID).contains(p))
        .or(t.gpu_pid.filter(|p| (MIN_GPU_OS_PID..=MAX_PID).contains(p)))
        .unwrap_or(i64::from(rank.max(0)));
    StreamIdent {
        job: job.to_string(),
        host: t
            .hostname
            .clone()
            .unwrap_or_else(|| format!("rank{}", t.rank)),
        pid: pid as u32,
        rank,
        world,
    }
}

/// The `comm_init` of a communicator (its `time_ns` and device filled in by the caller).
pub(super) fn comm_init(key: &CommKey, rank: i32, world: i32) -> CommInit {
    let (hash, nranks, crank, name) = match key {
        CommKey::Pg {
            name,
            desc,
            ranks,
            size,
        } => {
            let nranks = match (ranks, size) {
                (Some(r), _) if !r.is_empty() => r.len() as u64,
                (_, Some(s)) => *s,
                _ => 0,
            };
            let nranks = if nranks <= u64::from(MAX_RANKS) {
                nranks as u32
            } else {
                0
            };
            let crank = ranks
                .as_ref()
                .and_then(|r| r.iter().position(|x| *x == i64::from(rank)))
                .map_or(-1, |i| i as i32);
            let cname = if desc.is_empty() {
                name.clone()
            } else {
                format!("{desc}:{name}")
            };
            (fnv1a64(&format!("kineto:pg:{name}")), nranks, crank, cname)
        }
        CommKey::Stream { stream, .. } => {
            let nranks = world.max(0) as u32;
            (
                fnv1a64(&format!("kineto:stream:{stream}")),
                nranks,
                rank,
                format!("stream{stream}"),
            )
        }
    };
    let crank = if crank >= 0 && (nranks == 0 || (crank as u32) < nranks) {
        crank
    } else {
        -1
    };
    CommInit {
        comm_hash: hash,
        nranks,
        rank: crank,
        nnodes: 0,
        local_rank: -1,
        device: -1,
        abi_version: 0,
        time_ns: 0,
        comm_name: name.as_str().into(),
    }
}

fn is_p2p(f: Func) -> bool {
    matches!(f, Func::SEND | Func::RECV | Func::SEND_RECV)
}

/// The op record of one kernel, or the reason it is skipped.
fn op(k: &Kernel, t: &KinetoTrace, c: &CommInit) -> Result<OpRecord, &'static str> {
    let start = t
        .absolute(k.start)
        .ok_or("NCCL kernel time outside 0..2^62 ns")?;
    let end = t
        .absolute(k.start + i128::from(k.dur))
        .ok_or("NCCL kernel time outside 0..2^62 ns")?;
    let bytes = k.count.saturating_mul(k.dtype.size());
    if k.count >= MAX_BYTES || bytes >= MAX_BYTES {
        return Err("NCCL kernel with a message size beyond 2^48");
    }
    Ok(OpRecord {
        comm_hash: c.comm_hash,
        count: k.count,
        bytes,
        enqueue_ns: start,
        start_ns: start,
        end_ns: end,
        gpu_start_ns: start,
        gpu_end_ns: end,
        rank: c.rank,
        root: -1,
        peer: -1,
        func: k.func,
        datatype: k.dtype,
        algo: k.algo,
        proto: k.proto,
        nchannels: 1,
        timing: Timing::KernelGpu,
        channels_done: 1,
        ..OpRecord::default()
    })
}

/// Write the trace's kernels as one stream under `out`; nothing is written when it has none.
pub(super) fn write_trace(
    t: &KinetoTrace,
    job: &str,
    out: &Path,
) -> Result<ImportSummary, ImportError> {
    let mut sum = ImportSummary {
        files: 1,
        skipped: t.skips.clone(),
        ..ImportSummary::default()
    };
    let mut order: Vec<(u64, usize)> = Vec::with_capacity(t.kernels.len());
    for (i, k) in t.kernels.iter().enumerate() {
        match t.absolute(k.start) {
            Some(s) => order.push((s, i)),
            None => sum.skipped.add("NCCL kernel time outside 0..2^62 ns", 1),
        }
    }
    if order.is_empty() {
        return Ok(sum);
    }
    order.sort_unstable();
    let id = ident(t, job);
    let mut s = StreamOut::create(out, &id, Format::Kineto.source(), order[0].0);
    let mut inits: Vec<Option<CommInit>> = vec![None; t.comms.len()];
    let mut sn: HashMap<(u32, Func), u64> = HashMap::new();
    let mut local = 0u64;
    for (start, i) in order {
        let k = &t.kernels[i];
        let Some(slot) = inits.get_mut(k.comm as usize) else {
            continue;
        };
        let c = slot.get_or_insert_with(|| {
            let mut c = comm_init(&t.comms[k.comm as usize], id.rank, id.world);
            c.time_ns = start;
            c.device = if k.device >= 0 && (k.device as u32) < MAX_RANKS {
                k.device
            } else {
                -1
            };
            s.push_preamble(Body::CommInit(c.clone()), 0);
            c.clone()
        });
        let mut o = match op(k, t, c) {
            Ok(o) => o,
            Err(why) => {
                sum.skipped.add(why, 1);
                continue;
            }
        };
        let n = sn.entry((k.comm, k.func)).or_insert(0);
        o.coll_sn = *n;
        *n += 1;
        o.coll_local_sn = local;
        local += 1;
        s.push(
            if is_p2p(k.func) {
                Body::P2p(o)
            } else {
                Body::Coll(o)
            },
            0,
        );
        sum.ops += 1;
    }
    sum.records = s.finish()?;
    sum.streams = 1;
    Ok(sum)
}

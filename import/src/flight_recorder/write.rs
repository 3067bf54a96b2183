//! Dumps turned into record streams: one per rank, a `comm_init` per group the rank is in, an
//! op record per entry that maps.

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_wire::bounds::{MAX_BYTES, MAX_RANKS, MAX_SEQ, MAX_TIME_NS};
use comminsight_wire::names::Func;
use comminsight_wire::record::{Body, CommInit, OpRecord, Timing, FLAG_INCOMPLETE};

use super::{comm_hash, FrDump, FrEntry};
use crate::out::{StreamIdent, StreamOut};
use crate::{Format, ImportError, ImportSummary, Skips};

/// Write one stream per dump under `out` (`<out>/<job>/rank<R>/<R>/seg-*.cis`, marked
/// `SOURCE_FLIGHT_RECORDER`). Entries that do not map to an operation are skipped and counted
/// in the summary. Two dumps of the same rank are an error naming both files.
pub fn write_streams(
    dumps: &[FrDump],
    job: &str,
    out: &Path,
) -> Result<ImportSummary, ImportError> {
    let mut seen: BTreeMap<i64, &Path> = BTreeMap::new();
    for d in dumps {
        if let Some(first) = seen.insert(d.rank, &d.path) {
            return Err(ImportError::format(
                &d.path,
                format!(
                    "rank {} is also the rank of {}; give one dump per rank",
                    d.rank,
                    first.display()
                ),
            ));
        }
    }
    let mut sum = ImportSummary::default();
    for d in dumps {
        let (records, ops, skips) = write_one(d, job, out)?;
        sum.files += 1;
        sum.streams += 1;
        sum.records += records;
        sum.ops += ops;
        sum.skipped.merge(&skips);
    }
    Ok(sum)
}

/// One dump's stream: (records, ops, skipped).
fn write_one(d: &FrDump, job: &str, out: &Path) -> Result<(u64, u64, Skips), ImportError> {
    let rank = i32::try_from(d.rank)
        .ok()
        .filter(|r| *r >= 0 && (*r as u32) < MAX_RANKS)
        .ok_or_else(|| ImportError::format(&d.path, format!("rank {} out of range", d.rank)))?;
    let world = i32::try_from(d.world())
        .ok()
        .filter(|w| *w > rank && (*w as u32) <= MAX_RANKS)
        .unwrap_or(-1);
    let t0 = d
        .entries
        .iter()
        .map(|e| e.time_created_ns)
        .filter(|t| *t < MAX_TIME_NS)
        .min()
        .unwrap_or(0);
    let ident = StreamIdent {
        job: job.to_string(),
        host: format!("rank{rank}"),
        pid: rank as u32,
        rank,
        world,
    };
    let mut s = StreamOut::create(out, &ident, Format::FlightRecorder.source(), t0);
    let mut skips = Skips::default();
    for (name, g) in &d.pg_config {
        let Some(me) = g.ranks.iter().position(|r| *r == d.rank) else {
            continue;
        };
        let Some(nranks) = u32::try_from(g.ranks.len())
            .ok()
            .filter(|n| *n <= MAX_RANKS)
        else {
            skips.add(
                "process group with more ranks than a communicator may have",
                1,
            );
            continue;
        };
        let init = CommInit {
            comm_hash: comm_hash(name),
            nranks,
            rank: me as i32,
            nnodes: 0,
            local_rank: -1,
            device: -1,
            abi_version: 0,
            time_ns: t0,
            comm_name: format!("{}:{}", g.desc, name).as_str().into(),
        };
        s.push_preamble(Body::CommInit(init), 0);
    }
    let mut ops = 0u64;
    for e in &d.entries {
        match op_record(d, e, ops) {
            Ok((body, flags)) => {
                s.push(body, flags);
                ops += 1;
            }
            Err(why) => skips.add(why, 1),
        }
    }
    let records = s.finish()?;
    Ok((records, ops, skips))
}

/// The group rank of the dump's rank in the entry's group, and the group's size.
fn group_rank(d: &FrDump, e: &FrEntry) -> Result<(i64, usize), &'static str> {
    let g = d
        .pg_config
        .get(&e.pg_name)
        .ok_or("entry of a process group missing from pg_config")?;
    let me = g
        .ranks
        .iter()
        .position(|r| *r == d.rank)
        .ok_or("entry of a process group this rank is not in")?;
    Ok((me as i64, g.ranks.len()))
}

/// The op record of one entry (header flags with it), or why it is skipped.
fn op_record(d: &FrDump, e: &FrEntry, local_sn: u64) -> Result<(Body, u16), &'static str> {
    let func = e
        .func()
        .ok_or("entry with no NCCL function in its profiling_name")?;
    let (me, size) = group_rank(d, e)?;
    let p2p = func == Func::SEND || func == Func::RECV;
    let (sn, peer) = if p2p {
        let (from, to) = e
            .p2p_pair()
            .ok_or("send/recv without its ranks in profiling_name")?;
        let peer = match func {
            Func::SEND if from == me => to,
            Func::RECV if to == me => from,
            _ => return Err("send/recv whose ranks do not include this rank"),
        };
        if !(0..size as i64).contains(&peer) {
            return Err("send/recv peer outside its group");
        }
        (e.p2p_seq_id, peer as i32)
    } else {
        (e.collective_seq_id, -1)
    };
    let coll_sn = u64::try_from(sn)
        .ok()
        .filter(|s| *s < MAX_SEQ)
        .ok_or("entry with a sequence id out of range")?;
    let (count, bytes) = (e.count(), e.bytes());
    if count >= MAX_BYTES || bytes >= MAX_BYTES {
        return Err("entry larger than 256 TiB");
    }
    let (enqueue_ns, start_ns, end_ns, timing) = times(e)?;
    let complete = e.state == "completed";
    let op = OpRecord {
        comm_hash: comm_hash(&e.pg_name),
        coll_sn,
        coll_local_sn: local_sn,
        count,
        bytes,
        enqueue_ns,
        start_ns,
        end_ns,
        rank: me as i32,
        root: -1,
        peer,
        func,
        datatype: e.datatype(),
        timing,
        ..OpRecord::default()
    };
    let flags = if complete { 0 } else { FLAG_INCOMPLETE };
    Ok((if p2p { Body::P2p(op) } else { Body::Coll(op) }, flags))
}

/// (enqueue, start, end, timing) of an entry, within wire's bounds. A completed entry without
/// a completion time ends at its start (finished, duration not measured: `Timing::Enqueue`);
/// one not completed has end 0.
fn times(e: &FrEntry) -> Result<(u64, u64, u64, Timing), &'static str> {
    let enqueue = e.time_created_ns;
    if enqueue >= MAX_TIME_NS {
        return Err("entry with a creation time beyond 2116");
    }
    let ok = |t: Option<u64>| t.filter(|t| *t > 0 && *t < MAX_TIME_NS);
    let (started, completed) = (ok(e.time_started_ns), ok(e.time_completed_ns));
    let timing = if started.is_some() || completed.is_some() {
        Timing::CollectiveCpu
    } else {
        Timing::Enqueue
    };
    let mut start = started.unwrap_or(enqueue);
    let end = match (e.state == "completed", completed) {
        (true, Some(c)) => c,
        (true, None) => start,
        (false, _) => 0,
    };
    if end != 0 && end < start {
        if end < enqueue {
            return Err("entry completed before it was created");
        }
        start = enqueue;
    }
    Ok((enqueue, start, end, timing))
}

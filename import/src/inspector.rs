//! NCCL Inspector JSON lines (`<hostname>-pid<pid>.log`, format v4.x), read line by line —
//! NVIDIA's Inspector plugin and CommInsight's compatible writer (`plugin/src/inspector.rs`)
//! alike.
//!
//! * One stream per (hostname, pid), marked `SOURCE_NCCL_INSPECTOR`. Inspector does not state
//!   the global rank: the stream's rank is the `header.rank` of the process' communicator with
//!   the most ranks (the first seen among equals), its world size that communicator's
//!   `n_ranks`.
//! * A `comm_init` per communicator (`header`) before its first operation.
//! * Operations in end-time order: `end_ns` = `event_trace_ts.coll_stop` (verbose mode) × 1000
//!   when present, else `dump_timestamp_us` × 1000 (when the line was written: later than the
//!   op); `start_ns` = end − exec time; `coll_sn` = `coll_sn` / `p2p_sn`; bytes = message size,
//!   count 0 (Inspector does not state the data type); timing from `*_timing_source`.
//! * Skipped and counted: lines over 1 MiB, not JSON, without a needed key, of another format
//!   version, naming `Invalid` (Inspector's name for AlltoAll and the others it does not map),
//!   duplicates (same communicator, function, sequence number, peer).
//!
//! A file none of whose lines is valid is an error ([`ImportError::Version`] when some were of
//! an unsupported version); otherwise what is valid is imported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use comminsight_wire::bounds::{MAX_BYTES, MAX_RANKS, MAX_SEQ, MAX_TIME_NS};
use comminsight_wire::names::Func;
use comminsight_wire::record::{Body, CommInit, OpRecord, Timing};

use crate::out::{StreamIdent, StreamOut};
use crate::{Format, ImportError, ImportSummary, Skips};

mod line;
#[cfg(test)]
mod tests;

pub use line::InspectorOp;
use line::LineError;

/// Lines longer than this are skipped.
const MAX_LINE: usize = 1 << 20;
/// Progress is reported at most this often (input bytes).
const PROGRESS_EVERY: u64 = 8 << 20;
/// What the version error says this build reads.
const SUPPORTED: &str = "v4.x";

/// Parse one Inspector line; `Err` says why it would be skipped.
pub fn parse_line(line: &str) -> Result<InspectorOp, String> {
    line::parse(line).map_err(|e| e.reason())
}

/// A communicator as its lines' header states it.
#[derive(Clone, Debug)]
struct Comm {
    name: String,
    rank: i64,
    n_ranks: u64,
    nnodes: u64,
}

/// One operation, compact.
#[derive(Clone, Debug)]
struct Op {
    end: u64,
    start: u64,
    sn: u64,
    bytes: u64,
    comm: u64,
    peer: i32,
    func: Func,
    timing: Timing,
    is_p2p: bool,
}

/// Everything read for one process.
#[derive(Default)]
struct Proc {
    comms: HashMap<u64, Comm>,
    /// Communicators in the order first seen.
    comm_order: Vec<u64>,
    ops: Vec<Op>,
    seen: HashSet<(u64, Func, u64, i32)>,
}

/// Everything read so far, by (hostname, pid).
#[derive(Default)]
struct Reader {
    procs: BTreeMap<(String, u32), Proc>,
    skips: Skips,
    read: u64,
    reported: u64,
}

impl Reader {
    /// Take one parsed line; `Err` when it is skipped.
    fn take(&mut self, op: InspectorOp) -> Result<(), &'static str> {
        let end = match op.stop_us {
            Some(s) => s.checked_mul(1000),
            None => op.dump_timestamp_us.checked_mul(1000),
        }
        .filter(|e| *e < MAX_TIME_NS)
        .ok_or("line with a time beyond 2^62 ns")?;
        let exec = (op.exec_us * 1000.0).round();
        let start = end.saturating_sub(if exec < 1.8e19 { exec as u64 } else { u64::MAX });
        if op.sn >= MAX_SEQ || op.bytes >= MAX_BYTES {
            return Err("line with a sequence number or size beyond bounds");
        }
        let peer = i32::try_from(op.peer)
            .ok()
            .filter(|p| *p >= -1 && *p < MAX_RANKS as i32);
        let peer = peer.unwrap_or(-1);
        let p = self.procs.entry((op.hostname, op.pid)).or_default();
        if !p.seen.insert((op.comm_hash, op.func, op.sn, peer)) {
            return Err("duplicate operation (same communicator, function and sequence number)");
        }
        if !p.comms.contains_key(&op.comm_hash) {
            p.comm_order.push(op.comm_hash);
            p.comms.insert(
                op.comm_hash,
                Comm {
                    name: op.comm_name,
                    rank: op.rank,
                    n_ranks: op.n_ranks,
                    nnodes: op.nnodes,
                },
            );
        }
        p.ops.push(Op {
            end,
            start,
            sn: op.sn,
            bytes: op.bytes,
            comm: op.comm_hash,
            peer,
            func: op.func,
            timing: op.timing,
            is_p2p: op.is_p2p,
        });
        Ok(())
    }

    fn progress(&mut self, n: u64, progress: &mut dyn FnMut(u64)) {
        self.read += n;
        if self.read - self.reported >= PROGRESS_EVERY {
            self.reported = self.read;
            progress(self.read);
        }
    }

    /// Read one file; an error when none of its lines is valid.
    fn file(&mut self, path: &Path, progress: &mut dyn FnMut(u64)) -> Result<(), ImportError> {
        let f = std::fs::File::open(path).map_err(|e| ImportError::io(path, e))?;
        let mut r = BufReader::with_capacity(256 << 10, f);
        let mut buf = Vec::new();
        let (mut valid, mut lines) = (0u64, 0u64);
        let mut version: Option<String> = None;
        let mut skips = Skips::default();
        loop {
            buf.clear();
            let (n, too_long) =
                read_line(&mut r, &mut buf, MAX_LINE).map_err(|e| ImportError::io(path, e))?;
            if n == 0 {
                break;
            }
            self.progress(n, progress);
            let text = String::from_utf8_lossy(&buf);
            if text.trim().is_empty() {
                continue;
            }
            lines += 1;
            if too_long {
                skips.add("line over 1 MiB", 1);
                continue;
            }
            match line::parse(&text) {
                Ok(op) => match self.take(op) {
                    Ok(()) => valid += 1,
                    Err(why) => skips.add(why, 1),
                },
                Err(e) => {
                    if let LineError::Version(v) = &e {
                        version.get_or_insert_with(|| v.clone());
                    }
                    skips.add(&e.reason(), 1);
                }
            }
        }
        self.skips.merge(&skips);
        if valid > 0
            || skips
                .0
                .keys()
                .any(|k| k.starts_with("duplicate") || k.starts_with("collective named Invalid"))
        {
            return Ok(());
        }
        if let Some(v) = version {
            return Err(ImportError::Version {
                path: path.to_path_buf(),
                what: "NCCL Inspector output format",
                version: v,
                supported: SUPPORTED,
            });
        }
        Err(ImportError::format(
            path,
            format!(
                "no valid NCCL Inspector line in {lines} lines ({})",
                skips
                    .describe()
                    .unwrap_or_else(|| "the file is empty".into())
            ),
        ))
    }
}

/// Read one line (through `\n`) into `buf`, keeping at most `max` bytes; returns the bytes
/// consumed and whether the line was longer than `max`.
fn read_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<(u64, bool)> {
    let mut n = 0u64;
    let mut long = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((n, long));
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if take > room {
            long = true;
        }
        buf.extend_from_slice(&chunk[..take.min(room)]);
        r.consume(take);
        n += take as u64;
        if done {
            return Ok((n, long));
        }
    }
}

/// The stream identity of a process: the rank of its largest communicator (see the module
/// documentation).
fn ident(job: &str, host: &str, pid: u32, p: &Proc) -> StreamIdent {
    let mut best: Option<&Comm> = None;
    for h in &p.comm_order {
        if let Some(c) = p.comms.get(h) {
            if best.is_none_or(|b| c.n_ranks > b.n_ranks) {
                best = Some(c);
            }
        }
    }
    let world = best
        .map(|c| c.n_ranks)
        .filter(|n| *n > 0 && *n <= u64::from(MAX_RANKS))
        .map_or(-1, |n| n as i32);
    let rank = best
        .map(|c| c.rank)
        .filter(|r| *r >= 0 && (world < 0 || *r < i64::from(world)))
        .map_or(-1, |r| r as i32);
    StreamIdent {
        job: job.to_string(),
        host: host.to_string(),
        pid,
        rank,
        world,
    }
}

/// The `comm_init` of a communicator, within the bounds readers accept.
fn comm_init(hash: u64, c: &Comm, time_ns: u64) -> CommInit {
    let nranks = if c.n_ranks <= u64::from(MAX_RANKS) {
        c.n_ranks as u32
    } else {
        0
    };
    let rank = if c.rank >= 0 && (nranks == 0 || c.rank < i64::from(nranks)) {
        c.rank as i32
    } else {
        -1
    };
    let nnodes = if c.nnodes <= u64::from(nranks.max(1)) {
        c.nnodes as u32
    } else {
        0
    };
    CommInit {
        comm_hash: hash,
        nranks,
        rank,
        nnodes,
        local_rank: -1,
        device: -1,
        abi_version: 0,
        time_ns,
        comm_name: c.name.as_str().into(),
    }
}

/// Write one process' stream; returns (records, ops).
fn write_proc(
    job: &str,
    host: &str,
    pid: u32,
    mut p: Proc,
    out: &Path,
) -> Result<(u64, u64), ImportError> {
    p.ops.sort_by_key(|o| (o.end, o.start));
    let first = p.ops.iter().map(|o| o.start).min().unwrap_or(0);
    let id = ident(job, host, pid, &p);
    let mut s = StreamOut::create(out, &id, Format::NcclInspector.source(), first);
    let mut inited: HashMap<u64, i32> = HashMap::new();
    for (local, o) in p.ops.iter().enumerate() {
        let rank = match inited.get(&o.comm) {
            Some(r) => *r,
            None => {
                let Some(c) = p.comms.get(&o.comm) else {
                    continue;
                };
                let init = comm_init(o.comm, c, o.start);
                inited.insert(o.comm, init.rank);
                s.push_preamble(Body::CommInit(init.clone()), 0);
                init.rank
            }
        };
        let gpu = o.timing == Timing::KernelGpu;
        let rec = OpRecord {
            comm_hash: o.comm,
            coll_sn: o.sn,
            coll_local_sn: local as u64,
            bytes: o.bytes,
            enqueue_ns: o.start,
            start_ns: o.start,
            end_ns: o.end,
            gpu_start_ns: if gpu { o.start } else { 0 },
            gpu_end_ns: if gpu { o.end } else { 0 },
            rank,
            root: -1,
            peer: o.peer,
            func: o.func,
            timing: o.timing,
            ..OpRecord::default()
        };
        s.push(
            if o.is_p2p {
                Body::P2p(rec)
            } else {
                Body::Coll(rec)
            },
            0,
        );
    }
    let ops = p.ops.len() as u64;
    Ok((s.finish()?, ops))
}

/// Import NCCL Inspector files into `<out>/<job>/<hostname>/<pid>/`. `progress` gets the input
/// bytes read so far (all files together), at most every 8 MiB and once at the end.
pub fn import_files(
    paths: &[PathBuf],
    job: &str,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<ImportSummary, ImportError> {
    let mut r = Reader::default();
    for p in paths {
        r.file(p, progress)?;
    }
    progress(r.read);
    let mut sum = ImportSummary {
        files: paths.len() as u64,
        skipped: std::mem::take(&mut r.skips),
        ..ImportSummary::default()
    };
    for ((host, pid), p) in std::mem::take(&mut r.procs) {
        if p.ops.is_empty() {
            continue;
        }
        let (records, ops) = write_proc(job, &host, pid, p, out)?;
        sum.streams += 1;
        sum.records += records;
        sum.ops += ops;
    }
    Ok(sum)
}

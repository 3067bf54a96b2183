//! Reading segment files as they are, for `dump`: every record of a segment file (or of every
//! segment under a directory), problems reported, and the per-job summary `dump --summary` prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, Record, FLAG_INCOMPLETE, FLAG_REPEAT};
use comminsight_wire::segment::{find_segments, read_segment, SegmentError};

use crate::offline::skipped::{classify, reason, FileSkip, SkipLog, Skipped};

/// Problem lines kept in [`Loaded::problems`] (the counts are in [`Loaded::skips`]).
pub const MAX_PROBLEMS: usize = 5;

/// Why a path could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("{path}: no such file or directory (give a segment file, a process directory or any directory above one, e.g. a test-bed output directory)")]
    Missing { path: PathBuf },
    #[error(
        "{path}: no segment files (seg-*.cis) found under it; check COMMINSIGHT_LOG_DIR of the job"
    )]
    NoSegments { path: PathBuf },
    #[error("{path}: {message}")]
    Unreadable { path: PathBuf, message: String },
    #[error("{path}: no CommInsight records in its segment files (skipped {skipped}); give a segment file or a directory the CommInsight plugin wrote (COMMINSIGHT_LOG_DIR)")]
    NoRecords { path: PathBuf, skipped: String },
}

/// A record and the segment file it came from.
#[derive(Clone, Debug)]
pub struct SourcedRecord {
    /// Index into [`Loaded::paths`].
    pub file: usize,
    pub record: Record,
}

/// Everything read from one path.
#[derive(Debug, Default)]
pub struct Loaded {
    pub files: usize,
    pub paths: Vec<PathBuf>,
    pub records: Vec<SourcedRecord>,
    /// One line per problem met (corrupt record, torn tail, unreadable file), the first
    /// [`MAX_PROBLEMS`]; reading went on.
    pub problems: Vec<String>,
    /// Problems not in `problems`.
    pub more_problems: usize,
    /// What was skipped, counted (per file).
    pub skips: SkipLog,
    /// Corrupt records (and torn tails) per file, by index into `paths`.
    pub corrupt: BTreeMap<usize, u64>,
}

impl Loaded {
    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        } else {
            self.more_problems += 1;
        }
    }
}

/// Read every segment under `path` (a segment file or any directory above segments), in
/// (directory, segment index) order. Corrupt records and torn tails are reported in
/// `problems` and counted in `skips`; every readable record is kept. No record at all is an
/// error.
pub fn load(path: &Path) -> Result<Loaded, DumpError> {
    if !path.exists() {
        return Err(DumpError::Missing {
            path: path.to_path_buf(),
        });
    }
    let files = find_segments(path).map_err(|e| DumpError::Unreadable {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if files.is_empty() {
        return Err(DumpError::NoSegments {
            path: path.to_path_buf(),
        });
    }
    let mut out = Loaded {
        files: files.len(),
        ..Default::default()
    };
    for (i, f) in files.iter().enumerate() {
        match read_segment(f) {
            Ok(seg) => {
                for (index, err) in &seg.bad {
                    out.problem(format!(
                        "{}: record {index} is corrupt ({err}); skipped it, the rest of the file was read",
                        f.display()
                    ));
                }
                if seg.torn_tail_bytes > 0 {
                    out.problem(format!(
                        "{}: {} trailing bytes are a partial record (the writer was killed mid-write); ignored",
                        f.display(),
                        seg.torn_tail_bytes
                    ));
                }
                let bad = seg.bad.len() as u64 + u64::from(seg.torn_tail_bytes > 0);
                if bad > 0 {
                    out.skips.corrupt(f, bad);
                    out.corrupt.insert(i, bad);
                }
                out.records.extend(
                    seg.records
                        .into_iter()
                        .map(|record| SourcedRecord { file: i, record }),
                );
            }
            Err(e) => {
                let (how, why) = match &e {
                    SegmentError::Io { source, .. } => (classify(source), reason(source)),
                    other => (FileSkip::Unreadable, other.to_string()),
                };
                out.skips.file(f, how, why);
                out.problem(format!("{}: {e}", f.display()));
            }
        }
        out.paths.push(f.clone());
    }
    if out.records.is_empty() {
        return Err(DumpError::NoRecords {
            path: path.to_path_buf(),
            skipped: out
                .skips
                .summary()
                .describe()
                .unwrap_or_else(|| "nothing: every segment is empty".into()),
        });
    }
    Ok(out)
}

/// One process (one `proc_start`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProcSummary {
    pub host: String,
    pub job: String,
    pub pid: u32,
    pub rank: i32,
    pub colls: u64,
    pub p2ps: u64,
    pub incomplete: u64,
    pub overdue: u64,
    /// Mean of (end - start) over completed operations, µs.
    pub mean_op_us: f64,
    /// Plugin drops: the largest drop / loss counters its `stats` records report.
    pub ring_drops: u64,
    pub pool_drops: u64,
    pub records_lost_io: u64,
    /// Records on disk that were corrupt (skipped by the reader; not plugin drops).
    pub corrupt: u64,
    /// Seqs missing beyond the corrupt records (records that never reached the segment).
    pub seq_gaps: u64,
    /// Control files the plugin refused (foreign owner, group/other-writable, not a regular
    /// file) and event-mask changes it accepted, from its latest `stats`.
    pub ctl_refused: u64,
    pub mask_changes: u64,
}

impl ProcSummary {
    /// What the plugin itself reports as dropped or lost.
    pub fn plugin_drops(&self) -> u64 {
        self.ring_drops + self.pool_drops + self.records_lost_io
    }
}

/// One communicator (by hash), with the ranks that reported it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CommSummary {
    pub comm_hash: String,
    pub name: String,
    pub nranks: u32,
    pub nnodes: u32,
    pub ranks_seen: Vec<i32>,
    pub ops: u64,
    pub overdue: u64,
}

/// What `dump --summary` prints.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    pub files: usize,
    pub records: usize,
    pub kinds: BTreeMap<String, u64>,
    pub processes: Vec<ProcSummary>,
    pub comms: Vec<CommSummary>,
    /// Observations worth a look (not verdicts): e.g. a rank whose operations are much shorter
    /// than its peers' (they spend the time waiting for it inside collectives).
    pub hints: Vec<String>,
    pub problems: Vec<String>,
    /// What was skipped (corrupt records, unreadable files), as every offline command says.
    pub skipped: Skipped,
}

/// A `comm_init` into its communicator's summary.
fn add_comm_init(e: &mut CommSummary, c: &comminsight_wire::record::CommInit) {
    e.comm_hash = format!("0x{:016x}", c.comm_hash);
    if e.name.is_empty() {
        e.name = c.comm_name.as_str_lossy().into_owned();
    }
    e.nranks = c.nranks;
    e.nnodes = c.nnodes;
    if !e.ranks_seen.contains(&c.rank) {
        e.ranks_seen.push(c.rank);
    }
}

/// A plugin `stats` record into its process' summary (the counters are cumulative).
fn add_stats(p: &mut ProcSummary, st: &comminsight_wire::record::Stats) {
    p.ring_drops = p.ring_drops.max(st.ring_drops);
    p.pool_drops = p.pool_drops.max(st.pool_drops);
    p.records_lost_io = p.records_lost_io.max(st.records_lost_io);
    p.ctl_refused = p.ctl_refused.max(u64::from(st.ctl_refused));
    p.mask_changes = p.mask_changes.max(u64::from(st.mask_changes));
}

/// Aggregate a loaded stream. Repeated preamble records (`FLAG_REPEAT`) are not counted twice.
pub fn summarize(l: &Loaded) -> Summary {
    let mut s = Summary {
        files: l.files,
        records: l.records.len(),
        problems: l.problems.clone(),
        skipped: l.skips.summary(),
        ..Default::default()
    };
    let dir_of = |i: usize| {
        l.paths[i]
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    };
    // Process key: the directory holding the segments (one per process).
    let mut procs: BTreeMap<PathBuf, (ProcSummary, f64, u64, Option<u64>)> = BTreeMap::new();
    let mut comms: BTreeMap<u64, CommSummary> = BTreeMap::new();
    for sr in &l.records {
        let rec = &sr.record;
        *s.kinds.entry(rec.kind().name().to_string()).or_default() += 1;
        let (p, sum_us, n_done, last_seq) = procs.entry(dir_of(sr.file)).or_default();
        if rec.flags & FLAG_REPEAT == 0 && !matches!(rec.body, Body::Segment(_)) {
            if let Some(prev) = *last_seq {
                if rec.seq > prev.saturating_add(1) {
                    p.seq_gaps = p.seq_gaps.saturating_add(rec.seq - prev - 1);
                }
            }
            *last_seq = Some(rec.seq);
        }
        if rec.flags & FLAG_REPEAT != 0 {
            continue;
        }
        match &rec.body {
            Body::ProcStart(ps) => {
                p.host = ps.host.as_str_lossy().into_owned();
                p.job = ps.job.as_str_lossy().into_owned();
                p.pid = ps.pid;
                p.rank = ps.rank;
            }
            Body::CommInit(c) => add_comm_init(comms.entry(c.comm_hash).or_default(), c),
            Body::Coll(o) | Body::P2p(o) => {
                if matches!(rec.body, Body::Coll(_)) {
                    p.colls += 1;
                } else {
                    p.p2ps += 1;
                }
                if rec.flags & FLAG_INCOMPLETE != 0 || o.end_ns == 0 {
                    p.incomplete += 1;
                } else {
                    *sum_us += o.end_ns.saturating_sub(o.start_ns) as f64 / 1000.0;
                    *n_done += 1;
                }
                comms.entry(o.comm_hash).or_default().ops += 1;
            }
            Body::Overdue(o) => {
                p.overdue += 1;
                comms.entry(o.comm_hash).or_default().overdue += 1;
            }
            Body::Stats(st) => add_stats(p, st),
            _ => {}
        }
    }
    for (&file, &n) in &l.corrupt {
        if let Some(p) = procs.get_mut(&dir_of(file)) {
            p.0.corrupt += n;
        }
    }
    for (_, (mut p, sum_us, n, _)) in procs {
        // A corrupt record's seq is missing from what was read: not a record lost upstream.
        p.seq_gaps = p.seq_gaps.saturating_sub(p.corrupt);
        p.mean_op_us = if n > 0 { sum_us / n as f64 } else { 0.0 };
        s.processes.push(p);
    }
    s.processes.sort_by_key(|p| (p.rank, p.host.clone(), p.pid));
    s.hints = short_op_hints(&s.processes);
    for (hash, mut c) in comms {
        if c.comm_hash.is_empty() {
            c.comm_hash = format!("0x{hash:016x}");
        }
        c.ranks_seen.sort_unstable();
        s.comms.push(c);
    }
    s
}

/// Ranks whose mean operation time is under half the median of all ranks: in a collective every
/// member waits for the last one to arrive, so the rank that arrives last spends the least time
/// inside it. Needs at least 4 ranks with completed operations.
fn short_op_hints(procs: &[ProcSummary]) -> Vec<String> {
    let mut means: Vec<f64> = procs
        .iter()
        .filter(|p| p.mean_op_us > 0.0)
        .map(|p| p.mean_op_us)
        .collect();
    if means.len() < 4 {
        return Vec::new();
    }
    means.sort_by(f64::total_cmp);
    let median = means[means.len() / 2];
    procs
        .iter()
        .filter(|p| p.mean_op_us > 0.0 && p.mean_op_us < 0.5 * median)
        .map(|p| {
            format!(
                "rank {} ({} pid {}): mean operation time {:.0} us vs median {:.0} us; its peers spend longer inside collectives, i.e. they wait for it",
                p.rank, p.host, p.pid, p.mean_op_us, median
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(rank: i32, mean: f64) -> ProcSummary {
        ProcSummary {
            rank,
            mean_op_us: mean,
            ..Default::default()
        }
    }

    #[test]
    fn a_rank_with_much_shorter_ops_is_hinted() {
        let procs: Vec<_> = [1700.0, 1650.0, 1800.0, 450.0, 1690.0]
            .iter()
            .enumerate()
            .map(|(r, m)| proc(r as i32, *m))
            .collect();
        let h = short_op_hints(&procs);
        assert_eq!(h.len(), 1);
        assert!(h[0].starts_with("rank 3 "), "{h:?}");
    }

    #[test]
    fn even_ranks_and_small_jobs_get_no_hint() {
        let even: Vec<_> = (0..8).map(|r| proc(r, 1000.0 + r as f64)).collect();
        assert!(short_op_hints(&even).is_empty());
        assert!(short_op_hints(&[proc(0, 10.0), proc(1, 1000.0)]).is_empty());
    }
}

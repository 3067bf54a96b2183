//! Per-communicator operation metrics (pure: no I/O, no tokio, deterministic).
//!
//! [`MetricsAggregator::observe`] takes every record of every stream in stream order and keeps
//! integer sums per series; [`MetricsAggregator::snapshot`] renders them with names, sorted, so
//! the same records in any interleaving of streams give the same snapshot (byte for byte as
//! JSON), as long as the series fit in `max_series` (which series are folded into
//! `comm="other"` depends on the order in which they first appear).
//!
//! Series key (bounded cardinality): job, comm name (from `comm_init`; empty -> `unnamed`, no
//! `comm_init` seen -> `unknown`), func, message-size bucket ([`buckets::SIZE_BUCKETS`]),
//! algo, proto. The aggregator is serde (de)serializable so the pipeline can checkpoint it.

pub mod buckets;
mod fx;
pub mod self_metrics;
mod state;

use std::collections::{BTreeMap, HashMap};

use comminsight_wire::names::{Algo, Func, Proto};
use comminsight_wire::record::{Body, OpRecord, Record, FLAG_INCOMPLETE, FLAG_REPEAT};
use serde::{Deserialize, Serialize};

use crate::stream::StreamId;
use buckets::{DURATION_BUCKETS, SIZE_BUCKETS};
use fx::FxMap;
pub use self_metrics::SelfMetrics;

/// Comm name of the series beyond `max_series`.
pub const OTHER_COMM: &str = "other";
/// Comm name of operations whose communicator's `comm_init` was not seen.
pub const UNKNOWN_COMM: &str = "unknown";
/// Comm name of communicators with an empty name.
pub const UNNAMED_COMM: &str = "unnamed";

const OTHER_ID: u32 = 0;
const UNKNOWN_ID: u32 = 1;
const UNNAMED_ID: u32 = 2;

/// Compact series key: interned job and comm names, one-byte codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Key {
    job: u32,
    comm: u32,
    func: u8,
    size: u8,
    algo: u8,
    proto: u8,
}

/// What the aggregator knows about one communicator of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct CommInfo {
    name: u32,
    nranks: u32,
}

/// Per-stream state: its job, its communicators, the sequence follow-up and the plugin's drops.
#[derive(Clone, Debug, Default)]
struct StreamState {
    job: u32,
    comms: FxMap<u64, CommInfo>,
    /// Highest `seq` seen (repeats and segment headers excluded); `None` before the first.
    last_seq: Option<u64>,
    /// Records missing between consecutive sequence numbers.
    lost: u64,
    /// `ring_drops + pool_drops` of the latest `stats` record.
    drops: u64,
}

/// Per-job counters that are not per series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct JobState {
    overdue_ops: u64,
    folded_ops: u64,
}

/// Integer sums of one series (order-independent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesValues {
    /// Completed operations (also the histogram's count).
    pub ops: u64,
    /// Sum of message sizes (`count * typesize`) of completed operations.
    pub bytes: u64,
    /// Sum of execution times (ns), see [`buckets::exec_ns`] (also the histogram's sum).
    pub exec_ns_sum: u64,
    /// Execution-time histogram: `hist[i]` counts ops with time `<= DURATION_BOUNDS_US[i]` µs
    /// and above the previous bound; the last bucket is unbounded.
    pub hist: [u64; DURATION_BUCKETS],
    /// Operations written with `FLAG_INCOMPLETE` (not counted in `ops`).
    pub incomplete: u64,
    /// Sum of Inspector's traffic bytes (algbw numerator), see [`buckets::traffic`].
    pub traffic_bytes: u64,
    /// Sum of traffic bytes times the bus factor (busbw numerator).
    pub bus_bytes: u64,
}

/// The labels of one series, as exported.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeriesLabels {
    /// Communicator name from `comm_init` (`unnamed`, `unknown`, `other`: see the constants).
    pub comm: String,
    /// NCCL function (`AllReduce`, `Send`, ...).
    pub func: String,
    /// Message-size bucket ([`buckets::SIZE_BUCKETS`]).
    pub size: String,
    /// NCCL algorithm (`RING`, `TREE`, ..., `Unknown`).
    pub algo: String,
    /// NCCL protocol (`LL`, `LL128`, `SIMPLE`, `Unknown`).
    pub proto: String,
}

/// One series of a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// What the series is about.
    pub labels: SeriesLabels,
    /// Its sums.
    pub values: SeriesValues,
    /// `traffic_bytes / exec_ns_sum` (GB/s), Inspector's algbw over the whole series.
    pub algbw_gbs: f64,
    /// `bus_bytes / exec_ns_sum` (GB/s), Inspector's busbw over the whole series.
    pub busbw_gbs: f64,
}

/// Per-job totals and series of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    /// Distinct overdue operations (`overdue` records with `repeat == 0`).
    pub overdue_ops: u64,
    /// Plugin drops: `ring_drops + pool_drops` of the latest `stats` of each stream, summed.
    pub plugin_drops: u64,
    /// Records missing from the streams (gaps in `seq`).
    pub records_lost: u64,
    /// Operations folded into `comm="other"` because `max_series` was reached.
    pub folded_ops: u64,
    /// Series sorted by labels.
    pub series: Vec<Series>,
}

/// Everything the aggregator knows, with names, sorted: deterministic, serde.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    /// Upper bounds (µs) of the execution-time histogram buckets.
    pub duration_bounds_us: Vec<u64>,
    /// Per job id (the streams' `<job>`).
    pub jobs: BTreeMap<String, JobSnapshot>,
}

/// Folds records into per-series sums. See the module documentation.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "state::AggregatorState", from = "state::AggregatorState")]
pub struct MetricsAggregator {
    max_series: usize,
    /// Interned job and comm names (`names[id]`), ids 0..3 fixed: other, unknown, unnamed.
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    streams: Vec<(StreamId, StreamState)>,
    stream_ids: HashMap<StreamId, u32>,
    /// Index of the last stream observed (records come in batches per stream).
    last_stream: Option<u32>,
    series_index: FxMap<Key, u32>,
    series: Vec<(Key, SeriesValues)>,
    jobs: FxMap<u32, JobState>,
}

impl MetricsAggregator {
    /// An empty aggregator keeping at most `max_series` distinct series before folding new
    /// ones into `comm="other"`.
    pub fn new(max_series: usize) -> MetricsAggregator {
        let mut agg = MetricsAggregator {
            max_series,
            names: Vec::new(),
            name_ids: HashMap::new(),
            streams: Vec::new(),
            stream_ids: HashMap::new(),
            last_stream: None,
            series_index: FxMap::default(),
            series: Vec::new(),
            jobs: FxMap::default(),
        };
        for n in [OTHER_COMM, UNKNOWN_COMM, UNNAMED_COMM] {
            agg.intern(n);
        }
        agg
    }

    /// Distinct series kept so far (folded ones included once as `other`).
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// The name of communicator `comm_hash` of `stream` as its `comm_init` gave it (`unnamed`
    /// for an empty name), if seen; for log records about the stream's operations.
    pub fn comm_name(&self, stream: &StreamId, comm_hash: u64) -> Option<&str> {
        let i = *self.stream_ids.get(stream)?;
        let info = self.streams[i as usize].1.comms.get(&comm_hash)?;
        Some(&self.names[info.name as usize])
    }

    /// Fold one record of `stream` (records of one stream must come in stream order).
    pub fn observe(&mut self, stream: &StreamId, rec: &Record) {
        let si = self.stream_index(stream);
        let st = &mut self.streams[si as usize].1;
        if rec.flags & FLAG_REPEAT == 0 && !matches!(rec.body, Body::Segment(_)) {
            match st.last_seq {
                Some(last) if rec.seq > last => {
                    st.lost += rec.seq - last - 1;
                    st.last_seq = Some(rec.seq);
                }
                // Backwards: a new writer in the same process directory starts over.
                Some(last) if rec.seq < last => st.last_seq = Some(rec.seq),
                Some(_) => {}
                None => st.last_seq = Some(rec.seq),
            }
        }
        match &rec.body {
            Body::CommInit(c) => {
                let name = if c.comm_name.is_empty() {
                    UNNAMED_ID
                } else {
                    let name = c.comm_name.as_str_lossy();
                    match self.name_ids.get(name.as_ref()) {
                        Some(id) => *id,
                        None => self.intern(&name),
                    }
                };
                let info = CommInfo {
                    name,
                    nranks: c.nranks,
                };
                self.streams[si as usize].1.comms.insert(c.comm_hash, info);
            }
            Body::Coll(op) => self.observe_op(si, op, false, rec.flags),
            Body::P2p(op) => self.observe_op(si, op, true, rec.flags),
            Body::Overdue(o) if o.repeat == 0 => {
                let job = st.job;
                self.jobs.entry(job).or_default().overdue_ops += 1;
            }
            Body::Stats(s) => st.drops = s.ring_drops.saturating_add(s.pool_drops),
            _ => {}
        }
    }

    fn observe_op(&mut self, si: u32, op: &OpRecord, is_p2p: bool, flags: u16) {
        let st = &self.streams[si as usize].1;
        let comm = st.comms.get(&op.comm_hash).copied().unwrap_or(CommInfo {
            name: UNKNOWN_ID,
            nranks: 0,
        });
        let key = Key {
            job: st.job,
            comm: comm.name,
            func: op.func.0,
            size: buckets::size_bucket(op.bytes),
            algo: op.algo.0,
            proto: op.proto.0,
        };
        let idx = match self.series_index.get(&key) {
            Some(i) => *i,
            None => self.insert_series(key),
        };
        let v = &mut self.series[idx as usize].1;
        if flags & FLAG_INCOMPLETE != 0 {
            v.incomplete += 1;
            return;
        }
        let ns = buckets::exec_ns(op);
        v.ops += 1;
        v.bytes = v.bytes.saturating_add(op.bytes);
        v.exec_ns_sum = v.exec_ns_sum.saturating_add(ns);
        v.hist[buckets::duration_bucket(ns)] += 1;
        let (traffic, num, den) = buckets::traffic(is_p2p, op.func, op.bytes, comm.nranks);
        v.traffic_bytes = v.traffic_bytes.saturating_add(traffic);
        v.bus_bytes = v
            .bus_bytes
            .saturating_add(buckets::bus_bytes(traffic, num, den));
    }

    /// A new series, or its `other` fold when `max_series` is reached (counted per job).
    #[cold]
    fn insert_series(&mut self, mut key: Key) -> u32 {
        if self.series.len() >= self.max_series && key.comm != OTHER_ID {
            self.jobs.entry(key.job).or_default().folded_ops += 1;
            key.comm = OTHER_ID;
            if let Some(i) = self.series_index.get(&key) {
                return *i;
            }
        }
        let idx = self.series.len() as u32;
        self.series.push((key, SeriesValues::default()));
        self.series_index.insert(key, idx);
        idx
    }

    fn stream_index(&mut self, stream: &StreamId) -> u32 {
        if let Some(i) = self.last_stream {
            if self.streams[i as usize].0 == *stream {
                return i;
            }
        }
        let i = match self.stream_ids.get(stream) {
            Some(i) => *i,
            None => self.add_stream(stream),
        };
        self.last_stream = Some(i);
        i
    }

    #[cold]
    fn add_stream(&mut self, stream: &StreamId) -> u32 {
        let job = match self.name_ids.get(&stream.job) {
            Some(id) => *id,
            None => self.intern(&stream.job),
        };
        let i = self.streams.len() as u32;
        let st = StreamState {
            job,
            ..Default::default()
        };
        self.streams.push((stream.clone(), st));
        self.stream_ids.insert(stream.clone(), i);
        i
    }

    #[cold]
    fn intern(&mut self, name: &str) -> u32 {
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.name_ids.insert(name.to_owned(), id);
        id
    }

    /// Everything observed so far, with names, sorted (see [`MetricsSnapshot`]).
    pub fn snapshot(&self) -> MetricsSnapshot {
        let mut jobs: BTreeMap<String, JobSnapshot> = BTreeMap::new();
        for (_, st) in &self.streams {
            let job = jobs.entry(self.names[st.job as usize].clone()).or_default();
            job.plugin_drops = job.plugin_drops.saturating_add(st.drops);
            job.records_lost = job.records_lost.saturating_add(st.lost);
        }
        for (id, js) in &self.jobs {
            let job = jobs.entry(self.names[*id as usize].clone()).or_default();
            job.overdue_ops += js.overdue_ops;
            job.folded_ops += js.folded_ops;
        }
        for (key, values) in &self.series {
            let job = jobs
                .entry(self.names[key.job as usize].clone())
                .or_default();
            let labels = SeriesLabels {
                comm: self.names[key.comm as usize].clone(),
                func: Func(key.func).name().to_owned(),
                size: SIZE_BUCKETS[key.size as usize].to_owned(),
                algo: Algo(key.algo).name().to_owned(),
                proto: Proto(key.proto).name().to_owned(),
            };
            job.series.push(Series {
                labels,
                values: values.clone(),
                algbw_gbs: buckets::gbs(values.traffic_bytes, values.exec_ns_sum),
                busbw_gbs: buckets::gbs(values.bus_bytes, values.exec_ns_sum),
            });
        }
        for job in jobs.values_mut() {
            job.series.sort_by(|a, b| a.labels.cmp(&b.labels));
        }
        MetricsSnapshot {
            duration_bounds_us: buckets::DURATION_BOUNDS_US.to_vec(),
            jobs,
        }
    }
}

#[cfg(test)]
mod tests;

//! One segment as a Parquet file, with the `parquet` crate's low-level writer (no arrow).
//!
//! One row per record except the `segment` header and `FLAG_REPEAT` preamble copies, so counting
//! rows equals counting the plugin's records. Operation columns are null for kinds without them.
//! `coll` / `p2p` rows carry every field of the record in columns (`api_ns`, `nwarps`,
//! `channels_done` included) and no JSON (rendering JSON for each of 160k ops/s cost most of a
//! core); every other kind (proc_start, comm_init, stats, overdue, ...) carries its lossless wire
//! JSON rendering in `body_json`. Host times are also given on the job timeline
//! (`aligned_*_ns` ± `clock_err_ns`), and GPU timer values too (`aligned_gpu_*_ns` ±
//! `gpu_clock_err_ns`) once the process' GPU timer is fitted. Host times of 0 (absent) are
//! null. `start_ns` of `proc_start`, `comm_init`, `comm_fini` and `stats` is the record's event
//! time, so every row can be placed on the aligned timeline. The output is deterministic.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use ::parquet::basic::{Compression, ZstdLevel};
use ::parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use ::parquet::errors::ParquetError;
use ::parquet::file::properties::{EnabledStatistics, WriterProperties};
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;
use ::parquet::schema::types::ColumnPath;
use comminsight_wire::record::{Body, OpRecord, Overdue, Record, FLAG_REPEAT};

use crate::stream::Alignment;

/// Rows per row group: the archive holds one row group's columns at a time (~12 MiB), not a
/// whole segment's (a default 64 MiB segment is 500 k rows; 2^20-row groups held 400 MiB).
pub const ROW_GROUP_ROWS: usize = 1 << 15;
/// `created_by` in every file (constant so output is byte-identical for the same input).
const CREATED_BY: &str = "comminsight-agent";
/// zstd level of the Parquet pages (1: the archive runs beside training on every host).
const PAGE_ZSTD_LEVEL: i32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    /// INT64 annotated unsigned (DuckDB UBIGINT).
    U64,
    I64,
    I32,
    /// INT32 annotated UINT_16.
    U16,
    /// INT32 annotated UINT_8.
    U8,
    Str,
}

/// Name, type and nullability of each column, in file order.
const COLUMNS: [(&str, Ty, bool); 35] = [
    ("pid", Ty::I64, false),
    ("seq", Ty::U64, true),
    ("kind", Ty::Str, true),
    ("flags", Ty::U16, true),
    ("comm_hash", Ty::Str, false),
    ("comm_name", Ty::Str, false),
    ("rank", Ty::I32, false),
    ("peer", Ty::I32, false),
    ("root", Ty::I32, false),
    ("func", Ty::Str, false),
    ("algo", Ty::Str, false),
    ("proto", Ty::Str, false),
    ("datatype", Ty::Str, false),
    ("coll_sn", Ty::U64, false),
    ("coll_local_sn", Ty::U64, false),
    ("count", Ty::U64, false),
    ("bytes", Ty::U64, false),
    ("nchannels", Ty::U8, false),
    ("timing", Ty::Str, false),
    ("enqueue_ns", Ty::U64, false),
    ("start_ns", Ty::U64, false),
    ("end_ns", Ty::U64, false),
    ("gpu_start_ns", Ty::U64, false),
    ("gpu_end_ns", Ty::U64, false),
    ("duration_ns", Ty::U64, false),
    ("aligned_start_ns", Ty::U64, false),
    ("aligned_end_ns", Ty::U64, false),
    ("clock_err_ns", Ty::U64, true),
    ("api_ns", Ty::U64, false),
    ("nwarps", Ty::U8, false),
    ("channels_done", Ty::U8, false),
    ("aligned_gpu_start_ns", Ty::U64, false),
    ("aligned_gpu_end_ns", Ty::U64, false),
    ("gpu_clock_err_ns", Ty::U64, false),
    ("body_json", Ty::Str, false),
];

/// The Parquet column names, in file order (the hive partition columns `job`, `host`, `hour`
/// come from the directory names).
pub const PARQUET_COLUMNS: [&str; 35] = {
    let mut out = [""; 35];
    let mut i = 0;
    while i < COLUMNS.len() {
        out[i] = COLUMNS[i].0;
        i += 1;
    }
    out
};

const N: usize = COLUMNS.len();

/// One cell.
#[derive(Clone, Debug, Default)]
enum V {
    #[default]
    Null,
    I(i64),
    S(ByteArray),
}

/// Shared string cells (a `ByteArray` clone is a reference count), so rows do not allocate
/// for names and comm hashes.
#[derive(Default)]
struct Strs {
    names: HashMap<&'static str, ByteArray>,
    /// comm hash -> ("0x%016x", comm name from its comm_init).
    comms: HashMap<u64, (ByteArray, Option<ByteArray>)>,
}

impl Strs {
    fn name(&mut self, s: &'static str) -> V {
        V::S(
            self.names
                .entry(s)
                .or_insert_with(|| ByteArray::from(s))
                .clone(),
        )
    }

    /// (comm_hash, comm_name) cells of a comm.
    fn comm(&mut self, h: u64) -> (V, V) {
        let (hash, name) = self
            .comms
            .entry(h)
            .or_insert_with(|| (ByteArray::from(format!("0x{h:016x}").into_bytes()), None));
        (V::S(hash.clone()), name.clone().map_or(V::Null, V::S))
    }
}

fn schema() -> String {
    let mut s = String::from("message comminsight_record {\n");
    for (name, ty, required) in COLUMNS {
        let rep = if required { "REQUIRED" } else { "OPTIONAL" };
        let t = match ty {
            Ty::U64 => "INT64 {} (INTEGER(64,false))",
            Ty::I64 => "INT64 {}",
            Ty::I32 => "INT32 {}",
            Ty::U16 => "INT32 {} (INTEGER(16,false))",
            Ty::U8 => "INT32 {} (INTEGER(8,false))",
            Ty::Str => "BYTE_ARRAY {} (STRING)",
        };
        s.push_str(&format!("  {rep} {};\n", t.replace("{}", name)));
    }
    s.push('}');
    s
}

/// A non-zero host time as a cell (0 = absent = null).
fn t(ns: u64) -> V {
    if ns == 0 {
        V::Null
    } else {
        V::I(ns as i64)
    }
}

fn u(v: u64) -> V {
    V::I(v as i64)
}

/// The row of one record (None for the segment header and preamble repeats).
fn row(
    rec: &Record,
    pid: Option<i64>,
    strs: &mut Strs,
    align: Alignment,
    gpu: Option<Alignment>,
) -> Option<[V; N]> {
    if rec.flags & FLAG_REPEAT != 0 || matches!(rec.body, Body::Segment(_)) {
        return None;
    }
    let mut r: [V; N] = std::array::from_fn(|_| V::Null);
    r[0] = pid.map_or(V::Null, V::I);
    r[1] = u(rec.seq);
    r[2] = strs.name(rec.kind().name());
    r[3] = V::I(i64::from(rec.flags));
    let (hash, start, end) = body_cells(&mut r, &rec.body, strs, gpu)?;
    if let Some(h) = hash {
        (r[4], r[5]) = strs.comm(h);
    }
    r[20] = t(start);
    r[21] = t(end);
    if start != 0 && end >= start {
        r[24] = u(end - start);
    }
    r[25] = t(align.apply(start));
    r[26] = t(align.apply(end));
    r[27] = u(align.err_ns);
    if !matches!(rec.body, Body::Coll(_) | Body::P2p(_)) {
        let mut body = Vec::with_capacity(512);
        super::body_json::render(rec, &mut body);
        r[34] = V::S(ByteArray::from(body));
    }
    Some(r)
}

/// The cells of the fields of `body` that have their own columns; returns its comm hash and
/// its host (start, end) times (end 0 when it has none), None for a segment header.
fn body_cells(
    r: &mut [V; N],
    body: &Body,
    strs: &mut Strs,
    gpu: Option<Alignment>,
) -> Option<(Option<u64>, u64, u64)> {
    let mut hash = None;
    let start: u64;
    let mut end = 0u64;
    match body {
        Body::Segment(_) => return None,
        Body::ProcStart(p) => {
            r[6] = V::I(i64::from(p.rank));
            start = p.real_ns;
        }
        Body::CommInit(c) => {
            hash = Some(c.comm_hash);
            r[6] = V::I(i64::from(c.rank));
            start = c.time_ns;
        }
        Body::CommFini(c) => {
            hash = Some(c.comm_hash);
            r[6] = V::I(i64::from(c.rank));
            start = c.time_ns;
        }
        Body::Coll(o) | Body::P2p(o) => {
            hash = Some(o.comm_hash);
            op_cells(r, o, strs, gpu);
            (start, end) = (o.start_ns, o.end_ns);
        }
        Body::Proxy(p) => {
            hash = Some(p.comm_hash);
            r[6] = V::I(i64::from(p.rank));
            r[7] = V::I(i64::from(p.peer));
            r[16] = u(p.bytes);
            (start, end) = (p.start_ns, p.end_ns);
        }
        Body::Net(n) => {
            hash = Some(n.comm_hash);
            r[6] = V::I(i64::from(n.rank));
            r[16] = u(n.length);
            (start, end) = (n.start_ns, n.end_ns);
        }
        Body::Overdue(o) => {
            hash = Some(o.comm_hash);
            overdue_cells(r, o, strs);
            start = o.start_ns;
        }
        Body::Stats(s) => start = s.time_ns,
        // Host context (the agent's host stream): the interval, or the event's time.
        Body::Thread(t) => (start, end) = (t.time_ns.saturating_sub(t.interval_ns), t.time_ns),
        Body::Tcp(t) => (start, end) = (t.time_ns.saturating_sub(t.interval_ns), t.time_ns),
        Body::Port(p) => (start, end) = (p.time_ns.saturating_sub(p.interval_ns), p.time_ns),
        Body::Qp(q) => start = q.time_ns,
        Body::CommDevice(c) => {
            hash = Some(c.comm_hash);
            r[6] = V::I(i64::from(c.rank));
            start = c.time_ns;
        }
        // GPU samples (the agent's host stream): the interval, or the event's time.
        Body::Gpu(g) => (start, end) = (g.time_ns.saturating_sub(g.interval_ns), g.time_ns),
        Body::GpuLink(l) => (start, end) = (l.time_ns.saturating_sub(l.interval_ns), l.time_ns),
        Body::Xid(x) => start = x.time_ns,
        // MoE EP wait counters: the window, the writer's EP rank.
        Body::EpStats(e) => {
            r[6] = V::I(i64::from(e.rank));
            (start, end) = (e.t_start_ns, e.t_end_ns);
        }
    }
    Some((hash, start, end))
}

/// The cells of a `coll` / `p2p` op's own fields (its GPU times also aligned once `gpu`, the
/// process' GPU timer, is fitted).
fn op_cells(r: &mut [V; N], o: &OpRecord, strs: &mut Strs, gpu: Option<Alignment>) {
    r[6] = V::I(i64::from(o.rank));
    r[7] = V::I(i64::from(o.peer));
    r[8] = V::I(i64::from(o.root));
    r[9] = strs.name(o.func.name());
    r[10] = strs.name(o.algo.name());
    r[11] = strs.name(o.proto.name());
    r[12] = strs.name(o.datatype.name());
    r[13] = u(o.coll_sn);
    r[14] = u(o.coll_local_sn);
    r[15] = u(o.count);
    r[16] = u(o.bytes);
    r[17] = V::I(i64::from(o.nchannels));
    r[18] = strs.name(o.timing.name());
    r[19] = t(o.enqueue_ns);
    r[22] = t(o.gpu_start_ns);
    r[23] = t(o.gpu_end_ns);
    r[28] = t(o.api_ns);
    r[29] = V::I(i64::from(o.nwarps));
    r[30] = V::I(i64::from(o.channels_done));
    if let Some(g) = gpu {
        if o.gpu_start_ns != 0 || o.gpu_end_ns != 0 {
            r[31] = t(g.apply(o.gpu_start_ns));
            r[32] = t(g.apply(o.gpu_end_ns));
            r[33] = u(g.err_ns);
        }
    }
}

/// The cells of an `overdue` record's own fields.
fn overdue_cells(r: &mut [V; N], o: &Overdue, strs: &mut Strs) {
    r[6] = V::I(i64::from(o.rank));
    r[7] = V::I(i64::from(o.peer));
    r[9] = strs.name(o.func.name());
    r[13] = u(o.coll_sn);
    r[14] = u(o.coll_local_sn);
    r[15] = u(o.count);
    r[16] = u(o.bytes);
    r[17] = V::I(i64::from(o.nchannels));
    r[19] = t(o.enqueue_ns);
}

/// The first host time of a record, if it has one (0 = none).
pub(crate) fn record_time(rec: &Record) -> u64 {
    match &rec.body {
        Body::Segment(h) => h.created_real_ns,
        Body::ProcStart(p) => p.real_ns,
        Body::CommInit(c) => c.time_ns,
        Body::CommFini(c) => c.time_ns,
        Body::Coll(o) | Body::P2p(o) => [o.enqueue_ns, o.start_ns, o.end_ns]
            .into_iter()
            .find(|&v| v != 0)
            .unwrap_or(0),
        Body::Proxy(p) => p.start_ns,
        Body::Net(n) => n.start_ns,
        Body::Overdue(o) => o.enqueue_ns,
        Body::Stats(s) => s.time_ns,
        Body::Thread(t) => t.time_ns.saturating_sub(t.interval_ns),
        Body::Tcp(t) => t.time_ns.saturating_sub(t.interval_ns),
        Body::Port(p) => p.time_ns.saturating_sub(p.interval_ns),
        Body::Qp(q) => q.time_ns,
        Body::CommDevice(c) => c.time_ns,
        Body::Gpu(g) => g.time_ns.saturating_sub(g.interval_ns),
        Body::GpuLink(l) => l.time_ns.saturating_sub(l.interval_ns),
        Body::Xid(x) => x.time_ns,
        Body::EpStats(e) => e.t_start_ns,
    }
}

/// `YYYY-MM-DDTHH` (UTC) of a CLOCK_REALTIME time in ns.
pub fn hour_of_ns(ns: u64) -> String {
    let (y, m, d, hour, ..) = crate::util::time::utc_parts(ns);
    format!("{y:04}-{m:02}-{d:02}T{hour:02}")
}

/// Column buffers of one row group.
#[derive(Default)]
struct Cols {
    ints: Vec<Vec<i64>>,
    strs: Vec<Vec<ByteArray>>,
    defs: Vec<Vec<i16>>,
    rows: usize,
    /// Upper bound of the rows still to come (sizes the next row group's buffers).
    left: usize,
}

impl Cols {
    /// Buffers sized for `rows` rows (no regrowth while filling a row group).
    fn new(rows: usize) -> Cols {
        let cap = |want: bool| if want { rows } else { 0 };
        Cols {
            ints: COLUMNS
                .iter()
                .map(|c| Vec::with_capacity(cap(c.1 != Ty::Str)))
                .collect(),
            strs: COLUMNS
                .iter()
                .map(|c| Vec::with_capacity(cap(c.1 == Ty::Str)))
                .collect(),
            defs: COLUMNS
                .iter()
                .map(|c| Vec::with_capacity(cap(!c.2)))
                .collect(),
            rows: 0,
            left: 0,
        }
    }

    fn push(&mut self, row: [V; N]) {
        for (i, v) in row.into_iter().enumerate() {
            let def = match v {
                V::Null => 0,
                V::I(x) => {
                    self.ints[i].push(x);
                    1
                }
                V::S(s) => {
                    self.strs[i].push(s);
                    1
                }
            };
            // Required columns have no definition levels (and are never null).
            if !COLUMNS[i].2 {
                self.defs[i].push(def);
            }
        }
        self.rows += 1;
    }

    fn write<W: Write + Send>(
        &mut self,
        w: &mut SerializedFileWriter<W>,
    ) -> Result<(), ParquetError> {
        let mut rg = w.next_row_group()?;
        let mut i = 0;
        while let Some(mut col) = rg.next_column()? {
            let (_, ty, required) = COLUMNS[i];
            let defs = if required {
                None
            } else {
                Some(&self.defs[i][..])
            };
            match ty {
                Ty::Str => {
                    col.typed::<ByteArrayType>()
                        .write_batch(&self.strs[i], defs, None)?;
                }
                Ty::U64 | Ty::I64 => {
                    col.typed::<Int64Type>()
                        .write_batch(&self.ints[i], defs, None)?;
                }
                Ty::I32 | Ty::U16 | Ty::U8 => {
                    let v: Vec<i32> = self.ints[i].iter().map(|&x| x as i32).collect();
                    col.typed::<Int32Type>().write_batch(&v, defs, None)?;
                }
            }
            col.close()?;
            i += 1;
        }
        rg.close()?;
        // The buffers are reused for the next row group (no second set allocated beside them).
        self.left = self.left.saturating_sub(self.rows);
        self.rows = 0;
        for v in &mut self.ints {
            v.clear();
        }
        for v in &mut self.strs {
            v.clear();
        }
        for v in &mut self.defs {
            v.clear();
        }
        Ok(())
    }
}

/// A segment's Parquet file, written a row at a time and a row group at a time: the comm names
/// are learnt first ([`ParquetWriter::learn`] on the segment's `comm_init` records), then every
/// record is [`ParquetWriter::push`]ed in order.
pub(crate) struct ParquetWriter<W: Write + Send> {
    fw: SerializedFileWriter<W>,
    cols: Cols,
    strs: Strs,
    pid: Option<i64>,
    align: Alignment,
    gpu: Option<Alignment>,
    total: u64,
}

impl<W: Write + Send> ParquetWriter<W> {
    /// A writer for about `rows_hint` rows (sizes the first row group's buffers).
    pub(crate) fn new(
        w: W,
        rows_hint: usize,
        pid: Option<i64>,
        align: Alignment,
        gpu: Option<Alignment>,
    ) -> Result<Self, ParquetError> {
        let schema = Arc::new(parse_message_type(&schema())?);
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(PAGE_ZSTD_LEVEL)?))
            .set_created_by(CREATED_BY.into())
            // Dictionaries only for the low-cardinality name columns; numbers are mostly unique
            // per row (seq, times), where a dictionary only costs time.
            .set_dictionary_enabled(false)
            .set_column_dictionary_enabled(ColumnPath::from("kind"), true)
            .set_column_dictionary_enabled(ColumnPath::from("comm_hash"), true)
            .set_column_dictionary_enabled(ColumnPath::from("comm_name"), true)
            .set_column_dictionary_enabled(ColumnPath::from("func"), true)
            .set_column_dictionary_enabled(ColumnPath::from("algo"), true)
            .set_column_dictionary_enabled(ColumnPath::from("proto"), true)
            .set_column_dictionary_enabled(ColumnPath::from("datatype"), true)
            .set_column_dictionary_enabled(ColumnPath::from("timing"), true)
            .set_column_statistics_enabled(ColumnPath::from("body_json"), EnabledStatistics::None)
            .build();
        let fw = SerializedFileWriter::new(w, schema, Arc::new(props))?;
        let mut cols = Cols::new(rows_hint.min(ROW_GROUP_ROWS));
        cols.left = rows_hint;
        Ok(ParquetWriter {
            fw,
            cols,
            strs: Strs::default(),
            pid,
            align,
            gpu,
            total: 0,
        })
    }

    /// Take a `comm_init`'s name for every row of its communicator (other records: nothing).
    pub(crate) fn learn(&mut self, r: &Record) {
        if let Body::CommInit(c) = &r.body {
            if !c.comm_name.is_empty() {
                let name = ByteArray::from(c.comm_name.as_str_lossy().as_bytes());
                self.strs
                    .comms
                    .entry(c.comm_hash)
                    .or_insert_with(|| {
                        let h = c.comm_hash;
                        (ByteArray::from(format!("0x{h:016x}").into_bytes()), None)
                    })
                    .1 = Some(name);
            }
        }
    }

    /// The row of `rec` (none for a segment header or a repeated preamble record).
    pub(crate) fn push(&mut self, rec: &Record) -> Result<(), ParquetError> {
        if let Some(r) = row(rec, self.pid, &mut self.strs, self.align, self.gpu) {
            self.cols.push(r);
            self.total += 1;
            if self.cols.rows == ROW_GROUP_ROWS {
                self.cols.write(&mut self.fw)?;
            }
        }
        Ok(())
    }

    /// Write the last row group and the footer; returns the number of rows.
    pub(crate) fn finish(mut self) -> Result<u64, ParquetError> {
        if self.cols.rows > 0 {
            self.cols.write(&mut self.fw)?;
        }
        self.fw.close()?;
        Ok(self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_are_utc_calendar_hours() {
        assert_eq!(hour_of_ns(0), "1970-01-01T00");
        // 2026-11-29T16:28:03Z
        assert_eq!(hour_of_ns(1_795_969_683_000_000_000), "2026-11-29T16");
        // 2024-02-29T23:59:59Z (leap day)
        assert_eq!(hour_of_ns(1_709_251_199_000_000_000), "2024-02-29T23");
        assert_eq!(hour_of_ns(1_709_251_200_000_000_000), "2024-03-01T00");
    }

    #[test]
    fn schema_parses_and_lists_every_column() {
        let s = parse_message_type(&schema()).unwrap();
        assert_eq!(s.get_fields().len(), PARQUET_COLUMNS.len());
        assert_eq!(PARQUET_COLUMNS[34], "body_json");
    }
}

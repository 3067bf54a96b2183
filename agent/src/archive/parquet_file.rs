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
//! Numbers are DELTA_BINARY_PACKED, names dictionary-coded, pages zstd 1; min / max statistics
//! only on the columns queries filter on (times, seq, comm, rank, sizes; [`NO_STATISTICS`]).

use std::io::Write;
use std::sync::Arc;

use ::parquet::basic::{Compression, Encoding, ZstdLevel};
use ::parquet::data_type::ByteArray;
use ::parquet::errors::ParquetError;
use ::parquet::file::properties::{EnabledStatistics, WriterProperties};
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;
use ::parquet::schema::types::ColumnPath;
use comminsight_wire::record::{Body, Record};

use super::parquet_cols::{Cols, Strs, Ty, COLUMNS};
use crate::stream::Alignment;

/// Rows per row group: the archive holds one row group's columns at a time (~12 MiB), not a
/// whole segment's (a default 64 MiB segment is 500 k rows; 2^20-row groups held 400 MiB).
pub const ROW_GROUP_ROWS: usize = 1 << 15;
/// `created_by` in every file (constant so output is byte-identical for the same input).
const CREATED_BY: &str = "comminsight-agent";
/// zstd level of the Parquet pages (1: the archive runs beside training on every host).
const PAGE_ZSTD_LEVEL: i32 = 1;

/// Columns written without min / max statistics (see [`ParquetWriter::new`]).
pub(super) const NO_STATISTICS: [&str; 21] = [
    "kind",
    "flags",
    "comm_name",
    "peer",
    "root",
    "func",
    "algo",
    "proto",
    "datatype",
    "coll_local_sn",
    "count",
    "nchannels",
    "timing",
    "gpu_start_ns",
    "gpu_end_ns",
    "clock_err_ns",
    "api_ns",
    "nwarps",
    "channels_done",
    "gpu_clock_err_ns",
    "body_json",
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
            // per row (seq, times), where a dictionary only costs time (they are delta-coded).
            .set_dictionary_enabled(false)
            .set_column_dictionary_enabled(ColumnPath::from("kind"), true)
            .set_column_dictionary_enabled(ColumnPath::from("comm_hash"), true)
            .set_column_dictionary_enabled(ColumnPath::from("comm_name"), true)
            .set_column_dictionary_enabled(ColumnPath::from("func"), true)
            .set_column_dictionary_enabled(ColumnPath::from("algo"), true)
            .set_column_dictionary_enabled(ColumnPath::from("proto"), true)
            .set_column_dictionary_enabled(ColumnPath::from("datatype"), true)
            .set_column_dictionary_enabled(ColumnPath::from("timing"), true);
        // Numbers as DELTA_BINARY_PACKED: times, sequence numbers and sizes of consecutive
        // operations differ little, so a page holds ~10-20 bits a value instead of 64 and its
        // zstd pass has ~1/4 of the bytes to compress (issue 23: 17 % less archive time).
        let props = COLUMNS
            .iter()
            .filter(|c| c.1 != Ty::Str)
            .fold(props, |p, c| {
                p.set_column_encoding(ColumnPath::from(c.0), Encoding::DELTA_BINARY_PACKED)
            });
        // Min / max statistics (row-group and page pruning) only where queries filter: times,
        // seq, comm, rank, sizes. Names repeat in every row group and the other numbers are
        // not filtered on; computing their statistics cost ~10 % of the archive's time.
        let props = NO_STATISTICS.iter().fold(props, |p, c| {
            p.set_column_statistics_enabled(ColumnPath::from(*c), EnabledStatistics::None)
        });
        let props = props.build();
        let fw = SerializedFileWriter::new(w, schema, Arc::new(props))?;
        let cols = Cols::new(rows_hint.min(ROW_GROUP_ROWS));
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
                self.strs.name_comm(c.comm_hash, name);
            }
        }
    }

    /// The row of `rec` (none for a segment header or a repeated preamble record).
    pub(crate) fn push(&mut self, rec: &Record) -> Result<(), ParquetError> {
        let (pid, align, gpu) = (self.pid, self.align, self.gpu);
        if super::parquet_row::push_row(&mut self.cols, rec, pid, &mut self.strs, align, gpu) {
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

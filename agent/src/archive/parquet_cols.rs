//! The Parquet columns of the archive and one row group's buffers of them: the schema's columns
//! in file order, their indices, and the buffers `parquet_row` fills a row at a time and
//! `parquet_file` writes a row group at a time.

use std::collections::HashMap;
use std::io::Write;

use ::parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use ::parquet::errors::ParquetError;
use ::parquet::file::writer::SerializedFileWriter;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ty {
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
pub(super) const COLUMNS: [(&str, Ty, bool); 35] = [
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

/// Column indices, in file order (of [`COLUMNS`]).
pub(super) mod col {
    pub const PID: usize = 0;
    pub const SEQ: usize = 1;
    pub const KIND: usize = 2;
    pub const FLAGS: usize = 3;
    pub const COMM_HASH: usize = 4;
    pub const COMM_NAME: usize = 5;
    pub const RANK: usize = 6;
    pub const PEER: usize = 7;
    pub const ROOT: usize = 8;
    pub const FUNC: usize = 9;
    pub const ALGO: usize = 10;
    pub const PROTO: usize = 11;
    pub const DATATYPE: usize = 12;
    pub const COLL_SN: usize = 13;
    pub const COLL_LOCAL_SN: usize = 14;
    pub const COUNT: usize = 15;
    pub const BYTES: usize = 16;
    pub const NCHANNELS: usize = 17;
    pub const TIMING: usize = 18;
    pub const ENQUEUE_NS: usize = 19;
    pub const START_NS: usize = 20;
    pub const END_NS: usize = 21;
    pub const GPU_START_NS: usize = 22;
    pub const GPU_END_NS: usize = 23;
    pub const DURATION_NS: usize = 24;
    pub const ALIGNED_START_NS: usize = 25;
    pub const ALIGNED_END_NS: usize = 26;
    pub const CLOCK_ERR_NS: usize = 27;
    pub const API_NS: usize = 28;
    pub const NWARPS: usize = 29;
    pub const CHANNELS_DONE: usize = 30;
    pub const ALIGNED_GPU_START_NS: usize = 31;
    pub const ALIGNED_GPU_END_NS: usize = 32;
    pub const GPU_CLOCK_ERR_NS: usize = 33;
    pub const BODY_JSON: usize = 34;
}
const N: usize = COLUMNS.len();

/// The comm cells, shared by every row of a comm (a `ByteArray` clone is a reference count).
#[derive(Default)]
pub(super) struct Strs {
    /// comm hash -> ("0x%016x", comm name from its comm_init).
    comms: HashMap<u64, (ByteArray, Option<ByteArray>)>,
}

impl Strs {
    /// The cells of comm `h` (its hash rendered once, its name once learnt).
    fn entry(&mut self, h: u64) -> &mut (ByteArray, Option<ByteArray>) {
        self.comms
            .entry(h)
            .or_insert_with(|| (ByteArray::from(format!("0x{h:016x}").into_bytes()), None))
    }

    /// (comm_hash, comm_name) cells of a comm.
    pub(super) fn comm(&mut self, h: u64) -> (ByteArray, Option<ByteArray>) {
        let (hash, name) = self.entry(h);
        (hash.clone(), name.clone())
    }

    /// Name a comm (from its `comm_init`) for all its rows.
    pub(super) fn name_comm(&mut self, h: u64, name: ByteArray) {
        self.entry(h).1 = Some(name);
    }
}

/// Bit i set: column i is required.
const REQUIRED_MASK: u64 = {
    let mut m = 0u64;
    let mut i = 0;
    while i < N {
        if COLUMNS[i].2 {
            m |= 1 << i;
        }
        i += 1;
    }
    m
};

/// The nullable columns (those with definition levels).
const OPTIONAL: [usize; N - REQUIRED_MASK.count_ones() as usize] = {
    let mut out = [0; N - REQUIRED_MASK.count_ones() as usize];
    let (mut i, mut k) = (0, 0);
    while i < N {
        if !COLUMNS[i].2 {
            out[k] = i;
            k += 1;
        }
        i += 1;
    }
    out
};

/// Column buffers of one row group (filled a row at a time by `parquet_row::Row`).
#[derive(Default)]
pub(super) struct Cols {
    pub(super) ints: Vec<Vec<i64>>,
    pub(super) strs: Vec<Vec<ByteArray>>,
    /// The INT32 columns' values at write time (reused).
    narrow: Vec<i32>,
    defs: Vec<Vec<i16>>,
    pub(super) rows: usize,
}

impl Cols {
    /// Buffers sized for `rows` rows (no regrowth while filling a row group).
    pub(super) fn new(rows: usize) -> Cols {
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
            narrow: Vec::new(),
            rows: 0,
        }
    }

    /// End a row whose columns with a value are the bits of `set`: definition levels of the
    /// nullable columns (required columns are always set and have none).
    pub(super) fn end_row(&mut self, set: u64) {
        debug_assert_eq!(
            set & REQUIRED_MASK,
            REQUIRED_MASK,
            "a required column is null"
        );
        for &i in &OPTIONAL {
            self.defs[i].push(((set >> i) & 1) as i16);
        }
        self.rows += 1;
    }

    pub(super) fn write<W: Write + Send>(
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
                    self.narrow.clear();
                    self.narrow.extend(self.ints[i].iter().map(|&x| x as i32));
                    col.typed::<Int32Type>()
                        .write_batch(&self.narrow, defs, None)?;
                }
            }
            col.close()?;
            i += 1;
        }
        rg.close()?;
        // The buffers are reused for the next row group (no second set allocated beside them).
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

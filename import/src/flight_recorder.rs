//! PyTorch NCCL Flight Recorder dumps (format 2.x): the per-rank pickle torch writes (read by
//! [`crate::pickle`], nothing executed) or its JSON form, typed ([`FrDump`]) and turned into
//! CommInsight record streams ([`write_streams`]).
//!
//! A dump holds the last operations each process group of one rank enqueued (`entries`), the
//! groups it knows (`pg_config`, keyed by the group's NAME, which is the same on every rank) and
//! per-group progress (`pg_status`, keyed by `pg_id`, a per-rank local index that differs from
//! rank to rank). Entries are matched across ranks by the group name ([`comm_hash`]) and
//! `collective_seq_id` / `p2p_seq_id`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use comminsight_wire::names::{DataType, Func};

use crate::{ImportError, Skips};

mod parse;
#[cfg(test)]
mod tests;
mod write;

pub use write::write_streams;

/// The largest dump file read (1 GiB).
pub const MAX_DUMP_BYTES: u64 = 1 << 30;

/// One Python frame of an entry's call site.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrFrame {
    pub name: String,
    pub filename: String,
    pub line: i64,
}

/// One operation a process group enqueued.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrEntry {
    pub record_id: i64,
    /// The group's local index on this rank (not comparable across ranks; use `pg_name`).
    pub pg_id: i64,
    /// The group's name: the same on every rank.
    pub pg_name: String,
    /// The group's description (`default_pg`, Megatron's `TENSOR_MODEL_PARALLEL_GROUP`, ...).
    pub pg_desc: String,
    /// The Python thread that issued the op (`thread_name`, `thread_id`), when the dump says.
    pub thread_name: String,
    pub thread_id: u64,
    pub collective_seq_id: i64,
    pub p2p_seq_id: i64,
    pub op_id: i64,
    /// `nccl:all_reduce`, `nccl:send 0->1`, `nccl:recv 0<-8`, ...
    pub profiling_name: String,
    pub time_created_ns: u64,
    pub input_sizes: Vec<Vec<i64>>,
    pub input_dtypes: Vec<String>,
    pub output_sizes: Vec<Vec<i64>>,
    pub output_dtypes: Vec<String>,
    /// `scheduled`, `started` or `completed`.
    pub state: String,
    /// `time_discovered_started_ns`, when timing was enabled.
    pub time_started_ns: Option<u64>,
    /// `time_discovered_completed_ns`, when timing was enabled.
    pub time_completed_ns: Option<u64>,
    pub timeout_ms: u64,
    pub is_p2p: bool,
    pub retired: bool,
    /// Call-site frames (innermost first), when the dump has them.
    pub frames: Vec<FrFrame>,
}

/// A process group as `pg_config` describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgConfig {
    pub name: String,
    pub desc: String,
    /// Global ranks of the members, in group-rank order.
    pub ranks: Vec<i64>,
}

/// A group's progress (`pg_status`): sequence ids of the last collective enqueued, started and
/// completed (-1 when none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgStatus {
    pub last_enqueued: i64,
    pub last_started: i64,
    pub last_completed: i64,
}

/// One rank's dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrDump {
    pub path: PathBuf,
    /// Global rank: the `rank` key, else the trailing digits of the file name.
    pub rank: i64,
    pub version: String,
    pub nccl_version: String,
    /// By group name.
    pub pg_config: BTreeMap<String, PgConfig>,
    /// By `pg_id` (this rank's local index).
    pub pg_status: BTreeMap<i64, PgStatus>,
    pub entries: Vec<FrEntry>,
}

impl FrDump {
    /// Size of the world: the `default_pg` group's, else the largest group's.
    pub fn world(&self) -> usize {
        self.pg_config
            .values()
            .find(|g| g.desc == "default_pg")
            .or_else(|| self.pg_config.values().max_by_key(|g| g.ranks.len()))
            .map_or(0, |g| g.ranks.len())
    }

    /// Group names by this rank's `pg_id` (the key of `pg_status`), as its entries pair them;
    /// groups with no entry in the dump are missing. `pg_id`s differ from rank to rank.
    pub fn pg_names(&self) -> BTreeMap<i64, String> {
        self.entries
            .iter()
            .map(|e| (e.pg_id, e.pg_name.clone()))
            .collect()
    }

    /// This rank's index in group `pg_name`, when it is a member.
    pub fn group_rank(&self, pg_name: &str) -> Option<usize> {
        let g = self.pg_config.get(pg_name)?;
        g.ranks.iter().position(|r| *r == self.rank)
    }
}

impl FrEntry {
    /// The operation word of `profiling_name`, lowercased (`nccl:send 0->1` -> `send`).
    fn op_word(&self) -> String {
        let n = self.profiling_name.trim();
        let n = n.split_once(':').map_or(n, |(_, rest)| rest);
        n.split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_lowercase()
    }

    /// The NCCL function of the entry, from `profiling_name`; `None` for what has none
    /// (`nccl:coalesced`, unknown names).
    pub fn func(&self) -> Option<Func> {
        let w = self.op_word();
        let has = |s: &str| w.contains(s);
        Some(if has("all_reduce") || has("allreduce") || w == "barrier" {
            Func::ALL_REDUCE
        } else if has("all_gather") || has("allgather") {
            Func::ALL_GATHER
        } else if has("reduce_scatter") || has("reducescatter") {
            Func::REDUCE_SCATTER
        } else if has("all_to_all") || has("alltoall") {
            Func::ALL_TO_ALL
        } else if has("broadcast") {
            Func::BROADCAST
        } else if has("reduce") {
            Func::REDUCE
        } else if has("send") {
            Func::SEND
        } else if has("recv") {
            Func::RECV
        } else if has("gather") {
            Func::GATHER
        } else if has("scatter") {
            Func::SCATTER
        } else {
            return None;
        })
    }

    /// (sender, receiver) group ranks of a send or recv: `a->b` gives `(a, b)`, `a<-b` gives
    /// `(b, a)`.
    pub fn p2p_pair(&self) -> Option<(i64, i64)> {
        let rest = self.profiling_name.split_whitespace().nth(1)?;
        let num = |s: &str| s.trim().parse::<i64>().ok();
        if let Some((a, b)) = rest.split_once("->") {
            return Some((num(a)?, num(b)?));
        }
        let (a, b) = rest.split_once("<-")?;
        Some((num(b)?, num(a)?))
    }

    /// Elements of the input tensors (sum over tensors of the product of their dimensions;
    /// negative dimensions count 0), saturating.
    pub fn count(&self) -> u64 {
        self.input_sizes.iter().fold(0u64, |acc, shape| {
            let n = shape.iter().fold(1u64, |p, d| {
                p.saturating_mul(u64::try_from(*d).unwrap_or(0))
            });
            acc.saturating_add(n)
        })
    }

    /// The first input dtype as NCCL names it (`BFloat16` -> `ncclBfloat16`); unknown when
    /// there is none or NCCL has no such type.
    pub fn datatype(&self) -> DataType {
        self.input_dtypes
            .first()
            .map_or(DataType(0), |d| DataType::from_name(nccl_dtype(d)))
    }

    /// `count() * element size` (0 for an unknown dtype), saturating.
    pub fn bytes(&self) -> u64 {
        self.count().saturating_mul(self.datatype().size())
    }
}

/// NCCL's name for a torch dtype (`c10::toString` spelling, or `torch.<name>`).
fn nccl_dtype(d: &str) -> &'static str {
    let d = d.trim();
    let d = d.strip_prefix("torch.").unwrap_or(d).to_ascii_lowercase();
    match d.as_str() {
        "char" | "int8" => "ncclInt8",
        "byte" | "uint8" | "bool" => "ncclUint8",
        "int" | "int32" => "ncclInt32",
        "uint32" => "ncclUint32",
        "long" | "int64" => "ncclInt64",
        "uint64" => "ncclUint64",
        "half" | "float16" => "ncclFloat16",
        "float" | "float32" => "ncclFloat32",
        "double" | "float64" => "ncclFloat64",
        "bfloat16" => "ncclBfloat16",
        "float8_e4m3fn" | "float8_e4m3fnuz" => "ncclFloat8e4m3",
        "float8_e5m2" | "float8_e5m2fnuz" => "ncclFloat8e5m2",
        _ => "Unknown",
    }
}

/// The communicator hash of a process group: FNV-1a 64 of `"flight_recorder:" + name`, the
/// same on every rank (group names are global).
pub fn comm_hash(pg_name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"flight_recorder:".iter().chain(pg_name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parse one dump: a pickle (starts with `0x80`, or anything not JSON) or its JSON form.
/// Entries that cannot be read are skipped and counted; the error names `path` and what is
/// missing.
pub fn parse_dump(bytes: &[u8], path: &Path) -> Result<(FrDump, Skips), ImportError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let doc = if matches!(first, Some(b'{' | b'[')) {
        serde_json::from_slice::<serde_json::Value>(bytes).map_err(|e| {
            ImportError::format(
                path,
                format!("not a Flight Recorder dump: invalid JSON ({e})"),
            )
        })?
    } else {
        crate::pickle::parse(bytes)
            .map_err(|e| {
                ImportError::format(path, format!("not a readable Flight Recorder pickle: {e}"))
            })?
            .to_json()
    };
    parse::dump(&doc, path)
}

/// Read and parse the dump at `path`; files over [`MAX_DUMP_BYTES`] are refused.
pub fn read_dump(path: &Path) -> Result<(FrDump, Skips), ImportError> {
    let f = std::fs::File::open(path).map_err(|e| ImportError::io(path, e))?;
    let len = f.metadata().map_err(|e| ImportError::io(path, e))?.len();
    let too_big = |len: u64| {
        ImportError::format(
            path,
            format!("{len} bytes, more than the {MAX_DUMP_BYTES} (1 GiB) a Flight Recorder dump may have; is this a dump?"),
        )
    };
    if len > MAX_DUMP_BYTES {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.take(MAX_DUMP_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImportError::io(path, e))?;
    if bytes.len() as u64 > MAX_DUMP_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    parse_dump(&bytes, path)
}

/// The rank a file name states: its trailing digits (`_dump_9`, `nccl_trace_rank_9`,
/// `_dump_9.json`), a `.json`, `.pkl` or `.pickle` extension ignored.
pub fn rank_from_name(path: &Path) -> Option<i64> {
    let name = path.file_name()?.to_str()?;
    let stem = [".json", ".pkl", ".pickle"]
        .iter()
        .find_map(|e| name.strip_suffix(e))
        .unwrap_or(name);
    let digits: String = stem
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// The dumps at `path`: the file itself, or the files of a directory that are Flight Recorder
/// dumps (by content), sorted by the rank their names state (then by name). A JSON file
/// `X.json` next to a dump `X` is its converted copy and is left out.
pub fn find_dumps(path: &Path) -> Result<Vec<PathBuf>, ImportError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let files = crate::detect::files_in(path)?;
    let mut dumps = Vec::new();
    for p in &files {
        if crate::detect::sniff(&crate::detect::head(p)?) == Some(crate::Format::FlightRecorder) {
            dumps.push(p.clone());
        }
    }
    let all = dumps.clone();
    dumps.retain(|p| {
        let copy_of = p
            .to_str()
            .and_then(|s| s.strip_suffix(".json"))
            .map(PathBuf::from);
        !copy_of.is_some_and(|orig| all.contains(&orig))
    });
    if dumps.is_empty() {
        return Err(ImportError::format(
            path,
            "no Flight Recorder dump in this directory (pickle or JSON with \"entries\"); give the dump files",
        ));
    }
    dumps.sort_by_key(|p| (rank_from_name(p).unwrap_or(i64::MAX), p.clone()));
    Ok(dumps)
}

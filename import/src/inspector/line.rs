//! One NCCL Inspector JSON line (NVIDIA's plugin, format v4.x, or CommInsight's compatible
//! writer) parsed into an [`InspectorOp`].

use comminsight_wire::names::Func;
use comminsight_wire::record::Timing;
use serde_json::{Map, Value};

/// One operation as a line states it.
#[derive(Clone, Debug, PartialEq)]
pub struct InspectorOp {
    /// `header.id` (`"0x<hex>"`).
    pub comm_hash: u64,
    /// `header.comm_name` (`"unknown"` when NCCL had none; empty when absent).
    pub comm_name: String,
    /// `header.rank`: the rank in this communicator.
    pub rank: i64,
    /// `header.n_ranks`.
    pub n_ranks: u64,
    /// `header.nnodes` (0 when absent).
    pub nnodes: u64,
    /// `metadata.inspector_output_format_version`.
    pub version: String,
    /// `metadata.hostname`.
    pub hostname: String,
    /// `metadata.pid`.
    pub pid: u32,
    /// `metadata.dump_timestamp_us`: when the line was written (not when the op ran).
    pub dump_timestamp_us: u64,
    /// `p2p_perf` rather than `coll_perf`.
    pub is_p2p: bool,
    /// `coll` / `p2p`, NCCL's spelling.
    pub func: Func,
    /// `coll_sn` / `p2p_sn`.
    pub sn: u64,
    /// `p2p_peer`, -1 when absent (and for collectives).
    pub peer: i64,
    /// `*_msg_size_bytes`.
    pub bytes: u64,
    /// `*_exec_time_us`.
    pub exec_us: f64,
    /// `*_timing_source` (enqueue when absent or unknown).
    pub timing: Timing,
    /// `event_trace_ts.coll_start` / `p2p_start` (verbose mode), µs of the wall clock.
    pub start_us: Option<u64>,
    /// `event_trace_ts.coll_stop` / `p2p_stop` (verbose mode), µs of the wall clock.
    pub stop_us: Option<u64>,
}

/// Why a line is skipped; each is one counted reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum LineError {
    NotJson,
    Missing(&'static str),
    Version(String),
    Invalid,
    UnknownFunc,
}

impl LineError {
    /// The phrase it is counted under.
    pub(super) fn reason(&self) -> String {
        match self {
            LineError::NotJson => "line not JSON".into(),
            LineError::Missing(k) => format!("line without a valid {k}"),
            LineError::Version(v) => format!("line in unsupported format version {v}"),
            LineError::Invalid => {
                "collective named Invalid by Inspector (AlltoAll and others it does not name)"
                    .into()
            }
            LineError::UnknownFunc => "line naming an unknown collective".into(),
        }
    }
}

fn obj<'a>(
    v: &'a Map<String, Value>,
    k: &'static str,
) -> Result<&'a Map<String, Value>, LineError> {
    v.get(k)
        .and_then(Value::as_object)
        .ok_or(LineError::Missing(k))
}

fn uint(v: &Map<String, Value>, k: &'static str) -> Result<u64, LineError> {
    v.get(k).and_then(as_u64).ok_or(LineError::Missing(k))
}

/// A non-negative integer, also written as an integral float or a decimal string.
fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0 && *f < 1.8e19)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn int(v: &Map<String, Value>, k: &'static str) -> Result<i64, LineError> {
    v.get(k)
        .and_then(|x| {
            x.as_i64()
                .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
        })
        .ok_or(LineError::Missing(k))
}

/// Versions this build reads: `v4`, `v4.<anything>`.
fn version_ok(v: &str) -> bool {
    v == "v4" || v.starts_with("v4.")
}

/// Parse one line; `Err` says why it is skipped.
pub(super) fn parse(line: &str) -> Result<InspectorOp, LineError> {
    let v: Value = serde_json::from_str(line).map_err(|_| LineError::NotJson)?;
    let top = v.as_object().ok_or(LineError::NotJson)?;
    let meta = obj(top, "metadata")?;
    let version = meta
        .get("inspector_output_format_version")
        .and_then(Value::as_str)
        .ok_or(LineError::Missing("inspector_output_format_version"))?;
    if !version_ok(version) {
        return Err(LineError::Version(version.chars().take(32).collect()));
    }
    let header = obj(top, "header")?;
    let id = header
        .get("id")
        .and_then(Value::as_str)
        .ok_or(LineError::Missing("header.id"))?;
    let hex = id
        .strip_prefix("0x")
        .or_else(|| id.strip_prefix("0X"))
        .unwrap_or(id);
    let comm_hash = u64::from_str_radix(hex, 16).map_err(|_| LineError::Missing("header.id"))?;
    let (perf, is_p2p, p) = match (top.get("coll_perf"), top.get("p2p_perf")) {
        (Some(Value::Object(m)), _) => (m, false, "coll"),
        (_, Some(Value::Object(m))) => (m, true, "p2p"),
        _ => return Err(LineError::Missing("coll_perf or p2p_perf")),
    };
    let k = |s: &'static str, c: &'static str| if is_p2p { s } else { c };
    let name = perf
        .get(p)
        .and_then(Value::as_str)
        .ok_or(LineError::Missing("coll or p2p name"))?;
    if name == "Invalid" {
        return Err(LineError::Invalid);
    }
    let func = Func::parse(name)
        .filter(|f| f.0 != 0)
        .ok_or(LineError::UnknownFunc)?;
    let exec_us = perf
        .get(k("p2p_exec_time_us", "coll_exec_time_us"))
        .and_then(Value::as_f64)
        .filter(|f| f.is_finite() && *f >= 0.0)
        .ok_or(LineError::Missing("exec_time_us"))?;
    let trace = perf
        .get("event_trace_ts")
        .or_else(|| top.get("event_trace_ts"))
        .and_then(Value::as_object);
    let ts = |key: &str| trace.and_then(|t| t.get(key)).and_then(as_u64);
    let pid = uint(meta, "pid")?;
    Ok(InspectorOp {
        comm_hash,
        comm_name: header
            .get("comm_name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        rank: int(header, "rank")?,
        n_ranks: uint(header, "n_ranks")?,
        nnodes: header.get("nnodes").and_then(as_u64).unwrap_or(0),
        version: version.to_string(),
        hostname: meta
            .get("hostname")
            .and_then(Value::as_str)
            .ok_or(LineError::Missing("metadata.hostname"))?
            .to_string(),
        pid: u32::try_from(pid).map_err(|_| LineError::Missing("metadata.pid"))?,
        dump_timestamp_us: uint(meta, "dump_timestamp_us")?,
        is_p2p,
        func,
        sn: uint(perf, k("p2p_sn", "coll_sn"))?,
        peer: if is_p2p {
            perf.get("p2p_peer").and_then(Value::as_i64).unwrap_or(-1)
        } else {
            -1
        },
        bytes: uint(perf, k("p2p_msg_size_bytes", "coll_msg_size_bytes"))?,
        exec_us,
        timing: perf
            .get(k("p2p_timing_source", "coll_timing_source"))
            .and_then(Value::as_str)
            .and_then(Timing::from_name)
            .unwrap_or(Timing::Enqueue),
        start_us: ts(k("p2p_start", "coll_start")),
        stop_us: ts(k("p2p_stop", "coll_stop")),
    })
}

//! JSON-lines rendering of records (one object per line) and its lossless inverse.
//!
//! Field names follow DESIGN.md §4. Every binary field is written; `comm_hash` is a `"0x…"` hex
//! string (64-bit values do not survive JavaScript/DuckDB doubles), codes are NCCL's strings.
//! Derived fields for humans and tests — `start_us` / `end_us` (µs, integer, from the `_ns`
//! fields) and `comm_name` on operation records (from the stream's `comm_init`) — are ignored
//! when parsing, so binary -> JSON -> binary is byte-identical.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::names::{Algo, DataType, Func, Proto};
use crate::record::*;

/// Why a JSON line is not a record.
#[derive(Debug)]
pub enum JsonError {
    Syntax(serde_json::Error),
    NotAnObject,
    UnknownKind(String),
    Missing(&'static str),
    Invalid { field: &'static str, value: String },
}

impl core::fmt::Display for JsonError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            JsonError::Syntax(e) => write!(f, "not JSON: {e}"),
            JsonError::NotAnObject => f.write_str("a record line must be a JSON object"),
            JsonError::UnknownKind(k) => write!(f, "unknown record kind {k:?}"),
            JsonError::Missing(field) => write!(f, "missing field {field:?}"),
            JsonError::Invalid { field, value } => {
                write!(f, "invalid value {value} for field {field:?}")
            }
        }
    }
}

impl std::error::Error for JsonError {}

/// How one Rust field type maps to JSON.
trait Field: Sized {
    fn to_json(&self) -> Value;
    fn from_json(v: &Value) -> Option<Self>;
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn to_json(&self) -> Value {
                Value::from(*self)
            }
            fn from_json(v: &Value) -> Option<Self> {
                if let Some(u) = v.as_u64() {
                    <$t>::try_from(u).ok()
                } else {
                    v.as_i64().and_then(|i| <$t>::try_from(i).ok())
                }
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64, i32);

macro_rules! code_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn to_json(&self) -> Value {
                Value::from(self.name())
            }
            fn from_json(v: &Value) -> Option<Self> {
                v.as_str().and_then(<$t>::parse)
            }
        }
    )*};
}
code_field!(Func, DataType, Algo, Proto);

impl Field for Timing {
    fn to_json(&self) -> Value {
        Value::from(self.name())
    }
    fn from_json(v: &Value) -> Option<Self> {
        v.as_str().and_then(Timing::from_name)
    }
}

impl Field for StrField {
    fn to_json(&self) -> Value {
        Value::from(self.as_str_lossy().into_owned())
    }
    fn from_json(v: &Value) -> Option<Self> {
        v.as_str().map(StrField::from)
    }
}

/// A 16-byte address (IPv6, IPv4 stored v4-mapped, or an InfiniBand GID) written as an IP
/// address string: v4-mapped as dotted IPv4, everything else in IPv6 notation.
impl Field for [u8; 16] {
    fn to_json(&self) -> Value {
        let a = std::net::Ipv6Addr::from(*self);
        match a.to_ipv4_mapped() {
            Some(v4) => Value::from(v4.to_string()),
            None => Value::from(a.to_string()),
        }
    }
    fn from_json(v: &Value) -> Option<Self> {
        let s = v.as_str()?;
        match s.parse::<std::net::IpAddr>().ok()? {
            std::net::IpAddr::V4(a) => Some(a.to_ipv6_mapped().octets()),
            std::net::IpAddr::V6(a) => Some(a.octets()),
        }
    }
}

/// A u64 written as a `"0x%016x"` string (hashes).
struct Hex;
impl Hex {
    fn to_json(v: &u64) -> Value {
        Value::from(format!("0x{v:016x}"))
    }
    fn from_json(v: &Value) -> Option<u64> {
        let s = v.as_str()?;
        let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
        u64::from_str_radix(digits, 16).ok()
    }
}

/// A UUID written as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
struct Uuid;
impl Uuid {
    fn to_json(v: &[u8; 16]) -> Value {
        Value::from(crate::moe::uuid_string(v))
    }
    fn from_json(v: &Value) -> Option<[u8; 16]> {
        crate::moe::parse_uuid(v.as_str()?)
    }
}

/// The values of an `ep_stats` record as a JSON array (all five; unused ones are 0).
impl Field for [u64; crate::moe::EP_VALUES_PER_RECORD] {
    fn to_json(&self) -> Value {
        Value::from(self.to_vec())
    }
    fn from_json(v: &Value) -> Option<Self> {
        let a = v.as_array()?;
        let mut out = [0u64; crate::moe::EP_VALUES_PER_RECORD];
        if a.len() != out.len() {
            return None;
        }
        for (o, x) in out.iter_mut().zip(a) {
            *o = u64::from_json(x)?;
        }
        Some(out)
    }
}

/// Default mapping through [`Field`].
struct Plain;
impl Plain {
    fn to_json<T: Field>(v: &T) -> Value {
        v.to_json()
    }
    fn from_json<T: Field>(v: &Value) -> Option<T> {
        T::from_json(v)
    }
}

trait JsonBody: Sized {
    fn write(&self, m: &mut Map<String, Value>);
    fn read(m: &Map<String, Value>) -> Result<Self, JsonError>;
}

fn get<'a>(m: &'a Map<String, Value>, field: &'static str) -> Result<&'a Value, JsonError> {
    m.get(field).ok_or(JsonError::Missing(field))
}

fn invalid(field: &'static str, v: &Value) -> JsonError {
    JsonError::Invalid {
        field,
        value: v.to_string(),
    }
}

/// `json_body!(Type { field: Conv, ... })`, optionally followed by `; added { field: Conv, ... }`:
/// fields added later, read as their default when absent (lines written by older versions).
macro_rules! json_body {
    ($ty:ident { $($f:ident : $conv:ident),* $(,)? }) => {
        json_body!($ty { $($f: $conv),* } ; added {});
    };
    ($ty:ident { $($f:ident : $conv:ident),* $(,)? } ; added { $($a:ident : $aconv:ident),* $(,)? }) => {
        impl JsonBody for $ty {
            fn write(&self, m: &mut Map<String, Value>) {
                $( m.insert(stringify!($f).into(), $conv::to_json(&self.$f)); )*
                $( m.insert(stringify!($a).into(), $aconv::to_json(&self.$a)); )*
            }
            fn read(m: &Map<String, Value>) -> Result<Self, JsonError> {
                Ok($ty { $( $f: {
                    let v = get(m, stringify!($f))?;
                    $conv::from_json(v).ok_or_else(|| invalid(stringify!($f), v))?
                }, )* $( $a: match m.get(stringify!($a)) {
                    None => Default::default(),
                    Some(v) => $aconv::from_json(v).ok_or_else(|| invalid(stringify!($a), v))?,
                }, )* })
            }
        }
    };
}

json_body!(SegmentHeader {
    format: Plain,
    record_size: Plain,
    segment_index: Plain,
    pid: Plain,
    created_real_ns: Plain,
    created_mono_ns: Plain,
} ; added {
    source: Plain,
});
json_body!(ProcStart {
    pid: Plain,
    rank: Plain,
    local_rank: Plain,
    world_size: Plain,
    mono_ns: Plain,
    real_ns: Plain,
    abi_version: Plain,
    host: Plain,
    job: Plain,
});
json_body!(CommInit {
    comm_hash: Hex,
    nranks: Plain,
    rank: Plain,
    nnodes: Plain,
    local_rank: Plain,
    device: Plain,
    abi_version: Plain,
    time_ns: Plain,
    comm_name: Plain,
});
json_body!(CommFini {
    comm_hash: Hex,
    rank: Plain,
    time_ns: Plain,
    ops: Plain,
    open_ops: Plain
});
json_body!(OpRecord {
    comm_hash: Hex,
    coll_sn: Plain,
    coll_local_sn: Plain,
    count: Plain,
    bytes: Plain,
    enqueue_ns: Plain,
    start_ns: Plain,
    end_ns: Plain,
    gpu_start_ns: Plain,
    gpu_end_ns: Plain,
    api_ns: Plain,
    rank: Plain,
    root: Plain,
    peer: Plain,
    func: Plain,
    datatype: Plain,
    algo: Plain,
    proto: Plain,
    nchannels: Plain,
    nwarps: Plain,
    timing: Plain,
    channels_done: Plain,
});
json_body!(ProxyRecord {
    comm_hash: Hex,
    parent_local_sn: Plain,
    start_ns: Plain,
    end_ns: Plain,
    bytes: Plain,
    send_wait_ns: Plain,
    recv_wait_ns: Plain,
    pid: Plain,
    rank: Plain,
    peer: Plain,
    nsteps: Plain,
    chunk_size: Plain,
    steps_done: Plain,
    channel: Plain,
    is_send: Plain,
});
json_body!(NetRecord {
    comm_hash: Hex,
    parent_local_sn: Plain,
    start_ns: Plain,
    end_ns: Plain,
    wr_id: Plain,
    length: Plain,
    net_type: Plain,
    net_version: Plain,
    rank: Plain,
    device: Plain,
    qp_num: Plain,
    opcode: Plain,
    fd: Plain,
    sock_op: Plain,
});
json_body!(Overdue {
    comm_hash: Hex,
    coll_sn: Plain,
    coll_local_sn: Plain,
    enqueue_ns: Plain,
    start_ns: Plain,
    now_ns: Plain,
    count: Plain,
    bytes: Plain,
    age_ms: Plain,
    repeat: Plain,
    threshold_ms: Plain,
    rank: Plain,
    peer: Plain,
    func: Plain,
    phase: Plain,
    channels_started: Plain,
    channels_done: Plain,
    is_p2p: Plain,
    nchannels: Plain,
});
json_body!(Stats {
    time_ns: Plain,
    mono_ns: Plain,
    real_ns: Plain,
    records_pushed: Plain,
    ring_drops: Plain,
    pool_drops: Plain,
    bytes_written: Plain,
    records_lost_io: Plain,
    events_ignored: Plain,
    overdue_emitted: Plain,
    segments_sealed: Plain,
    segments_deleted: Plain,
    io_errors: Plain,
    event_mask: Plain,
    writer_failed: Plain,
} ; added {
    ctl_refused: Plain,
    mask_changes: Plain,
});

json_body!(HostThread {
    time_ns: Plain,
    interval_ns: Plain,
    on_cpu_ns: Plain,
    runnable_ns: Plain,
    blocked_ns: Plain,
    blocked_io_ns: Plain,
    state_since_ns: Plain,
    pid: Plain,
    tid: Plain,
    voluntary_switches: Plain,
    involuntary_switches: Plain,
    state: Plain,
    source: Plain,
    comm: Plain,
    syscall: Plain,
});
json_body!(HostQp {
    time_ns: Plain,
    created_ns: Plain,
    pid: Plain,
    tid: Plain,
    qp_num: Plain,
    dest_qp_num: Plain,
    attr_mask: Plain,
    dlid: Plain,
    event: Plain,
    qp_type: Plain,
    old_state: Plain,
    new_state: Plain,
    port: Plain,
    dgid: Plain,
    device: Plain,
});
json_body!(HostTcp {
    time_ns: Plain,
    interval_ns: Plain,
    pid: Plain,
    retransmits: Plain,
    state_changes: Plain,
    sport: Plain,
    dport: Plain,
    event: Plain,
    family: Plain,
    old_state: Plain,
    new_state: Plain,
    saddr: Plain,
    daddr: Plain,
});
json_body!(HostPort {
    time_ns: Plain,
    interval_ns: Plain,
    rx_bytes: Plain,
    tx_bytes: Plain,
    rx_packets: Plain,
    tx_packets: Plain,
    errors: Plain,
    link_downed: Plain,
    port: Plain,
    link_layer: Plain,
    up: Plain,
    port_flags: Plain,
    device: Plain,
});

json_body!(CommDevice {
    comm_hash: Plain,
    time_ns: Plain,
    pci: Plain,
    rank: Plain,
    device: Plain,
    source: Plain,
    uuid: Plain,
});
json_body!(GpuSample {
    time_ns: Plain,
    interval_ns: Plain,
    energy_mj: Plain,
    memory_used_bytes: Plain,
    throttle_reasons: Plain,
    pci: Plain,
    ecc_corrected: Plain,
    ecc_uncorrected: Plain,
    pcie_tx_kbps: Plain,
    pcie_rx_kbps: Plain,
    pcie_replays: Plain,
    power_mw: Plain,
    valid: Plain,
    sm_clock_mhz: Plain,
    memory_clock_mhz: Plain,
    sw_power_share: Plain,
    hw_slowdown_share: Plain,
    hw_thermal_share: Plain,
    hw_power_brake_share: Plain,
    sw_thermal_share: Plain,
    sm_active_share: Plain,
    retired_pages: Plain,
    remapped_rows: Plain,
    sm_util: Plain,
    memory_util: Plain,
    temperature_c: Plain,
    index: Plain,
    source: Plain,
    sample_flags: Plain,
});
json_body!(GpuLink {
    time_ns: Plain,
    interval_ns: Plain,
    tx_bytes: Plain,
    rx_bytes: Plain,
    pci: Plain,
    crc_flit: Plain,
    crc_data: Plain,
    replay: Plain,
    recovery: Plain,
    index: Plain,
    link: Plain,
    up: Plain,
    valid: Plain,
    sample_flags: Plain,
    source: Plain,
});
json_body!(GpuXid {
    time_ns: Plain,
    xid: Plain,
    pci: Plain,
    index: Plain,
    source: Plain,
});

json_body!(EpStats {
    ep_group_id: Hex,
    instance: Uuid,
    window_seq: Plain,
    t_start_ns: Plain,
    t_end_ns: Plain,
    steps: Plain,
    scale_bits: Plain,
    ep_size: Plain,
    rank: Plain,
    first: Plain,
    count: Plain,
    phase: Plain,
    source: Plain,
    ep_flags: Plain,
    values: Plain,
});

/// Render one record as a JSON object (no derived fields).
pub fn to_value(rec: &Record) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("kind".into(), Value::from(rec.kind().name()));
    m.insert("seq".into(), Value::from(rec.seq));
    m.insert("flags".into(), Value::from(rec.flags));
    match &rec.body {
        Body::Segment(b) => b.write(&mut m),
        Body::ProcStart(b) => b.write(&mut m),
        Body::CommInit(b) => b.write(&mut m),
        Body::CommFini(b) => b.write(&mut m),
        Body::Coll(b) | Body::P2p(b) => b.write(&mut m),
        Body::Proxy(b) => b.write(&mut m),
        Body::Net(b) => b.write(&mut m),
        Body::Overdue(b) => b.write(&mut m),
        Body::Stats(b) => b.write(&mut m),
        Body::Thread(b) => b.write(&mut m),
        Body::Qp(b) => b.write(&mut m),
        Body::Tcp(b) => b.write(&mut m),
        Body::Port(b) => b.write(&mut m),
        Body::CommDevice(b) => b.write(&mut m),
        Body::Gpu(b) => b.write(&mut m),
        Body::GpuLink(b) => b.write(&mut m),
        Body::Xid(b) => b.write(&mut m),
        Body::EpStats(b) => b.write(&mut m),
    }
    m
}

/// Parse one record from a JSON object; derived fields are ignored.
pub fn from_value(v: &Value) -> Result<Record, JsonError> {
    let m = v.as_object().ok_or(JsonError::NotAnObject)?;
    let kind_v = get(m, "kind")?;
    let kind_s = kind_v.as_str().ok_or_else(|| invalid("kind", kind_v))?;
    let kind = Kind::from_name(kind_s).ok_or_else(|| JsonError::UnknownKind(kind_s.to_string()))?;
    let seq_v = get(m, "seq")?;
    let seq = u64::from_json(seq_v).ok_or_else(|| invalid("seq", seq_v))?;
    let flags_v = get(m, "flags")?;
    let flags = u16::from_json(flags_v).ok_or_else(|| invalid("flags", flags_v))?;
    let body = match kind {
        Kind::Segment => Body::Segment(JsonBody::read(m)?),
        Kind::ProcStart => Body::ProcStart(JsonBody::read(m)?),
        Kind::CommInit => Body::CommInit(JsonBody::read(m)?),
        Kind::CommFini => Body::CommFini(JsonBody::read(m)?),
        Kind::Coll => Body::Coll(JsonBody::read(m)?),
        Kind::P2p => Body::P2p(JsonBody::read(m)?),
        Kind::Proxy => Body::Proxy(JsonBody::read(m)?),
        Kind::Net => Body::Net(JsonBody::read(m)?),
        Kind::Overdue => Body::Overdue(JsonBody::read(m)?),
        Kind::Stats => Body::Stats(JsonBody::read(m)?),
        Kind::Thread => Body::Thread(JsonBody::read(m)?),
        Kind::Qp => Body::Qp(JsonBody::read(m)?),
        Kind::Tcp => Body::Tcp(JsonBody::read(m)?),
        Kind::Port => Body::Port(JsonBody::read(m)?),
        Kind::CommDevice => Body::CommDevice(JsonBody::read(m)?),
        Kind::Gpu => Body::Gpu(JsonBody::read(m)?),
        Kind::GpuLink => Body::GpuLink(JsonBody::read(m)?),
        Kind::Xid => Body::Xid(JsonBody::read(m)?),
        Kind::EpStats => Body::EpStats(JsonBody::read(m)?),
    };
    Ok(Record { seq, flags, body })
}

/// Parse one JSON line.
pub fn from_line(line: &str) -> Result<Record, JsonError> {
    let v: Value = serde_json::from_str(line).map_err(JsonError::Syntax)?;
    from_value(&v)
}

/// Renders a record stream as JSON lines, adding the derived fields (`start_us`, `end_us`,
/// `comm_name` of operations) from what it has seen so far.
#[derive(Default)]
pub struct JsonRenderer {
    comm_names: HashMap<u64, String>,
}

impl JsonRenderer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The object for one record, with derived fields.
    pub fn render_value(&mut self, rec: &Record) -> Map<String, Value> {
        let mut m = to_value(rec);
        let (start, end, hash) = match &rec.body {
            Body::CommInit(c) => {
                if !c.comm_name.is_empty() {
                    self.comm_names
                        .insert(c.comm_hash, c.comm_name.as_str_lossy().into_owned());
                }
                (None, None, None)
            }
            Body::Coll(o) | Body::P2p(o) => (Some(o.start_ns), Some(o.end_ns), Some(o.comm_hash)),
            Body::Proxy(p) => (Some(p.start_ns), Some(p.end_ns), Some(p.comm_hash)),
            Body::Net(n) => (Some(n.start_ns), Some(n.end_ns), Some(n.comm_hash)),
            Body::Overdue(o) => (Some(o.start_ns.max(o.enqueue_ns)), None, Some(o.comm_hash)),
            _ => (None, None, None),
        };
        if let Some(s) = start {
            m.insert("start_us".into(), Value::from(s / 1000));
        }
        if let Some(e) = end {
            m.insert("end_us".into(), Value::from(e / 1000));
        }
        if let Some(name) = hash.and_then(|h| self.comm_names.get(&h)) {
            m.insert("comm_name".into(), Value::from(name.clone()));
        }
        m
    }

    /// One JSON line (without the trailing newline).
    pub fn render_line(&mut self, rec: &Record) -> String {
        Value::Object(self.render_value(rec)).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::samples;

    #[test]
    fn binary_json_binary_is_byte_identical() {
        let mut r = JsonRenderer::new();
        for rec in samples() {
            let raw = rec.encode();
            let line = r.render_line(&Record::decode(&raw).unwrap());
            let back = from_line(&line).unwrap();
            assert_eq!(back.encode(), raw, "{line}");
        }
    }

    #[test]
    fn json_binary_json_is_identical() {
        let mut r1 = JsonRenderer::new();
        let mut r2 = JsonRenderer::new();
        for rec in samples() {
            let line = r1.render_line(&rec);
            let again =
                r2.render_line(&Record::decode(&from_line(&line).unwrap().encode()).unwrap());
            assert_eq!(line, again);
        }
    }

    /// A `stats` line written before the control-file counters existed still parses (as 0); a
    /// bad value in them is still an error.
    #[test]
    fn stats_lines_without_the_added_counters_parse() {
        let rec = samples()
            .into_iter()
            .find(|r| r.kind() == Kind::Stats)
            .unwrap();
        let mut v = to_value(&rec);
        assert_eq!(v["ctl_refused"], 14);
        assert_eq!(v["mask_changes"], 15);
        v.remove("ctl_refused");
        v.remove("mask_changes");
        let back = from_line(&Value::Object(v.clone()).to_string()).unwrap();
        let Body::Stats(s) = back.body else { panic!() };
        assert_eq!((s.ctl_refused, s.mask_changes, s.event_mask), (0, 0, 0x747));
        v.insert("mask_changes".into(), Value::from("many"));
        assert!(from_line(&Value::Object(v).to_string()).is_err());
    }

    #[test]
    fn derived_fields_are_rendered() {
        let mut r = JsonRenderer::new();
        let recs = samples();
        let _ = r.render_value(&recs[2]); // comm_init of hash 7
        let coll = r.render_value(&recs[4]);
        assert_eq!(coll["kind"], "coll");
        assert_eq!(coll["comm_hash"], "0xdeadbeef01234567");
        assert_eq!(coll["func"], "AllReduce");
        assert_eq!(coll["start_us"], 1_764_425_999_123_460u64);
        let overdue = r.render_value(&recs[8]);
        assert_eq!(overdue["comm_name"], "dp:pp_stage3");
    }

    #[test]
    fn bad_lines_name_the_field() {
        let e = from_line(r#"{"kind":"coll","seq":1,"flags":0}"#).unwrap_err();
        assert_eq!(e.to_string(), r#"missing field "comm_hash""#);
        let e = from_line(r#"{"kind":"nope","seq":1,"flags":0}"#).unwrap_err();
        assert!(e.to_string().contains("unknown record kind"));
        let mut m = to_value(&samples()[4]);
        m.insert("func".into(), Value::from("Frobnicate"));
        let e = from_value(&Value::Object(m)).unwrap_err();
        assert!(e.to_string().contains("\"func\""), "{e}");
    }
}

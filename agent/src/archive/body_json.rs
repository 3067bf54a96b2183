//! `body_json`: the wire JSON rendering of a record (`comminsight_wire::json::to_value`,
//! serialized compactly), with a fast path for `coll` / `p2p` records, the bulk of every
//! segment. The fast path writes the same bytes directly (keys in serde_json's map order)
//! instead of building a map per record; it is checked against the generic rendering at first
//! use and not used if they differ (e.g. a changed wire format or serde_json key order).

use std::sync::OnceLock;

use comminsight_wire::json;
use comminsight_wire::record::{Body, OpRecord, Record};

/// Append the JSON rendering of `rec` to `buf`.
pub(crate) fn render(rec: &Record, buf: &mut Vec<u8>) {
    match &rec.body {
        Body::Coll(o) | Body::P2p(o) if fast_path_ok() => {
            op_json(rec.kind().name(), rec.seq, rec.flags, o, buf)
        }
        _ => generic(rec, buf),
    }
}

/// The generic rendering (a map, serialized).
fn generic(rec: &Record, buf: &mut Vec<u8>) {
    serde_json::to_writer(&mut *buf, &serde_json::Value::Object(json::to_value(rec)))
        .expect("writing JSON to a Vec cannot fail");
}

/// One JSON value of the fast path.
enum J<'a> {
    U(u64),
    I(i64),
    S(&'a str),
    Hex(u64),
}

/// The fields of an operation record, sorted by key (serde_json's default map order).
fn op_fields<'a>(kind: &'a str, seq: u64, flags: u16, o: &OpRecord) -> [(&'static str, J<'a>); 25] {
    [
        ("algo", J::S(o.algo.name())),
        ("api_ns", J::U(o.api_ns)),
        ("bytes", J::U(o.bytes)),
        ("channels_done", J::U(o.channels_done.into())),
        ("coll_local_sn", J::U(o.coll_local_sn)),
        ("coll_sn", J::U(o.coll_sn)),
        ("comm_hash", J::Hex(o.comm_hash)),
        ("count", J::U(o.count)),
        ("datatype", J::S(o.datatype.name())),
        ("end_ns", J::U(o.end_ns)),
        ("enqueue_ns", J::U(o.enqueue_ns)),
        ("flags", J::U(flags.into())),
        ("func", J::S(o.func.name())),
        ("gpu_end_ns", J::U(o.gpu_end_ns)),
        ("gpu_start_ns", J::U(o.gpu_start_ns)),
        ("kind", J::S(kind)),
        ("nchannels", J::U(o.nchannels.into())),
        ("nwarps", J::U(o.nwarps.into())),
        ("peer", J::I(o.peer.into())),
        ("proto", J::S(o.proto.name())),
        ("rank", J::I(o.rank.into())),
        ("root", J::I(o.root.into())),
        ("seq", J::U(seq)),
        ("start_ns", J::U(o.start_ns)),
        ("timing", J::S(o.timing.name())),
    ]
}

fn op_json(kind: &str, seq: u64, flags: u16, o: &OpRecord, buf: &mut Vec<u8>) {
    use std::io::Write;
    buf.push(b'{');
    for (i, (k, v)) in op_fields(kind, seq, flags, o).into_iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        buf.push(b'"');
        buf.extend_from_slice(k.as_bytes());
        buf.extend_from_slice(b"\":");
        let res = match v {
            J::U(n) => write!(buf, "{n}"),
            J::I(n) => write!(buf, "{n}"),
            J::S(s) => serde_json::to_writer(&mut *buf, s).map_err(std::io::Error::other),
            J::Hex(h) => write!(buf, "\"0x{h:016x}\""),
        };
        res.expect("writing to a Vec cannot fail");
    }
    buf.push(b'}');
}

/// A coll and a p2p record with every field set, for the self-check and the tests.
pub(crate) fn op_samples() -> Vec<Record> {
    use comminsight_wire::record::Timing;
    use comminsight_wire::{Algo, DataType, Func, Proto};
    let o = OpRecord {
        comm_hash: 0xdead_beef_0123_4567,
        coll_sn: 41,
        coll_local_sn: u64::MAX,
        count: 1 << 20,
        bytes: 4 << 20,
        enqueue_ns: 1_764_425_999_123_456_789,
        start_ns: 1_764_425_999_123_460_000,
        end_ns: 1_764_425_999_124_000_001,
        gpu_start_ns: 1,
        gpu_end_ns: 2,
        api_ns: 3,
        rank: 3,
        root: -1,
        peer: i32::MIN,
        func: Func::ALL_REDUCE,
        datatype: DataType::from_name("ncclFloat32"),
        algo: Algo::from_name("RING"),
        proto: Proto::from_name("LL128"),
        nchannels: 255,
        nwarps: 16,
        timing: Timing::KernelGpu,
        channels_done: 4,
    };
    let mut coll = Record::new(Body::Coll(o.clone()));
    coll.seq = 77;
    coll.flags = 0x1234;
    let mut p2p = Record::new(Body::P2p(OpRecord {
        func: Func::SEND,
        algo: Algo(0),
        ..o
    }));
    p2p.seq = u64::MAX;
    vec![coll, p2p]
}

/// Whether the fast path renders the samples exactly like the generic path (checked once).
fn fast_path_ok() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let ok = op_samples().iter().all(|r| {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            if let Body::Coll(o) | Body::P2p(o) = &r.body {
                op_json(r.kind().name(), r.seq, r.flags, o, &mut a);
            }
            generic(r, &mut b);
            a == b
        });
        if !ok {
            tracing::warn!("archive: fast body_json rendering differs from the wire JSON; using the generic one");
        }
        ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_rendering_equals_the_wire_json() {
        assert!(fast_path_ok());
        let mut recs = op_samples();
        let mut zero = Record::new(Body::Coll(OpRecord::default()));
        zero.seq = 0;
        recs.push(zero);
        for r in &recs {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            render(r, &mut a);
            generic(r, &mut b);
            assert_eq!(String::from_utf8(a).unwrap(), String::from_utf8(b).unwrap());
        }
        let keys: Vec<&str> = op_fields("coll", 0, 0, &OpRecord::default())
            .iter()
            .map(|f| f.0)
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
    }
}

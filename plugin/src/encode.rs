//! The hot path's record encoder: a `coll` / `p2p` record written as sixteen little-endian words,
//! byte-for-byte what `wire`'s general codec produces (`Record::encode`, which goes through a
//! bounds-checked field writer: about 230 instructions per record against about 40 here). The
//! test below holds the two together.

use comminsight_wire::record::{Kind, OpRecord, RawRecord, MAGIC, RECORD_SIZE, RECORD_VERSION};

/// `Record { seq: 0, flags, body: Body::Coll(o) or Body::P2p(o) }.encode()`.
#[inline]
pub fn op_record(p2p: bool, flags: u16, o: &OpRecord) -> RawRecord {
    let kind = if p2p { Kind::P2p } else { Kind::Coll } as u64;
    let w: [u64; 16] = [
        u64::from(MAGIC)
            | u64::from(RECORD_VERSION) << 16
            | kind << 24
            | (RECORD_SIZE as u64) << 32
            | u64::from(flags) << 48,
        0,
        o.comm_hash,
        o.coll_sn,
        o.coll_local_sn,
        o.count,
        o.bytes,
        o.enqueue_ns,
        o.start_ns,
        o.end_ns,
        o.gpu_start_ns,
        o.gpu_end_ns,
        o.api_ns,
        u64::from(o.rank as u32) | u64::from(o.root as u32) << 32,
        u64::from(o.peer as u32)
            | u64::from(o.func.0) << 32
            | u64::from(o.datatype.0) << 40
            | u64::from(o.algo.0) << 48
            | u64::from(o.proto.0) << 56,
        u64::from(o.nchannels)
            | u64::from(o.nwarps) << 8
            | u64::from(o.timing as u8) << 16
            | u64::from(o.channels_done) << 24,
    ];
    // SAFETY: `[u64; 16]` and `[u8; 128]` have the same size and every bit pattern is valid for
    // both; `to_le` makes the byte order little-endian on any host.
    RawRecord(unsafe { core::mem::transmute::<[u64; 16], [u8; RECORD_SIZE]>(w.map(u64::to_le)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use comminsight_wire::names::{Algo, DataType, Func, Proto};
    use comminsight_wire::record::{Body, Record, Timing, FLAG_INCOMPLETE};

    #[test]
    fn op_records_match_the_wire_codec_byte_for_byte() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..2000 {
            let o = OpRecord {
                comm_hash: next(),
                coll_sn: next(),
                coll_local_sn: next(),
                count: next(),
                bytes: next(),
                enqueue_ns: next(),
                start_ns: next(),
                end_ns: next(),
                gpu_start_ns: next(),
                gpu_end_ns: next(),
                api_ns: next(),
                rank: next() as i32,
                root: next() as i32,
                peer: if i % 3 == 0 { -1 } else { next() as i32 },
                func: Func(next() as u8),
                datatype: DataType(next() as u8),
                algo: Algo(next() as u8),
                proto: Proto(next() as u8),
                nchannels: next() as u8,
                nwarps: next() as u8,
                timing: Timing::from_u8((next() % 4) as u8),
                channels_done: next() as u8,
            };
            let p2p = i % 2 == 1;
            let flags = if i % 5 == 0 { FLAG_INCOMPLETE } else { 0 };
            let want = Record {
                seq: 0,
                flags,
                body: if p2p {
                    Body::P2p(o.clone())
                } else {
                    Body::Coll(o.clone())
                },
            }
            .encode();
            assert!(op_record(p2p, flags, &o) == want, "record {i}: {o:?}");
        }
    }
}

//! Encoding and decoding of the MoE EP body (`crate::moe`).

use super::{R, W};
use crate::body::Body;
use crate::moe::*;

/// Returns whether a string field was truncated (it has none).
pub(super) fn encode_ep_stats(e: &EpStats, w: &mut W<'_>) -> bool {
    w.u64(e.ep_group_id)
        .bytes(&e.instance)
        .u64(e.window_seq)
        .u64(e.t_start_ns)
        .u64(e.t_end_ns)
        .u32(e.steps)
        .u32(e.scale_bits)
        .u16(e.ep_size)
        .u16(e.rank)
        .u16(e.first)
        .u8(e.count)
        .u8(e.phase)
        .u8(e.source)
        .u8(e.ep_flags);
    for v in e.values {
        w.u64(v);
    }
    false
}

pub(super) fn decode_ep_stats(r: &mut R<'_>) -> Body {
    Body::EpStats(EpStats {
        ep_group_id: r.u64(),
        instance: r.take(),
        window_seq: r.u64(),
        t_start_ns: r.u64(),
        t_end_ns: r.u64(),
        steps: r.u32(),
        scale_bits: r.u32(),
        ep_size: r.u16(),
        rank: r.u16(),
        first: r.u16(),
        count: r.u8(),
        phase: r.u8(),
        source: r.u8(),
        ep_flags: r.u8(),
        values: [r.u64(), r.u64(), r.u64(), r.u64(), r.u64()],
    })
}

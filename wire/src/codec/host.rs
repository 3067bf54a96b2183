//! Encoding and decoding of the host-context bodies (`crate::host`).

use super::{put_str, R, W};
use crate::body::Body;
use crate::host::*;

/// Each encoder returns whether a string field was truncated.
pub(super) fn encode_thread(t: &HostThread, w: &mut W<'_>) -> bool {
    w.u64(t.time_ns)
        .u64(t.interval_ns)
        .u64(t.on_cpu_ns)
        .u64(t.runnable_ns)
        .u64(t.blocked_ns)
        .u64(t.blocked_io_ns)
        .u64(t.state_since_ns)
        .u32(t.pid)
        .u32(t.tid)
        .u32(t.voluntary_switches)
        .u32(t.involuntary_switches)
        .u8(t.state)
        .u8(t.source);
    let a = put_str(w, &t.comm, THREAD_NAME_LEN);
    let b = put_str(w, &t.syscall, THREAD_NAME_LEN);
    a || b
}

pub(super) fn encode_qp(q: &HostQp, w: &mut W<'_>) -> bool {
    w.u64(q.time_ns)
        .u64(q.created_ns)
        .u32(q.pid)
        .u32(q.tid)
        .u32(q.qp_num)
        .u32(q.dest_qp_num)
        .u32(q.attr_mask)
        .u16(q.dlid)
        .u8(q.event)
        .u8(q.qp_type)
        .u8(q.old_state)
        .u8(q.new_state)
        .u8(q.port)
        .bytes(&q.dgid);
    put_str(w, &q.device, DEVICE_LEN)
}

pub(super) fn encode_tcp(t: &HostTcp, w: &mut W<'_>) -> bool {
    w.u64(t.time_ns)
        .u64(t.interval_ns)
        .u32(t.pid)
        .u32(t.retransmits)
        .u32(t.state_changes)
        .u16(t.sport)
        .u16(t.dport)
        .u8(t.event)
        .u8(t.family)
        .u8(t.old_state)
        .u8(t.new_state)
        .bytes(&t.saddr)
        .bytes(&t.daddr);
    false
}

pub(super) fn encode_port(p: &HostPort, w: &mut W<'_>) -> bool {
    w.u64(p.time_ns)
        .u64(p.interval_ns)
        .u64(p.rx_bytes)
        .u64(p.tx_bytes)
        .u64(p.rx_packets)
        .u64(p.tx_packets)
        .u64(p.errors)
        .u32(p.link_downed)
        .u8(p.port)
        .u8(p.link_layer)
        .u8(p.up)
        .u8(p.port_flags);
    put_str(w, &p.device, DEVICE_LEN)
}

pub(super) fn decode_thread(r: &mut R<'_>) -> Body {
    Body::Thread(HostThread {
        time_ns: r.u64(),
        interval_ns: r.u64(),
        on_cpu_ns: r.u64(),
        runnable_ns: r.u64(),
        blocked_ns: r.u64(),
        blocked_io_ns: r.u64(),
        state_since_ns: r.u64(),
        pid: r.u32(),
        tid: r.u32(),
        voluntary_switches: r.u32(),
        involuntary_switches: r.u32(),
        state: r.u8(),
        source: r.u8(),
        comm: r.str_field(THREAD_NAME_LEN),
        syscall: r.str_field(THREAD_NAME_LEN),
    })
}

pub(super) fn decode_qp(r: &mut R<'_>) -> Body {
    Body::Qp(HostQp {
        time_ns: r.u64(),
        created_ns: r.u64(),
        pid: r.u32(),
        tid: r.u32(),
        qp_num: r.u32(),
        dest_qp_num: r.u32(),
        attr_mask: r.u32(),
        dlid: r.u16(),
        event: r.u8(),
        qp_type: r.u8(),
        old_state: r.u8(),
        new_state: r.u8(),
        port: r.u8(),
        dgid: r.take(),
        device: r.str_field(DEVICE_LEN),
    })
}

pub(super) fn decode_tcp(r: &mut R<'_>) -> Body {
    Body::Tcp(HostTcp {
        time_ns: r.u64(),
        interval_ns: r.u64(),
        pid: r.u32(),
        retransmits: r.u32(),
        state_changes: r.u32(),
        sport: r.u16(),
        dport: r.u16(),
        event: r.u8(),
        family: r.u8(),
        old_state: r.u8(),
        new_state: r.u8(),
        saddr: r.take(),
        daddr: r.take(),
    })
}

pub(super) fn decode_port(r: &mut R<'_>) -> Body {
    Body::Port(HostPort {
        time_ns: r.u64(),
        interval_ns: r.u64(),
        rx_bytes: r.u64(),
        tx_bytes: r.u64(),
        rx_packets: r.u64(),
        tx_packets: r.u64(),
        errors: r.u64(),
        link_downed: r.u32(),
        port: r.u8(),
        link_layer: r.u8(),
        up: r.u8(),
        port_flags: r.u8(),
        device: r.str_field(DEVICE_LEN),
    })
}

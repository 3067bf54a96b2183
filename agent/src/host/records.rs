//! From what the probes and the port sampler report to host-context records (`qp`, `tcp`,
//! `port`; the `thread` record is built in [`super::recorder`]).

use std::net::SocketAddr;

use comminsight_wire::host::{port_flags, port_kind, qp_event, qp_state, tcp_event};
use comminsight_wire::record::{HostPort, HostQp, HostTcp};

use super::ports::{PortEvent, PortKind, PortSample};
use crate::probes::events::{tcp_state_name, MASK_AV, MASK_DEST_QPN, MASK_PORT, MASK_STATE};
use crate::probes::{TcpPeerStats, VerbsCall};

/// The `qp` record of a verbs call that changes a QP's life (create, a modify that sets the
/// state, destroy), `old` its state before; `None` for every other call and failed ones.
/// `time_ns` is the call's time on the host clock.
pub fn qp_record(c: &VerbsCall, old: u8, time_ns: u64) -> Option<HostQp> {
    let mut q = HostQp {
        time_ns,
        pid: c.pid,
        tid: c.tid,
        qp_num: c.qp_num,
        attr_mask: c.attr_mask,
        qp_type: c.qp_type.min(255) as u8,
        old_state: old,
        new_state: qp_state::UNKNOWN,
        device: c.device.as_str().into(),
        ..HostQp::default()
    };
    match c.func.as_str() {
        "ibv_create_qp" if c.ret != 0 && c.qp_num != 0 => {
            q.event = qp_event::CREATE;
            q.created_ns = time_ns;
            q.old_state = qp_state::UNKNOWN;
            q.new_state = 0; // RESET
        }
        "ibv_modify_qp" if c.ret == 0 && c.attr_mask & MASK_STATE != 0 => {
            q.new_state = c.new_state.min(254) as u8;
            q.event = if q.new_state == qp_state::ERR {
                qp_event::ERROR
            } else {
                qp_event::MODIFY
            };
            if c.attr_mask & MASK_PORT != 0 {
                q.port = c.port_num;
            }
            if c.attr_mask & MASK_DEST_QPN != 0 {
                q.dest_qp_num = c.dest_qp_num;
            }
            if c.attr_mask & MASK_AV != 0 {
                q.dlid = c.dlid;
                q.dgid = c
                    .dgid
                    .parse::<std::net::Ipv6Addr>()
                    .map(|a| a.octets())
                    .unwrap_or_default();
            }
        }
        "ibv_destroy_qp" if c.ret == 0 => {
            q.event = qp_event::DESTROY;
            q.new_state = qp_state::UNKNOWN;
        }
        _ => return None,
    }
    Some(q)
}

fn tcp_state_number(name: &str) -> u8 {
    (1..=12u8)
        .find(|n| tcp_state_name(u32::from(*n)) == name)
        .unwrap_or(0)
}

fn addr16(a: &SocketAddr) -> ([u8; 16], u16) {
    let ip = match a.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    (ip.octets(), a.port())
}

/// The `tcp` record of a connection whose counters moved since `last` (`None`: first seen),
/// or `None` when nothing changed.
pub fn tcp_record(
    s: &TcpPeerStats,
    last: Option<(u64, u64)>,
    time_ns: u64,
    interval_ns: u64,
) -> Option<HostTcp> {
    let (r0, c0) = last.unwrap_or((0, 0));
    let retrans = s.retransmits.saturating_sub(r0);
    let changes = s.state_changes.saturating_sub(c0);
    if retrans == 0 && changes == 0 {
        return None;
    }
    let local: SocketAddr = s.local.parse().ok()?;
    let remote: SocketAddr = s.remote.parse().ok()?;
    let (saddr, sport) = addr16(&local);
    let (daddr, dport) = addr16(&remote);
    Some(HostTcp {
        time_ns,
        interval_ns,
        pid: s.pid,
        retransmits: retrans.min(u64::from(u32::MAX)) as u32,
        state_changes: changes.min(u64::from(u32::MAX)) as u32,
        sport,
        dport,
        event: if retrans > 0 {
            tcp_event::RETRANSMIT
        } else {
            tcp_event::STATE
        },
        family: if local.is_ipv4() { 4 } else { 6 },
        old_state: 0,
        new_state: tcp_state_number(&s.last_state),
        saddr,
        daddr,
    })
}

/// Counters whose deltas are summed into `errors` (IB `counters/`, Ethernet `statistics/`).
const ERROR_COUNTERS: &[&str] = &[
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "link_error_recovery",
    "VL15_dropped",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
];

/// One `port` record per port of a sample (`time_ns` on the host clock).
pub fn port_records(s: &PortSample, time_ns: u64) -> Vec<HostPort> {
    let mut out = Vec::with_capacity(s.ports.len());
    for p in &s.ports {
        let mut r = HostPort {
            time_ns,
            port: p.port.unwrap_or(0).min(255) as u8,
            link_layer: match p.kind {
                PortKind::Ib => port_kind::INFINIBAND,
                _ => port_kind::ETHERNET,
            },
            up: match p.state.as_deref() {
                Some(st) if st.contains("ACTIVE") || st == "up" => 1,
                Some(_) => 0,
                None => 255,
            },
            device: p.device.as_str().into(),
            ..HostPort::default()
        };
        for c in &p.counters {
            if c.saturated {
                r.port_flags |= port_flags::SATURATED;
            }
            let Some(d) = c.delta else { continue };
            if let Some(rate) = c.rate_per_s.filter(|r| *r > 0.0) {
                // The interval the deltas cover: delta / rate.
                r.interval_ns = r.interval_ns.max((d as f64 / rate * 1e9) as u64);
            }
            match c.name.as_str() {
                "port_rcv_data" | "rx_bytes" => r.rx_bytes += d,
                "port_xmit_data" | "tx_bytes" => r.tx_bytes += d,
                "port_rcv_packets" | "rx_packets" => r.rx_packets += d,
                "port_xmit_packets" | "tx_packets" => r.tx_packets += d,
                "link_downed" | "carrier_down_count" => {
                    r.link_downed = r
                        .link_downed
                        .saturating_add(d.min(u64::from(u32::MAX)) as u32)
                }
                n if ERROR_COUNTERS.contains(&n) => r.errors += d,
                _ => {}
            }
        }
        for e in &s.events {
            let (dev, port, bit) = match e {
                PortEvent::LinkDown { device, port, .. } => (device, *port, port_flags::LINK_DOWN),
                PortEvent::LinkUp { device, port, .. } => (device, *port, port_flags::LINK_UP),
                PortEvent::CounterReset { device, port, .. } => {
                    (device, *port, port_flags::COUNTER_RESET)
                }
            };
            if *dev == p.device && port == p.port {
                r.port_flags |= bit;
            }
        }
        if s.read_errors
            .iter()
            .any(|e| e.path.contains(&format!("/{}/", p.device)))
        {
            r.port_flags |= port_flags::READ_ERRORS;
        }
        out.push(r);
    }
    out
}

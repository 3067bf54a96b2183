//! Ring-buffer records of the BPF probes decoded into owned values, and the live QP map built
//! from the ibverbs calls: `(pid, QP number) -> device, port, remote QPN, destination, state`,
//! with every state change kept as a transition (an `ERR` transition is flagged).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use comminsight_ebpf_common::{kind, tcp, verbs, EventHeader, TcpEvent, VerbsEvent};
use serde::{Deserialize, Serialize};

/// ibverbs functions probed, by id (`comminsight_ebpf_common::verbs`), with the BPF program
/// name prefix: `ibv_<name>_enter` / `ibv_<name>_leave`.
pub const VERBS_FUNCTIONS: [(u32, &str); 16] = [
    (verbs::GET_DEVICE_LIST, "ibv_get_device_list"),
    (verbs::FREE_DEVICE_LIST, "ibv_free_device_list"),
    (verbs::FORK_INIT, "ibv_fork_init"),
    (verbs::OPEN_DEVICE, "ibv_open_device"),
    (verbs::CLOSE_DEVICE, "ibv_close_device"),
    (verbs::ALLOC_PD, "ibv_alloc_pd"),
    (verbs::DEALLOC_PD, "ibv_dealloc_pd"),
    (verbs::REG_MR, "ibv_reg_mr"),
    (verbs::REG_MR_IOVA2, "ibv_reg_mr_iova2"),
    (verbs::DEREG_MR, "ibv_dereg_mr"),
    (verbs::CREATE_CQ, "ibv_create_cq"),
    (verbs::DESTROY_CQ, "ibv_destroy_cq"),
    (verbs::CREATE_QP, "ibv_create_qp"),
    (verbs::MODIFY_QP, "ibv_modify_qp"),
    (verbs::DESTROY_QP, "ibv_destroy_qp"),
    (verbs::GET_ASYNC_EVENT, "ibv_get_async_event"),
];

/// The name of verbs function `id`.
pub fn verbs_name(id: u32) -> &'static str {
    VERBS_FUNCTIONS
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, n)| *n)
        .unwrap_or("unknown")
}

/// `enum ibv_qp_state` names.
pub fn qp_state_name(s: u32) -> &'static str {
    comminsight_wire::host::qp_state::name(u8::try_from(s).unwrap_or(u8::MAX))
}

/// `IBV_QP_STATE` in a modify's attribute mask.
pub const MASK_STATE: u32 = 1;
/// `IBV_QP_PORT`.
pub const MASK_PORT: u32 = 1 << 5;
/// `IBV_QP_AV`.
pub const MASK_AV: u32 = 1 << 7;
/// `IBV_QP_DEST_QPN`.
pub const MASK_DEST_QPN: u32 = 1 << 20;

/// One ibverbs call of a tracked process, as it returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerbsCall {
    /// Return time (ns, CLOCK_MONOTONIC).
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub func: String,
    pub ret: i64,
    pub device: String,
    pub qp_num: u32,
    pub qp_type: u32,
    /// QP state before a modify, after a create.
    pub qp_state: u32,
    pub new_state: u32,
    pub attr_mask: u32,
    pub dest_qp_num: u32,
    pub dlid: u16,
    pub port_num: u8,
    /// `ibv_qp_attr.ah_attr.grh.dgid` as hex.
    pub dgid: String,
}

/// A TCP retransmit or state change of a tracked process's socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// `retransmit` or `state`.
    pub what: String,
    /// `10.0.0.1:4242`.
    pub local: String,
    pub remote: String,
    pub old_state: u32,
    pub new_state: u32,
}

impl TcpRecord {
    /// The connection's canonical (local, remote) addresses (v4-mapped folded to IPv4);
    /// `None` if `local` / `remote` are not addresses.
    pub fn endpoints(&self) -> Option<(SocketAddr, SocketAddr)> {
        Some((
            super::sockets::canonical(self.local.parse().ok()?),
            super::sockets::canonical(self.remote.parse().ok()?),
        ))
    }
}

/// Kernel TCP state names (`include/net/tcp_states.h`).
pub fn tcp_state_name(s: u32) -> &'static str {
    match s {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => "UNKNOWN",
    }
}

/// What the TCP probes counted for one connection of one tracked process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpPeerStats {
    /// The owning process (from the socket tables, not the task current at the event).
    pub pid: u32,
    /// Canonical `10.0.0.1:4242` / `[fd00::1]:4242`.
    pub local: String,
    pub remote: String,
    /// `tcp:tcp_retransmit_skb` hits.
    pub retransmits: u64,
    /// `sock:inet_sock_set_state` changes seen.
    pub state_changes: u64,
    /// State after the last event (`ESTABLISHED`, `FIN_WAIT1`, ...).
    pub last_state: String,
    pub first_ns: u64,
    pub last_ns: u64,
    /// Retransmission timeout (ms) and congestion window (segments) at the last socket-table
    /// read that showed the connection.
    pub rto_ms: Option<u64>,
    pub snd_cwnd: Option<u32>,
}

/// Most connections [`TcpPeerTable`] keeps; events of others are counted in `overflow`.
pub const MAX_TCP_PEERS: usize = 16_384;

/// Per (pid, local, remote) TCP counters of the tracked processes.
#[derive(Clone, Debug, Default)]
pub struct TcpPeerTable {
    peers: BTreeMap<(u32, SocketAddr, SocketAddr), TcpPeerStats>,
    /// Events of connections not kept because the table was full.
    pub overflow: u64,
}

impl TcpPeerTable {
    /// Count record `r` of connection (`local`, `remote`), owned by `pid`; `rto_ms` and
    /// `snd_cwnd` are the socket table's, when known.
    pub fn apply(
        &mut self,
        r: &TcpRecord,
        pid: u32,
        (local, remote): (SocketAddr, SocketAddr),
        (rto_ms, snd_cwnd): (Option<u64>, Option<u32>),
    ) {
        let key = (pid, local, remote);
        if !self.peers.contains_key(&key) && local.port() != 0 {
            // The `connect` that made this connection was seen before it had a local port.
            let connecting = (pid, SocketAddr::new(local.ip(), 0), remote);
            if let Some(mut p) = self.peers.remove(&connecting) {
                p.local = local.to_string();
                self.peers.insert(key, p);
            }
        }
        if self.peers.len() >= MAX_TCP_PEERS && !self.peers.contains_key(&key) {
            self.overflow += 1;
            return;
        }
        let p = self.peers.entry(key).or_insert_with(|| TcpPeerStats {
            pid,
            local: local.to_string(),
            remote: remote.to_string(),
            retransmits: 0,
            state_changes: 0,
            last_state: String::new(),
            first_ns: r.ts_ns,
            last_ns: r.ts_ns,
            rto_ms: None,
            snd_cwnd: None,
        });
        if r.what == "retransmit" {
            p.retransmits += 1;
        } else {
            p.state_changes += 1;
        }
        p.last_state = tcp_state_name(r.new_state).into();
        p.first_ns = p.first_ns.min(r.ts_ns);
        p.last_ns = p.last_ns.max(r.ts_ns);
        p.rto_ms = rto_ms.or(p.rto_ms);
        p.snd_cwnd = snd_cwnd.or(p.snd_cwnd);
    }

    /// Every connection, by (pid, local, remote).
    pub fn all(&self) -> Vec<TcpPeerStats> {
        self.peers.values().cloned().collect()
    }

    /// Forget the connections of a process no longer tracked.
    pub fn forget(&mut self, pid: u32) {
        self.peers.retain(|(p, _, _), _| *p != pid);
    }
}

/// A decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeEvent {
    Verbs(VerbsCall),
    Tcp(TcpRecord),
}

/// Read a `T` from the front of `b` (records are `#[repr(C)]` PODs); `None` when too short.
fn pod<T: Copy>(b: &[u8]) -> Option<T> {
    if b.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length is checked above; T is a Copy #[repr(C)] type of integers from
    // comminsight-ebpf-common, valid for any bit pattern; read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn hex(b: &[u8]) -> String {
    if b.iter().all(|&c| c == 0) {
        return String::new();
    }
    b.iter().map(|c| format!("{c:02x}")).collect()
}

/// Decode one ring-buffer record; `None` for an unknown kind or a short record (counted by the caller).
pub fn decode(b: &[u8]) -> Option<ProbeEvent> {
    let h: EventHeader = pod(b)?;
    match h.kind {
        kind::VERBS => {
            let e: VerbsEvent = pod(b)?;
            Some(ProbeEvent::Verbs(VerbsCall {
                ts_ns: h.ts_ns,
                dur_ns: h.ts_ns.saturating_sub(e.enter_ns),
                pid: h.pid,
                tid: h.tid,
                func: verbs_name(h.what).to_string(),
                ret: e.ret,
                device: cstr(&e.device),
                qp_num: e.qp_num,
                qp_type: e.qp_type,
                qp_state: e.qp_state,
                new_state: e.new_state,
                attr_mask: e.attr_mask,
                dest_qp_num: e.dest_qp_num,
                dlid: e.dlid,
                port_num: e.port_num,
                dgid: hex(&e.dgid),
            }))
        }
        kind::TCP => {
            let e: TcpEvent = pod(b)?;
            Some(ProbeEvent::Tcp(TcpRecord {
                ts_ns: h.ts_ns,
                pid: h.pid,
                tid: h.tid,
                what: if h.what == tcp::RETRANSMIT {
                    "retransmit"
                } else {
                    "state"
                }
                .into(),
                local: addr(e.family, &e.saddr, e.sport),
                remote: addr(e.family, &e.daddr, e.dport),
                old_state: e.old_state,
                new_state: e.new_state,
            }))
        }
        _ => None,
    }
}

fn addr(family: u16, a: &[u8; 16], port: u16) -> String {
    if family == 10 {
        format!("[{}]:{port}", std::net::Ipv6Addr::from(*a))
    } else {
        format!("{}.{}.{}.{}:{port}", a[0], a[1], a[2], a[3])
    }
}

/// One QP state change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpTransition {
    pub ts_ns: u64,
    pub from: String,
    pub to: String,
}

/// What the agent knows of one queue pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    pub pid: u32,
    pub qp_num: u32,
    pub qp_type: u32,
    pub device: String,
    pub port: u8,
    pub dest_qp_num: u32,
    pub dlid: u16,
    pub dgid: String,
    pub state: String,
    pub created_ns: u64,
    pub modified_ns: u64,
    pub destroyed_ns: Option<u64>,
    pub history: Vec<QpTransition>,
    /// True once the QP went to ERR (the event a verdict cites).
    pub errored: bool,
}

impl QpInfo {
    /// A QP first seen in call `c` (its create, or a modify when created before tracking).
    fn first_seen(c: &VerbsCall, created_ns: u64) -> QpInfo {
        QpInfo {
            pid: c.pid,
            qp_num: c.qp_num,
            qp_type: c.qp_type,
            device: c.device.clone(),
            port: 0,
            dest_qp_num: 0,
            dlid: 0,
            dgid: String::new(),
            state: qp_state_name(c.qp_state).into(),
            created_ns,
            modified_ns: c.ts_ns,
            destroyed_ns: None,
            history: Vec::new(),
            errored: false,
        }
    }
}

/// The QP map of every tracked process.
#[derive(Clone, Debug, Default)]
pub struct QpTable {
    qps: BTreeMap<(u32, u32), QpInfo>,
}

impl QpTable {
    /// Apply one call; returns the QP's new info when the call changed it to ERR.
    pub fn apply(&mut self, c: &VerbsCall) -> Option<&QpInfo> {
        match c.func.as_str() {
            "ibv_create_qp" if c.ret != 0 && c.qp_num != 0 => {
                let info = QpInfo::first_seen(c, c.ts_ns);
                self.qps.insert((c.pid, c.qp_num), info);
                None
            }
            "ibv_modify_qp" if c.ret == 0 => self.modified(c),
            "ibv_destroy_qp" if c.ret == 0 => {
                if let Some(q) = self.qps.get_mut(&(c.pid, c.qp_num)) {
                    q.destroyed_ns = Some(c.ts_ns);
                }
                None
            }
            _ => None,
        }
    }

    fn modified(&mut self, c: &VerbsCall) -> Option<&QpInfo> {
        // A QP created before tracking began is known from its first modify (created_ns 0).
        let q = self
            .qps
            .entry((c.pid, c.qp_num))
            .or_insert_with(|| QpInfo::first_seen(c, 0));
        q.modified_ns = c.ts_ns;
        if c.attr_mask & MASK_PORT != 0 {
            q.port = c.port_num;
        }
        if c.attr_mask & MASK_DEST_QPN != 0 {
            q.dest_qp_num = c.dest_qp_num;
        }
        if c.attr_mask & MASK_AV != 0 {
            q.dlid = c.dlid;
            q.dgid = c.dgid.clone();
        }
        if c.attr_mask & MASK_STATE == 0 {
            return None;
        }
        let to = qp_state_name(c.new_state).to_string();
        q.history.push(QpTransition {
            ts_ns: c.ts_ns,
            from: q.state.clone(),
            to: to.clone(),
        });
        q.state = to;
        if c.new_state == 6 {
            q.errored = true;
            return Some(q);
        }
        None
    }

    /// Every QP, by (pid, QP number).
    pub fn all(&self) -> Vec<QpInfo> {
        self.qps.values().cloned().collect()
    }

    /// Forget the QPs of a process that exited.
    pub fn forget(&mut self, pid: u32) {
        self.qps.retain(|(p, _), _| *p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(func: &str, ret: i64, mask: u32, new_state: u32) -> VerbsCall {
        VerbsCall {
            ts_ns: 10,
            dur_ns: 1,
            pid: 7,
            tid: 7,
            func: func.into(),
            ret,
            device: "mlx5_0".into(),
            qp_num: 0x1a2b,
            qp_type: 2,
            qp_state: 0,
            new_state,
            attr_mask: mask,
            dest_qp_num: 0x5678b,
            dlid: 0x12,
            port_num: 1,
            dgid: String::new(),
        }
    }

    #[test]
    fn qp_history_follows_successful_modifies_and_flags_err() {
        let mut t = QpTable::default();
        assert!(t.apply(&call("ibv_create_qp", 0x5555, 0, 0)).is_none());
        t.apply(&call("ibv_modify_qp", 0, MASK_STATE | MASK_PORT, 1));
        t.apply(&call(
            "ibv_modify_qp",
            0,
            MASK_STATE | MASK_DEST_QPN | MASK_AV,
            2,
        ));
        // A failed modify changes nothing.
        t.apply(&call("ibv_modify_qp", 22, MASK_STATE, 4));
        t.apply(&call("ibv_modify_qp", 0, MASK_STATE, 3));
        let err = t.apply(&call("ibv_modify_qp", 0, MASK_STATE, 6)).cloned();
        assert!(err.is_some_and(|q| q.errored && q.state == "ERR"));
        t.apply(&call("ibv_destroy_qp", 0, 0, 0));
        let q = &t.all()[0];
        let path: Vec<_> = q.history.iter().map(|h| h.to.as_str()).collect();
        assert_eq!(path, ["INIT", "RTR", "RTS", "ERR"]);
        assert_eq!((q.port, q.dest_qp_num, q.dlid), (1, 0x5678b, 0x12));
        assert_eq!(q.destroyed_ns, Some(10));
    }

    fn tcp(what: &str, ts_ns: u64, local: &str, new_state: u32) -> TcpRecord {
        TcpRecord {
            ts_ns,
            pid: 1,
            tid: 1,
            what: what.into(),
            local: local.into(),
            remote: "10.0.0.2:5000".into(),
            old_state: 1,
            new_state,
        }
    }

    #[test]
    fn tcp_peers_count_per_pid_and_connection_with_v4_mapped_folded() {
        let mut t = TcpPeerTable::default();
        let connect = tcp("state", 5, "10.0.0.1:0", 2);
        t.apply(&connect, 7, connect.endpoints().unwrap(), (None, None));
        let a = tcp("retransmit", 20, "10.0.0.1:4000", 1);
        let b = tcp("retransmit", 10, "[::ffff:10.0.0.1]:4000", 1);
        let c = tcp("state", 30, "10.0.0.1:4000", 4);
        assert_eq!(a.endpoints(), b.endpoints());
        for r in [&a, &b, &c] {
            t.apply(r, 7, r.endpoints().unwrap(), (Some(204), None));
        }
        t.apply(&a, 8, a.endpoints().unwrap(), (None, Some(10)));
        let all = t.all();
        assert_eq!(all.len(), 2);
        let p = &all[0];
        assert_eq!((p.pid, p.local.as_str()), (7, "10.0.0.1:4000"));
        // The connect seen without a local port folds into the connection.
        assert_eq!((p.retransmits, p.state_changes), (2, 2));
        assert_eq!(p.last_state, "FIN_WAIT1");
        assert_eq!((p.first_ns, p.last_ns, p.rto_ms), (5, 30, Some(204)));
        assert_eq!((all[1].pid, all[1].snd_cwnd), (8, Some(10)));
        t.forget(7);
        assert_eq!(t.all().len(), 1);
        assert!(tcp("state", 0, "nonsense", 0).endpoints().is_none());
    }

    #[test]
    fn short_or_unknown_records_do_not_decode() {
        assert!(decode(&[1, 0, 0]).is_none());
        assert!(decode(&[9u8; 24]).is_none());
    }
}

//! The queue pairs of a rank process as the host context keeps them ([`QpView`]): their
//! lifecycle from the verbs uprobes' `qp` records ([`apply`]), the communicator that used each
//! from the plugin's `net` records (NCCL's IB transport names the QP it posted a work request
//! on; [`QpComms`]), and the peer process at the other end, found by the reciprocal QP numbers
//! — its QP's `dest_qp_num` is ours and ours is its QP's number ([`join_peers`]).

use std::collections::{BTreeMap, HashMap};

use comminsight_wire::host::{qp_event, qp_state};
use comminsight_wire::record::HostQp;
use serde::{Deserialize, Serialize};

/// Queue pairs kept per process (destroyed ones go first).
pub const MAX_QPS: usize = 1024;
/// Transitions kept per QP.
pub const MAX_QP_HISTORY: usize = 16;

/// One queue pair of a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpView {
    pub qp_num: u32,
    pub device: String,
    pub port: u8,
    pub qp_type: u8,
    pub dest_qp_num: u32,
    pub dlid: u16,
    pub dgid: String,
    pub state: String,
    /// It went to `ERR` at least once.
    pub errored: bool,
    pub destroyed: bool,
    /// Aligned µs.
    pub created_us: u64,
    pub modified_us: u64,
    /// `(aligned µs, state)` of each transition, oldest first (the last [`MAX_QP_HISTORY`]).
    pub history: Vec<(u64, String)>,
    /// The communicator whose work requests it carried (`0x` + 16 hex digits), when a `net`
    /// record of the process named it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub comm: String,
    /// The process at the other end, when its host stream is read too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<QpPeer>,
}

/// The other end of a queue pair.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpPeer {
    pub host: String,
    pub pid: u32,
    /// Its global rank, -1 when unknown.
    pub rank: i64,
    pub qp_num: u32,
}

/// Apply one `qp` record at `at_us` (aligned) to a process' queue pairs; false when the
/// bound ([`MAX_QPS`], no destroyed QP to make room) dropped it.
pub fn apply(qps: &mut BTreeMap<u32, QpView>, q: &HostQp, at_us: u64, created_us: u64) -> bool {
    if !qps.contains_key(&q.qp_num) && qps.len() >= MAX_QPS {
        let gone = qps
            .iter()
            .filter(|(_, v)| v.destroyed)
            .min_by_key(|(_, v)| v.modified_us)
            .map(|(n, _)| *n);
        match gone {
            Some(n) => {
                qps.remove(&n);
            }
            None => return false,
        }
    }
    let v = qps.entry(q.qp_num).or_insert_with(|| QpView {
        qp_num: q.qp_num,
        created_us: if q.created_ns != 0 { created_us } else { at_us },
        ..QpView::default()
    });
    v.device = q.device.as_str_lossy().into_owned();
    if q.port != 0 {
        v.port = q.port;
    }
    v.qp_type = q.qp_type;
    if q.dest_qp_num != 0 {
        v.dest_qp_num = q.dest_qp_num;
        v.dlid = q.dlid;
        v.dgid = std::net::Ipv6Addr::from(q.dgid).to_string();
    }
    v.modified_us = at_us;
    match q.event {
        qp_event::DESTROY => v.destroyed = true,
        _ if q.new_state != qp_state::UNKNOWN => {
            let name = qp_state::name(q.new_state).to_string();
            if v.history.last().map(|h| &h.1) != Some(&name) || q.event == qp_event::CREATE {
                v.history.push((at_us, name.clone()));
                if v.history.len() > MAX_QP_HISTORY {
                    v.history.remove(0);
                }
            }
            v.errored |= q.new_state == qp_state::ERR;
            v.state = name;
        }
        _ => {}
    }
    true
}

/// The communicator of each QP number of a process, from its `net` records (the first that
/// named it; at most [`MAX_QPS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpComms(#[serde(with = "crate::util::serde_pairs")] BTreeMap<u32, u64>);

impl QpComms {
    /// A `net` record of the process posted on `qp_num` for `comm_hash`.
    pub fn note(&mut self, qp_num: u32, comm_hash: u64) {
        if qp_num != 0 && (self.0.len() < MAX_QPS || self.0.contains_key(&qp_num)) {
            self.0.entry(qp_num).or_insert(comm_hash);
        }
    }

    /// The communicator of `qp_num`, as `0x` + 16 hex digits; empty when none named it.
    pub fn name(&self, qp_num: u32) -> String {
        self.0
            .get(&qp_num)
            .map(|c| format!("0x{c:016x}"))
            .unwrap_or_default()
    }
}

/// One process' queue pairs in a join: `(host, pid, rank, its QPs)`.
pub type ProcQps<'a> = (&'a str, u32, i64, &'a mut Vec<QpView>);

/// Give every QP of `procs` (the ranks of one job) its peer: the QP of another process whose
/// number is its `dest_qp_num` and whose `dest_qp_num` is its number.
pub fn join_peers(procs: &mut [ProcQps<'_>]) {
    let mut ends: HashMap<(u32, u32), QpPeer> = HashMap::new();
    for (host, pid, rank, qps) in procs.iter() {
        for q in qps.iter().filter(|q| q.dest_qp_num != 0) {
            ends.insert(
                (q.qp_num, q.dest_qp_num),
                QpPeer {
                    host: host.to_string(),
                    pid: *pid,
                    rank: *rank,
                    qp_num: q.qp_num,
                },
            );
        }
    }
    for (host, pid, _, qps) in procs.iter_mut() {
        for q in qps.iter_mut().filter(|q| q.dest_qp_num != 0) {
            q.peer = ends
                .get(&(q.dest_qp_num, q.qp_num))
                .filter(|p| !(p.host == *host && p.pid == *pid))
                .cloned();
        }
    }
}

/// The queue pairs of a rank that went to `ERR`, one line: `QP 0x1a2b on mlx5_0/1 to rank 5
/// (host1 pid 4242 QP 0x5678b), comm 0x…: ERR since 12.300 s; ...`; `None` when none did.
pub fn errored_line(qps: &[QpView]) -> Option<String> {
    let lines: Vec<String> = qps
        .iter()
        .filter(|q| q.errored)
        .map(|q| {
            let peer = q.peer.as_ref().map_or_else(
                || format!(" to QP {:#x}", q.dest_qp_num),
                |p| {
                    format!(
                        " to rank {} ({} pid {} QP {:#x})",
                        p.rank, p.host, p.pid, p.qp_num
                    )
                },
            );
            let comm = if q.comm.is_empty() {
                String::new()
            } else {
                format!(", comm {}", q.comm)
            };
            let at = q
                .history
                .iter()
                .rev()
                .find(|h| h.1 == "ERR")
                .map_or(q.modified_us, |h| h.0);
            format!(
                "QP {:#x} on {}/{}{peer}{comm}: ERR at {:.3} s{}",
                q.qp_num,
                q.device,
                q.port,
                at as f64 / 1e6,
                if q.destroyed { ", destroyed" } else { "" }
            )
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp(num: u32, dest: u32) -> QpView {
        QpView {
            qp_num: num,
            dest_qp_num: dest,
            device: "mlx5_0".into(),
            port: 1,
            ..QpView::default()
        }
    }

    #[test]
    fn peers_join_by_reciprocal_qp_numbers() {
        let mut a = vec![qp(0x10, 0x20), qp(0x11, 0x99)];
        let mut b = vec![qp(0x20, 0x10)];
        // Same number 0x20 on a third process, but it does not point back at 0x10.
        let mut c = vec![qp(0x20, 0x55)];
        let mut procs: Vec<ProcQps<'_>> = vec![
            ("h0", 100, 0, &mut a),
            ("h1", 200, 1, &mut b),
            ("h2", 300, 2, &mut c),
        ];
        join_peers(&mut procs);
        let p = a[0].peer.clone().unwrap();
        assert_eq!(
            (p.host.as_str(), p.pid, p.rank, p.qp_num),
            ("h1", 200, 1, 0x20)
        );
        assert_eq!(a[1].peer, None);
        assert_eq!(b[0].peer.as_ref().map(|p| p.rank), Some(0));
        assert_eq!(c[0].peer, None);
    }

    #[test]
    fn comms_are_noted_once_per_qp_and_bounded() {
        let mut c = QpComms::default();
        c.note(7, 0xabc);
        c.note(7, 0xdef);
        c.note(0, 0x1);
        assert_eq!(c.name(7), "0x0000000000000abc");
        assert_eq!(c.name(0), "");
        for n in 0..(MAX_QPS as u32 + 10) {
            c.note(1000 + n, 1);
        }
        assert_eq!(c.0.len(), MAX_QPS);
    }

    #[test]
    fn errored_queue_pairs_in_one_line() {
        let mut q = qp(0x1a2b, 0x5678b);
        q.errored = true;
        q.history = vec![(1_000_000, "RTS".into()), (12_300_000, "ERR".into())];
        q.comm = "0x00000000000000aa".into();
        q.peer = Some(QpPeer {
            host: "host1".into(),
            pid: 4242,
            rank: 5,
            qp_num: 0x5678b,
        });
        assert_eq!(
            errored_line(&[qp(1, 2), q]).unwrap(),
            "QP 0x1a2b on mlx5_0/1 to rank 5 (host1 pid 4242 QP 0x5678b), comm 0x00000000000000aa: ERR at 12.300 s"
        );
        assert_eq!(errored_line(&[qp(1, 2)]), None);
    }
}

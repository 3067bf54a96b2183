//! Unique id and bootstrap. The id carries the root's listener address and a random nonce; the process
//! that created it runs a root thread that gathers every rank's (address, host, pid) and answers the
//! full table, as NCCL's bootstrap root does.

use super::transport::{net, Kind, ANY};
use crate::types::{NcclError, NcclResult, UniqueId, UNIQUE_ID_BYTES};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const ID_MAGIC: &[u8; 4] = b"CIS1";

/// One rank of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its process' listener.
    pub addr: SocketAddr,
    /// Host identity (`COMMINSIGHT_TESTBED_HOST`).
    pub host: String,
    /// Its pid.
    pub pid: u32,
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut b).is_ok() {
            return u64::from_le_bytes(b);
        }
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    crate::hash::mix(t ^ u64::from(std::process::id()).rotate_left(32))
}

/// Encodes a root address and nonce into the 128 id bytes.
pub fn encode_id(root: SocketAddr, nonce: u64) -> [u8; UNIQUE_ID_BYTES] {
    let mut b = [0u8; UNIQUE_ID_BYTES];
    b[0..4].copy_from_slice(ID_MAGIC);
    match root.ip() {
        IpAddr::V4(ip) => {
            b[4] = 4;
            b[8..12].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[4] = 6;
            b[8..24].copy_from_slice(&ip.octets());
        }
    }
    b[5..7].copy_from_slice(&root.port().to_le_bytes());
    b[24..32].copy_from_slice(&nonce.to_le_bytes());
    b
}

/// Decodes the root address; `None` if these bytes were not made by `ncclGetUniqueId`.
pub fn decode_id(b: &[u8; UNIQUE_ID_BYTES]) -> Option<SocketAddr> {
    if &b[0..4] != ID_MAGIC {
        return None;
    }
    let port = u16::from_le_bytes([b[5], b[6]]);
    let ip = match b[4] {
        4 => IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Bytes of a C `ncclUniqueId`.
pub fn id_bytes(id: &UniqueId) -> [u8; UNIQUE_ID_BYTES] {
    id.internal.map(|c| c as u8)
}

/// `ncclGetUniqueId`: a new id rooted at this process, with its root thread running.
pub fn new_unique_id() -> UniqueId {
    let n = net();
    let bytes = encode_id(n.addr, random_u64());
    let comm = crate::hash::bytes(&bytes);
    let _ = std::thread::Builder::new()
        .name("nccl-bootroot".into())
        .spawn(move || root_thread(comm));
    UniqueId {
        internal: bytes.map(|b| b as std::ffi::c_char),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.0.split_at_checked(4)?;
        self.0 = t;
        Some(u32::from_le_bytes(h.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        let (h, t) = self.0.split_at_checked(n)?;
        self.0 = t;
        Some(String::from_utf8_lossy(h).into_owned())
    }
}

fn encode_peer(out: &mut Vec<u8>, p: &Peer) {
    put_str(out, &p.addr.to_string());
    put_str(out, &p.host);
    out.extend_from_slice(&p.pid.to_le_bytes());
}

fn decode_peer(r: &mut Rd<'_>) -> Option<Peer> {
    Some(Peer {
        addr: r.string()?.parse().ok()?,
        host: r.string()?,
        pid: r.u32()?,
    })
}

/// Encodes a peer table (also used by split).
pub fn encode_table(peers: &[Peer]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(peers.len() as u32).to_le_bytes());
    for p in peers {
        encode_peer(&mut out, p);
    }
    out
}

fn decode_table(b: &[u8]) -> Option<Vec<Peer>> {
    let mut r = Rd(b);
    let n = r.u32()? as usize;
    (0..n).map(|_| decode_peer(&mut r)).collect()
}

fn root_thread(comm: u64) {
    let n = net();
    let never = || false;
    let mut table: Vec<Option<Peer>> = Vec::new();
    let mut got = 0usize;
    loop {
        let Ok(f) = n.recv((comm, Kind::BootHello, ANY, ANY), None, &never) else {
            return;
        };
        let mut r = Rd(&f.data);
        let (Some(rank), Some(nranks)) = (r.u32(), r.u32()) else {
            continue;
        };
        let Some(peer) = decode_peer(&mut r) else {
            continue;
        };
        if table.is_empty() {
            table = vec![None; nranks as usize];
        }
        let (rank, nranks) = (rank as usize, nranks as usize);
        if nranks != table.len() || rank >= nranks || table[rank].is_some() {
            crate::log::warn(&format!(
                "Bootstrap root: unexpected hello rank {rank} nranks {nranks} (expected {} ranks)",
                table.len()
            ));
            continue;
        }
        table[rank] = Some(peer);
        got += 1;
        if got == nranks {
            break;
        }
    }
    let peers: Vec<Peer> = table.into_iter().flatten().collect();
    let enc = encode_table(&peers);
    for (r, p) in peers.iter().enumerate() {
        if let Err(e) = n.send(p.addr, (comm, Kind::BootTable, ANY, r as u32), 0, &enc) {
            crate::log::warn(&format!(
                "Bootstrap root: cannot reach rank {r} at {}: {e}",
                p.addr
            ));
        }
    }
}

/// Runs the bootstrap for one rank: hello to the root, wait for the table.
pub fn bootstrap_init(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    aborted: &dyn Fn() -> bool,
) -> NcclResult<(u64, Vec<Peer>)> {
    let bytes = id_bytes(id);
    let Some(root) = decode_id(&bytes) else {
        crate::log::warn("ncclCommInitRank: invalid ncclUniqueId (not created by ncclGetUniqueId)");
        return Err(NcclError::InvalidArgument);
    };
    let comm = crate::hash::bytes(&bytes);
    let n = net();
    let env = crate::env::get();
    let me = Peer {
        addr: n.addr,
        host: env.host.clone(),
        pid: std::process::id(),
    };
    let mut hello = Vec::new();
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(nranks as u32).to_le_bytes());
    encode_peer(&mut hello, &me);
    n.send(root, (comm, Kind::BootHello, ANY, ANY), 0, &hello)
        .map_err(|e| {
            crate::log::warn(&format!("Bootstrap: cannot reach root {root}: {e}"));
            NcclError::System
        })?;
    let f = n
        .recv((comm, Kind::BootTable, ANY, rank as u32), None, aborted)
        .map_err(|_| NcclError::InvalidUsage)?;
    let peers = decode_table(&f.data).ok_or(NcclError::Internal)?;
    if peers.len() != nranks {
        return Err(NcclError::Internal);
    }
    Ok((comm, peers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips_root_address() {
        let a: SocketAddr = "127.0.0.1:4567".parse().unwrap();
        let b = encode_id(a, 42);
        assert_eq!(decode_id(&b), Some(a));
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(decode_id(&bad), None);
    }

    #[test]
    fn table_round_trips() {
        let p = vec![Peer {
            addr: "10.0.0.1:1".parse().unwrap(),
            host: "h".into(),
            pid: 7,
        }];
        assert_eq!(decode_table(&encode_table(&p)), Some(p));
    }
}

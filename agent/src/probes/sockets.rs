//! Which tracked process owns a TCP connection. The TCP tracepoints fire for every socket on the
//! host, often in softirq context, so the task current at an event says nothing about whose socket
//! it is; this table maps a connection's 4-tuple (local, remote) to the tracked pid that holds the
//! socket, read from `/proc/<pid>/fd/*` (`socket:[inode]`) and the process's own network
//! namespace's `/proc/<pid>/net/tcp` and `tcp6`.
//!
//! Addresses are kept canonical: an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, a dual-stack
//! socket talking IPv4) is folded to IPv4, so a tuple matches whichever way the kernel spelled it.
//! The table is refreshed lazily (by the caller on a miss, at most every [`REFRESH_INTERVAL`]) and is
//! bounded ([`MAX_SOCKETS`] connections, bounded reads). Everything read from `/proc` is
//! untrusted: a malformed line is skipped and counted, an unreadable process is skipped.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Least time between two reads of the socket tables.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(200);
/// Most connections (and, separately, listeners) kept.
pub const MAX_SOCKETS: usize = 65_536;
/// Most fd entries looked at per process and refresh.
const MAX_FDS: usize = 1 << 20;
/// Most bytes read of one `/proc/<pid>/net/tcp{,6}` (about 400k sockets).
const MAX_TABLE_BYTES: u64 = 64 << 20;
/// A connection or listener no longer seen in the tables (closed, its fd gone) is kept this
/// long, so that the events of its last moments (FIN retransmits, the final state changes)
/// still find it.
const STALE_AFTER: Duration = Duration::from_secs(30);

/// TCP_LISTEN in `/proc/net/tcp`'s `st` column.
pub const STATE_LISTEN: u8 = 10;

/// One row of `/proc/net/tcp` or `tcp6`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocketRow {
    /// Canonical local and remote address (v4-mapped folded to IPv4).
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Kernel TCP state (1 ESTABLISHED .. 10 LISTEN .. 12 NEW_SYN_RECV).
    pub state: u8,
    /// Socket inode, 0 for a socket no file refers to (orphaned, TIME_WAIT, request).
    pub inode: u64,
    /// Retransmission timeout in clock ticks (`USER_HZ`); `None` in the short rows of TIME_WAIT
    /// and request sockets.
    pub rto_ticks: Option<u64>,
    /// Congestion window in segments; `None` in short rows.
    pub snd_cwnd: Option<u32>,
}

/// Fold an IPv4-mapped IPv6 address to IPv4 (ports and other addresses unchanged).
pub fn canonical(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

/// One 8-hex-digit word of an address column: the kernel prints the in-memory `u32`
/// (network-order bytes) as a host-order number, so its native bytes are the address bytes.
fn addr_word(hex: &str) -> Option<[u8; 4]> {
    if hex.len() != 8 {
        return None;
    }
    Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
}

/// `0100007F:0CEA` (IPv4) or 32 hex digits `:0CEA` (IPv6) into a canonical address.
pub fn parse_endpoint(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    if port.len() != 4 || !ip.is_ascii() {
        return None;
    }
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(addr_word(ip)?)),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&addr_word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(canonical(SocketAddr::new(ip, port)))
}

/// One data line of `/proc/net/tcp{,6}`; `None` for the header or a malformed line.
///
/// Columns: `sl local rem st tx:rx tr:when retrnsmt uid timeout inode` then, in full rows,
/// `refcnt sk rto ato quick|pingpong cwnd ssthresh`.
pub fn parse_tcp_line(line: &str) -> Option<TcpSocketRow> {
    let f: Vec<&str> = line.split_ascii_whitespace().take(17).collect();
    if f.len() < 10 || !f[0].ends_with(':') {
        return None;
    }
    let state = u8::from_str_radix(f[3], 16).ok()?;
    let full = f.len() >= 16;
    Some(TcpSocketRow {
        local: parse_endpoint(f[1])?,
        remote: parse_endpoint(f[2])?,
        state,
        inode: f[9].parse().ok()?,
        rto_ticks: full.then(|| f[12].parse().ok()).flatten(),
        snd_cwnd: full.then(|| f[15].parse().ok()).flatten(),
    })
}

/// Every row of a socket table's text, and how many non-header lines did not parse.
pub fn parse_tcp_table(text: &str) -> (Vec<TcpSocketRow>, u64) {
    let mut bad = 0;
    let rows = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("sl"))
        .filter_map(|l| {
            let r = parse_tcp_line(l);
            bad += u64::from(r.is_none());
            r
        })
        .collect();
    (rows, bad)
}

/// The inode of a `socket:[12345]` fd link.
pub fn parse_socket_link(s: &str) -> Option<u64> {
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Network namespace (`net:[inode]`) -> a pid to read its tables through, and the tracked
/// processes in it with their socket inodes.
type Spaces = HashMap<String, (u32, Vec<(u32, HashSet<u64>)>)>;

/// The owner of one connection (or listener), as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    /// Kernel TCP state at the last read.
    pub state: u8,
    /// Retransmission timeout (ms) at the last read.
    pub rto_ms: Option<u64>,
    pub snd_cwnd: Option<u32>,
    /// When a table read last showed it.
    seen: Instant,
}

/// What reading the tables met (for the agent's self-report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerCounters {
    pub refreshes: u64,
    /// Table lines that did not parse.
    pub malformed: u64,
    /// Connections not kept because the table was full.
    pub truncated: u64,
    /// Processes whose fds or tables could not be read at a refresh.
    pub unreadable: u64,
}

/// TCP 4-tuple -> owning tracked pid.
pub struct SocketOwners {
    /// `/proc`, or a fixture directory in tests.
    root: PathBuf,
    pids: BTreeSet<u32>,
    conns: HashMap<(SocketAddr, SocketAddr), Owner>,
    /// Listening sockets by local address (possibly the unspecified address).
    listeners: HashMap<SocketAddr, Owner>,
    last_refresh: Option<Instant>,
    generation: u64,
    clk_tck: u64,
    pub counters: OwnerCounters,
}

impl Default for SocketOwners {
    fn default() -> Self {
        SocketOwners::new(PathBuf::from("/proc"))
    }
}

impl SocketOwners {
    /// A table reading the procfs mounted at `root`.
    pub fn new(root: PathBuf) -> Self {
        // SAFETY: sysconf has no preconditions.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        SocketOwners {
            root,
            pids: BTreeSet::new(),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            last_refresh: None,
            generation: 0,
            clk_tck: u64::try_from(tck).ok().filter(|&t| t > 0).unwrap_or(100),
            counters: OwnerCounters::default(),
        }
    }

    /// Attribute the sockets of `pid` from the next refresh on.
    pub fn track(&mut self, pid: u32) {
        self.pids.insert(pid);
    }

    /// Forget `pid` and its sockets.
    pub fn untrack(&mut self, pid: u32) {
        self.pids.remove(&pid);
        self.conns.retain(|_, o| o.pid != pid);
        self.listeners.retain(|_, o| o.pid != pid);
    }

    /// The owner of connection (local, remote) as last read: the connection itself, else a
    /// listener on its local address (a connection not yet accepted, a SYN-ACK retransmit).
    pub fn lookup(&self, local: SocketAddr, remote: SocketAddr) -> Option<&Owner> {
        let (l, r) = (canonical(local), canonical(remote));
        if let Some(o) = self.conns.get(&(l, r)) {
            return Some(o);
        }
        let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), l.port());
        let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), l.port());
        [l, any4, any6].iter().find_map(|a| self.listeners.get(a))
    }

    /// The local ports `pid` listens on, as last read.
    pub fn listening_ports(&self, pid: u32) -> Vec<u16> {
        let mut v: Vec<u16> = self
            .listeners
            .iter()
            .filter(|(_, o)| o.pid == pid)
            .map(|(a, _)| a.port())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// True when a refresh is allowed now (none in the last [`REFRESH_INTERVAL`]).
    pub fn refresh_due(&self) -> bool {
        self.last_refresh
            .is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL)
    }

    /// How many refreshes have run: an event that arrived at generation `g` and still misses
    /// once the generation is past `g` belongs to no tracked process.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Connections known now.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no connection is known.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Read the tracked processes' sockets again (whatever the interval). Connections seen keep
    /// or take their owner; ones not seen for [`STALE_AFTER`] are dropped.
    pub fn refresh(&mut self) {
        let now = Instant::now();
        self.generation += 1;
        self.last_refresh = Some(now);
        self.counters.refreshes += 1;
        let mut spaces: Spaces = HashMap::new();
        for &pid in &self.pids {
            let Some(inodes) = self.socket_inodes(pid) else {
                self.counters.unreadable += 1;
                continue;
            };
            let ns = std::fs::read_link(self.root.join(format!("{pid}/ns/net")))
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("pid:{pid}"));
            spaces
                .entry(ns)
                .or_insert((pid, Vec::new()))
                .1
                .push((pid, inodes));
        }
        for (via, owners) in spaces.into_values() {
            for table in ["tcp", "tcp6"] {
                let path = self.root.join(format!("{via}/net/{table}"));
                let Ok(file) = File::open(&path) else {
                    self.counters.unreadable += 1;
                    continue;
                };
                let reader = BufReader::new(file.take(MAX_TABLE_BYTES));
                for line in reader.split(b'\n') {
                    let Ok(line) = line else { break };
                    let text = String::from_utf8_lossy(&line);
                    if text.trim().is_empty() || text.trim_start().starts_with("sl") {
                        continue;
                    }
                    let Some(row) = parse_tcp_line(&text) else {
                        self.counters.malformed += 1;
                        continue;
                    };
                    if row.inode == 0 {
                        continue;
                    }
                    if let Some((pid, _)) = owners.iter().find(|(_, s)| s.contains(&row.inode)) {
                        self.insert(*pid, &row, now);
                    }
                }
            }
        }
        self.conns
            .retain(|_, o| now.duration_since(o.seen) < STALE_AFTER);
        // A listener closed since (its process exited) still owns the events it made before:
        // those waiting for this refresh because some other record missed.
        self.listeners
            .retain(|_, o| now.duration_since(o.seen) < STALE_AFTER);
    }

    fn insert(&mut self, pid: u32, row: &TcpSocketRow, now: Instant) {
        let owner = Owner {
            pid,
            state: row.state,
            rto_ms: row.rto_ticks.map(|t| t.saturating_mul(1000) / self.clk_tck),
            snd_cwnd: row.snd_cwnd,
            seen: now,
        };
        if row.state == STATE_LISTEN {
            if self.listeners.len() >= MAX_SOCKETS && !self.listeners.contains_key(&row.local) {
                self.counters.truncated += 1;
                return;
            }
            self.listeners.insert(row.local, owner);
            return;
        }
        let key = (row.local, row.remote);
        if self.conns.len() >= MAX_SOCKETS && !self.conns.contains_key(&key) {
            self.counters.truncated += 1;
            return;
        }
        self.conns.insert(key, owner);
    }

    /// Socket inodes among `pid`'s open files; `None` when its fd directory cannot be read.
    fn socket_inodes(&self, pid: u32) -> Option<HashSet<u64>> {
        let dir = std::fs::read_dir(self.root.join(format!("{pid}/fd"))).ok()?;
        let mut out = HashSet::new();
        for e in dir.take(MAX_FDS).flatten() {
            if let Some(inode) = std::fs::read_link(e.path())
                .ok()
                .and_then(|l| l.to_str().and_then(parse_socket_link))
            {
                out.insert(inode);
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/net/tcp` with a listener, an established loopback pair, a TIME_WAIT (short) row
    /// and junk lines.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1598 1 00000000a6783818 100 0 0 10 0
   1: 0100007F:87D6 0100007F:DE49 01 00000000:00000000 00:00000000 00000000     0        0 550965 2 00000000d3a046e5 20 0 0 10 -1
   2: 020200C0:8870 507100CB:0050 06 00000000:00000000 03:00000E71 00000000     0        0 0 3 00000000827ad79c
   3: 0100007F:87D6 zz 01
   4: 0100007F:87D6 0100007F:DE49 01 00000000:00000000 00:00000000 00000000     0        0 notanumber 2
";

    /// `/proc/net/tcp6`: a dual-stack listener, a `::1` pair and a v4-mapped accepted socket.
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:DE49 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 550964 1 000000006716a312 100 0 0 10 0
   1: 00000000000000000000000001000000:A67A 00000000000000000000000001000000:DE49 01 00000000:00000000 00:00000000 00000000     0        0 550967 2 000000001021e058 20 0 0 10 -1
   3: 0000000000000000FFFF00000100007F:DE49 0000000000000000FFFF00000100007F:87D6 01 00000000:00000000 00:00000000 00000000     0        0 550966 1 000000008b5e40a4 20 0 0 10 -1
";

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv4_rows_parse_with_their_rto_and_cwnd_and_junk_is_counted() {
        let (rows, bad) = parse_tcp_table(TCP);
        assert_eq!(bad, 2);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].local, sa("0.0.0.0:2024"));
        assert_eq!(rows[0].state, STATE_LISTEN);
        assert_eq!(rows[0].inode, 1598);
        assert_eq!(
            rows[1],
            TcpSocketRow {
                local: sa("127.0.0.1:34774"),
                remote: sa("127.0.0.1:56905"),
                state: 1,
                inode: 550965,
                rto_ticks: Some(20),
                snd_cwnd: Some(10),
            }
        );
        // TIME_WAIT: short row, no inode, no rto.
        assert_eq!(rows[2].local, sa("192.0.2.2:34928"));
        assert_eq!(rows[2].remote, sa("203.0.113.80:80"));
        assert_eq!(
            (rows[2].state, rows[2].inode, rows[2].rto_ticks),
            (6, 0, None)
        );
    }

    #[test]
    fn ipv6_rows_parse_and_v4_mapped_ones_fold_to_ipv4() {
        let (rows, bad) = parse_tcp_table(TCP6);
        assert_eq!(bad, 0);
        assert_eq!(rows[0].local, sa("[::]:56905"));
        assert_eq!(rows[1].local, sa("[::1]:42618"));
        assert_eq!(rows[1].remote, sa("[::1]:56905"));
        assert_eq!(rows[2].local, sa("127.0.0.1:56905"));
        assert_eq!(rows[2].remote, sa("127.0.0.1:34774"));
        assert_eq!(canonical(sa("[::ffff:10.1.2.3]:9")), sa("10.1.2.3:9"));
        assert_eq!(canonical(sa("[::1]:9")), sa("[::1]:9"));
    }

    #[test]
    fn hostile_lines_never_panic() {
        for l in [
            "",
            "0:",
            "   0: : : : : : : : :",
            "   0: 0100007F:FFFFF 0100007F:0001 01 a b c d e 1",
            "   0: 0100007F0:0001 0100007F:0001 01 a b c d e 1",
            "   0: 010\u{e9}007F:0001 0100007F:0001 01 a b c d e 1",
            "   0: 0000000000000000000000000000\u{e9}:0001 0100007F:0001 01 a b c d e 1",
            "   0: 0100007F:0001 0100007F:0001 1FF a b c d e 1",
            "   0: 0100007F:0001 0100007F:0001 01 a b c d e 99999999999999999999999",
        ] {
            assert!(parse_tcp_line(l).is_none(), "{l:?}");
        }
        assert_eq!(parse_socket_link("socket:[42]"), Some(42));
        for l in [
            "socket:[]",
            "socket:[-1]",
            "pipe:[3]",
            "socket:[1",
            "/dev/null",
        ] {
            assert_eq!(parse_socket_link(l), None, "{l}");
        }
    }

    /// A fixture procfs: pid 100 holds the v4 client socket and the dual-stack listener, pid 200
    /// (untracked) the rest.
    fn fixture(tag: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("comminsight-sockets-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (pid, inodes) in [(100, &[550965u64, 550964, 7][..]), (200, &[550966, 550967])] {
            let p = root.join(format!("{pid}"));
            std::fs::create_dir_all(p.join("fd")).unwrap();
            std::fs::create_dir_all(p.join("net")).unwrap();
            std::fs::create_dir_all(p.join("ns")).unwrap();
            for (fd, ino) in inodes.iter().enumerate() {
                std::os::unix::fs::symlink(format!("socket:[{ino}]"), p.join(format!("fd/{fd}")))
                    .unwrap();
            }
            std::os::unix::fs::symlink("/dev/null", p.join("fd/99")).unwrap();
            std::os::unix::fs::symlink("net:[4026531840]", p.join("ns/net")).unwrap();
            std::fs::write(p.join("net/tcp"), TCP).unwrap();
            std::fs::write(p.join("net/tcp6"), TCP6).unwrap();
        }
        root
    }

    #[test]
    fn tuples_map_to_the_tracked_owner_and_listeners_cover_unaccepted_connections() {
        let root = fixture("owners");
        let mut o = SocketOwners::new(root.clone());
        o.track(100);
        assert!(o.refresh_due());
        o.refresh();
        assert!(!o.refresh_due());
        assert_eq!(o.generation(), 1);
        assert_eq!(o.counters.malformed, 2);
        let c = o
            .lookup(sa("127.0.0.1:34774"), sa("127.0.0.1:56905"))
            .expect("the client socket");
        assert_eq!((c.pid, c.state, c.snd_cwnd), (100, 1, Some(10)));
        assert_eq!(c.rto_ms, Some(20 * 1000 / o.clk_tck));
        // The same tuple spelled v4-mapped, as a dual-stack socket's event has it.
        assert!(o
            .lookup(
                sa("[::ffff:127.0.0.1]:34774"),
                sa("[::ffff:127.0.0.1]:56905")
            )
            .is_some());
        // Pid 200's ::1 socket is not tracked; its v4-mapped accepted socket sits on pid 100's
        // dual-stack listener port, so it is attributed to the listener (not yet accepted).
        assert!(o.lookup(sa("[::1]:42618"), sa("[::1]:56905")).is_none());
        assert_eq!(
            o.lookup(sa("127.0.0.1:56905"), sa("127.0.0.1:34774"))
                .map(|o| o.pid),
            Some(100)
        );
        assert!(o.lookup(sa("10.9.9.9:1"), sa("10.9.9.8:2")).is_none());
        o.untrack(100);
        assert!(o.is_empty());
        assert!(o
            .lookup(sa("127.0.0.1:56905"), sa("127.0.0.1:34774"))
            .is_none());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn an_unreadable_process_is_counted_and_skipped() {
        let root = fixture("gone");
        let mut o = SocketOwners::new(root.clone());
        o.track(100);
        o.track(4242);
        o.refresh();
        assert_eq!(o.counters.unreadable, 1);
        assert_eq!(o.len(), 1);
        let _ = std::fs::remove_dir_all(root);
    }
}

//! Framed messages over TCP. Every frame: comm id, kind, source rank, destination rank, tag, length.
//! Reader threads never block on the application, so writers never deadlock; receivers wait on the
//! mailbox of (comm, kind, src, dst) and match the head frame's tag exactly (a mismatch stalls, like a
//! GPU kernel waiting for data that never comes).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x4e43_4349; // "ICCN"
const HDR: usize = 40;
/// Wildcard rank for bootstrap mailboxes.
pub const ANY: u32 = u32::MAX;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Rank → root: hello with rank, nranks, address, host.
    BootHello = 1,
    /// Root → rank: the full peer table.
    BootTable = 2,
    /// Split: (color, key) exchange over the parent comm.
    Split = 3,
    /// Collective data.
    Coll = 4,
    /// Point-to-point data.
    P2pData = 5,
    /// Point-to-point clear-to-send (receiver → sender).
    P2pCts = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::BootHello,
            2 => Self::BootTable,
            3 => Self::Split,
            4 => Self::Coll,
            5 => Self::P2pData,
            6 => Self::P2pCts,
            _ => return None,
        })
    }
}

/// Mailbox key: (comm id, kind, source rank, destination rank).
pub type Key = (u64, Kind, u32, u32);

/// One received frame.
#[derive(Debug)]
pub struct Frame {
    /// Operation tag (what the sender was executing).
    pub tag: u64,
    /// Payload.
    pub data: Vec<u8>,
    /// The socket it arrived on.
    pub fd: i32,
    /// When its last byte was read off the socket (the data "arrived").
    pub arrived: Instant,
}

/// Why a wait ended without a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The comm was aborted or destroyed.
    Aborted,
}

/// The process' transport.
pub struct Net {
    /// Our listener's address (what peers connect to).
    pub addr: SocketAddr,
    boxes: Mutex<HashMap<Key, VecDeque<Frame>>>,
    cv: Condvar,
    conns: Mutex<HashMap<SocketAddr, Arc<Mutex<TcpStream>>>>,
    warned: Mutex<HashSet<Key>>,
    dead: Mutex<HashSet<u64>>,
    gone: Mutex<HashSet<(u64, u32)>>,
}

/// The process-wide transport, started on first use.
pub fn net() -> &'static Net {
    static NET: OnceLock<Net> = OnceLock::new();
    static STARTED: AtomicBool = AtomicBool::new(false);
    let n = NET.get_or_init(|| {
        let bind = format!("{}:0", crate::env::get().bind_addr);
        let listener = TcpListener::bind(&bind)
            .or_else(|e| {
                crate::log::warn(&format!(
                    "COMMINSIGHT_TESTBED_BIND_ADDR: cannot listen on {bind} ({e}); using 127.0.0.1"
                ));
                TcpListener::bind("127.0.0.1:0")
            })
            .expect("bind a TCP listener for the nccl stand-in");
        let addr = listener.local_addr().expect("listener address");
        crate::log::info(
            crate::log::SUB_BOOTSTRAP,
            &format!("Bootstrap : Using listener {addr}"),
        );
        LISTENER.set(Mutex::new(Some(listener))).ok();
        Net {
            addr,
            boxes: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            warned: Mutex::new(HashSet::new()),
            dead: Mutex::new(HashSet::new()),
            gone: Mutex::new(HashSet::new()),
        }
    });
    if !STARTED.swap(true, Ordering::SeqCst) {
        let l = LISTENER
            .get()
            .and_then(|m| m.lock().ok()?.take())
            .expect("listener present");
        std::thread::Builder::new()
            .name("nccl-listen".into())
            .spawn(move || accept_loop(l))
            .expect("spawn listener thread");
    }
    n
}

static LISTENER: OnceLock<Mutex<Option<TcpListener>>> = OnceLock::new();

fn accept_loop(l: TcpListener) {
    for s in l.incoming() {
        let Ok(s) = s else { continue };
        let _ = s.set_nodelay(true);
        let _ = std::thread::Builder::new()
            .name("nccl-reader".into())
            .spawn(move || reader_loop(s));
    }
}

fn reader_loop(s: TcpStream) {
    let mut seen = HashSet::new();
    read_frames(s, &mut seen);
    // The connection is gone: remember which (comm, rank) pairs spoke on it.
    let n = net();
    if let Ok(mut g) = n.gone.lock() {
        g.extend(seen);
    }
    n.wake_all();
}

fn read_frames(mut s: TcpStream, seen: &mut HashSet<(u64, u32)>) {
    let mut hdr = [0u8; HDR];
    loop {
        if s.read_exact(&mut hdr).is_err() {
            return;
        }
        let u32_at = |o: usize| u32::from_le_bytes(hdr[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(hdr[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            crate::log::warn("stand-in transport: bad frame magic, closing connection");
            return;
        }
        let Some(kind) = Kind::from_u8(hdr[4]) else {
            return;
        };
        let comm = u64_at(8);
        let src = u32_at(16);
        let dst = u32_at(20);
        let tag = u64_at(24);
        let len = u64_at(32) as usize;
        let mut data = Vec::with_capacity(len);
        match (&mut s).take(len as u64).read_to_end(&mut data) {
            Ok(n) if n == len => {}
            _ => return,
        }
        seen.insert((comm, src));
        let n = net();
        if n.dead.lock().map(|d| d.contains(&comm)).unwrap_or(false) {
            continue; // late frame of a destroyed/aborted comm
        }
        let mut b = n.boxes.lock().unwrap_or_else(|e| e.into_inner());
        b.entry((comm, kind, src, dst))
            .or_default()
            .push_back(Frame {
                tag,
                data,
                fd: s.as_raw_fd(),
                arrived: Instant::now(),
            });
        drop(b);
        n.cv.notify_all();
    }
}

impl Net {
    fn conn(&self, to: SocketAddr) -> std::io::Result<Arc<Mutex<TcpStream>>> {
        if let Some(c) = self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&to)
        {
            return Ok(c.clone());
        }
        // Connect outside the map lock; retry while the peer's listener comes up.
        let deadline = Instant::now() + Duration::from_secs(60);
        let s = loop {
            match TcpStream::connect(to) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        let _ = s.set_nodelay(true);
        let mut m = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        Ok(m.entry(to)
            .or_insert_with(|| Arc::new(Mutex::new(s)))
            .clone())
    }

    /// Sends one frame (whole, under the connection's lock); returns the socket's fd.
    pub fn send(&self, to: SocketAddr, key: Key, tag: u64, data: &[u8]) -> std::io::Result<i32> {
        let (comm, kind, src, dst) = key;
        let mut hdr = [0u8; HDR];
        hdr[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        hdr[4] = kind as u8;
        hdr[8..16].copy_from_slice(&comm.to_le_bytes());
        hdr[16..20].copy_from_slice(&src.to_le_bytes());
        hdr[20..24].copy_from_slice(&dst.to_le_bytes());
        hdr[24..32].copy_from_slice(&tag.to_le_bytes());
        hdr[32..40].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let c = self.conn(to)?;
        let mut s = c.lock().unwrap_or_else(|e| e.into_inner());
        s.write_all(&hdr)?;
        s.write_all(data)?;
        Ok(s.as_raw_fd())
    }

    /// Waits for the head frame of `key`. `tag == None` takes any tag. A head frame with another tag
    /// is a mismatch: logged once, then the wait continues until `aborted` says stop.
    pub fn recv(
        &self,
        key: Key,
        tag: Option<u64>,
        aborted: &dyn Fn() -> bool,
    ) -> Result<Frame, Wait> {
        self.recv_or_gone(key, tag, aborted, &|| {})
    }

    /// As [`Net::recv`]; `on_gone` is called (once) when the sender's connection closed and nothing
    /// more can come; the wait then goes on until abort (as a GPU kernel keeps spinning while NCCL's
    /// proxy reports the network error).
    pub fn recv_or_gone(
        &self,
        key: Key,
        tag: Option<u64>,
        aborted: &dyn Fn() -> bool,
        on_gone: &dyn Fn(),
    ) -> Result<Frame, Wait> {
        let mut reported = false;
        let mut b = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if aborted() {
                return Err(Wait::Aborted);
            }
            if let Some(q) = b.get_mut(&key) {
                if let Some(head) = q.front() {
                    if tag.is_none() || tag == Some(head.tag) {
                        return Ok(q.pop_front().expect("head present"));
                    }
                    self.warn_mismatch(key, tag.unwrap_or(0), head.tag);
                }
            }
            if !reported
                && self
                    .gone
                    .lock()
                    .map(|g| g.contains(&(key.0, key.2)))
                    .unwrap_or(false)
            {
                reported = true;
                on_gone();
            }
            b = self
                .cv
                .wait_timeout(b, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn warn_mismatch(&self, key: Key, want: u64, got: u64) {
        let mut w = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        if w.insert(key) {
            crate::log::warn(&format!(
                "comm 0x{:x}: rank {} received {:?} data from rank {} for operation tag 0x{:x} while \
                 executing tag 0x{:x} (mismatched operation); waiting as a GPU kernel would",
                key.0, key.3, key.1, key.2, got, want
            ));
        }
    }

    /// Wakes every waiter (used by abort/destroy).
    pub fn wake_all(&self) {
        let _g = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }

    /// Drops every mailbox of `comm` (destroy/abort).
    pub fn forget_comm(&self, comm: u64) {
        if let Ok(mut d) = self.dead.lock() {
            d.insert(comm);
        }
        let mut b = self.boxes.lock().unwrap_or_else(|e| e.into_inner());
        b.retain(|k, _| k.0 != comm);
        drop(b);
        self.warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k| k.0 != comm);
        self.cv.notify_all();
    }

    /// Closes every outgoing connection (the last comm of the process is gone).
    pub fn close_all(&self) {
        let mut m = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        for c in m.values() {
            let s = c.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        m.clear();
    }
}

//! Shared-memory MPSC ring of [`RawRecord`]s (docs/contracts.md "Shared-memory ring").
//!
//! Producers are any threads of the training process: lock-free, bounded (at most
//! [`MAX_CAS_TRIES`] compare-and-swap attempts), never blocking and never waiting for a consumer.
//! A full ring drops the record and counts it. The consumer is the plugin's drain thread
//! ([`ShmRing::pop_into`]); readers in other processes ([`RingReader`]) follow the ring read-only,
//! attach at any time and detect what they missed.
//!
//! # File layout (all words little-endian `u64`, accessed atomically)
//! ```text
//! byte   0  magic  RING_MAGIC (stored last, with Release: a reader seeing it sees the rest)
//! byte   8  layout version RING_LAYOUT_VERSION
//! byte  16  record size (128)      byte 24  slot size (136)    byte 32  capacity (power of two)
//! byte  40  header size (4096)     byte 48  owner pid          byte 56  created (CLOCK_REALTIME ns)
//! byte 128  head: next position to claim == records pushed    (own 128-byte block)
//! byte 256  tail: next position the consumer pops             (own 128-byte block)
//! byte 384  drops: records refused (ring full or contention)  (own 128-byte block)
//! byte 4096 slot[0], slot[1], ... slot[capacity-1]
//! ```
//! A slot is a sequence word then the 128-byte record: 136 bytes. We chose 136 over padding to 192
//! (three whole cache lines): `/dev/shm` is small in containers (Docker's default is 64 MiB for
//! all ranks and NCCL together), and the default 8 MiB of records costs 8.5 MiB instead of 12 MiB.
//! The price is that neighbouring slots may share a cache line; the `head` CAS is the contended
//! line anyway, so this costs little.
//!
//! # Protocol (Vyukov's bounded queue, plus a seqlock check for foreign readers)
//! Slot `i` starts with sequence `i`. For position `p` (slot `p % capacity`): sequence `p` = free,
//! `p + 1` = record `p` written, `p + capacity` = record `p` consumed (and free for `p + capacity`).
//! A reader copies record `p` when the sequence is `p + 1` or `p + capacity`, then checks that
//! `head <= p + capacity` (nobody claimed the slot's next lap); producers issue a release fence
//! between their claim and their writes, so a copy torn by an overwrite always fails that check.

use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::record::{RawRecord, RECORD_SIZE};
use crate::sys::{self, Mapping};

mod reader;
mod userdir;
pub use reader::{ReadStatus, RingHeader, RingReader};
pub use userdir::{
    ensure_shared_dir, kind_name, shared_dir_problem, user_dir_problem, UserDir, UserDirError,
    SHARED_DIR_MODE, USER_DIR_MODE,
};

/// `b"CIRING\0\x01"`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"CIRING\0\x01");
/// Layout version of the ring file.
pub const RING_LAYOUT_VERSION: u64 = 1;
/// Bytes before the first slot.
pub const RING_HEADER_BYTES: usize = 4096;
/// Bytes per slot: sequence word + record.
pub const SLOT_BYTES: usize = 8 + RECORD_SIZE;
/// Smallest capacity, in records.
pub const MIN_CAPACITY: usize = 64;
/// Largest capacity, in records (16 Mi records, about 2.1 GiB).
pub const MAX_CAPACITY: usize = 1 << 24;
/// Default ring size (`COMMINSIGHT_RING_BYTES`).
pub const DEFAULT_RING_BYTES: u64 = 8 << 20;
/// A producer gives up (and counts a drop) after this many lost CAS races.
pub const MAX_CAS_TRIES: u32 = 64;

const REC_WORDS: usize = RECORD_SIZE / 8;
const SLOT_WORDS: usize = 1 + REC_WORDS;
const _: () = assert!(SLOT_WORDS * 8 == SLOT_BYTES);
const HDR_WORDS: usize = RING_HEADER_BYTES / 8;

// Header word indices.
const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_RECORD_SIZE: usize = 2;
const W_SLOT_SIZE: usize = 3;
const W_CAPACITY: usize = 4;
const W_HEADER_SIZE: usize = 5;
const W_PID: usize = 6;
const W_CREATED: usize = 7;
const W_HEAD: usize = 16;
const W_TAIL: usize = 32;
const W_DROPS: usize = 48;

/// Ring failures. Each names the path (if any) and the failing call.
#[derive(Debug)]
pub enum RingError {
    /// A system call failed.
    Io {
        call: &'static str,
        path: Option<PathBuf>,
        source: std::io::Error,
    },
    /// Requested capacity above [`MAX_CAPACITY`].
    TooLarge { capacity: usize },
    /// The file is not a ring of this layout.
    NotARing { path: PathBuf, reason: String },
    /// The file exists but its creator has not finished initialising it.
    NotReady { path: PathBuf },
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingError::Io {
                call,
                path: Some(p),
                source,
            } => write!(f, "ring {}: {call} failed: {source}", p.display()),
            RingError::Io {
                call,
                path: None,
                source,
            } => write!(f, "private ring: {call} failed: {source}"),
            RingError::TooLarge { capacity } => write!(
                f,
                "ring capacity {capacity} records exceeds the maximum {MAX_CAPACITY}; lower COMMINSIGHT_RING_BYTES"
            ),
            RingError::NotARing { path, reason } => {
                write!(f, "{} is not a CommInsight ring: {reason}", path.display())
            }
            RingError::NotReady { path } => write!(
                f,
                "ring {} is still being initialised; retry shortly",
                path.display()
            ),
        }
    }
}

impl std::error::Error for RingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RingError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Ring capacity (records, a power of two) for a byte budget such as `COMMINSIGHT_RING_BYTES`:
/// `bytes / 128` rounded down to a power of two (so the record area never exceeds the budget),
/// clamped to [`MIN_CAPACITY`]..=[`MAX_CAPACITY`]. The default 8 MiB gives 65536 records.
pub fn capacity_for_bytes(bytes: u64) -> usize {
    let recs = (bytes / RECORD_SIZE as u64).min(MAX_CAPACITY as u64) as usize;
    if recs <= MIN_CAPACITY {
        return MIN_CAPACITY;
    }
    1 << (usize::BITS - 1 - recs.leading_zeros())
}

/// Capacity actually used for a requested one: rounded up to a power of two, at least 64.
pub fn round_capacity(capacity: usize) -> Result<usize, RingError> {
    let cap = capacity.max(MIN_CAPACITY);
    if cap > MAX_CAPACITY {
        return Err(RingError::TooLarge { capacity });
    }
    Ok(cap.next_power_of_two())
}

/// Total mapping size for a capacity.
pub fn mapping_bytes(capacity: usize) -> usize {
    RING_HEADER_BYTES + capacity * SLOT_BYTES
}

/// Index of slot `pos`'s sequence word; the record follows in the next 16 words.
fn slot_word(pos: u64, mask: u64) -> usize {
    HDR_WORDS + (pos & mask) as usize * SLOT_WORDS
}

fn store_record(words: &[AtomicU64], rec: &RawRecord) {
    for (w, chunk) in words.iter().zip(rec.0.chunks_exact(8)) {
        let v = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
        w.store(v, Ordering::Relaxed);
    }
}

fn load_record(words: &[AtomicU64]) -> RawRecord {
    let mut rec = RawRecord::ZERO;
    for (w, chunk) in words.iter().zip(rec.0.chunks_exact_mut(8)) {
        chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
    rec
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The producer/consumer end of a ring, owned by the training process. `Send + Sync`: share it
/// (e.g. in an `Arc`) between producer threads and the drain thread. Dropping it unmaps the
/// ring; the file stays until [`ShmRing::unlink`].
pub struct ShmRing {
    map: Mapping,
    capacity: usize,
    mask: u64,
    path: Option<PathBuf>,
    /// The directory the ring was created in and its name there ([`ShmRing::create_in`]):
    /// unlinked relative to it.
    at: Option<(Arc<std::fs::File>, String)>,
    /// Guards `pop_into` against two concurrent consumers in this process.
    popping: AtomicBool,
}

impl std::fmt::Debug for ShmRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmRing")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .field("pushed", &self.pushed())
            .field("drops", &self.drops())
            .finish()
    }
}

impl ShmRing {
    /// Create a ring file at `path` (exclusive, mode 0600, blocks reserved), creating its parent
    /// directory with mode 01777 if missing. `capacity` is rounded up to a power of two, min 64.
    pub fn create(path: &Path, capacity: usize) -> Result<ShmRing, RingError> {
        let capacity = round_capacity(capacity)?;
        let io = |call: &'static str, p: &Path| {
            let p = p.to_path_buf();
            move |source| RingError::Io {
                call,
                path: Some(p),
                source,
            }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            ensure_sticky_dir(dir).map_err(io("mkdir", dir))?;
        }
        let (file, len) = {
            let file = sys::create_excl(path, 0o600).map_err(|(call, e)| io(call, path)(e))?;
            let len = mapping_bytes(capacity);
            if let Err((call, e)) = sys::size_and_reserve(&file, len as u64) {
                let _ = std::fs::remove_file(path);
                return Err(io(call, path)(e));
            }
            (file, len)
        };
        let map = match Mapping::shared(&file, len, true) {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(io("mmap", path)(e));
            }
        };
        Ok(Self::init(map, capacity, Some(path.to_path_buf())))
    }

    /// Create a ring file `name` (one path component) in the checked per-user directory `dir`,
    /// relative to the open directory (`openat`, exclusive, `O_NOFOLLOW`, mode 0600 forced with
    /// `fchmod`, blocks reserved). This is how the plugin creates its rings.
    pub fn create_in(dir: &UserDir, name: &str, capacity: usize) -> Result<ShmRing, RingError> {
        let capacity = round_capacity(capacity)?;
        let path = dir.path().join(name);
        let handle = dir.handle();
        let io = |call: &'static str| {
            let p = path.clone();
            move |source| RingError::Io {
                call,
                path: Some(p),
                source,
            }
        };
        let file = sys::create_excl_at(handle, name, 0o600).map_err(|(c, e)| io(c)(e))?;
        let len = mapping_bytes(capacity);
        let map = sys::size_and_reserve(&file, len as u64)
            .and_then(|()| Mapping::shared(&file, len, true).map_err(|e| ("mmap", e)));
        match map {
            Ok(map) => {
                let mut ring = Self::init(map, capacity, Some(path.clone()));
                ring.at = Some((handle.clone(), name.to_string()));
                Ok(ring)
            }
            Err((call, e)) => {
                let _ = sys::unlink_at(handle, name);
                Err(io(call)(e))
            }
        }
    }

    /// A ring in anonymous private memory: no file, no foreign readers (fallback and tests).
    pub fn private(capacity: usize) -> Result<ShmRing, RingError> {
        let capacity = round_capacity(capacity)?;
        let map = Mapping::anonymous(mapping_bytes(capacity)).map_err(|source| RingError::Io {
            call: "mmap",
            path: None,
            source,
        })?;
        Ok(Self::init(map, capacity, None))
    }

    fn init(map: Mapping, capacity: usize, path: Option<PathBuf>) -> ShmRing {
        let w = map.words();
        for i in 0..capacity {
            w[slot_word(i as u64, u64::MAX)].store(i as u64, Ordering::Relaxed);
        }
        w[W_VERSION].store(RING_LAYOUT_VERSION, Ordering::Relaxed);
        w[W_RECORD_SIZE].store(RECORD_SIZE as u64, Ordering::Relaxed);
        w[W_SLOT_SIZE].store(SLOT_BYTES as u64, Ordering::Relaxed);
        w[W_CAPACITY].store(capacity as u64, Ordering::Relaxed);
        w[W_HEADER_SIZE].store(RING_HEADER_BYTES as u64, Ordering::Relaxed);
        w[W_PID].store(u64::from(sys::pid()), Ordering::Relaxed);
        w[W_CREATED].store(realtime_ns(), Ordering::Relaxed);
        w[W_MAGIC].store(RING_MAGIC, Ordering::Release);
        ShmRing {
            map,
            capacity,
            mask: capacity as u64 - 1,
            path,
            at: None,
            popping: AtomicBool::new(false),
        }
    }

    /// Records the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The ring file (None for a private ring).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Push one record; its header `seq` is overwritten with the ring position. Returns false
    /// (and counts a drop) when the ring is full or after [`MAX_CAS_TRIES`] lost races. Never
    /// blocks, sleeps, allocates or waits for the consumer.
    pub fn push(&self, rec: &RawRecord) -> bool {
        let w = self.map.words();
        let head = &w[W_HEAD];
        let mut pos = head.load(Ordering::Relaxed);
        for _ in 0..MAX_CAS_TRIES {
            let s = slot_word(pos, self.mask);
            let seq = w[s].load(Ordering::Acquire);
            if seq == pos {
                match head.compare_exchange(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        // Orders the claim before the record stores, for readers' overwrite check.
                        fence(Ordering::Release);
                        let mut r = *rec;
                        r.set_seq(pos);
                        store_record(&w[s + 1..s + SLOT_WORDS], &r);
                        w[s].store(pos + 1, Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if seq < pos {
                // Slot still holds the record of the previous lap: full.
                break;
            } else {
                pos = head.load(Ordering::Relaxed);
            }
        }
        w[W_DROPS].fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Records accepted so far (== the next position).
    pub fn pushed(&self) -> u64 {
        self.map.words()[W_HEAD].load(Ordering::Relaxed)
    }

    /// Records refused so far.
    pub fn drops(&self) -> u64 {
        self.map.words()[W_DROPS].load(Ordering::Relaxed)
    }

    /// Move up to `max` records, oldest first, into `out` and free their slots. Meant for one
    /// consumer thread; a concurrent second call in this process returns 0.
    pub fn pop_into(&self, out: &mut Vec<RawRecord>, max: usize) -> usize {
        if self.popping.swap(true, Ordering::Acquire) {
            return 0;
        }
        let w = self.map.words();
        let mut tail = w[W_TAIL].load(Ordering::Relaxed);
        let mut n = 0;
        while n < max {
            let s = slot_word(tail, self.mask);
            if w[s].load(Ordering::Acquire) != tail + 1 {
                break;
            }
            out.push(load_record(&w[s + 1..s + SLOT_WORDS]));
            w[s].store(tail + self.capacity as u64, Ordering::Release);
            tail += 1;
            n += 1;
        }
        w[W_TAIL].store(tail, Ordering::Release);
        self.popping.store(false, Ordering::Release);
        n
    }

    /// Remove the file name (the mapping stays valid). Errors are ignored: best effort at exit.
    pub fn unlink(&self) {
        if let Some((dir, name)) = &self.at {
            let _ = sys::unlink_at(dir, name);
        } else if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Create `dir` (and missing ancestors) and, if we created the last component, make it 01777
/// like /tmp. An existing directory is left as it is.
fn ensure_sticky_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;

//! The read-only end of a ring: a follower in another process (the agent) that attaches at any
//! time, never writes to the ring, and counts the records it was too slow to copy.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};

use super::{
    load_record, mapping_bytes, slot_word, RingError, MAX_CAPACITY, MIN_CAPACITY,
    RING_HEADER_BYTES, RING_LAYOUT_VERSION, RING_MAGIC, SLOT_BYTES, SLOT_WORDS, W_CAPACITY,
    W_CREATED, W_DROPS, W_HEAD, W_HEADER_SIZE, W_MAGIC, W_PID, W_RECORD_SIZE, W_SLOT_SIZE, W_TAIL,
    W_VERSION,
};
use crate::fsafe::{self, OpenError, Owner};
use crate::record::{RawRecord, RECORD_SIZE};
use crate::sys::Mapping;

/// A ring's header as a reader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingHeader {
    pub pid: u32,
    pub capacity: usize,
    /// Records accepted (the producers' next position).
    pub pushed: u64,
    /// Records refused by producers.
    pub drops: u64,
    /// Records taken by the owner's consumer.
    pub consumed: u64,
    pub created_real_ns: u64,
}

/// What one [`RingReader::read_into`] call saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStatus {
    /// Records appended to `out`.
    pub records: usize,
    /// Records overwritten before this reader could copy them (lapped).
    pub lost: u64,
}

/// A read-only follower of another process' ring (the agent). Never writes to the ring, so it
/// can neither slow down nor disturb the producers.
pub struct RingReader {
    map: Mapping,
    path: PathBuf,
    capacity: usize,
    mask: u64,
    next: u64,
}

impl std::fmt::Debug for RingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingReader")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .field("next", &self.next)
            .finish()
    }
}

impl RingReader {
    /// Map `path` read-only and validate its header. The reader starts at the oldest record the
    /// ring may still hold (see [`RingReader::seek_to_end`] to follow only new records).
    ///
    /// The file is opened as [`crate::fsafe::open_untrusted`] does (not through a symbolic link,
    /// non-blocking, a regular file owned by its directory's owner); see [`RingReader::open_below`].
    pub fn open(path: &Path) -> Result<RingReader, RingError> {
        RingReader::open_below(path, 1, Owner::OfDir)
    }

    /// [`RingReader::open`], with the last `below` components of `path` checked (2 for
    /// `<shm_dir>/<uid>/<name>.ring`: neither the per-user directory nor the file may be a
    /// symbolic link) and the owner rule `owner`. A refusal is a [`RingError::NotARing`] whose
    /// reason starts with "refused".
    pub fn open_below(path: &Path, below: usize, owner: Owner) -> Result<RingReader, RingError> {
        let file = match fsafe::open_below(path, below, owner) {
            Ok(f) => f,
            Err(OpenError::Refused { reason, .. }) => {
                return Err(RingError::NotARing {
                    path: path.to_path_buf(),
                    reason: format!("refused: {reason}"),
                })
            }
            Err(OpenError::Io { source, .. }) => {
                return Err(RingError::Io {
                    call: "open",
                    path: Some(path.to_path_buf()),
                    source,
                })
            }
        };
        RingReader::from_file(&file, path)
    }

    /// Map an already opened (and checked) ring file read-only and validate its header.
    pub fn from_file(file: &File, path: &Path) -> Result<RingReader, RingError> {
        let io = |call: &'static str| {
            let p = path.to_path_buf();
            move |source| RingError::Io {
                call,
                path: Some(p),
                source,
            }
        };
        let not_ring = |reason: String| RingError::NotARing {
            path: path.to_path_buf(),
            reason,
        };
        let size = file.metadata().map_err(io("fstat"))?.len();
        if size < RING_HEADER_BYTES as u64 {
            return Err(RingError::NotReady {
                path: path.to_path_buf(),
            });
        }
        let hdr = Mapping::shared_untrusted(file, RING_HEADER_BYTES).map_err(io("mmap"))?;
        let h = hdr.words();
        if h[W_MAGIC].load(Ordering::Relaxed) != RING_MAGIC {
            return Err(if h[W_MAGIC].load(Ordering::Relaxed) == 0 {
                RingError::NotReady {
                    path: path.to_path_buf(),
                }
            } else {
                not_ring("bad magic".into())
            });
        }
        fence(Ordering::Acquire);
        let get = |i: usize| h[i].load(Ordering::Relaxed);
        let check = |what: &str, got: u64, want: u64| {
            if got == want {
                Ok(())
            } else {
                Err(not_ring(format!("{what} is {got}, expected {want}")))
            }
        };
        check("layout version", get(W_VERSION), RING_LAYOUT_VERSION)?;
        check("record size", get(W_RECORD_SIZE), RECORD_SIZE as u64)?;
        check("slot size", get(W_SLOT_SIZE), SLOT_BYTES as u64)?;
        check("header size", get(W_HEADER_SIZE), RING_HEADER_BYTES as u64)?;
        let cap = get(W_CAPACITY);
        if !cap.is_power_of_two() || cap < MIN_CAPACITY as u64 || cap > MAX_CAPACITY as u64 {
            return Err(not_ring(format!("capacity {cap} is invalid")));
        }
        let capacity = cap as usize;
        check("file size", size, mapping_bytes(capacity) as u64)?;
        drop(hdr);
        let map = Mapping::shared_untrusted(file, mapping_bytes(capacity)).map_err(io("mmap"))?;
        let mut r = RingReader {
            map,
            path: path.to_path_buf(),
            capacity,
            mask: cap - 1,
            next: 0,
        };
        r.next = r.head().saturating_sub(cap);
        Ok(r)
    }

    fn head(&self) -> u64 {
        self.map.words()[W_HEAD].load(Ordering::Relaxed)
    }

    /// The ring file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The position (== record `seq`) this reader reads next.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Skip everything already pushed; read only records pushed from now on.
    pub fn seek_to_end(&mut self) {
        self.next = self.head();
    }

    /// The ring file was found shorter than its mapping: its owner truncated it while this
    /// reader mapped it. The missing pages read as zeros (no record, no `SIGBUS`); nothing more
    /// will come from this mapping, so the caller should let the ring go (and may attach again
    /// to whatever file is at the path later, which is checked afresh).
    pub fn truncated(&self) -> bool {
        self.map.faults() > 0
    }

    /// Current header values.
    pub fn header(&self) -> RingHeader {
        let w = self.map.words();
        let get = |i: usize| w[i].load(Ordering::Relaxed);
        RingHeader {
            pid: get(W_PID) as u32,
            capacity: self.capacity,
            pushed: get(W_HEAD),
            drops: get(W_DROPS),
            consumed: get(W_TAIL),
            created_real_ns: get(W_CREATED),
        }
    }

    /// Copy up to `max` new records into `out`. Stops at the first record not yet written.
    /// Records overwritten before they could be copied are skipped and counted in `lost`.
    ///
    /// The producers' contended `head` word is read twice per call, not per record: once to
    /// detect being lapped, once after copying — a record at position `p` is trusted only if no
    /// producer had claimed position `p + capacity` by then (its copy cannot be torn).
    pub fn read_into(&mut self, out: &mut Vec<RawRecord>, max: usize) -> ReadStatus {
        let w = self.map.words();
        let cap = self.capacity as u64;
        let mut st = ReadStatus::default();
        let head = self.head();
        if head.saturating_sub(self.next) > cap {
            // Lapped: the oldest record still possibly present is head - cap.
            st.lost += head - cap - self.next;
            self.next = head - cap;
        }
        let first = out.len();
        while st.records < max {
            let p = self.next;
            let s = slot_word(p, self.mask);
            let seq = w[s].load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if seq != p + 1 && seq != p + cap {
                if seq > p + cap {
                    // Overwritten since we loaded head.
                    st.lost += 1;
                    self.next += 1;
                    continue;
                }
                break; // not written yet
            }
            let rec = load_record(&w[s + 1..s + SLOT_WORDS]);
            self.next += 1;
            if rec.seq() != p {
                // Already rewritten for a later lap.
                st.lost += 1;
                continue;
            }
            out.push(rec);
            st.records += 1;
        }
        fence(Ordering::Acquire);
        // Positions below `trusted_from` may have been claimed for their next lap while we
        // copied them. They form a prefix of what this call pushed (positions only grow).
        let trusted_from = self.head().saturating_sub(cap);
        let suspect = out[first..]
            .iter()
            .take_while(|r| r.seq() < trusted_from)
            .count();
        if suspect > 0 {
            out.drain(first..first + suspect);
            st.records -= suspect;
            st.lost += suspect as u64;
        }
        st
    }
}

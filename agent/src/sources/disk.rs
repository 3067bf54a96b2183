//! Low-level helpers of the cursor: segment listing, cheap header checks, ring attachment, and
//! the identity of a seq epoch ([`EpochKey`]).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, Kind, RawRecord, Record, MAGIC, RECORD_SIZE, RECORD_VERSION};
use comminsight_wire::ring::RingReader;
use comminsight_wire::segment::{parse_segment_name, segment_file_name};
use serde::{Deserialize, Serialize};

/// Identity of a seq epoch: the `proc_start` clock pair that opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochKey {
    pub mono_ns: u64,
    pub real_ns: u64,
}

/// The header of `raw` is valid (magic, version, known kind, length, a seq below
/// [`MAX_SEQ`](comminsight_wire::bounds::MAX_SEQ)): `Record::decode` would accept it (the body
/// is checked there). Checked without decoding the body (the hot path).
pub(crate) fn header_ok(raw: &RawRecord) -> bool {
    let b = &raw.0;
    u16::from_le_bytes([b[0], b[1]]) == MAGIC
        && b[2] == RECORD_VERSION
        && Kind::from_u8(b[3]).is_some()
        && u16::from_le_bytes([b[4], b[5]]) as usize == RECORD_SIZE
        && raw.seq() < comminsight_wire::bounds::MAX_SEQ
}

/// The header flags of `raw`.
pub(crate) fn flags(raw: &RawRecord) -> u16 {
    u16::from_le_bytes([raw.0[6], raw.0[7]])
}

/// The clock pair of a `proc_start` record: identifies a seq epoch.
pub(crate) fn epoch_key(raw: &RawRecord) -> Option<EpochKey> {
    match Record::decode(raw).ok()?.body {
        Body::ProcStart(p) => Some(EpochKey {
            mono_ns: p.mono_ns,
            real_ns: p.real_ns,
        }),
        _ => None,
    }
}

/// Segments of a process directory: index -> still `.open`. A missing directory is empty.
pub(crate) fn list_segments(dir: &Path) -> std::io::Result<BTreeMap<u64, bool>> {
    let mut out = BTreeMap::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd {
        let e = e?;
        if let Some((i, open)) = e.file_name().to_str().and_then(parse_segment_name) {
            // Between a listing's two reads of a renamed file both names may show: sealed wins.
            let v = out.entry(i).or_insert(open);
            *v &= open;
        }
    }
    Ok(out)
}

/// Path of segment `index` in `dir`.
/// Path components of a segment below its log root that a job user controls
/// (`<job>/<host>/<pid>/seg-*.cis`): none of them is ever a symbolic link
/// ([`comminsight_wire::fsafe::open_below`]).
pub const SEGMENT_DEPTH: usize = 4;

/// Path components of a ring below the shm directory a job user controls
/// (`<uid>/<job>.<host>.<pid>.ring`).
pub const RING_DEPTH: usize = 2;

/// Attach to a ring read-only, its per-user directory and the file checked as
/// [`RING_DEPTH`] says.
pub(crate) fn open_ring(path: &Path) -> Result<RingReader, comminsight_wire::ring::RingError> {
    RingReader::open_below(path, RING_DEPTH, comminsight_wire::fsafe::Owner::OfDir)
}

pub(crate) fn seg_path(dir: &Path, index: u64, open: bool) -> PathBuf {
    dir.join(segment_file_name(index, open))
}

/// The process is alive in our pid namespace: `<proc_root>/<pid>` exists for a numeric pid.
/// A non-numeric process directory name never counts as alive.
pub(crate) fn pid_alive(proc_root: &Path, pid: &str) -> bool {
    !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && proc_root.join(pid).exists()
}

/// An attached ring and what the cursor knows about it.
pub(crate) struct Ring {
    pub reader: RingReader,
    /// Inode of the file when attached (a new ring at the same path has another).
    pub ino: u64,
    pub created_real_ns: u64,
    /// The `proc_start` at seq 0, when the ring still held it at attach time.
    pub key: Option<EpochKey>,
    /// Whether this ring's seq space is the cursor's current epoch, decided for `matched_for`.
    pub matched: Option<bool>,
    pub matched_for: Option<EpochKey>,
    pub last_pushed: u64,
    pub last_change: std::time::Instant,
}

impl Ring {
    /// Attach read-only. `Ok(None)`: the file is gone or not initialised yet (retry later).
    pub fn attach(path: &Path, now: std::time::Instant) -> Result<Option<Ring>, String> {
        let ino = match std::fs::metadata(path) {
            Ok(m) => m.ino(),
            Err(_) => return Ok(None),
        };
        let reader = match open_ring(path) {
            Ok(r) => r,
            Err(comminsight_wire::ring::RingError::NotReady { .. }) => return Ok(None),
            Err(comminsight_wire::ring::RingError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e.to_string()),
        };
        let key = if reader.position() == 0 {
            let mut peek = open_ring(path).map_err(|e| e.to_string())?;
            let mut first = Vec::new();
            peek.read_into(&mut first, 1);
            first
                .first()
                .filter(|r| r.seq() == 0 && r.kind_byte() == Kind::ProcStart as u8)
                .and_then(epoch_key)
        } else {
            None
        };
        let h = reader.header();
        Ok(Some(Ring {
            ino,
            created_real_ns: h.created_real_ns,
            key,
            matched: None,
            matched_for: None,
            last_pushed: h.pushed,
            last_change: now,
            reader,
        }))
    }
}

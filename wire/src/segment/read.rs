//! Reading segments: locate them under any directory and decode them, reporting corruption
//! instead of failing on it.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::record::{Body, DecodeError, RawRecord, Record, SegmentHeader, RECORD_SIZE};

/// Why segments could not be listed or read. Each message names the path and what to do.
#[derive(Debug)]
pub enum SegmentError {
    /// The path does not exist.
    Missing { path: PathBuf },
    /// A file given directly is not named like a segment.
    NotASegment { path: PathBuf },
    /// A safety check refused the file (a symbolic link, a FIFO, a foreign owner, too big).
    Refused { path: PathBuf, reason: String },
    /// Reading a file or listing a directory failed.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for SegmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SegmentError::Missing { path } => write!(
                f,
                "{}: no such file or directory; give a segment file, a process directory or any directory above one",
                path.display()
            ),
            SegmentError::NotASegment { path } => write!(
                f,
                "{}: not a segment file (expected seg-NNNNNN.cis or seg-NNNNNN.cis.open); give a segment or a directory",
                path.display()
            ),
            SegmentError::Refused { path, reason } => write!(
                f,
                "{}: refused ({reason}); segments are regular files owned by the owner of their directory",
                path.display()
            ),
            SegmentError::Io { path, source } => write!(
                f,
                "{}: {source}; check that it exists and is readable",
                path.display()
            ),
        }
    }
}

impl std::error::Error for SegmentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SegmentError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The largest segment file a reader loads: 4 GiB (the plugin's `COMMINSIGHT_SEGMENT_BYTES`
/// default is 64 MiB).
pub const MAX_SEGMENT_FILE_BYTES: u64 = 4 << 30;

/// One segment file, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentRead {
    /// Every decodable record, in file order (the `segment` record and repeats included).
    pub records: Vec<Record>,
    /// Undecodable records: (index of the record in the file, why), skipped.
    pub bad: Vec<(u64, DecodeError)>,
    /// Trailing bytes that do not make a whole record (a writer killed mid-write); ignored.
    pub torn_tail_bytes: u64,
    /// The file still has its `.open` name (being written, or its writer died).
    pub open: bool,
}

impl SegmentRead {
    /// The `segment` record, when the file starts with one.
    pub fn header(&self) -> Option<&SegmentHeader> {
        match self.records.first().map(|r| &r.body) {
            Some(Body::Segment(h)) => Some(h),
            _ => None,
        }
    }
}

/// Decode a segment file. Only I/O fails; corrupt records and a torn tail are reported.
pub fn read_segment(path: &Path) -> Result<SegmentRead, SegmentError> {
    let io_err = |source: std::io::Error| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = crate::fsafe::open_untrusted(path).map_err(|e| match e {
        e if e.is_not_found() => SegmentError::Missing {
            path: path.to_path_buf(),
        },
        crate::fsafe::OpenError::Refused { path, reason } => SegmentError::Refused { path, reason },
        crate::fsafe::OpenError::Io { path, source } => SegmentError::Io { path, source },
    })?;
    let len = file.metadata().map_err(io_err)?.len();
    if len > MAX_SEGMENT_FILE_BYTES {
        return Err(SegmentError::Refused {
            path: path.to_path_buf(),
            reason: format!(
                "{len} bytes, more than the {MAX_SEGMENT_FILE_BYTES} a segment may have (COMMINSIGHT_SEGMENT_BYTES is capped there)"
            ),
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    (&mut file)
        .take(MAX_SEGMENT_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    let mut out = decode_segment_bytes(&bytes);
    out.open = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_segment_name)
        .is_some_and(|(_, open)| open);
    Ok(out)
}

/// Decode the bytes of a segment (pure; see [`read_segment`]).
pub fn decode_segment_bytes(bytes: &[u8]) -> SegmentRead {
    let chunks = bytes.chunks_exact(RECORD_SIZE);
    let torn_tail_bytes = chunks.remainder().len() as u64;
    let mut out = SegmentRead {
        torn_tail_bytes,
        ..Default::default()
    };
    for (i, c) in chunks.enumerate() {
        let raw = RawRecord(c.try_into().expect("record-sized chunk"));
        match Record::decode(&raw) {
            Ok(r) => out.records.push(r),
            Err(e) => out.bad.push((i as u64, e)),
        }
    }
    out
}

/// `seg-<digits>.cis` -> (index, false); `seg-<digits>.cis.open` -> (index, true).
pub fn parse_segment_name(name: &str) -> Option<(u64, bool)> {
    let rest = name.strip_prefix("seg-")?;
    let (digits, open) = match rest.strip_suffix(".cis.open") {
        Some(d) => (d, true),
        None => (rest.strip_suffix(".cis")?, false),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, open))
}

/// Segment files under `root` (a segment file, a process directory or any directory above),
/// sorted by (directory, index). Symbolic links to directories are not followed.
pub fn find_segments(root: &Path) -> Result<Vec<PathBuf>, SegmentError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SegmentError::Io { path, source }
    };
    let meta = std::fs::metadata(root).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            SegmentError::Missing {
                path: root.to_path_buf(),
            }
        } else {
            SegmentError::Io {
                path: root.to_path_buf(),
                source,
            }
        }
    })?;
    if !meta.is_dir() {
        let named = root
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_segment_name)
            .is_some();
        return if named {
            Ok(vec![root.to_path_buf()])
        } else {
            Err(SegmentError::NotASegment {
                path: root.to_path_buf(),
            })
        };
    }
    let mut found: Vec<(PathBuf, u64, PathBuf)> = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let e = e.map_err(io(&dir))?;
            let ft = e.file_type().map_err(io(&e.path()))?;
            if ft.is_dir() {
                dirs.push(e.path());
            } else if let Some((idx, _)) = e.file_name().to_str().and_then(parse_segment_name) {
                found.push((dir.clone(), idx, e.path()));
            }
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, _, p)| p).collect())
}

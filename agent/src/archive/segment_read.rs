//! Reading a segment for the archive: opened as every reader of job users' files does, then
//! streamed a chunk at a time (a first pass for the comm names, the hour and the header, a
//! second that compresses and decodes), so archiving holds a chunk and one Parquet row group,
//! never a whole segment (a default 64 MiB segment held ~400 MiB decoded: issue 23's soak).

use std::path::Path;

use comminsight_wire::fsafe;
use comminsight_wire::record::{Body, RawRecord, Record, RECORD_SIZE};

use super::{io_err, parquet_file, ArchiveError};
use crate::sources::SEGMENT_DEPTH;

/// A segment file opened as every reader of job users' files does ([`comminsight_wire::fsafe`]:
/// `<job>/<host>/<pid>/seg-*` never through a symbolic link, a regular file owned by its
/// directory's owner, at most a segment's maximum size), and its length.
pub(super) fn open_segment_file(path: &Path) -> Result<(std::fs::File, u64), ArchiveError> {
    let max = comminsight_wire::segment::MAX_SEGMENT_FILE_BYTES;
    let f = fsafe::open_below(path, SEGMENT_DEPTH, fsafe::Owner::OfDir).map_err(|e| match e {
        fsafe::OpenError::Io { path, source } => ArchiveError::Io { path, source },
        fsafe::OpenError::Refused { path, reason } => ArchiveError::Refused { path, reason },
    })?;
    let len = f.metadata().map_err(io_err(path))?.len();
    if len > max {
        return Err(ArchiveError::Refused {
            path: path.to_path_buf(),
            reason: format!("{len} bytes, more than a segment may have ({max})"),
        });
    }
    Ok((f, len))
}

/// Records read from a segment file at a time (2 MiB): the archive streams a segment, it never
/// holds it whole.
const CHUNK_RECORDS: usize = 16_384;

/// Call `each` with the whole records of the first `whole` bytes of `file`, a chunk at a time,
/// then with `recovered`'s bytes. The file is read from its start (positioned reads).
pub(super) fn for_each_chunk(
    file: &std::fs::File,
    whole: u64,
    recovered: &[RawRecord],
    path: &Path,
    mut each: impl FnMut(&[u8]) -> Result<(), ArchiveError>,
) -> Result<(), ArchiveError> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; CHUNK_RECORDS * RECORD_SIZE];
    let mut at = 0u64;
    while at < whole {
        let n = (whole - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(io_err(path))?;
        each(&buf[..n])?;
        at += n as u64;
    }
    for r in recovered {
        each(&r.0)?;
    }
    Ok(())
}

/// What the first pass over a segment learns before anything is written.
#[derive(Default)]
pub(super) struct SegmentScan {
    /// The segment's `comm_init` records (they name the rows of their communicators).
    pub comm_inits: Vec<Record>,
    /// The first record time (the header's creation time): the hour partition.
    pub first_time_ns: u64,
    /// The header's index and pid.
    pub header: Option<(u64, u32)>,
}

/// The first pass: only `comm_init` records and the first ones up to a timed record are
/// decoded.
pub(super) fn scan_segment(
    file: &std::fs::File,
    whole: u64,
    recovered: &[RawRecord],
    path: &Path,
) -> Result<SegmentScan, ArchiveError> {
    let mut scan = SegmentScan::default();
    let mut first = true;
    for_each_chunk(file, whole, recovered, path, |bytes| {
        for c in bytes.chunks_exact(RECORD_SIZE) {
            let raw = RawRecord(c.try_into().expect("record-sized chunk"));
            let is_init = raw.kind_byte() == comminsight_wire::record::Kind::CommInit as u8;
            if !is_init && scan.first_time_ns != 0 {
                first = false;
                continue;
            }
            let Ok(rec) = Record::decode(&raw) else {
                continue;
            };
            if let (true, Body::Segment(h)) = (first, &rec.body) {
                scan.header = Some((h.segment_index, h.pid));
            }
            first = false;
            if scan.first_time_ns == 0 {
                scan.first_time_ns = parquet_file::record_time(&rec);
            }
            if is_init {
                scan.comm_inits.push(rec);
            }
        }
        Ok(())
    })?;
    Ok(scan)
}

/// The raw archive's zstd stream at `level`, with a frame checksum: a flipped bit in the archive
/// fails decoding instead of decoding to wrong records.
pub(super) fn raw_encoder<'a>(
    w: &'a mut std::io::BufWriter<std::fs::File>,
    path: &Path,
    level: i32,
) -> Result<zstd::Encoder<'static, &'a mut std::io::BufWriter<std::fs::File>>, ArchiveError> {
    let mut enc = zstd::Encoder::new(w, level).map_err(io_err(path))?;
    enc.include_checksum(true).map_err(io_err(path))?;
    Ok(enc)
}

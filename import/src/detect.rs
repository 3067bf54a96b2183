//! Which importer reads a file: from its first bytes, never from its name alone.

use std::io::Read;
use std::path::Path;

use crate::ImportError;

/// Bytes read to tell the formats apart.
const SNIFF_BYTES: usize = 64 << 10;

/// A format `import` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// PyTorch NCCL Flight Recorder dumps (pickle or JSON).
    FlightRecorder,
    /// Kineto / Chrome JSON traces (plain or gzip).
    Kineto,
    /// NCCL Inspector JSON lines.
    NcclInspector,
}

impl Format {
    pub const ALL: [Format; 3] = [
        Format::FlightRecorder,
        Format::Kineto,
        Format::NcclInspector,
    ];

    /// The command-line name (`flight-recorder`, `kineto`, `nccl-inspector`).
    pub fn name(self) -> &'static str {
        match self {
            Format::FlightRecorder => "flight-recorder",
            Format::Kineto => "kineto",
            Format::NcclInspector => "nccl-inspector",
        }
    }

    /// The `SOURCE_*` its segments carry.
    pub fn source(self) -> u8 {
        use comminsight_wire::segment::{
            SOURCE_FLIGHT_RECORDER, SOURCE_KINETO, SOURCE_NCCL_INSPECTOR,
        };
        match self {
            Format::FlightRecorder => SOURCE_FLIGHT_RECORDER,
            Format::Kineto => SOURCE_KINETO,
            Format::NcclInspector => SOURCE_NCCL_INSPECTOR,
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown import format {s:?}: use flight-recorder, kineto or nccl-inspector"
                )
            })
    }
}

/// The format of the first bytes of a file (already decompressed), if they say.
pub fn sniff(head: &[u8]) -> Option<Format> {
    // Pickle protocol 2+ opens with PROTO (0x80) and the protocol number.
    if head.len() >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1]) {
        return Some(Format::FlightRecorder);
    }
    let text = String::from_utf8_lossy(head);
    let t = text.trim_start();
    if !t.starts_with('{') {
        return None;
    }
    let first_line = t.lines().next().unwrap_or("");
    if first_line.contains("\"header\"")
        && (first_line.contains("\"coll_perf\"") || first_line.contains("\"p2p_perf\""))
    {
        return Some(Format::NcclInspector);
    }
    if t.contains("\"traceEvents\"") || t.contains("\"schemaVersion\"") {
        return Some(Format::Kineto);
    }
    // json.dump writes `entries` last: a large `pg_config` / `pg_status` may fill the sniffed
    // head, so either of those keys is enough.
    if t.contains("\"pg_config\"")
        || t.contains("\"pg_status\"")
        || (t.contains("\"entries\"") && t.contains("\"version\""))
    {
        return Some(Format::FlightRecorder);
    }
    None
}

/// The first (decompressed) bytes of `path`.
pub fn head(path: &Path) -> Result<Vec<u8>, ImportError> {
    let f = std::fs::File::open(path).map_err(|e| ImportError::io(path, e))?;
    let mut raw = Vec::new();
    f.take(SNIFF_BYTES as u64)
        .read_to_end(&mut raw)
        .map_err(|e| ImportError::io(path, e))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        let f = std::fs::File::open(path).map_err(|e| ImportError::io(path, e))?;
        // A short read of a truncated gzip still gives its first bytes.
        let _ = flate2::read::MultiGzDecoder::new(f)
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut out);
        return Ok(out);
    }
    Ok(raw)
}

/// The regular files directly in `dir`, sorted by name (an importer's directory input).
pub fn files_in(dir: &Path) -> Result<Vec<std::path::PathBuf>, ImportError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| ImportError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// The format of `path`: a file by its content; a directory by the first file in it that says.
pub fn detect(path: &Path) -> Result<Format, ImportError> {
    if path.is_dir() {
        for p in files_in(path)? {
            if let Some(f) = sniff(&head(&p)?) {
                return Ok(f);
            }
        }
        return Err(ImportError::format(
            path,
            "no file in this directory is a Flight Recorder dump, a Kineto trace or NCCL Inspector JSON lines; name the format (import flight-recorder|kineto|nccl-inspector) or give the files",
        ));
    }
    sniff(&head(path)?).ok_or_else(|| {
        ImportError::format(
            path,
            "not a Flight Recorder dump (pickle or JSON), a Kineto trace (JSON, gzip) or NCCL Inspector JSON lines; name the format (import flight-recorder|kineto|nccl-inspector) to see why it is refused",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_each_format() {
        assert_eq!(sniff(b"\x80\x04\x95"), Some(Format::FlightRecorder));
        assert_eq!(
            sniff(br#"{"version": "2.9", "pg_config": {}, "entries": []}"#),
            Some(Format::FlightRecorder)
        );
        assert_eq!(
            sniff(b"{\"schemaVersion\": 1, \"traceEvents\": ["),
            Some(Format::Kineto)
        );
        assert_eq!(
            sniff(b"{\"header\":{\"id\":\"0x1\"},\"metadata\":{},\"coll_perf\":{}}\n{"),
            Some(Format::NcclInspector)
        );
        assert_eq!(sniff(b"hello"), None);
        assert_eq!(sniff(b"\x80\x09"), None);
    }
}

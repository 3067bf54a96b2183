//! What an import could not read: the error that stops a file, and the count of what was skipped.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Why an input file (or the output) could not be imported. Every message names the file, says
/// what is wrong and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not what the importer reads, or is corrupt beyond the first valid part.
    #[error("{path}: {what}")]
    Format { path: PathBuf, what: String },
    /// A format version this build does not read.
    #[error("{path}: {what} version {version} is not supported (this build reads {supported}); convert it with a matching tool or file an issue with a sample")]
    Version {
        path: PathBuf,
        what: &'static str,
        version: String,
        supported: &'static str,
    },
    /// Writing the output failed.
    #[error("{path}: cannot write the imported records: {what}")]
    Output { path: PathBuf, what: String },
}

impl ImportError {
    pub fn format(path: impl Into<PathBuf>, what: impl Into<String>) -> ImportError {
        ImportError::Format {
            path: path.into(),
            what: what.into(),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ImportError {
        ImportError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Input an importer skipped, counted by reason (a short phrase, e.g. `"kernel with no known
/// collective"`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Skips(pub BTreeMap<String, u64>);

impl Skips {
    pub fn add(&mut self, reason: &str, n: u64) {
        if n > 0 {
            *self.0.entry(reason.to_string()).or_default() += n;
        }
    }

    pub fn merge(&mut self, other: &Skips) {
        for (k, v) in &other.0 {
            self.add(k, *v);
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// `"3 kernel with no known collective, 1 line not JSON"`, or `None` when nothing was skipped.
    pub fn describe(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        Some(
            self.0
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

/// What an import wrote and skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ImportSummary {
    /// Input files read.
    pub files: u64,
    /// Process streams written.
    pub streams: u64,
    /// Records written, `proc_start` and `comm_init` included.
    pub records: u64,
    /// Operations (`coll` / `p2p` records) among them.
    pub ops: u64,
    pub skipped: Skips,
}

impl ImportSummary {
    pub fn merge(&mut self, o: &ImportSummary) {
        self.files += o.files;
        self.streams += o.streams;
        self.records += o.records;
        self.ops += o.ops;
        self.skipped.merge(&o.skipped);
    }
}

//! What a configuration that cannot be used is ([`ConfigError`]), and where each value came
//! from ([`Origins`]), for the one-line messages of loading and validation.

use std::collections::HashMap;
use std::path::PathBuf;

/// The documented default location of the agent's configuration file.
pub const DEFAULT_PATH: &str = "/etc/comminsight/agent.toml";

/// Where to look for the key documentation, named in error messages.
pub(crate) const SEE: &str = "see agent/config.example.toml";

/// A configuration that cannot be used. Each message is one line naming the file or variable, the
/// key and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{}: cannot read the config file: {source}; fix the path (--config or COMMINSIGHT_CONFIG), or give neither to use {DEFAULT_PATH} (all defaults when absent)", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not one the agent may trust (type, size, owner, mode).
    #[error("{}: {why}", path.display())]
    Refused {
        /// The file.
        path: PathBuf,
        /// What is wrong, and the fix.
        why: String,
    },
    /// The file is not valid TOML.
    #[error("{}:{line}:{column}: invalid TOML: {message}; {SEE}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message (one line).
        message: String,
    },
    /// A key (or variable) the agent does not know.
    #[error("{origin}: unknown key `{key}`{hint}; {SEE}")]
    UnknownKey {
        /// The file.
        origin: String,
        /// The dotted key.
        key: String,
        /// ` (did you mean `x`?)` or empty.
        hint: String,
    },
    /// A value of the wrong type or out of range.
    #[error("{origin}: {message}")]
    BadValue {
        /// `FILE: `key` = value` or `VAR=value`.
        origin: String,
        /// The dotted key.
        key: String,
        /// What is expected, and the fix.
        message: String,
    },
}

impl ConfigError {
    /// The dotted key the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. } | ConfigError::BadValue { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Where a key's value came from (for error messages).
#[derive(Clone, Debug)]
pub(crate) enum Origin {
    Default,
    File(PathBuf),
    Env { var: String, raw: String },
}

/// The origin of each key that was set, for validation messages.
pub(crate) struct Origins {
    pub(crate) map: HashMap<&'static str, Origin>,
    pub(crate) file: Option<PathBuf>,
}

impl Origins {
    /// `FILE: `key` = value` / `VAR=raw` / `default `key` = value`.
    pub(crate) fn describe(&self, key: &str, value: &dyn std::fmt::Display) -> String {
        match self.map.get(key).unwrap_or(&Origin::Default) {
            Origin::Default => match &self.file {
                Some(f) => format!("{}: `{key}` = {value} (the default)", f.display()),
                None => format!("defaults: `{key}` = {value}"),
            },
            Origin::File(p) => format!("{}: `{key}` = {value}", p.display()),
            Origin::Env { var, raw } => format!("{var}={raw} (`{key}`)"),
        }
    }
}

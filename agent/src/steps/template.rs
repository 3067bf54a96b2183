//! Step templates: the format of `templates/*.toml` (documented in `templates/README.md`),
//! validation on load, and selection by a job's features (DESIGN.md §5.2).
//!
//! A template describes one framework's training (or decode) step by three strictly contiguous op
//! sequences of one rank: **Open** (how a step begins), **Anchor** (a cross-rank identity inside the
//! step) and **Close** (how it ends), each a list of alternatives; optional phase rules label the
//! time inside a step ([`super::phase`]). The shipped files are embedded
//! ([`TemplateSet::builtin`]); a directory of files can replace them ([`TemplateSet::load_dir`]).
//!
//! ```
//! use comminsight_agent::steps::template::{Features, TemplateSet};
//! let set = TemplateSet::builtin();
//! let f = Features::of(["global", "dp", "tp", "pp", "global.AllReduce", "dp.AllReduce"]);
//! assert_eq!(set.select(&f).unwrap().name, "megatron-1f1b");
//! ```

mod parse;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

pub use super::matcher::{OpMatch, Seq, SizeClass};

/// The template files shipped in `templates/`, embedded at build time (file name, text).
pub const BUILTIN_FILES: &[(&str, &str)] = &[
    (
        "megatron.toml",
        include_str!("../../../templates/megatron.toml"),
    ),
    ("fsdp.toml", include_str!("../../../templates/fsdp.toml")),
    ("ddp.toml", include_str!("../../../templates/ddp.toml")),
    (
        "decode.toml",
        include_str!("../../../templates/decode.toml"),
    ),
    ("world.toml", include_str!("../../../templates/world.toml")),
];

/// The only template file format version.
pub const FORMAT_VERSION: u32 = 1;

/// One template.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// Unique over every loaded file.
    pub name: String,
    /// This template's version (>= 1), recorded with every result.
    pub version: u32,
    /// Unique over every loaded template; the highest satisfied one wins.
    pub priority: i64,
    /// One line for humans (`steps` output, reports).
    pub description: String,
    /// Features that must all hold (canonical spelling: `dp`, `dp.AllReduce`, `ep.AlltoAll`).
    pub requires: Vec<String>,
    /// Features none of which may hold.
    pub forbids: Vec<String>,
    /// Alternatives: how a step begins.
    pub open: Vec<Seq>,
    /// Alternatives: the cross-rank identity inside a step.
    pub anchor: Vec<Seq>,
    /// Alternatives: how a step ends.
    pub close: Vec<Seq>,
    /// `[[template.phase]]` rules: phase labels inside a step (empty: none).
    pub phases: Vec<super::phase::PhaseRule>,
    /// The file it came from (file name only).
    pub file: String,
    /// That file's `format`.
    pub file_version: u32,
    /// Line of the template's `name` key in its file (0 when built in code).
    pub line: usize,
}

impl Template {
    /// Whether every `requires` feature holds and no `forbids` one does.
    pub fn satisfied_by(&self, f: &Features) -> bool {
        self.requires.iter().all(|x| f.0.contains(x))
            && !self.forbids.iter().any(|x| f.0.contains(x))
    }
}

/// Features of a job (`dp`, `dp.AllReduce`, ...): see [`Features::of_job`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features(pub BTreeSet<String>);

impl Features {
    /// A job's features: each role with a communicator of at least two ranks (`tp`; a 1-rank
    /// group moves nothing and frameworks create them for unused dimensions), and `<role>.<Func>`
    /// for each function seen on a communicator of that role and at least two ranks
    /// (`dp.ReduceScatter`, `pp.Send`).
    pub fn of_job(roles: &crate::roles::JobRoles, obs: &crate::roles::JobObs) -> Features {
        let mut s = BTreeSet::new();
        let mut role_of: BTreeMap<u64, Role> = BTreeMap::new();
        for c in roles.comms.iter().filter(|c| c.nranks >= 2) {
            if let Some(r) = c.role {
                role_of.insert(c.hash, r);
                s.insert(r.as_str().to_string());
            }
        }
        for (hash, mix) in &obs.ops {
            let Some(r) = role_of.get(hash) else { continue };
            for (&code, &(n, _)) in &mix.funcs {
                if n > 0 && code != 0 && usize::from(code) < Func::NAMES.len() {
                    s.insert(format!("{}.{}", r.as_str(), Func(code).name()));
                }
            }
        }
        Features(s)
    }

    /// Features from names (tests, tools).
    pub fn of<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Features {
        Features(names.into_iter().map(Into::into).collect())
    }
}

/// Why a template file (or set) was rejected; each message is one line naming the file and line.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// TOML syntax, a wrong type, an unknown or a missing key.
    #[error("{file}:{line}: {msg}; fix the TOML (keys and types: templates/README.md)")]
    Syntax {
        file: String,
        line: usize,
        msg: String,
    },
    /// `format` is missing or not 1.
    #[error(
        "{file}:{line}: `format` is {found}, expected `format = 1` (the only template file format)"
    )]
    Format {
        file: String,
        line: usize,
        found: String,
    },
    /// A key that must be present is not.
    #[error("{file}:{line}: template `{template}` has no `{key}`; add it (templates/README.md)")]
    Missing {
        file: String,
        line: usize,
        template: String,
        key: &'static str,
    },
    /// A value outside its vocabulary or range.
    #[error("{file}:{line}: bad `{key}` value `{value}`; use {expected}")]
    BadValue {
        file: String,
        line: usize,
        key: &'static str,
        value: String,
        expected: String,
    },
    /// An empty alternative list or an empty sequence.
    #[error("{file}:{line}: `{key}` has an empty {what}; give at least one {need}")]
    Empty {
        file: String,
        line: usize,
        key: &'static str,
        what: &'static str,
        need: &'static str,
    },
    /// A matcher with neither `role` nor `func`.
    #[error("{file}:{line}: a matcher in `{key}` has neither `role` nor `func`; give at least one of them")]
    EmptyMatcher {
        file: String,
        line: usize,
        key: &'static str,
    },
    /// A file without any `[[template]]`.
    #[error("{file}:1: the file declares no `[[template]]`; add one or remove the file")]
    NoTemplate { file: String },
    /// Two templates with one name.
    #[error("{file}:{line}: duplicate template name `{name}` (also {other_file}:{other_line}); rename one")]
    DuplicateName {
        file: String,
        line: usize,
        name: String,
        other_file: String,
        other_line: usize,
    },
    /// Two templates with one priority.
    #[error("{file}:{line}: template `{name}` has priority {priority}, as has `{other_name}` ({other_file}:{other_line}); priorities must be unique, change one")]
    DuplicatePriority {
        file: String,
        line: usize,
        name: String,
        priority: i64,
        other_name: String,
        other_file: String,
        other_line: usize,
    },
    /// A template directory or file that cannot be read.
    #[error("{file}:0: cannot read: {msg}; check the path given for the templates")]
    Io { file: String, msg: String },
    /// A template directory without `*.toml` files.
    #[error("{file}:0: no `*.toml` template file in this directory; point at the folder holding the templates")]
    EmptyDir { file: String },
}

impl TemplateError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        match self {
            TemplateError::Syntax { file, .. }
            | TemplateError::Format { file, .. }
            | TemplateError::Missing { file, .. }
            | TemplateError::BadValue { file, .. }
            | TemplateError::Empty { file, .. }
            | TemplateError::EmptyMatcher { file, .. }
            | TemplateError::NoTemplate { file }
            | TemplateError::DuplicateName { file, .. }
            | TemplateError::DuplicatePriority { file, .. }
            | TemplateError::Io { file, .. }
            | TemplateError::EmptyDir { file } => file,
        }
    }

    /// The 1-based line the error is about (0: the whole file or directory).
    pub fn line(&self) -> usize {
        match self {
            TemplateError::Syntax { line, .. }
            | TemplateError::Format { line, .. }
            | TemplateError::Missing { line, .. }
            | TemplateError::BadValue { line, .. }
            | TemplateError::Empty { line, .. }
            | TemplateError::EmptyMatcher { line, .. }
            | TemplateError::DuplicateName { line, .. }
            | TemplateError::DuplicatePriority { line, .. } => *line,
            TemplateError::NoTemplate { .. } => 1,
            TemplateError::Io { .. } | TemplateError::EmptyDir { .. } => 0,
        }
    }
}

/// Loaded templates, highest priority first.
#[derive(Clone, Debug, Default)]
pub struct TemplateSet {
    /// Sorted by `priority`, highest first.
    pub templates: Vec<Template>,
}

impl TemplateSet {
    /// The shipped files ([`BUILTIN_FILES`]), embedded at build time.
    ///
    /// # Panics
    /// Never for the shipped files (a unit test parses them); a broken file fails every test.
    pub fn builtin() -> TemplateSet {
        let mut all = Vec::new();
        for (file, text) in BUILTIN_FILES {
            all.extend(
                Self::parse(file, text).unwrap_or_else(|e| panic!("built-in template: {e}")),
            );
        }
        Self::from_templates(all).unwrap_or_else(|e| panic!("built-in templates: {e}"))
    }

    /// Parse and validate one file's text; `file` names it in errors and in [`Template::file`].
    /// Names and priorities are checked for uniqueness inside the file (across files:
    /// [`TemplateSet::from_templates`]).
    pub fn parse(file: &str, text: &str) -> Result<Vec<Template>, TemplateError> {
        let v = parse::parse_file(file, text)?;
        check_unique(&v)?;
        Ok(v)
    }

    /// Every `*.toml` file of `dir` (in file-name order), validated, then checked as one set.
    pub fn load_dir(dir: &Path) -> Result<TemplateSet, TemplateError> {
        let io = |e: std::io::Error| TemplateError::Io {
            file: dir.display().to_string(),
            msg: e.to_string(),
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?
            .into_iter()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(TemplateError::EmptyDir {
                file: dir.display().to_string(),
            });
        }
        let mut all = Vec::new();
        for p in &files {
            let text = std::fs::read_to_string(p).map_err(|e| TemplateError::Io {
                file: p.display().to_string(),
                msg: e.to_string(),
            })?;
            let name = p
                .file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into());
            all.extend(Self::parse(&name, &text)?);
        }
        Self::from_templates(all)
    }

    /// A set from templates: names and priorities must be unique; sorted highest priority first.
    pub fn from_templates(mut v: Vec<Template>) -> Result<TemplateSet, TemplateError> {
        check_unique(&v)?;
        v.sort_by_key(|t| std::cmp::Reverse(t.priority));
        Ok(TemplateSet { templates: v })
    }

    /// The highest-priority template whose requires hold and forbids do not.
    pub fn select(&self, f: &Features) -> Option<&Template> {
        self.templates.iter().find(|t| t.satisfied_by(f))
    }

    /// The template called `name`.
    pub fn get(&self, name: &str) -> Option<&Template> {
        self.templates.iter().find(|t| t.name == name)
    }
}

/// Duplicate names, then duplicate priorities; the later template (in `v`'s order) is reported.
fn check_unique(v: &[Template]) -> Result<(), TemplateError> {
    let mut names: BTreeMap<&str, &Template> = BTreeMap::new();
    let mut prios: BTreeMap<i64, &Template> = BTreeMap::new();
    for t in v {
        if let Some(o) = names.insert(&t.name, t) {
            return Err(TemplateError::DuplicateName {
                file: t.file.clone(),
                line: t.line,
                name: t.name.clone(),
                other_file: o.file.clone(),
                other_line: o.line,
            });
        }
        if let Some(o) = prios.insert(t.priority, t) {
            return Err(TemplateError::DuplicatePriority {
                file: t.file.clone(),
                line: t.line,
                name: t.name.clone(),
                priority: t.priority,
                other_name: o.name.clone(),
                other_file: o.file.clone(),
                other_line: o.line,
            });
        }
    }
    Ok(())
}

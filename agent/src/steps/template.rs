//! Step templates: the format of `templates/*.toml`, validation and selection (stub: the
//! templates engineer replaces this file; the types are the contract of interfaces5.md).

use std::collections::BTreeSet;

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::StepOp;

/// Message size classes of matchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeClass {
    /// <= 1 KiB
    Tiny,
    /// <= 64 KiB
    Small,
    /// <= 4 MiB
    Medium,
    /// larger
    Large,
}

impl SizeClass {
    /// The class of `bytes`.
    pub fn of(bytes: u64) -> SizeClass {
        match bytes {
            0..=1024 => SizeClass::Tiny,
            1025..=65_536 => SizeClass::Small,
            65_537..=4_194_304 => SizeClass::Medium,
            _ => SizeClass::Large,
        }
    }
}

/// One op matcher: `None` = any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpMatch {
    pub role: Option<Role>,
    pub func: Option<Func>,
    pub size: Option<SizeClass>,
}

impl OpMatch {
    /// Whether `op` matches.
    pub fn matches(&self, op: &StepOp) -> bool {
        self.role.is_none_or(|r| op.role == Some(r))
            && self.func.is_none_or(|f| op.func == f)
            && self.size.is_none_or(|s| SizeClass::of(op.bytes) == s)
    }
}

/// A strictly contiguous op sequence.
pub type Seq = Vec<OpMatch>;

/// One template.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub name: String,
    pub version: u32,
    pub priority: i64,
    pub description: String,
    pub requires: Vec<String>,
    pub forbids: Vec<String>,
    pub open: Vec<Seq>,
    pub anchor: Vec<Seq>,
    pub close: Vec<Seq>,
    pub file: String,
    pub file_version: u32,
}

/// Features of a job (`dp`, `dp.AllReduce`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features(pub BTreeSet<String>);

/// Loaded templates, highest priority first.
#[derive(Clone, Debug, Default)]
pub struct TemplateSet {
    pub templates: Vec<Template>,
}

impl TemplateSet {
    /// The highest-priority template whose requires hold and forbids do not.
    pub fn select(&self, f: &Features) -> Option<&Template> {
        self.templates.iter().find(|t| {
            t.requires.iter().all(|x| f.0.contains(x)) && !t.forbids.iter().any(|x| f.0.contains(x))
        })
    }
}

//! Op matchers, shared by the templates' boundary sequences and the phase rules: an op's role,
//! function and size class, and the strictly contiguous sequences of them.

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::StepOp;

/// Message size classes of matchers (by the op's `bytes`).
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
    /// Every class, smallest first.
    pub const ALL: [SizeClass; 4] = [
        SizeClass::Tiny,
        SizeClass::Small,
        SizeClass::Medium,
        SizeClass::Large,
    ];

    /// The class of `bytes`.
    pub fn of(bytes: u64) -> SizeClass {
        match bytes {
            0..=1024 => SizeClass::Tiny,
            1025..=65_536 => SizeClass::Small,
            65_537..=4_194_304 => SizeClass::Medium,
            _ => SizeClass::Large,
        }
    }

    /// The name used in template files (`tiny`, `small`, `medium`, `large`).
    pub const fn as_str(self) -> &'static str {
        match self {
            SizeClass::Tiny => "tiny",
            SizeClass::Small => "small",
            SizeClass::Medium => "medium",
            SizeClass::Large => "large",
        }
    }
}

/// One op matcher: `None` = any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpMatch {
    /// The communicator's role (an op whose role is unknown matches only `None`).
    pub role: Option<Role>,
    /// The NCCL function.
    pub func: Option<Func>,
    /// The op's size class.
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

impl std::fmt::Display for OpMatch {
    /// `role:func:size`, `*` for any (`dp:AllReduce:*`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.role.map_or("*", Role::as_str),
            self.func.map_or("*", Func::name),
            self.size.map_or("*", SizeClass::as_str)
        )
    }
}

/// A strictly contiguous op sequence (never empty in a loaded template).
pub type Seq = Vec<OpMatch>;

//! Communicator roles and the names that carry them.
//!
//! A role is the parallel dimension a communicator serves: [`Role::Dp`], [`Role::Tp`],
//! [`Role::Pp`], [`Role::Ep`], [`Role::Cp`], or [`Role::Global`] (the world). CommInsight's own
//! naming (the LD_PRELOAD shim, the test bed) writes `commName` as `"<role>:<rest>"`, e.g.
//! `tp:TENSOR_MODEL_PARALLEL_GROUP:3` or `tp:pp1_dp0`. Frameworks that name communicators
//! themselves use their group descriptions instead (PyTorch: `"<group_desc>:<group_name>"`, e.g.
//! `TENSOR_MODEL_PARALLEL_GROUP:3`; DeviceMesh: `mesh_tp`; vLLM: `tp`); [`role_from_hint`] maps
//! those descriptions to roles.
//!
//! The shim (which runs inside training processes) and the agent share this table so a name means
//! the same to both.
//!
//! ```
//! use comminsight_wire::roles::{parse_comm_name, role_from_hint, Role};
//! assert_eq!(role_from_hint("TENSOR_MODEL_PARALLEL_GROUP"), Some(Role::Tp));
//! assert_eq!(role_from_hint("mesh_dp_shard"), Some(Role::Dp));
//! assert_eq!(role_from_hint("TENSOR_AND_DATA_PARALLEL_GROUP"), None); // two roles: no single one
//! assert_eq!(parse_comm_name("ep:EXPERT_MODEL_PARALLEL_GROUP:7"), Some(Role::Ep));
//! assert_eq!(parse_comm_name("PIPELINE_MODEL_PARALLEL_GROUP:12"), Some(Role::Pp));
//! assert_eq!(parse_comm_name("undefined:5"), None);
//! ```

use core::fmt;
use core::str::FromStr;

/// The parallel dimension a communicator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Every rank of the job (the default process group).
    Global,
    /// Data parallel (gradient all-reduce, or reduce-scatter + all-gather with ZeRO / FSDP).
    Dp,
    /// Tensor parallel.
    Tp,
    /// Pipeline parallel (send / recv between neighbour stages).
    Pp,
    /// Expert parallel (MoE all-to-all).
    Ep,
    /// Context / sequence parallel.
    Cp,
}

impl Role {
    /// Every role, in a fixed order.
    pub const ALL: [Role; 6] = [
        Role::Global,
        Role::Dp,
        Role::Tp,
        Role::Pp,
        Role::Ep,
        Role::Cp,
    ];

    /// The short lowercase name (`"dp"`, ..., `"global"`), as written in names and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Global => "global",
            Role::Dp => "dp",
            Role::Tp => "tp",
            Role::Pp => "pp",
            Role::Ep => "ep",
            Role::Cp => "cp",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not one of `global`, `dp`, `tp`, `pp`, `ep`, `cp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownRole(pub String);

impl fmt::Display for UnknownRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown communicator role {:?}: use one of global, dp, tp, pp, ep, cp",
            self.0
        )
    }
}

impl std::error::Error for UnknownRole {}

impl FromStr for Role {
    type Err = UnknownRole;

    /// Exactly one of the short names, case-insensitive (`"TP"` is `tp`).
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        let t = s.trim();
        Role::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| UnknownRole(s.to_string()))
    }
}

/// Whole descriptions of one role, compared case-insensitively after dropping a `_GLOO` suffix
/// (Megatron-core `parallel_state` group descriptions, PyTorch's default group, common short names).
const EXACT: &[(&str, Role)] = &[
    ("default_pg", Role::Global),
    ("world", Role::Global),
    ("global", Role::Global),
    ("TENSOR_MODEL_PARALLEL_GROUP", Role::Tp),
    ("EXPERT_TENSOR_PARALLEL_GROUP", Role::Tp),
    ("DATA_PARALLEL_GROUP", Role::Dp),
    ("DATA_PARALLEL_GROUP_WITH_CP", Role::Dp),
    ("EXPERT_DATA_PARALLEL_GROUP", Role::Dp),
    ("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", Role::Dp),
    ("INTER_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", Role::Dp),
    ("INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", Role::Dp),
    ("INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", Role::Dp),
    ("PIPELINE_MODEL_PARALLEL_GROUP", Role::Pp),
    ("EMBEDDING_GROUP", Role::Pp),
    ("POSITION_EMBEDDING_GROUP", Role::Pp),
    ("EXPERT_MODEL_PARALLEL_GROUP", Role::Ep),
    ("CONTEXT_PARALLEL_GROUP", Role::Cp),
];

/// Words that name one role inside a longer description (`mesh_tp`, `dp_shard`, `tp-group`).
const WORDS: &[(&str, Role)] = &[
    ("world", Role::Global),
    ("global", Role::Global),
    ("default", Role::Global),
    ("dp", Role::Dp),
    ("ddp", Role::Dp),
    ("fsdp", Role::Dp),
    ("hsdp", Role::Dp),
    ("zero", Role::Dp),
    ("data", Role::Dp),
    ("replicate", Role::Dp),
    ("shard", Role::Dp),
    ("edp", Role::Dp),
    ("tp", Role::Tp),
    ("etp", Role::Tp),
    ("tensor", Role::Tp),
    ("mp", Role::Tp),
    ("pp", Role::Pp),
    ("pipe", Role::Pp),
    ("pipeline", Role::Pp),
    ("stage", Role::Pp),
    ("ep", Role::Ep),
    ("expert", Role::Ep),
    ("experts", Role::Ep),
    ("moe", Role::Ep),
    ("cp", Role::Cp),
    ("sp", Role::Cp),
    ("context", Role::Cp),
    ("sequence", Role::Cp),
    ("ulysses", Role::Cp),
];

/// Words that say a description spans several dimensions (`TENSOR_AND_DATA_PARALLEL_GROUP`,
/// Megatron's `MODEL_PARALLEL_GROUP` = tp x pp), or describes a parent (`default_pg:split:3`,
/// PyTorch's `split_group` children): no single role.
const COMPOSITE: &[&str] = &["and", "model", "split"];

/// The role a group description names, if exactly one (case-insensitive).
///
/// Whole known descriptions first (Megatron-core constants, `default_pg`), then words split at
/// anything that is not a letter or digit: a description whose words name exactly one role gets it;
/// none, several, or a composite word (`AND`, a bare `MODEL`) gives `None`.
pub fn role_from_hint(desc: &str) -> Option<Role> {
    let d = desc.trim();
    let base = strip_suffix_ci(d, "_GLOO").unwrap_or(d);
    if let Some((_, r)) = EXACT.iter().find(|(k, _)| k.eq_ignore_ascii_case(base)) {
        return Some(*r);
    }
    let mut found: Option<Role> = None;
    let mut model_word = false;
    for w in base
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if COMPOSITE.iter().any(|c| c.eq_ignore_ascii_case(w)) {
            if w.eq_ignore_ascii_case("model") {
                model_word = true;
                continue;
            }
            return None;
        }
        if let Some((_, r)) = WORDS.iter().find(|(k, _)| k.eq_ignore_ascii_case(w)) {
            match found {
                Some(f) if f != *r => return None,
                _ => found = Some(*r),
            }
        }
    }
    // "MODEL" qualifies a role word ("TENSOR_MODEL", "EXPERT_MODEL"); alone it means tp x pp.
    if model_word && found.is_none() {
        return None;
    }
    found
}

fn strip_suffix_ci<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let n = s.len().checked_sub(suffix.len())?;
    (s.is_char_boundary(n) && s[n..].eq_ignore_ascii_case(suffix)).then(|| &s[..n])
}

/// The role a communicator name carries: its first `:`-separated field is a role name
/// (CommInsight's `"<role>:..."`) or a description [`role_from_hint`] knows
/// (`"<group_desc>:<group_name>"`, except a `split_group` child's `"<parent desc>:split:..."`);
/// `None` for an empty or role-less name.
pub fn parse_comm_name(name: &str) -> Option<Role> {
    let mut fields = name.split(':');
    let first = fields.next().unwrap_or("").trim();
    if first.is_empty() {
        return None;
    }
    if let Ok(r) = first.parse() {
        return Some(r);
    }
    // PyTorch's `split_group` describes a child as `<parent desc>:split:<n>`: the parent's
    // description says nothing about the child's role.
    if fields
        .next()
        .is_some_and(|f| f.trim().eq_ignore_ascii_case("split"))
    {
        return None;
    }
    role_from_hint(first)
}

/// The `commName` CommInsight writes for a role: `"<role>:<desc>:<group_name>"`, leaving out empty
/// parts (`"tp:TENSOR_MODEL_PARALLEL_GROUP:3"`, `"dp"`).
pub fn format_comm_name(role: Role, desc: &str, group_name: &str) -> String {
    let mut s = String::from(role.as_str());
    for part in [desc, group_name] {
        if !part.is_empty() {
            s.push(':');
            s.push_str(part);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_descriptions() {
        let cases = [
            ("TENSOR_MODEL_PARALLEL_GROUP", Some(Role::Tp)),
            ("DATA_PARALLEL_GROUP_GLOO", Some(Role::Dp)),
            ("DATA_PARALLEL_GROUP_WITH_CP", Some(Role::Dp)),
            ("PIPELINE_MODEL_PARALLEL_GROUP", Some(Role::Pp)),
            ("EXPERT_MODEL_PARALLEL_GROUP", Some(Role::Ep)),
            ("CONTEXT_PARALLEL_GROUP", Some(Role::Cp)),
            ("EXPERT_DATA_PARALLEL_GROUP", Some(Role::Dp)),
            ("MODEL_PARALLEL_GROUP", None),
            ("TENSOR_AND_DATA_PARALLEL_GROUP", None),
            ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", None),
            ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", None),
            ("default_pg", Some(Role::Global)),
            ("undefined", None),
            ("", None),
        ];
        for (d, want) in cases {
            assert_eq!(role_from_hint(d), want, "{d}");
        }
    }

    #[test]
    fn device_mesh_and_short_names() {
        for (d, want) in [
            ("mesh_tp", Some(Role::Tp)),
            ("mesh_dp_replicate", Some(Role::Dp)),
            ("mesh_dp_shard", Some(Role::Dp)),
            ("mesh_ep", Some(Role::Ep)),
            ("mesh_cp", Some(Role::Cp)),
            ("mesh_pp", Some(Role::Pp)),
            ("mesh_dim_0", None),
            ("tp", Some(Role::Tp)),
            ("pp", Some(Role::Pp)),
            ("world", Some(Role::Global)),
            ("mesh_dp_cp", None), // two roles
            ("pipeline-stage", Some(Role::Pp)),
            ("default_pg:split:3", None),
        ] {
            assert_eq!(role_from_hint(d), want, "{d}");
        }
    }

    #[test]
    fn names_round_trip() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
            assert_eq!(r.as_str().to_uppercase().parse::<Role>(), Ok(r));
            let n = format_comm_name(r, "SOME_GROUP", "4");
            assert_eq!(parse_comm_name(&n), Some(r), "{n}");
        }
        assert_eq!(format_comm_name(Role::Dp, "", ""), "dp");
        assert_eq!(format_comm_name(Role::Tp, "mesh_tp", ""), "tp:mesh_tp");
        assert_eq!(parse_comm_name("tp:pp1_dp0"), Some(Role::Tp));
        assert_eq!(parse_comm_name(""), None);
        assert_eq!(parse_comm_name("default_pg:split:3:4f2a"), None);
        assert_eq!(
            parse_comm_name("tp:default_pg:split:3:4f2a"),
            Some(Role::Tp)
        );
        let e = "xp".parse::<Role>().unwrap_err().to_string();
        assert!(e.contains("\"xp\"") && e.contains("global, dp, tp"), "{e}");
    }
}

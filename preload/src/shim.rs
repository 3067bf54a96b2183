//! What each interposed call does, decided before the real call ([`Plan`]) and recorded after it
//! ([`finish`]). Safe code; [`crate::ffi`] reads the C arguments and makes the calls.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::config::{CallerConfig, ConfigBuf, NAMED_VERSION};
use crate::state::{current_group, with_registry, with_warnings};

static DISABLED: AtomicBool = AtomicBool::new(false);
static NCCL_VERSION: AtomicU32 = AtomicU32::new(0);

/// `COMMINSIGHT_DISABLE=1`: forward everything untouched.
pub fn set_disabled(d: bool) {
    DISABLED.store(d, Ordering::Relaxed);
}

/// Whether the shim only forwards.
pub fn disabled() -> bool {
    DISABLED.load(Ordering::Relaxed)
}

/// The running NCCL's version code (`ncclGetVersion`), 0 = unknown.
pub fn set_nccl_version(v: u32) {
    NCCL_VERSION.store(v, Ordering::Relaxed);
}

/// The cached NCCL version code (0 = not known yet).
pub fn nccl_version() -> u32 {
    NCCL_VERSION.load(Ordering::Relaxed)
}

/// The caller's `ncclConfig_t*` argument, read.
#[derive(Debug, PartialEq, Eq)]
pub enum Caller {
    /// NULL.
    Null,
    /// A config, copied (or to be left alone).
    Config(CallerConfig),
}

/// What to pass to the real function.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// The caller's arguments, untouched.
    Forward,
    /// The caller's arguments, untouched, and this copy of its config (NCCL's defaults for a NULL
    /// one) remembered for the new communicator, so its children can be named later.
    Remember(ConfigBuf),
    /// Our config instead of the caller's (NULL) one; `ann` = the announcement that named it.
    Config {
        /// The config to pass.
        cfg: ConfigBuf,
        /// The announcement the name came from, if any.
        ann: Option<usize>,
    },
}

fn naming_off() -> bool {
    disabled() || nccl_version() < NAMED_VERSION
}

/// `cfg` with `commName` = the name chosen for a communicator of `geometry`; no name: the caller's
/// arguments, `cfg` remembered.
fn named(cfg: impl FnOnce() -> ConfigBuf, geometry: Option<(i32, i32)>) -> Plan {
    with_registry(|r| {
        let choice = r.choose(current_group(), geometry);
        let Some((choice, addr)) = choice.and_then(|c| r.intern(&c.name).map(|a| (c, a))) else {
            return Plan::Remember(cfg());
        };
        let mut c = cfg();
        c.set_comm_name_ptr(addr);
        Plan::Config {
            cfg: c,
            ann: choice.ann,
        }
    })
}

/// `ncclCommInitRank` / `ncclCommInitRankConfig` / `ncclCommInitRankScalable` (and
/// `ncclCommGrow` for a new rank): name the communicator when a name applies.
pub fn plan_init(caller: Caller, geometry: Option<(i32, i32)>) -> Plan {
    if naming_off() {
        return Plan::Forward;
    }
    match caller {
        Caller::Null => named(|| ConfigBuf::defaults(nccl_version()), geometry),
        Caller::Config(CallerConfig::Untouched) => Plan::Forward,
        Caller::Config(CallerConfig::Copy(c)) => named(|| c, geometry),
    }
}

/// `ncclCommSplit`. A NULL config inherits the parent's: when the shim made the parent's config,
/// the child gets a copy of it with its own name (or none), never the parent's.
pub fn plan_split(parent: usize, caller: Caller) -> Plan {
    if naming_off() {
        return Plan::Forward;
    }
    match caller {
        Caller::Null => with_registry(|r| {
            let Some(mut cfg) = r.config_of(parent).cloned() else {
                return Plan::Forward;
            };
            let choice = r.choose(current_group(), None);
            let addr = choice.as_ref().and_then(|c| r.intern(&c.name)).unwrap_or(0);
            cfg.set_comm_name_ptr(addr);
            Plan::Config {
                cfg,
                ann: choice.and_then(|c| c.ann).filter(|_| addr != 0),
            }
        }),
        c => plan_init(c, None),
    }
}

/// `ncclCommShrink`, and `ncclCommGrow` on an existing member: a NULL config inherits (same
/// group, same name); a given unnamed config gets the parent's name.
pub fn plan_shrink(parent: usize, caller: Caller) -> Plan {
    if naming_off() {
        return Plan::Forward;
    }
    match caller {
        Caller::Config(CallerConfig::Copy(mut c)) => {
            with_registry(
                |r| match r.config_of(parent).map(ConfigBuf::comm_name_ptr) {
                    Some(addr) if addr != 0 => {
                        c.set_comm_name_ptr(addr);
                        Plan::Config { cfg: c, ann: None }
                    }
                    _ => Plan::Forward,
                },
            )
        }
        _ => Plan::Forward,
    }
}

/// After the real call: `ok` = it returned ncclSuccess or ncclInProgress; `newcomm` = the
/// communicator it made (0: none). Remembers our config for later splits and counts the name.
pub fn finish(plan: Plan, ok: bool, newcomm: usize) {
    if !ok || newcomm == 0 {
        return;
    }
    match plan {
        Plan::Forward => {}
        Plan::Remember(cfg) => with_registry(|r| r.remember(newcomm, cfg)),
        Plan::Config { cfg, ann } => with_registry(|r| {
            if cfg.comm_name_ptr() != 0 {
                r.count_named(ann);
            }
            r.remember(newcomm, cfg);
        }),
    }
}

/// A communicator is being destroyed or aborted.
pub fn forget(comm: usize) {
    if comm != 0 {
        with_registry(|r| r.forget(comm));
    }
}

/// Warnings still queued after a comm-creating call (no plugin drained them): each printed once
/// to stderr as `CommInsight WARN <msg>`.
pub fn flush_warnings_to_stderr() {
    use std::io::Write;
    while let Some(m) = with_warnings(|w| w.pop()) {
        let _ = writeln!(std::io::stderr(), "CommInsight WARN {m}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::set_current_group;

    fn caller_copy() -> Caller {
        Caller::Config(ConfigBuf::from_caller(
            ConfigBuf::defaults(23007).as_bytes(),
            false,
        ))
    }

    #[test]
    fn unnamed_parents_are_remembered_and_children_named() {
        set_nccl_version(23007);
        // Nothing matches a 37-rank comm: forwarded, its (default) config remembered.
        let p = plan_init(Caller::Null, Some((37, 5)));
        assert!(matches!(p, Plan::Remember(_)), "{p:?}");
        finish(p, true, 0xa000);
        assert!(with_registry(|r| r.config_of(0xa000).is_some()));
        // A failed call remembers nothing.
        finish(plan_init(Caller::Null, Some((37, 5))), false, 0xa100);
        assert!(with_registry(|r| r.config_of(0xa100).is_none()));

        // A split with NULL config while a group is current: a copy named for the child.
        let id =
            with_registry(|r| r.announce(Some("cp"), "CONTEXT_PARALLEL_GROUP", "4", &[1, 2, 3], 2))
                .expect("announce");
        set_current_group(id);
        let p = plan_split(0xa000, Caller::Null);
        set_current_group(-1);
        let Plan::Config { cfg, ann } = &p else {
            panic!("{p:?}")
        };
        assert_eq!(*ann, Some(id as usize));
        let want = with_registry(|r| r.intern("cp:CONTEXT_PARALLEL_GROUP:4")).expect("name");
        assert_eq!(cfg.comm_name_ptr(), want);
        finish(p, true, 0xa010);
        assert_eq!(with_registry(|r| r.group_comms(id)), 1);

        // No current group: the child gets the parent's config without a name.
        let p = plan_split(0xa010, Caller::Null);
        let Plan::Config { cfg, ann: None } = &p else {
            panic!("{p:?}")
        };
        assert_eq!(cfg.comm_name_ptr(), 0, "never the parent's name");

        // Unknown parent: untouched.
        assert_eq!(plan_split(0xdead, Caller::Null), Plan::Forward);

        // Shrink with a given unnamed config: the parent's name; unnamed parent: untouched.
        let Plan::Config { cfg, ann: None } = plan_shrink(0xa010, caller_copy()) else {
            panic!("named")
        };
        assert_eq!(cfg.comm_name_ptr(), want);
        assert_eq!(plan_shrink(0xa000, caller_copy()), Plan::Forward);
        assert_eq!(plan_shrink(0xa010, Caller::Null), Plan::Forward);
        // A caller-named config is never touched.
        assert_eq!(
            plan_init(Caller::Config(CallerConfig::Untouched), Some((37, 5))),
            Plan::Forward
        );
        forget(0xa000);
        forget(0xa010);
        assert!(with_registry(|r| r.config_of(0xa010).is_none()));
    }
}

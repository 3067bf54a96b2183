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

/// `cfg` with `commName` = the name chosen for a communicator of `geometry` (None: no name).
fn named(cfg: impl FnOnce() -> ConfigBuf, geometry: Option<(i32, i32)>) -> Plan {
    with_registry(|r| {
        let Some(choice) = r.choose(current_group(), geometry) else {
            return Plan::Forward;
        };
        let Some(addr) = r.intern(&choice.name) else {
            return Plan::Forward;
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
    if let Plan::Config { cfg, ann } = plan {
        if ok && newcomm != 0 {
            with_registry(|r| {
                if cfg.comm_name_ptr() != 0 {
                    r.count_named(ann);
                }
                r.remember(newcomm, cfg);
            });
        }
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

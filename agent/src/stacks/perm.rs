//! Why reading another process's memory may be refused: CAP_SYS_PTRACE (CapEff bit 19 of
//! `/proc/self/status`), Yama `kernel.yama.ptrace_scope`, and the target's owner.

/// Capability number of CAP_SYS_PTRACE.
const CAP_SYS_PTRACE: u32 = 19;
const YAMA_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";
const ADD_CAP: &str = "add AmbientCapabilities=CAP_SYS_PTRACE to the unit or run as root";

/// What this process may do with ptrace-class access (ptrace, `process_vm_readv`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PtraceEnv {
    /// CapEff holds CAP_SYS_PTRACE.
    pub has_cap: bool,
    /// `kernel.yama.ptrace_scope` (`None`: no Yama on this kernel).
    pub yama_scope: Option<u32>,
    /// Effective uid of this process.
    pub euid: Option<u32>,
}

impl PtraceEnv {
    /// Read it from `/proc/self/status` and the Yama sysctl.
    pub fn current() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let has_cap = status_field(&status, "CapEff:")
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|caps| caps & (1u64 << CAP_SYS_PTRACE) != 0);
        let euid = status_field(&status, "Uid:").and_then(|v| nth_u32(v, 1));
        let yama_scope = std::fs::read_to_string(YAMA_SCOPE)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        PtraceEnv {
            has_cap,
            yama_scope,
            euid,
        }
    }

    /// `Err(cause and fix)` when this process cannot read arbitrary local processes.
    pub fn check(&self) -> Result<(), String> {
        if self.yama_scope == Some(3) {
            return Err(
                "kernel.yama.ptrace_scope=3 refuses all ptrace; it can only be lowered by a reboot \
                 (set it to 1 or 0 at boot)"
                    .to_owned(),
            );
        }
        if self.has_cap {
            return Ok(());
        }
        Err(match self.yama_scope {
            Some(2) => format!(
                "kernel.yama.ptrace_scope=2 refuses ptrace without CAP_SYS_PTRACE and the agent \
                 lacks it; {ADD_CAP}, or set it to 1 or 0"
            ),
            Some(1) => format!(
                "the agent lacks CAP_SYS_PTRACE and kernel.yama.ptrace_scope=1 allows tracing only \
                 its own descendants; {ADD_CAP}, or set kernel.yama.ptrace_scope=0"
            ),
            _ => format!(
                "the agent lacks CAP_SYS_PTRACE and can read only processes of its own uid{}; \
                 {ADD_CAP}",
                self.euid.map(|u| format!(" ({u})")).unwrap_or_default()
            ),
        })
    }

    /// Cause and fix of a refusal to read `pid` (owned by `target_uid`).
    pub fn explain(&self, pid: u32, target_uid: Option<u32>) -> String {
        if self.yama_scope == Some(3) || self.yama_scope == Some(2) && !self.has_cap {
            return self.check().err().unwrap_or_default();
        }
        if self.has_cap {
            return "the agent has CAP_SYS_PTRACE yet was refused (a security module such as \
                    AppArmor or SELinux, a seccomp profile, or another PID namespace); allow ptrace \
                    for the agent or run it in the host PID namespace"
                .to_owned();
        }
        match (self.euid, target_uid) {
            (Some(me), Some(them)) if me != them => format!(
                "the agent (uid {me}) lacks CAP_SYS_PTRACE and pid {pid} belongs to uid {them}; \
                 {ADD_CAP}"
            ),
            _ if self.yama_scope == Some(1) => format!(
                "the agent lacks CAP_SYS_PTRACE and kernel.yama.ptrace_scope=1 allows tracing \
                 only its own descendants; {ADD_CAP}, or set kernel.yama.ptrace_scope=0"
            ),
            _ => format!(
                "the agent lacks CAP_SYS_PTRACE (pid {pid} may be non-dumpable or have changed \
                 credentials); {ADD_CAP}"
            ),
        }
    }
}

/// Whether this process may read the memory of any local process (and so capture the stacks
/// of every rank): `Ok(())` with CAP_SYS_PTRACE and Yama `ptrace_scope` < 3, else `Err` with one
/// line naming the cause and the fix. Without the capability, processes of the agent's own uid
/// may still be readable (Yama permitting).
pub fn ptrace_permission() -> Result<(), String> {
    PtraceEnv::current().check()
}

/// The real uid owning `pid` (`/proc/PID/status`), `None` when unreadable.
pub(crate) fn target_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&status, "Uid:").and_then(|v| nth_u32(v, 0))
}

/// The OS reason in a failure's text when it is a permission refusal (EPERM / EACCES).
pub(crate) fn permission_reason(text: &str) -> Option<&'static str> {
    if text.contains("Operation not permitted") || text.contains("os error 1)") {
        Some("Operation not permitted")
    } else if text.contains("Permission denied") || text.contains("os error 13)") {
        Some("Permission denied")
    } else {
        None
    }
}

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key))
}

fn nth_u32(v: &str, n: usize) -> Option<u32> {
    v.split_whitespace().nth(n).and_then(|x| x.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(has_cap: bool, yama_scope: Option<u32>) -> PtraceEnv {
        PtraceEnv {
            has_cap,
            yama_scope,
            euid: Some(65534),
        }
    }

    #[test]
    fn check_names_cause_and_fix() {
        assert_eq!(env(true, None).check(), Ok(()));
        assert_eq!(env(true, Some(2)).check(), Ok(()));
        assert!(env(true, Some(3)).check().unwrap_err().contains("=3"));
        let e = env(false, None).check().unwrap_err();
        assert!(
            e.contains("CAP_SYS_PTRACE") && e.contains("AmbientCapabilities"),
            "{e}"
        );
        let e = env(false, Some(2)).check().unwrap_err();
        assert!(e.contains("kernel.yama.ptrace_scope=2"), "{e}");
    }

    #[test]
    fn explain_prefers_the_real_cause() {
        let e = env(false, None).explain(7, Some(0));
        assert!(e.contains("uid 65534") && e.contains("uid 0"), "{e}");
        let e = env(false, Some(2)).explain(7, Some(65534));
        assert!(e.contains("ptrace_scope=2"), "{e}");
        let e = env(false, Some(1)).explain(7, Some(65534));
        assert!(e.contains("ptrace_scope=1"), "{e}");
        assert!(env(true, None)
            .explain(7, Some(0))
            .contains("security module"));
        assert_eq!(
            permission_reason("x (os error 1)"),
            Some("Operation not permitted")
        );
        assert_eq!(
            permission_reason("Permission denied"),
            Some("Permission denied")
        );
        assert_eq!(permission_reason("no such file"), None);
    }
}

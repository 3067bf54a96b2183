//! Process state from `/proc/PID/stat` (and `/proc/PID/wchan`): never panics, never blocks.

use std::io::ErrorKind;

use super::{ProcState, ProcStatus};

/// The fields of `/proc/PID/stat` this module uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Field 3, the state letter.
    pub state: char,
    /// Field 4.
    pub ppid: u32,
    /// Field 22, start time in clock ticks after boot.
    pub start_ticks: u64,
    /// Field 52 (Linux 3.5+), the wait status of a zombie; `None` when absent.
    pub exit_code: Option<i64>,
}

/// Why `/proc/PID/stat` could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatError {
    /// No such process.
    #[error("no such process")]
    Gone,
    /// Reading failed for another reason.
    #[error("cannot read /proc/{pid}/stat: {source}; check that /proc is mounted and visible")]
    Io {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    /// The file did not look like a stat line.
    #[error("cannot parse /proc/{pid}/stat ({what}); is this a Linux procfs?")]
    Parse { pid: u32, what: &'static str },
}

/// Parse one `/proc/PID/stat` line. `comm` (field 2) may hold spaces and `)`, so the fields
/// start after the last `)`.
pub(crate) fn parse_stat(pid: u32, line: &str) -> Result<Stat, StatError> {
    let close = line.rfind(')').ok_or(StatError::Parse {
        pid,
        what: "no ')' after comm",
    })?;
    // rest[0] is field 3 (state), so field N is rest[N - 3].
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    let state = rest
        .first()
        .and_then(|s| s.chars().next())
        .ok_or(StatError::Parse {
            pid,
            what: "no state field",
        })?;
    let field = |n: usize| rest.get(n - 3).and_then(|s| s.parse::<i64>().ok());
    let ppid = field(4).ok_or(StatError::Parse {
        pid,
        what: "no ppid field",
    })?;
    let start = field(22).ok_or(StatError::Parse {
        pid,
        what: "no starttime field",
    })?;
    Ok(Stat {
        state,
        ppid: u32::try_from(ppid).unwrap_or(0),
        start_ticks: u64::try_from(start).unwrap_or(0),
        exit_code: field(52),
    })
}

/// Read and parse `/proc/PID/stat`.
pub(crate) fn read_stat(pid: u32) -> Result<Stat, StatError> {
    if pid == 0 {
        return Err(StatError::Gone);
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(line) => parse_stat(pid, &line),
        // ESRCH: the process exited between open and read.
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            Err(StatError::Gone)
        }
        Err(source) => Err(StatError::Io { pid, source }),
    }
}

/// Start time of `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`), which with the
/// PID identifies one process across PID reuse. `None` when the process is gone or unreadable.
pub fn start_ticks(pid: u32) -> Option<u64> {
    read_stat(pid).ok().map(|s| s.start_ticks)
}

/// The state of `pid` from `/proc/PID/stat`, with a one-line detail (`wchan=...` for a
/// sleeping process, who has not reaped a zombie and how it ended). Never panics.
pub fn proc_state(pid: u32) -> ProcState {
    proc_state_checked(pid, None)
}

/// Like [`proc_state`], but a process whose start time (see [`start_ticks`]) differs from
/// `expected_start` is [`ProcStatus::Gone`] with detail `pid reused by another process`.
pub fn proc_state_checked(pid: u32, expected_start: Option<u64>) -> ProcState {
    let stat = match read_stat(pid) {
        Ok(s) => s,
        Err(StatError::Gone) => {
            return ProcState {
                status: ProcStatus::Gone,
                detail: "no such process".to_owned(),
            }
        }
        Err(e) => {
            return ProcState {
                status: ProcStatus::Unknown,
                detail: e.to_string(),
            }
        }
    };
    if let Some(want) = expected_start {
        if stat.start_ticks != want {
            return ProcState {
                status: ProcStatus::Gone,
                detail: format!(
                    "pid reused by another process (start time {} ticks, expected {want})",
                    stat.start_ticks
                ),
            };
        }
    }
    describe(pid, &stat)
}

fn describe(pid: u32, stat: &Stat) -> ProcState {
    let wchan = || wchan(pid).map(|w| format!("wchan={w}")).unwrap_or_default();
    let (status, detail) = match stat.state {
        'R' => (ProcStatus::Running, String::new()),
        // I: idle kernel thread; W (paging/waking), K (wakekill), P (parked): sleeping variants.
        'S' | 'I' | 'W' | 'K' | 'P' => (ProcStatus::Sleeping, wchan()),
        'D' => (ProcStatus::DiskSleep, wchan()),
        'T' => (ProcStatus::Stopped, join("stopped by a signal", &wchan())),
        't' => (
            ProcStatus::Stopped,
            match tracer(pid) {
                Some(t) => format!("stopped by its tracer (pid {t})"),
                None => "stopped by its tracer".to_owned(),
            },
        ),
        'Z' => (
            ProcStatus::Zombie,
            format!(
                "zombie: parent (pid {}) has not reaped it{}",
                stat.ppid,
                ended(stat.exit_code)
            ),
        ),
        'X' | 'x' => (
            ProcStatus::Zombie,
            format!("dead: being reaped{}", ended(stat.exit_code)),
        ),
        other => (
            ProcStatus::Unknown,
            format!("unknown state letter '{other}' in /proc/{pid}/stat"),
        ),
    };
    ProcState { status, detail }
}

fn join(a: &str, b: &str) -> String {
    if b.is_empty() {
        a.to_owned()
    } else {
        format!("{a}, {b}")
    }
}

/// `, exit_code=N` or `, killed by signal N` from a wait status.
fn ended(wait_status: Option<i64>) -> String {
    match wait_status {
        Some(s) if s & 0x7f == 0 => format!(", exit_code={}", (s >> 8) & 0xff),
        Some(s) => format!(", killed by signal {}", s & 0x7f),
        None => String::new(),
    }
}

/// The kernel function a sleeping process waits in; `None` when unreadable or `0`.
fn wchan(pid: u32) -> Option<String> {
    let w = std::fs::read_to_string(format!("/proc/{pid}/wchan")).ok()?;
    let w = w.trim();
    (!w.is_empty() && w != "0").then(|| w.to_owned())
}

/// `TracerPid` from `/proc/PID/status`, when non-zero.
fn tracer(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|&t| t != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comm_with_spaces_and_parens() {
        let mut line = "42 (a) b) c) Z 7 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 9876".to_owned();
        for _ in 23..52 {
            line.push_str(" 0");
        }
        line.push_str(" 35072\n");
        let s = parse_stat(42, &line).unwrap();
        assert_eq!(s.state, 'Z');
        assert_eq!(s.ppid, 7);
        assert_eq!(s.start_ticks, 9876);
        assert_eq!(s.exit_code, Some(35072));
        assert_eq!(ended(s.exit_code), ", exit_code=137");
        assert_eq!(ended(Some(9)), ", killed by signal 9");
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            parse_stat(1, "garbage"),
            Err(StatError::Parse { .. })
        ));
        assert!(matches!(
            parse_stat(1, "1 (x) S"),
            Err(StatError::Parse { .. })
        ));
    }
}

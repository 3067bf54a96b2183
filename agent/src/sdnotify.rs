//! systemd readiness protocol (`sd_notify(3)`): one datagram per state change to `$NOTIFY_SOCKET`.
//!
//! The unit is `Type=notify` with `WatchdogSec=`: the daemon calls [`ready`] once its sources and
//! sinks are up, [`watchdog`] at least every half `WATCHDOG_USEC` ([`watchdog_interval`]), [`status`]
//! for the one-line state shown by `systemctl status`, and [`stopping`] when it begins to shut down.
//! Without `NOTIFY_SOCKET` (not started by systemd) every call is a no-op returning `Ok(false)`.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Send `state` (newline-separated `KEY=VALUE` assignments) to `$NOTIFY_SOCKET`.
/// `Ok(false)` when the variable is unset or empty; `Ok(true)` once the datagram is sent.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(path) if !path.is_empty() => notify_to(&path.to_string_lossy(), state).map(|()| true),
        _ => Ok(false),
    }
}

/// Send `state` to the socket named `socket`: a path, or an abstract name written `@name`.
pub fn notify_to(socket: &str, state: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = socket.strip_prefix('@') {
        send_abstract(&sock, name.as_bytes(), state)
    } else if socket.starts_with('/') {
        let n = sock.send_to(state.as_bytes(), socket)?;
        short_write(n, state)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET={socket}: expected an absolute path or an @abstract name"),
        ))
    }
}

#[cfg(target_os = "linux")]
fn send_abstract(sock: &UnixDatagram, name: &[u8], state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    let n = sock.send_to_addr(state.as_bytes(), &addr)?;
    short_write(n, state)
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract NOTIFY_SOCKET names exist only on Linux",
    ))
}

fn short_write(n: usize, state: &str) -> io::Result<()> {
    if n == state.len() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sd_notify: sent {n} of {} bytes", state.len()),
        ))
    }
}

/// `READY=1`: start-up finished (systemd then reports the unit active).
pub fn ready() -> io::Result<bool> {
    notify("READY=1")
}

/// `STOPPING=1`: shutdown began.
pub fn stopping() -> io::Result<bool> {
    notify("STOPPING=1")
}

/// `WATCHDOG=1`: still alive (required at least every `WatchdogSec`).
pub fn watchdog() -> io::Result<bool> {
    notify("WATCHDOG=1")
}

/// `STATUS=<msg>`: the one-line status shown by `systemctl status` (newlines become spaces).
pub fn status(msg: &str) -> io::Result<bool> {
    notify(&format!("STATUS={}", msg.replace('\n', " ")))
}

/// How often to call [`watchdog`]: half of `$WATCHDOG_USEC` when the watchdog is enabled for this
/// process (`$WATCHDOG_PID` unset or equal to our pid), else `None`.
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok()?;
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval_from(&usec, pid.as_deref(), std::process::id())
}

/// [`watchdog_interval`] over given values (for tests).
pub fn watchdog_interval_from(usec: &str, pid: Option<&str>, my_pid: u32) -> Option<Duration> {
    if let Some(p) = pid {
        if p.trim().parse::<u32>().ok()? != my_pid {
            return None;
        }
    }
    let us = usec.trim().parse::<u64>().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(us / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn recv(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a datagram");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_to_a_path_socket() {
        let dir = Dir(std::env::temp_dir().join(format!("ci-sdnotify-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).unwrap();
        let path = dir.0.join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        let p = path.to_str().unwrap();
        notify_to(p, "READY=1").unwrap();
        assert_eq!(recv(&server), "READY=1");
        notify_to(p, "STATUS=ingesting 3 streams\nWATCHDOG=1").unwrap();
        assert_eq!(recv(&server), "STATUS=ingesting 3 streams\nWATCHDOG=1");
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("comminsight-sdnotify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(&format!("@{name}"), "STOPPING=1").unwrap();
        assert_eq!(recv(&server), "STOPPING=1");
    }

    #[test]
    fn errors_name_the_problem() {
        let e = notify_to("relative.sock", "READY=1").unwrap_err();
        assert!(e.to_string().contains("NOTIFY_SOCKET=relative.sock"), "{e}");
        let e = notify_to("/nonexistent-dir-comminsight/x.sock", "READY=1").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn without_notify_socket_is_a_no_op() {
        // The test process is not started by systemd's notify protocol (cargo test under a
        // notify service would be unusual); then every call returns Ok(false).
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            assert!(!ready().unwrap());
            assert!(!status("x").unwrap());
        }
    }

    #[test]
    fn watchdog_interval_is_half_and_respects_pid() {
        assert_eq!(
            watchdog_interval_from("30000000", None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval_from("30000000", Some("7"), 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(watchdog_interval_from("30000000", Some("8"), 7), None);
        assert_eq!(watchdog_interval_from("0", None, 7), None);
        assert_eq!(watchdog_interval_from("abc", None, 7), None);
    }
}

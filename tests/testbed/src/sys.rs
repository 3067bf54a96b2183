//! The runner's few raw calls, each with its SAFETY note.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Send `sig` to `pid` (errors such as "no such process" are ignored: the child is gone).
/// This process' effective user id (the ranks it starts run as it).
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

pub fn signal(pid: u32, sig: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) takes plain integers; a positive pid names one process (never a group).
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Make the child receive SIGKILL when the runner dies, so no rank outlives a killed runner.
pub fn kill_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_sig: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Turn SIGINT / SIGTERM / SIGHUP into a flag ([`stop_requested`]) so the runner can end its
/// ranks and remove its namespaces instead of dying with them in place.
pub fn install_stop_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_stop` is async-signal-safe (one atomic store) and lives for the whole
        // program; signal(2) only replaces the disposition of these three signals.
        unsafe {
            libc::signal(sig, on_stop as *const () as libc::sighandler_t);
        }
    }
}

/// Whether a stop signal arrived.
pub fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}

//! Reading a file another user may truncate: a `MAP_SHARED` mapping of a file raises `SIGBUS`
//! in the reader when it touches a page past the file's end. A ring belongs to its job's user,
//! who can `ftruncate` it at any moment while the root agent maps it; without this module that
//! kills the agent.
//!
//! Every read-only shared mapping of an untrusted file is registered here ([`Guard`]). A
//! process-wide `SIGBUS` handler (installed once, by the first registration) looks the faulting
//! address up: inside a registered range, it maps a private zero page over the faulting page
//! (`MAP_FIXED`) and returns, so the load repeats and reads zeros, and it counts the fault on
//! the range (the reader sees a ring of zeros: "not written yet", and [`Guard::faults`] tells
//! it the file was truncated). Outside every range the fault is not ours: the previous handler
//! runs, or the default action (a core dump), exactly as without this module.
//!
//! The handler only loads atomics and calls `mmap`, a system call (async-signal-safe in
//! practice: no lock, no allocation). Ranges are unregistered before they are unmapped.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Ranges registered at once. The agent maps one ring per followed rank process (and one
/// header page briefly while attaching); a registration beyond this fails (the ring is not
/// followed, and says why) rather than being read unprotected.
pub(crate) const MAX_GUARDED: usize = 4096;

struct Slot {
    claimed: AtomicBool,
    start: AtomicUsize,
    len: AtomicUsize,
    faults: AtomicUsize,
}

#[allow(
    clippy::declare_interior_mutable_const,
    reason = "the array initializer: each slot is a distinct copy"
)]
const FREE: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faults: AtomicUsize::new(0),
};

static SLOTS: [Slot; MAX_GUARDED] = [FREE; MAX_GUARDED];
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// The handler before ours (`sa_sigaction` as an address) and its `sa_flags`.
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREV_FLAGS: AtomicUsize = AtomicUsize::new(0);

/// One registered range; unregistered on drop (drop it before unmapping the range).
pub(crate) struct Guard {
    slot: usize,
}

impl Guard {
    /// Register `[start, start + len)`. Fails when the handler cannot be installed or every
    /// slot is taken.
    pub(crate) fn register(start: usize, len: usize) -> io::Result<Guard> {
        install()?;
        for (i, s) in SLOTS.iter().enumerate() {
            if s.claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.faults.store(0, Ordering::Relaxed);
                s.len.store(len, Ordering::Relaxed);
                s.start.store(start, Ordering::Release);
                return Ok(Guard { slot: i });
            }
        }
        Err(io::Error::other(format!(
            "more than {MAX_GUARDED} shared mappings of untrusted files at once"
        )))
    }

    /// Pages of the range that faulted (the file was shorter than the mapping) so far.
    pub(crate) fn faults(&self) -> usize {
        SLOTS[self.slot].faults.load(Ordering::Relaxed)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        s.start.store(0, Ordering::Release);
        s.len.store(0, Ordering::Relaxed);
        s.claimed.store(false, Ordering::Release);
    }
}

fn install() -> io::Result<()> {
    INSTALL.call_once(|| {
        // SAFETY: sysconf reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: all-zero is a valid `sigaction` (no handler, empty mask, no flags).
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current action into `prev`, a valid writable struct.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) } != 0 {
            return;
        }
        PREV_HANDLER.store(prev.sa_sigaction, Ordering::Relaxed);
        PREV_FLAGS.store(prev.sa_flags as usize, Ordering::Relaxed);
        // SAFETY: as above, a zeroed `sigaction` is valid; we fill handler and flags.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `act.sa_mask` is a valid sigset to empty.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: installs a handler that is a valid `extern "C"` function for SA_SIGINFO.
        if unsafe { libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) } == 0 {
            INSTALLED.store(true, Ordering::Release);
        }
    });
    if INSTALLED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(io::Error::other("cannot install the SIGBUS handler"))
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo for the delivered signal.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for s in &SLOTS {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= s.len.load(Ordering::Relaxed) {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: `at` is a page inside a range this process mapped and still holds (it is
        // registered until just before its munmap, by the thread that reads it); the page is
        // replaced by a private zero page, read-only like the mapping it replaces.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            s.faults.fetch_add(1, Ordering::Relaxed);
            return;
        }
        break;
    }
    // Not ours: what would have happened without us.
    let prev = PREV_HANDLER.load(Ordering::Relaxed);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction is SIG_DFL; restoring it makes the repeated fault fatal
        // with the default action (a synchronous SIGBUS cannot be ignored).
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
    } else if PREV_FLAGS.load(Ordering::Relaxed) & libc::SA_SIGINFO as usize != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO: it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous handler was installed without SA_SIGINFO: `fn(int)`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

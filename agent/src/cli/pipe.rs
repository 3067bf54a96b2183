//! A closed pipe on standard output (`comminsight-agent dump DIR | head -1`) ends a command
//! cleanly: exit status 0, no error text. Writes that return the error are mapped in
//! [`is_broken_pipe`]; `print!` panics on it, which [`run_quiet_on_broken_pipe`] turns into the
//! same clean exit (after unwinding, so scratch directories are still removed).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

static BROKEN_PIPE: AtomicBool = AtomicBool::new(false);

/// Whether `e` (any cause in its chain) is a write to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let broken = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == broken
            || c.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == broken
    })
}

/// Run `f`; a panic of `print!` on a closed standard output exits 0 without a message.
pub fn run_quiet_on_broken_pipe(f: impl FnOnce() -> ExitCode + std::panic::UnwindSafe) -> ExitCode {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std") && msg.contains("Broken pipe") {
            BROKEN_PIPE.store(true, Ordering::SeqCst);
            return;
        }
        default(info);
    }));
    match std::panic::catch_unwind(f) {
        Ok(code) => code,
        Err(_) if BROKEN_PIPE.load(Ordering::SeqCst) => ExitCode::SUCCESS,
        Err(p) => std::panic::resume_unwind(p),
    }
}

//! The control file `<ring>.ctl` (docs/contracts.md "Shared-memory ring"): `key=value` lines,
//! today only `event_mask=...`, written by the agent (root) by rename and read by the drain thread
//! about once a second.
//!
//! It lives in this user's private ring directory, but the file itself is still checked, because
//! the event mask decides what is profiled at all (`event_mask=0` silences the job): it is opened
//! `O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC` (a FIFO must not block the drain, a symlink must not
//! be followed) and accepted only if `fstat` shows a regular file owned by root or by our
//! effective uid that neither group nor others may write. A refused file is ignored and counted
//! (`ctl_refused` in `stats`), with one WARN per path; every accepted mask change is counted
//! (`mask_changes`) and logged. Both counts reach the agent in every `stats` record.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::abi::{LOG_INFO, LOG_WARN};
use crate::core::Shared;
use crate::{config, sys};

/// Largest control file read (a few `key=value` lines are expected).
const CTL_MAX_BYTES: u64 = 64 << 10;

/// Parse the control file; returns the new mask if it names one.
pub fn parse_control(text: &str) -> Result<Option<u32>, String> {
    let mut mask = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("malformed line {line:?}"));
        };
        // Other keys belong to later versions and are skipped.
        if k.trim() == "event_mask" {
            mask = Some(config::parse_mask(v.trim())?);
        }
    }
    Ok(mask)
}

/// Why a control file with this `fstat` (or `lstat`) is not accepted from a process of effective
/// uid `euid`; `None`: accepted.
pub fn control_problem(m: &Metadata, euid: u32) -> Option<String> {
    let t = m.file_type();
    let what = if t.is_symlink() {
        "a symbolic link".to_string()
    } else if t.is_fifo() {
        "a FIFO".to_string()
    } else if !t.is_file() {
        "not a regular file".to_string()
    } else if m.uid() != 0 && m.uid() != euid {
        format!(
            "owned by uid {} (only root or uid {euid} may set the mask)",
            m.uid()
        )
    } else if m.mode() & 0o022 != 0 {
        format!(
            "mode {:04o}: writable by group or others",
            m.mode() & 0o7777
        )
    } else {
        return None;
    };
    Some(what)
}

/// What was last seen at the path: a changed file (or a new refusal) is looked at again.
type Seen = (u64, u64, i64, i64, u32, u32, u64);

fn seen(m: &Metadata) -> Seen {
    (
        m.dev(),
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        m.uid(),
        m.mode(),
        m.len(),
    )
}

/// The drain's view of one control file.
pub struct Control {
    path: PathBuf,
    seen: Option<Seen>,
    warned: bool,
}

enum Opened {
    Missing,
    Refused(Metadata, String),
    File(File, Metadata),
}

impl Control {
    pub fn new(path: PathBuf) -> Control {
        Control {
            path,
            seen: None,
            warned: false,
        }
    }

    fn open(&self, euid: u32) -> Opened {
        let f = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&self.path);
        let (f, m) = match f.and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok(fm) => fm,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return match std::fs::symlink_metadata(&self.path) {
                    Ok(m) => Opened::Refused(m, "a symbolic link".into()),
                    Err(_) => Opened::Missing,
                };
            }
            // Absent (the usual case), or unreadable: nothing to apply.
            Err(_) => return Opened::Missing,
        };
        match control_problem(&m, euid) {
            Some(why) => Opened::Refused(m, why),
            None => Opened::File(f, m),
        }
    }

    /// Look at the file (cheap when unchanged) and apply a new mask it names.
    pub fn check(&mut self, sh: &Shared) {
        let (file, meta) = match self.open(sys::euid()) {
            Opened::Missing => {
                self.seen = None;
                return;
            }
            Opened::Refused(m, why) => {
                if self.seen.replace(seen(&m)) != Some(seen(&m)) {
                    sh.counters.ctl_refused.fetch_add(1, Ordering::Relaxed);
                    if !std::mem::replace(&mut self.warned, true) {
                        sh.log(LOG_WARN, &format!(
                            "CommInsight: ignoring control file {}: {why}; it is counted (ctl_refused) and the event mask is unchanged. Fix: remove it; only the agent (root) or this job's user may write it, mode 0600 or 0644",
                            self.path.display()
                        ));
                    }
                }
                return;
            }
            Opened::File(f, m) => (f, m),
        };
        if self.seen.replace(seen(&meta)) == Some(seen(&meta)) || meta.len() > CTL_MAX_BYTES {
            return;
        }
        let mut text = String::new();
        if file.take(CTL_MAX_BYTES).read_to_string(&mut text).is_err() {
            return;
        }
        match parse_control(&text) {
            Ok(Some(m)) if m != sh.mask() => {
                sh.set_mask(m);
                sh.counters.mask_changes.fetch_add(1, Ordering::Relaxed);
                sh.log(
                    LOG_INFO,
                    &format!(
                        "CommInsight: event mask set to 0x{m:x} by {}",
                        self.path.display()
                    ),
                );
            }
            Ok(_) => {}
            Err(e) => sh.log(
                LOG_WARN,
                &format!(
                    "CommInsight: ignoring control file {}: {e}",
                    self.path.display()
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests;

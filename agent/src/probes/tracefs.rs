//! tracefs: mounted where the kernel expects it (tracepoint programs need
//! `/sys/kernel/tracing/events/<cat>/<event>/id`), and the field offsets of this kernel's
//! tracepoint records read from their `format` files, so the BPF programs never assume a layout.

use std::path::{Path, PathBuf};

/// Where tracefs lives.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Make sure tracefs is mounted at [`TRACEFS`] (mounting it when `mount` allows); the error is
/// one line with the fix.
pub fn ensure_mounted(mount: bool) -> Result<PathBuf, String> {
    let root = PathBuf::from(TRACEFS);
    if root.join("events").is_dir() {
        return Ok(root);
    }
    let fix = "mount it: mount -t tracefs nodev /sys/kernel/tracing";
    if !mount {
        return Err(format!("tracefs is not mounted at {TRACEFS}; {fix}"));
    }
    let (src, dst, fstype) = (c"nodev", c"/sys/kernel/tracing", c"tracefs");
    // SAFETY: all three are NUL-terminated C strings living for the call; data may be NULL.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "tracefs is not mounted at {TRACEFS} and mounting it failed ({e}); {fix}"
        ));
    }
    if root.join("events").is_dir() {
        Ok(root)
    } else {
        Err(format!(
            "tracefs mounted at {TRACEFS} has no events/; {fix}"
        ))
    }
}

/// The offset of `field` in the record of tracepoint `category/event`, from its format file.
pub fn field_offset(root: &Path, category: &str, event: &str, field: &str) -> Option<u32> {
    let text = std::fs::read_to_string(
        root.join("events")
            .join(category)
            .join(event)
            .join("format"),
    )
    .ok()?;
    parse_offset(&text, field)
}

/// `field:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;` -> 24 for `prev_pid`.
pub fn parse_offset(format: &str, field: &str) -> Option<u32> {
    for line in format.lines() {
        let line = line.trim();
        let Some(decl) = line.strip_prefix("field:") else {
            continue;
        };
        let decl = decl.split(';').next()?;
        // The name is the last word of the declaration, without an array suffix.
        let name = decl.split_whitespace().last()?.split('[').next()?;
        if name != field {
            continue;
        }
        let off = line.split("offset:").nth(1)?.split(';').next()?;
        return off.trim().parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_from_a_format_file() {
        let f = "name: sched_switch\nID: 316\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n";
        assert_eq!(parse_offset(f, "prev_pid"), Some(24));
        assert_eq!(parse_offset(f, "prev_state"), Some(32));
        assert_eq!(parse_offset(f, "prev_comm"), Some(8));
        assert_eq!(parse_offset(f, "next_pid"), None);
    }
}

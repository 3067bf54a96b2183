//! Archives made readable once: an agent archive's `raw/<job>/<host>/<pid>/seg-N.cis.zst` are
//! decompressed into a scratch tree `<job>/<host>/<pid>/seg-N.cis`, which the same exactly-once
//! cursors as for live segment directories then read.

use std::path::{Path, PathBuf};

use super::skipped::{reason, FileSkip, SkipLog};
use crate::util::fs::{dirs_named, files_under};

/// Directory levels searched below a root for `raw/` trees, and below `raw/` for segments.
const DEPTH: u32 = 4;

#[cfg(test)]
thread_local! {
    /// Segments decompressed by this thread (tests count that an input is staged once).
    pub(crate) static STAGED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One staged segment: its index in the stream's directory and the archived file it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedSegment {
    pub stream_dir: PathBuf,
    pub origin: PathBuf,
}

/// Decompress the archived segments under `root` into `dest`; returns one entry per segment
/// (none: `root` holds no archive, read it as it is). An archived segment that cannot be read
/// or decompressed is skipped (into `skips`); only failing to write the scratch copy is an error.
pub fn stage_archive(
    root: &Path,
    dest: &Path,
    skips: &mut SkipLog,
) -> std::io::Result<Vec<StagedSegment>> {
    let mut raw_roots = dirs_named(root, "raw", DEPTH);
    if raw_roots.is_empty() {
        raw_roots.push(root.to_path_buf());
    }
    let mut out = Vec::new();
    for raw in raw_roots {
        for f in files_under(&raw, DEPTH, &|n| n.ends_with(".cis.zst")) {
            let Some(seg) = f
                .file_name()
                .and_then(|s| s.to_str())
                .and_then(|n| n.strip_suffix(".zst"))
            else {
                continue;
            };
            let Some(rel) = f.parent().and_then(|p| p.strip_prefix(&raw).ok()) else {
                continue;
            };
            let dir = dest.join(rel);
            std::fs::create_dir_all(&dir)?;
            let to = dir.join(seg);
            let dec = std::fs::File::open(&f).and_then(zstd::stream::read::Decoder::new);
            let mut dec = match dec {
                Ok(d) => d,
                Err(e) => {
                    skips.file(&f, FileSkip::Unreadable, reason(&e));
                    continue;
                }
            };
            let mut file = std::fs::File::create(&to)?;
            if let Err(e) = std::io::copy(&mut dec, &mut file) {
                // A damaged archive (or a read error): what was decompressed is kept, as a torn
                // segment would be; the file is named as unreadable.
                skips.file(
                    &f,
                    FileSkip::Unreadable,
                    format!("cannot decompress: {}", reason(&e)),
                );
            }
            #[cfg(test)]
            STAGED.with(|c| c.set(c.get() + 1));
            out.push(StagedSegment {
                stream_dir: dir,
                origin: f,
            });
        }
    }
    Ok(out)
}

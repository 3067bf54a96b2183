//! Archives made readable once: an agent archive's `raw/<job>/<host>/<pid>/seg-N.cis.zst` are
//! decompressed into a scratch tree `<job>/<host>/<pid>/seg-N.cis`, which the same exactly-once
//! cursors as for live segment directories then read.

use std::path::{Path, PathBuf};

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
/// (none: `root` holds no archive, read it as it is).
pub fn stage_archive(root: &Path, dest: &Path) -> std::io::Result<Vec<StagedSegment>> {
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
            let mut dec = zstd::stream::read::Decoder::new(std::fs::File::open(&f)?)?;
            let mut to = std::fs::File::create(dir.join(seg))?;
            std::io::copy(&mut dec, &mut to)?;
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

//! Taking a stream's segments in order: one listing of its directory, used up segment by
//! segment (a listing per segment made long streams quadratic), each file opened as files from
//! a job user's directory are ([`comminsight_wire::fsafe`]), refusals counted and kept.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use comminsight_wire::fsafe::{self, OpenError, Owner};

use super::{Current, SealedSegment, StreamCursor, DIR_MTIME_MARGIN};
use crate::sources::disk::{list_segments, seg_path};
use crate::sources::SourceError;

/// Refusals a cursor keeps with their reason (all are counted).
pub(crate) const MAX_REFUSALS_KEPT: usize = 100;

/// Open segment `index` of `dir` as files from a job user's directory are opened
/// ([`comminsight_wire::fsafe::open_below`], [`crate::sources::SEGMENT_DEPTH`] components checked).
fn open_segment(dir: &Path, index: u64, open: bool, who: Owner) -> Result<File, OpenError> {
    fsafe::open_below(
        &seg_path(dir, index, open),
        crate::sources::SEGMENT_DEPTH,
        who,
    )
}

impl StreamCursor {
    pub(super) fn sealed(&self, index: u64, path: PathBuf, abandoned: bool) -> SealedSegment {
        SealedSegment {
            id: self.id.clone(),
            index,
            path,
            abandoned,
            recovered: Vec::new(),
        }
    }

    /// Segment `index` failed the safety checks: never read, counted, warned once.
    fn refuse(&mut self, index: u64, path: PathBuf, reason: String) {
        self.refused_idx.insert(index);
        self.stats.refused_files += 1;
        tracing::warn!(stream = %self.id, file = %path.display(), "segment refused: {reason}; it is not read or archived (segments are regular files owned by the owner of their process directory)");
        if self.refused.len() < MAX_REFUSALS_KEPT {
            self.refused.push((path, reason));
        }
    }

    /// Open the segment to read next; false when there is none.
    pub(super) fn open_next(&mut self, dir: &Path, now: Instant) -> Result<bool, SourceError> {
        if self.open_listed(dir, now)? {
            return Ok(true);
        }
        let mtime = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
        if mtime.is_some() && mtime == self.dir_seen {
            return Ok(false);
        }
        let list = match list_segments(dir) {
            Ok(l) => l,
            Err(e) => {
                if !self.reported {
                    self.reported = true;
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot list segments; check the agent's permissions");
                }
                return Ok(false);
            }
        };
        // Final segments already read in an earlier life (resume) and not yet archived.
        let done_upto = match (self.pos_index, self.pos_done) {
            (Some(i), true) => Some(i),
            (Some(i), false) => i.checked_sub(1),
            (None, _) => None,
        };
        let floor = self.acked.max(self.offered);
        if let Some(d) = done_upto {
            for (&i, &open) in list.range(..=d) {
                if floor.is_none_or(|f| i > f) && !self.finals.contains_key(&i) {
                    self.finals
                        .insert(i, self.sealed(i, seg_path(dir, i, open), open));
                }
            }
        }
        self.listed = list;
        if self.open_listed(dir, now)? {
            return Ok(true);
        }
        // Timestamps are coarse (a few ms): trust only an mtime well before this listing.
        self.dir_seen = mtime.filter(|m| m.elapsed().is_ok_and(|a| a > DIR_MTIME_MARGIN));
        Ok(false)
    }

    /// Open the first segment of the last listing after the position; false when it has none.
    /// Entries that are gone (retention) or refused are dropped from the listing.
    fn open_listed(&mut self, dir: &Path, now: Instant) -> Result<bool, SourceError> {
        loop {
            let next = match (self.pos_index, self.pos_done) {
                (Some(i), false) => self.listed.range(i..).next(),
                (Some(i), true) => self.listed.range(i + 1..).next(),
                (None, _) => self.listed.iter().next(),
            };
            let Some((&i, &open)) = next else {
                return Ok(false);
            };
            if self.refused_idx.contains(&i) {
                self.listed.remove(&i);
                continue;
            }
            let who = self.owner.map_or(Owner::OfDir, Owner::Uid);
            let opened = open_segment(dir, i, open, who)
                .map(|f| (f, open))
                .or_else(|e| match e {
                    e if e.is_not_found() && open => {
                        open_segment(dir, i, false, who).map(|f| (f, false))
                    }
                    e => Err(e),
                });
            let (file, open) = match opened {
                Ok(x) => x,
                Err(e) if e.is_not_found() => {
                    self.listed.remove(&i); // retention
                    continue;
                }
                Err(OpenError::Refused { path, reason }) => {
                    self.listed.remove(&i);
                    self.refuse(i, path, reason);
                    continue;
                }
                Err(OpenError::Io { path, source }) => {
                    return Err(SourceError::Read { path, source })
                }
            };
            if self.pos_index != Some(i) || self.pos_done {
                self.pos_index = Some(i);
                self.pos_offset = 0;
                self.pos_done = false;
            }
            // An unchanged file counts as quiet since its mtime (an agent restarted after its
            // writer died need not wait `stale_after` again).
            let (last_size, age) = file.metadata().map_or((u64::MAX, None), |m| {
                let age = m.modified().ok().and_then(|t| t.elapsed().ok());
                (m.len(), age)
            });
            self.cur = Some(Current {
                index: i,
                file,
                open,
                last_size,
                last_change: age.and_then(|a| now.checked_sub(a)).unwrap_or(now),
            });
            return Ok(true);
        }
    }
}

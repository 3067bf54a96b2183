//! The ring half of [`StreamCursor`]: attaching, epoch matching, following, and finalising
//! streams whose writer is gone.

use std::path::Path;
use std::time::{Duration, Instant};

use comminsight_wire::record::{Kind, RawRecord, FLAG_REPEAT, RECORD_SIZE};

use super::{Progress, StreamCursor, DISK_GRACE, RING_EPOCH_SLACK_NS};

/// Records of read buffer a cursor keeps between polls (64 KiB each).
const RING_BUF_KEPT: usize = 512;
use crate::sources::disk::{flags, header_ok, list_segments, pid_alive, seg_path, Ring};

impl StreamCursor {
    /// Records the ring holds beyond a seq gap may still reach the disk: it grew within
    /// [`DISK_GRACE`], or the writer process lives and the disk grew within `stale_after`.
    fn disk_may_catch_up(&self, now: Instant) -> bool {
        let since = |d: Duration| {
            self.last_disk_progress
                .is_some_and(|t| now.saturating_duration_since(t) < d)
        };
        self.seg_dir.is_some()
            && (since(DISK_GRACE)
                || (since(self.stale_after) && pid_alive(&self.proc_root, &self.id.pid)))
    }

    /// Attach (or re-attach) the ring and decide whether it belongs to the current epoch.
    fn ring_ready(&mut self, now: Instant) -> bool {
        let Some(path) = self.ring_path.clone() else {
            return false;
        };
        let ino = std::fs::metadata(&path)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        if ino.is_none() || ino == self.done_ino {
            // Unlinked at normal exit (the plugin drained it to disk first), or recovered.
            self.ring = None;
            return false;
        }
        if self.ring.as_ref().is_none_or(|r| Some(r.ino) != ino) {
            match Ring::attach(&path, now) {
                Ok(Some(r)) => self.attached(r),
                Ok(None) => return false,
                Err(e) => {
                    if !self.reported {
                        self.reported = true;
                        tracing::warn!(stream = %self.id, error = %e, "cannot follow the ring");
                    }
                    return false;
                }
            }
        }
        let (ek, ds, has_dir) = (self.epoch_key, self.disk_seq, self.seg_dir.is_some());
        let r = self.ring.as_mut().expect("attached");
        if r.matched.is_none() || r.matched_for != ek {
            r.matched_for = ek;
            r.matched = Some(match (r.key, ek) {
                _ if !has_dir => true,
                (Some(rk), Some(ek)) => rk == ek,
                (_, None) => ds.is_none(),
                (None, Some(ek)) => {
                    r.created_real_ns <= ek.real_ns.saturating_add(RING_EPOCH_SLACK_NS)
                        && r.reader.header().pushed > ds.unwrap_or(0)
                }
            });
        }
        let pushed = r.reader.header().pushed;
        if pushed != r.last_pushed {
            r.last_pushed = pushed;
            r.last_change = now;
        }
        r.matched == Some(true)
    }

    /// A ring was attached. Without segments, the ring alone tells a new seq space: another
    /// `proc_start` at seq 0, or another ring file in this cursor's life.
    fn attached(&mut self, r: Ring) {
        if self.seg_dir.is_none() {
            let other_key = matches!((r.key, self.epoch_key), (Some(a), Some(b)) if a != b);
            if other_key || (self.ring_seen && r.key.is_none()) {
                self.epoch += 1;
                self.stats.epochs += 1;
                self.last_seq = None;
            }
            if r.key.is_some() {
                self.epoch_key = r.key;
            }
        }
        self.ring_seen = true;
        self.ring = Some(r);
    }

    pub(super) fn poll_ring(
        &mut self,
        out: &mut Vec<RawRecord>,
        max: usize,
        now: Instant,
    ) -> usize {
        if self.ring_unlinked() {
            // Unlinked at exit: the plugin drained it to its segments first, unless its segment
            // writer had stopped (a full disk). What the mapping still holds past the delivered
            // seq is read once more, contiguous records only (as while it was followed), then
            // the ring is let go.
            let (n, full) = self.read_ring(out, max, now, Some(true));
            if !full {
                self.ring = None;
            }
            return n;
        }
        if !self.ring_ready(now) {
            return 0;
        }
        self.read_ring(out, max, now, None).0
    }

    /// The followed (matched) ring's file is gone: its process unlinked it at exit (discovery
    /// may have noticed first: `set_ring(None)` keeps such a ring for this).
    fn ring_unlinked(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| r.matched == Some(true))
            && self
                .ring_path
                .as_ref()
                .is_none_or(|p| std::fs::metadata(p).is_err())
    }

    /// Deliver up to `max` new ring records; whether `max` were read (more may follow).
    /// `strict`: only contiguous seqs (`None`: while the disk may still catch up).
    fn read_ring(
        &mut self,
        out: &mut Vec<RawRecord>,
        max: usize,
        now: Instant,
        mut strict: Option<bool>,
    ) -> (usize, bool) {
        let mut recs = std::mem::take(&mut self.ring_buf);
        recs.clear();
        let r = self.ring.as_mut().expect("ready");
        let full = r.reader.read_into(&mut recs, max).records >= max;
        let mut n = 0;
        for raw in recs.drain(..) {
            if !header_ok(&raw) {
                self.stats.corrupt += 1;
                continue;
            }
            let seq = raw.seq();
            if self.last_seq.is_some_and(|l| seq <= l)
                || raw.kind_byte() == Kind::Segment as u8
                || flags(&raw) & FLAG_REPEAT != 0
            {
                continue;
            }
            if seq != self.last_seq.map_or(0, |l| l + 1)
                && *strict.get_or_insert_with(|| self.disk_may_catch_up(now))
            {
                continue; // skipped by a lap: the disk delivers it
            }
            self.deliver(raw, out, true);
            n += 1;
        }
        // A full batch is 8 MiB: a follower of many rings keeps a small buffer each, not that.
        recs.shrink_to(RING_BUF_KEPT);
        self.ring_buf = recs;
        if self.ring.as_ref().is_some_and(|r| r.reader.truncated()) {
            self.let_truncated_ring_go();
        }
        (n, full)
    }

    /// The ring's owner truncated it while it was mapped: what was copied before stands, the
    /// rest of the stream comes from its segments. The same file is never attached again (a
    /// new file at the path is, after its checks).
    fn let_truncated_ring_go(&mut self) {
        self.stats.rings_truncated += 1;
        tracing::warn!(
            stream = %self.id,
            ring = ?self.ring_path,
            "the ring was truncated by its owner while mapped; following the stream's segments only"
        );
        self.finish_ring();
    }

    /// Finalise an `.open` segment whose writer is gone, and a ring whose writer is gone.
    pub(super) fn check_abandon(
        &mut self,
        out: &mut Vec<RawRecord>,
        now: Instant,
        p: &mut Progress,
    ) {
        let stale = |t: Instant| now.saturating_duration_since(t) >= self.stale_after;
        let ring_quiet = self.ring.as_ref().is_none_or(|r| stale(r.last_change));
        let cur_stale = self
            .cur
            .as_ref()
            .filter(|c| c.open)
            .map(|c| stale(c.last_change));
        let writer_gone = || !pid_alive(&self.proc_root, &self.id.pid);
        match cur_stale {
            Some(true) => {
                let dir = self.seg_dir.clone().expect("segments");
                let index = self.cur.as_ref().expect("current").index;
                let moved_on = list_segments(&dir)
                    .map(|l| l.range(index + 1..).next().is_some())
                    .unwrap_or(false);
                if moved_on || (ring_quiet && writer_gone()) {
                    self.abandon(&dir, index, !moved_on, out, p);
                }
            }
            Some(false) => {}
            None => {
                // No open segment: a ring-only or segment-less stream whose writer died.
                if self.ring.is_some() && ring_quiet && writer_gone() {
                    self.recover_ring(out, p);
                    self.finish_ring();
                }
            }
        }
    }

    fn abandon(
        &mut self,
        dir: &Path,
        index: u64,
        last: bool,
        out: &mut Vec<RawRecord>,
        p: &mut Progress,
    ) {
        let cur = self.cur.take().expect("current");
        self.stats.torn_bytes += cur.last_size % RECORD_SIZE as u64;
        let mut seg = self.sealed(index, seg_path(dir, index, true), true);
        if last {
            seg.recovered = self.recover_ring(out, p);
            self.finish_ring();
        }
        tracing::info!(stream = %self.id, index, recovered = seg.recovered.len(), "unsealed segment abandoned by its writer");
        self.finals.insert(index, seg);
        self.pos_done = true;
    }

    /// The ring's writer is gone and its records were recovered: never read it again.
    fn finish_ring(&mut self) {
        if let Some(r) = self.ring.take() {
            self.done_ino = Some(r.ino);
        }
    }

    /// The ring's records of the current epoch that are not on disk; those not yet delivered
    /// are delivered now.
    fn recover_ring(&mut self, out: &mut Vec<RawRecord>, p: &mut Progress) -> Vec<RawRecord> {
        let matched = self.ring.as_ref().is_some_and(|r| r.matched == Some(true));
        let Some(path) = self.ring_path.clone().filter(|_| matched) else {
            return Vec::new();
        };
        let Ok(mut reader) = super::super::disk::open_ring(&path) else {
            return Vec::new();
        };
        let mut all = Vec::new();
        while reader.read_into(&mut all, 1 << 16).records > 0 {}
        let recovered: Vec<RawRecord> = all
            .into_iter()
            .filter(|r| header_ok(r) && self.disk_seq.is_none_or(|d| r.seq() > d))
            .filter(|r| flags(r) & FLAG_REPEAT == 0 && r.kind_byte() != Kind::Segment as u8)
            .collect();
        for raw in &recovered {
            if self.last_seq.is_none_or(|l| raw.seq() > l) {
                self.deliver(*raw, out, true);
                p.from_ring += 1;
            }
        }
        recovered
    }
}

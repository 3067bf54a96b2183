//! The MoE expert-parallel wait counters a process pushes into its own stream (issue 21): the
//! C entry point `comminsight_ep_stats_push` ([`crate`]'s `lib.rs`) hands one rank's row for
//! one (phase, window) here; it becomes `ceil(n / 5)` `ep_stats` records
//! ([`comminsight_wire::moe::EpStats::split`]) pushed to the ring without blocking. Called by the
//! Python reporter (`preload/python/comminsight_moe`) once per phase and window, not per
//! collective, so the split's small allocation is off any hot path.
//!
//! The C layout is [`CiEpRow`] (version [`EP_ABI_VERSION`]); `plugin/README.md` and
//! `docs/contracts.md` ("EP wait records") document it.

use std::sync::atomic::Ordering;

use comminsight_wire::moe::{ep_flags, ep_phase, ep_source, EpStats, MAX_EP_SIZE};
use comminsight_wire::record::Body;

use crate::core::Shared;

/// The version of [`CiEpRow`] and of the entry point's contract
/// (`comminsight_ep_abi_version()`).
pub const EP_ABI_VERSION: u32 = 1;

/// Return codes of `comminsight_ep_stats_push` below zero.
pub mod code {
    /// The plugin has no ring yet (before NCCL's first `init`) or any more (after the last
    /// `finalize`): keep the row and try again later.
    pub const NOT_RUNNING: i32 = -1;
    /// A NULL pointer, a `size` / `version` this build does not know, or a field out of range.
    pub const BAD_ARGS: i32 = -2;
    /// A panic was caught (counted in the plugin's `panics`).
    pub const INTERNAL: i32 = -3;
}

/// `struct ci_ep_row` (version 1, 72 bytes): the head of one rank's row; the values travel as a
/// separate `const uint64_t*` of `n` = the EP size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CiEpRow {
    /// `sizeof(struct ci_ep_row)` as the caller compiled it (72 for version 1).
    pub size: u32,
    /// [`EP_ABI_VERSION`] the caller was written for.
    pub version: u32,
    pub ep_group_id: u64,
    /// DeepXTrace's instance id (16 UUID bytes).
    pub instance: [u8; 16],
    pub window_seq: u64,
    /// The window, host CLOCK_REALTIME ns.
    pub t_start_ns: u64,
    pub t_end_ns: u64,
    /// Calls in the window.
    pub steps: u32,
    /// ns per unit as an f32's bits; 0 = none.
    pub scale_bits: u32,
    /// The writer's rank in the EP group (< n).
    pub rank: u16,
    /// 0 dispatch, 1 combine.
    pub phase: u8,
    /// 1 DeepEP low-latency, 2 Ascend MC2.
    pub source: u8,
    /// 1 cumulative, 2 MC2 hierarchical.
    pub ep_flags: u8,
    pub reserved: [u8; 3],
}

const _: () = assert!(core::mem::size_of::<CiEpRow>() == 72);
const _: () = assert!(core::mem::offset_of!(CiEpRow, rank) == 64);

/// Why a row was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EpError {
    #[error("ci_ep_row size {size} / version {version} not supported (want {want_size} / {EP_ABI_VERSION})", want_size = core::mem::size_of::<CiEpRow>())]
    Abi { size: u32, version: u32 },
    #[error("ep size {n} out of 1..={MAX_EP_SIZE}")]
    Size { n: usize },
    #[error("rank {rank} not below the ep size {n}")]
    Rank { rank: u16, n: usize },
    #[error("phase {phase}, source {src} or flags {flags:#x} unknown")]
    Field { phase: u8, src: u8, flags: u8 },
    #[error("window ends ({end}) before it starts ({start})")]
    Window { start: u64, end: u64 },
}

/// The `ep_stats` head of a valid row of `n` values.
pub fn head_of(row: &CiEpRow, n: usize) -> Result<EpStats, EpError> {
    if row.size as usize != core::mem::size_of::<CiEpRow>() || row.version != EP_ABI_VERSION {
        return Err(EpError::Abi {
            size: row.size,
            version: row.version,
        });
    }
    if n == 0 || n > usize::from(MAX_EP_SIZE) {
        return Err(EpError::Size { n });
    }
    if usize::from(row.rank) >= n {
        return Err(EpError::Rank { rank: row.rank, n });
    }
    let known_flags = ep_flags::CUMULATIVE | ep_flags::HIERARCHICAL;
    if row.phase > ep_phase::COMBINE
        || !matches!(row.source, ep_source::DEEPEP_LL | ep_source::MC2)
        || row.ep_flags & !known_flags != 0
    {
        return Err(EpError::Field {
            phase: row.phase,
            src: row.source,
            flags: row.ep_flags,
        });
    }
    if row.t_end_ns < row.t_start_ns {
        return Err(EpError::Window {
            start: row.t_start_ns,
            end: row.t_end_ns,
        });
    }
    Ok(EpStats {
        ep_group_id: row.ep_group_id,
        instance: row.instance,
        window_seq: row.window_seq,
        t_start_ns: row.t_start_ns,
        t_end_ns: row.t_end_ns,
        steps: row.steps,
        scale_bits: row.scale_bits,
        ep_size: n as u16,
        rank: row.rank,
        phase: row.phase,
        source: row.source,
        ep_flags: row.ep_flags,
        ..EpStats::default()
    })
}

/// Push one row: the records that went in (a full ring drops the rest, counted by the ring), or
/// the reason it was refused (counted in `events_ignored`).
pub fn push_row(sh: &Shared, row: &CiEpRow, values: &[u64]) -> Result<usize, EpError> {
    let head = head_of(row, values.len()).inspect_err(|_| {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
    })?;
    Ok(EpStats::split(&head, values)
        .into_iter()
        .map(|r| sh.push_body(Body::EpStats(r), 0))
        .filter(|ok| *ok)
        .count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fixture, records, small_cfg};
    use comminsight_wire::record::RawRecord;

    fn row(rank: u16) -> CiEpRow {
        CiEpRow {
            size: core::mem::size_of::<CiEpRow>() as u32,
            version: EP_ABI_VERSION,
            ep_group_id: 0xe9,
            instance: [7; 16],
            window_seq: 3,
            t_start_ns: 10,
            t_end_ns: 20,
            steps: 4,
            rank,
            phase: ep_phase::COMBINE,
            source: ep_source::MC2,
            ep_flags: ep_flags::HIERARCHICAL,
            ..CiEpRow::default()
        }
    }

    fn ep_records(ring: &comminsight_wire::ring::ShmRing) -> Vec<EpStats> {
        records(ring)
            .into_iter()
            .filter_map(|r| match r.body {
                Body::EpStats(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_row_of_sixteen_becomes_four_records_with_the_head_and_values() {
        let (sh, ring) = fixture(small_cfg());
        let v: Vec<u64> = (100..116).collect();
        assert_eq!(push_row(sh, &row(5), &v), Ok(4));
        let got = ep_records(&ring);
        assert_eq!(got.len(), 4);
        assert_eq!((got[3].first, got[3].count, got[3].ep_size), (15, 1, 16));
        assert_eq!(got[0].values, [100, 101, 102, 103, 104]);
        assert!(got.iter().all(|e| e.rank == 5
            && e.window_seq == 3
            && (e.t_start_ns, e.t_end_ns, e.steps) == (10, 20, 4)
            && e.phase == ep_phase::COMBINE
            && e.source == ep_source::MC2
            && e.ep_flags == ep_flags::HIERARCHICAL
            && e.instance == [7; 16]));
    }

    #[test]
    fn bad_rows_are_refused_and_counted() {
        let (sh, ring) = fixture(small_cfg());
        let before = sh.counters.events_ignored.load(Ordering::Relaxed);
        let v = [1u64; 4];
        assert_eq!(
            push_row(sh, &row(4), &v),
            Err(EpError::Rank { rank: 4, n: 4 })
        );
        let mut r = row(0);
        r.version = 2;
        assert!(matches!(push_row(sh, &r, &v), Err(EpError::Abi { .. })));
        let mut r = row(0);
        r.size = 64;
        assert!(matches!(push_row(sh, &r, &v), Err(EpError::Abi { .. })));
        let mut r = row(0);
        r.source = 9;
        assert!(matches!(push_row(sh, &r, &v), Err(EpError::Field { .. })));
        let mut r = row(0);
        r.ep_flags = 4;
        assert!(matches!(push_row(sh, &r, &v), Err(EpError::Field { .. })));
        assert_eq!(push_row(sh, &row(0), &[]), Err(EpError::Size { n: 0 }));
        let big = vec![0u64; usize::from(MAX_EP_SIZE) + 1];
        assert!(matches!(
            push_row(sh, &row(0), &big),
            Err(EpError::Size { .. })
        ));
        let mut r = row(0);
        r.t_end_ns = 1;
        assert!(matches!(push_row(sh, &r, &v), Err(EpError::Window { .. })));
        assert_eq!(
            sh.counters.events_ignored.load(Ordering::Relaxed),
            before + 8
        );
        assert!(ep_records(&ring).is_empty());
    }

    #[test]
    fn a_full_ring_takes_what_fits_and_counts_the_rest() {
        let (sh, ring) = fixture(small_cfg());
        let mut n = 0;
        while ring.push(&RawRecord::ZERO) {
            n += 1;
        }
        // Two slots free: a row of 16 (4 records) puts 2 in, the ring counts 2 drops.
        let mut out = Vec::new();
        ring.pop_into(&mut out, 2);
        let drops = ring.drops();
        assert_eq!(push_row(sh, &row(1), &[9u64; 16]), Ok(2));
        assert_eq!(ring.drops(), drops + 2);
        assert!(n > 0);
    }
}

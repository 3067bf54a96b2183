//! EP windows end to end offline: `ep_stats` records in rank segments -> rows (parts joined in
//! any order, counters decoded) -> windows -> the detector, and a window a rank never
//! reported.

use std::path::Path;

use comminsight_wire::moe::{ep_flags, ep_phase, ep_source, EpStats};
use comminsight_wire::record::{Body, ProcStart, Record, SegmentHeader};
use comminsight_wire::RECORD_SIZE;

use super::MoeConfig;
use crate::offline::moe::windows;
use crate::offline::Input;
use crate::util::fs::ScratchDir;

const T0: u64 = 1_764_900_000_000_000_000;
const WINDOW_NS: u64 = 20_000_000_000;

/// Write `bodies` as one segment of process `pid` of `job`.
fn write_rank(root: &Path, job: &str, pid: u32, rank: i32, bodies: Vec<Body>) {
    let dir = root.join(job).join("h0").join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut recs = vec![
        Body::Segment(SegmentHeader {
            format: 1,
            record_size: RECORD_SIZE as u32,
            segment_index: 0,
            pid,
            source: 0,
            created_real_ns: T0,
            created_mono_ns: 1_000,
        }),
        Body::ProcStart(ProcStart {
            pid,
            rank,
            local_rank: rank,
            world_size: 16,
            mono_ns: 1_000,
            real_ns: T0,
            abi_version: 5,
            host: "h0".into(),
            job: job.into(),
        }),
    ];
    recs.extend(bodies);
    let bytes = Record::encode_numbered(recs);
    std::fs::write(dir.join("seg-000000.cis"), bytes).unwrap();
}

/// The spec's base cell (`100 (100 + ((3i + 5j) mod 11))`).
fn base(i: usize, j: usize) -> u64 {
    100 * (100 + ((3 * i + 5 * j) % 11) as u64)
}

/// Rank `rank`'s records for window `w` with row `values`, parts in reverse order.
fn row_records(rank: usize, w: u64, values: &[u64], source: u8, flags: u8) -> Vec<Body> {
    let head = EpStats {
        ep_group_id: 0xe9,
        instance: [0x5a; 16],
        window_seq: w,
        t_start_ns: T0 + w * WINDOW_NS,
        t_end_ns: T0 + (w + 1) * WINDOW_NS,
        steps: 100,
        rank: rank as u16,
        phase: ep_phase::DISPATCH,
        source,
        ep_flags: flags,
        ..EpStats::default()
    };
    let mut parts = EpStats::split(&head, values);
    parts.reverse();
    parts.into_iter().map(Body::EpStats).collect()
}

#[test]
fn a_late_sender_and_a_rank_that_stopped_reporting_deepep() {
    let dir = ScratchDir::new("moe-deepep");
    // Window 0 healthy; window 1: rank 2 sends late (everyone waits 1e7 more on it); window 2:
    // rank 7 never reports.
    for rank in 0..16usize {
        let mut bodies = Vec::new();
        for w in 0..3u64 {
            if w == 2 && rank == 7 {
                continue;
            }
            let v: Vec<u64> = (0..16)
                .map(|j| {
                    base(rank, j)
                        + if w == 1 && j == 2 && rank != 2 {
                            10_000_000
                        } else {
                            0
                        }
                })
                .collect();
            bodies.extend(row_records(rank, w, &v, ep_source::DEEPEP_LL, 0));
        }
        write_rank(dir.path(), "moe", 100 + rank as u32, rank as i32, bodies);
    }
    let input = Input::open(dir.path()).unwrap();
    let r = windows(&input, &MoeConfig::default(), None);
    assert_eq!((r.refused, r.dropped), (0, 0));
    let ev: Vec<_> = r.windows.iter().map(|w| &w.event).collect();
    assert_eq!(ev.len(), 3, "{ev:#?}");
    assert!(ev[0].findings.is_empty() && ev[0].incomplete_window.is_none());
    assert_eq!(ev[1].window_seq, 1);
    let j = serde_json::to_value(ev[1]).unwrap();
    assert_eq!(j["findings"].as_array().unwrap().len(), 1, "{j:#}");
    assert_eq!(j["findings"][0]["kind"], "sender_slow");
    assert_eq!(j["findings"][0]["rank"], 2);
    // The spec's S2: z = 15.736.
    let z = j["findings"][0]["ratio"].as_f64().unwrap();
    assert_eq!((z * 1000.0).round() / 1000.0, 15.736);
    assert_eq!(
        ev[2].incomplete_window.as_ref().unwrap().missing_rows,
        vec![7]
    );
    assert!(r.windows[2].is_finding() && !r.windows[0].is_finding());
}

#[test]
fn mc2_cumulative_counters_wrap_and_the_hierarchical_zeros_are_excluded() {
    let dir = ScratchDir::new("moe-mc2");
    // Cumulative low-32-bit µs counters starting just below 2^32: window 0 is the baseline,
    // windows 1 and 2 wrap; the hierarchical 2 x 8 layout leaves structural zeros.
    let cell = |i: usize, j: usize| -> u64 {
        if i / 8 == j / 8 {
            base(i, j)
        } else if i % 8 == j % 8 {
            4 * base(i, j)
        } else {
            0
        }
    };
    for rank in 0..16usize {
        let mut bodies = Vec::new();
        for w in 0..3u64 {
            // The high word is garbage MC2 never writes.
            let v: Vec<u64> = (0..16)
                .map(|j| {
                    0xdead_0000_0000_0000
                        | (0xffff_ff00u64.wrapping_add(w * cell(rank, j)) & 0xffff_ffff)
                })
                .collect();
            let flags = ep_flags::CUMULATIVE | ep_flags::HIERARCHICAL;
            bodies.extend(row_records(rank, w, &v, ep_source::MC2, flags));
        }
        write_rank(dir.path(), "mc2", 200 + rank as u32, rank as i32, bodies);
    }
    let input = Input::open(dir.path()).unwrap();
    let r = windows(&input, &MoeConfig::default(), None);
    assert_eq!(r.windows.len(), 2, "window 0 is the baseline");
    for w in &r.windows {
        let m = w.matrix.as_ref().unwrap();
        assert_eq!(m.get(0, 8), cell(0, 8) as f64, "the wrap is differenced");
        assert_eq!(m.get(0, 9), 0.0);
        assert!(
            !w.is_finding(),
            "auto zero exclusion: no false points: {:?}",
            w.event
        );
    }
    // DeepXTrace's default (zeros included) makes the 16 false points of the spec's S7.
    let off = MoeConfig {
        exclude_zeros: "off".into(),
        ..MoeConfig::default()
    };
    let r = windows(&input, &off, None);
    assert_eq!(r.windows[0].event.findings.len(), 16);
}

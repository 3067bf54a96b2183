//! The scenario table of the spec (§5.6, S1–S10) in compat mode, to 3 decimals, and what each
//! extension changes.

use super::*;

/// The spec's base: `M_ij = 100 (100 + ((3i + 5j) mod 11))` (µs over 100 steps).
fn base(n: usize) -> WaitMatrix {
    WaitMatrix::from_fn(n, |i, j| 100.0 * (100.0 + ((3 * i + 5 * j) % 11) as f64))
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn compat(m: &WaitMatrix) -> Detection {
    detect(m, &DetectConfig::default(), 100)
}

fn ranks(v: &[AxisFinding]) -> Vec<usize> {
    v.iter().map(|f| f.rank).collect()
}

#[test]
fn s1_base_only_flags_nothing() {
    let d = compat(&base(16));
    assert!(d.is_empty(), "{d:?}");
    assert_eq!((r3(d.max_col_ratio), r3(d.max_row_ratio)), (1.004, 1.005));
}

#[test]
fn s2_a_late_sender_is_its_column_and_its_cells_are_suppressed() {
    let mut m = base(16);
    for i in (0..16).filter(|i| *i != 2) {
        m.add(i, 2, 1e7);
    }
    let d = compat(&m);
    assert_eq!(ranks(&d.senders), [2]);
    assert_eq!(r3(d.senders[0].ratio), 15.736);
    assert!(d.receivers.is_empty() && d.paths.is_empty(), "{d:?}");
}

#[test]
fn s3_a_receiver_waiting_on_everyone_is_its_row() {
    let mut m = base(16);
    for j in (0..16).filter(|j| *j != 5) {
        m.add(5, j, 5e5);
    }
    let d = compat(&m);
    assert_eq!(ranks(&d.receivers), [5]);
    assert_eq!(r3(d.receivers[0].ratio), 12.043);
    assert!(d.senders.is_empty() && d.paths.is_empty(), "{d:?}");
}

#[test]
fn s4_a_slow_path_is_its_cell() {
    let mut m = base(16);
    m.add(3, 9, 2e5);
    let d = compat(&m);
    assert_eq!(d.paths.len(), 1, "{d:?}");
    assert_eq!((d.paths[0].waiter, d.paths[0].peer), (3, 9));
    assert_eq!(r3(d.paths[0].ratio), 18.704);
    assert!(d.senders.is_empty() && d.receivers.is_empty());
    // "max row and col z ≈ 2.04" (the spec, to 2 decimals).
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    assert_eq!((r2(d.max_col_ratio), r2(d.max_row_ratio)), (2.04, 2.04));
}

#[test]
fn s5_a_severe_path_is_a_row_and_a_column_unless_e3_reclassifies_it() {
    let mut m = base(16);
    m.add(3, 9, 2e6);
    let d = compat(&m);
    assert_eq!(ranks(&d.senders), [9]);
    assert_eq!(ranks(&d.receivers), [3]);
    assert_eq!(
        (r3(d.senders[0].ratio), r3(d.receivers[0].ratio)),
        (7.399, 7.401)
    );
    assert!(d.paths.is_empty(), "the point is suppressed: {d:?}");
    let e3 = DetectConfig {
        path_reclassify: true,
        ..DetectConfig::default()
    };
    let d = detect(&m, &e3, 100);
    assert!(d.senders.is_empty() && d.receivers.is_empty(), "{d:?}");
    assert_eq!(d.paths.len(), 1);
    assert_eq!((d.paths[0].waiter, d.paths[0].peer), (3, 9));
}

fn late_senders(n: usize, slow: &[usize]) -> WaitMatrix {
    let mut m = base(n);
    for &j in slow {
        for i in (0..n).filter(|i| *i != j) {
            m.add(i, j, 1e7);
        }
    }
    m
}

#[test]
fn s6_three_late_senders_of_eight_saturate_the_mean_unless_e4() {
    let m = late_senders(8, &[1, 2, 3]);
    let d = compat(&m);
    assert!(d.is_empty(), "{d:?}");
    assert_eq!(r3(d.max_col_ratio), 2.661);
    let e4 = DetectConfig {
        robust_baseline: true,
        ..DetectConfig::default()
    };
    let d = detect(&m, &e4, 100);
    assert_eq!(ranks(&d.senders), [1, 2, 3]);
    let d = compat(&late_senders(8, &[1, 2]));
    assert_eq!(ranks(&d.senders), [1, 2]);
    assert!(d.senders.iter().all(|s| r3(s.ratio) == 3.986), "{d:?}");
}

/// The MC2 hierarchical 2 × 8 layout: same-server cells at base, the same local index on the
/// other server 4× base, every other cell a structural zero.
fn hierarchical() -> WaitMatrix {
    let b = base(16);
    WaitMatrix::from_fn(16, |i, j| {
        if i / 8 == j / 8 {
            b.get(i, j)
        } else if i % 8 == j % 8 {
            4.0 * b.get(i, j)
        } else {
            0.0
        }
    })
}

#[test]
fn s7_structural_zeros_make_false_points_unless_excluded_or_masked() {
    let m = hierarchical();
    let d = compat(&m);
    assert!(d.senders.is_empty() && d.receivers.is_empty());
    assert_eq!(d.paths.len(), 16, "{d:?}");
    assert!(d
        .paths
        .iter()
        .all(|p| p.waiter % 8 == p.peer % 8 && p.waiter != p.peer));
    let (lo, hi) = d.paths.iter().fold((f64::MAX, 0.0f64), |(a, b), p| {
        (a.min(p.ratio), b.max(p.ratio))
    });
    // "z 5.08 to 5.59" (the spec, to 2 decimals).
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    assert_eq!((r2(lo), r2(hi)), (5.08, 5.59));
    let ez = DetectConfig {
        exclude_zeros: true,
        ..DetectConfig::default()
    };
    assert!(detect(&m, &ez, 100).is_empty());
    // E5: the mask's cells are the baseline: the structural zeros no longer dilute it.
    let e5 = DetectConfig {
        topology_mask: Some(TopologyMask::Hierarchical { per_server: 8 }),
        ..DetectConfig::default()
    };
    let d = detect(&m, &e5, 100);
    assert!(d.is_empty(), "{d:?}");
    assert!(d.mu > compat(&m).mu * 1.5);
}

#[test]
fn s8_a_late_sender_in_the_hierarchical_layout() {
    let mut m = hierarchical();
    for i in (1..8).chain([8]) {
        m.add(i, 0, 1e7);
    }
    for ez in [false, true] {
        let cfg = DetectConfig {
            exclude_zeros: ez,
            ..DetectConfig::default()
        };
        let d = detect(&m, &cfg, 100);
        assert_eq!(ranks(&d.senders), [0], "exclude_zeros {ez}: {d:?}");
        assert_eq!(r3(d.senders[0].ratio), 15.631);
        assert!(d.paths.is_empty() && d.receivers.is_empty(), "{d:?}");
    }
}

#[test]
fn s9_columns_of_three_ranks_are_never_flagged() {
    let mut m = base(3);
    m.add(1, 0, 1e7);
    m.add(2, 0, 1e7);
    let d = compat(&m);
    assert!(d.senders.is_empty() && d.receivers.is_empty(), "{d:?}");
    assert_eq!(r3(d.max_col_ratio), 2.991);
}

#[test]
fn s10_all_zero_is_nothing_and_no_nan() {
    for ez in [false, true] {
        let cfg = DetectConfig {
            exclude_zeros: ez,
            ..DetectConfig::default()
        };
        let d = detect(&WaitMatrix::zeros(16), &cfg, 100);
        assert!(d.is_empty());
        assert!(!d.mu.is_nan() && !d.max_col_ratio.is_nan() && !d.max_row_ratio.is_nan());
    }
}

#[test]
fn e1_min_excess_drops_a_finding_of_an_idle_window() {
    // S2's late sender, but over 1e6 steps the excess per step is 10 µs, under a 1 ms floor.
    let mut m = base(16);
    for i in (0..16).filter(|i| *i != 2) {
        m.add(i, 2, 1e7);
    }
    let e1 = DetectConfig {
        min_excess: Some(1000.0),
        ..DetectConfig::default()
    };
    assert_eq!(
        ranks(&detect(&m, &e1, 100).senders),
        [2],
        "per step well over"
    );
    assert!(detect(&m, &e1, 1_000_000).is_empty(), "per step under");
}

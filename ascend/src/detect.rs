//! The EP slow-rank detector (spec §5.3, §5.4).
//!
//! **Compat** (the default, [`DetectConfig::default`]) is DeepXTrace's `diagnose_matrix`
//! exactly: ratios to the global mean (not z-scores, not medians) with the diagonal and zeros
//! included, strict `>`, points suppressed in flagged rows and columns, zero exclusion for the
//! point baseline only, f64, findings sorted (columns and rows by index, points row-major):
//! * μ = ΣM / N²; c_j = the mean of column j, r_i = the mean of row i (N entries each);
//! * `sender_slow(j)` ⇔ c_j / (mean(c) + 1e-8) > `threshold_col` (3);
//! * `receiver_slow(i)` ⇔ r_i / (mean(r) + 1e-8) > `threshold_row` (3);
//! * `path_slow(j -> i)` ⇔ M_ij / (μ* + 1e-8) > `threshold_point` (5), i not a slow receiver and
//!   j not a slow sender; μ* = μ, or with `exclude_zeros` the mean of the non-zero cells (0 when
//!   there are none).
//!
//! The extensions are ours, **not in DeepXTrace**, each off by default and switched on alone:
//! * E1 [`DetectConfig::min_excess`]: a finding whose excess over its baseline, per step, is
//!   below the floor is dropped (idle windows);
//! * E2 persistence (m of n windows): [`super::persist::Persistence`], over the findings;
//! * E3 [`DetectConfig::path_reclassify`]: a flagged row i and column j whose cell (i, j) holds at
//!   least half of the row's and of the column's sum are one slow path `j -> i`;
//! * E4 [`DetectConfig::robust_baseline`]: columns against the median of the column means, rows
//!   against the median of the row means (no saturation when N/3 or more ranks are slow);
//! * E5 [`DetectConfig::topology_mask`]: means over the cells a known layout can fill only (the
//!   hierarchical 2 × 8 layout's structural zeros leave the baseline alone).

use serde::{Deserialize, Serialize};

use super::matrix::WaitMatrix;

/// DeepXTrace's ε.
const EPS: f64 = 1e-8;

/// Which cells a layout can fill (E5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopologyMask {
    /// Ascend MC2's hierarchical layout (`commAlg="hierarchy"`): servers of `per_server` ranks;
    /// rank i exchanges with every rank of its server and with the same local index on every
    /// other server.
    Hierarchical { per_server: usize },
}

impl TopologyMask {
    /// Whether cell (i, j) can be non-zero.
    pub fn allows(&self, i: usize, j: usize) -> bool {
        match self {
            TopologyMask::Hierarchical { per_server } => {
                let s = (*per_server).max(1);
                i / s == j / s || i % s == j % s
            }
        }
    }
}

/// The detector's settings. `Default` is compat: DeepXTrace's 3 / 3 / 5, zeros included, no
/// extension.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectConfig {
    pub threshold_col: f64,
    pub threshold_row: f64,
    pub threshold_point: f64,
    /// The point baseline is the mean of the non-zero cells (DeepXTrace's
    /// `DEEPEP_DIAGNOSE_EXCLUDING_ZEROS=1`).
    pub exclude_zeros: bool,
    /// E1 (not in DeepXTrace): the smallest excess per step, in the matrix's unit, a finding
    /// needs (`None`: off).
    pub min_excess: Option<f64>,
    /// E3 (not in DeepXTrace).
    pub path_reclassify: bool,
    /// E4 (not in DeepXTrace).
    pub robust_baseline: bool,
    /// E5 (not in DeepXTrace).
    pub topology_mask: Option<TopologyMask>,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            threshold_col: 3.0,
            threshold_row: 3.0,
            threshold_point: 5.0,
            exclude_zeros: false,
            min_excess: None,
            path_reclassify: false,
            robust_baseline: false,
            topology_mask: None,
        }
    }
}

/// An abnormal column or row: the rank, its mean and its ratio to the baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AxisFinding {
    pub rank: usize,
    pub mean: f64,
    pub ratio: f64,
}

/// An abnormal cell: waiter `i`, peer `j` (the path `j -> i`), its value and ratio.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PointFinding {
    pub waiter: usize,
    pub peer: usize,
    pub value: f64,
    pub ratio: f64,
}

/// What one matrix gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    /// μ, the mean of all cells (of the mask's cells with E5).
    pub mu: f64,
    /// Slow senders (abnormal columns).
    pub senders: Vec<AxisFinding>,
    /// Slow receivers (abnormal rows).
    pub receivers: Vec<AxisFinding>,
    /// Slow paths (abnormal cells).
    pub paths: Vec<PointFinding>,
    /// The largest column and row ratios (whether flagged or not).
    pub max_col_ratio: f64,
    pub max_row_ratio: f64,
}

impl Detection {
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty() && self.receivers.is_empty() && self.paths.is_empty()
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The cells the means run over: all, or the mask's (E5).
struct Cells<'a> {
    m: &'a WaitMatrix,
    mask: Option<&'a TopologyMask>,
}

impl Cells<'_> {
    fn counts(&self, i: usize, j: usize) -> bool {
        self.mask.is_none_or(|k| k.allows(i, j))
    }

    fn col(&self, j: usize) -> Vec<f64> {
        (0..self.m.n())
            .filter(|i| self.counts(*i, j))
            .map(|i| self.m.get(i, j))
            .collect()
    }

    fn row(&self, i: usize) -> Vec<f64> {
        (0..self.m.n())
            .filter(|j| self.counts(i, *j))
            .map(|j| self.m.get(i, j))
            .collect()
    }

    fn all(&self) -> Vec<f64> {
        let n = self.m.n();
        (0..n * n)
            .filter(|k| self.counts(k / n, k % n))
            .map(|k| self.m.cells()[k])
            .collect()
    }
}

/// Detect on `m` with `cfg`; `steps` (the window's steps, >= 1) scales E1's floor.
pub fn detect(m: &WaitMatrix, cfg: &DetectConfig, steps: u64) -> Detection {
    let n = m.n();
    let cells = Cells {
        m,
        mask: cfg.topology_mask.as_ref(),
    };
    let all = cells.all();
    let mu = mean(&all);
    let col_means: Vec<f64> = (0..n).map(|j| mean(&cells.col(j))).collect();
    let row_means: Vec<f64> = (0..n).map(|i| mean(&cells.row(i))).collect();
    let (col_base, row_base) = if cfg.robust_baseline {
        (median(&col_means), median(&row_means))
    } else {
        (mean(&col_means), mean(&row_means))
    };
    let point_base = if cfg.exclude_zeros {
        mean(
            &all.iter()
                .copied()
                .filter(|v| *v != 0.0)
                .collect::<Vec<_>>(),
        )
    } else {
        mu
    };
    let excess_ok = |value: f64, base: f64| {
        cfg.min_excess
            .is_none_or(|floor| (value - base) / steps.max(1) as f64 >= floor)
    };
    let axis = |means: &[f64], base: f64, t: f64| -> (Vec<AxisFinding>, f64) {
        let mut max = 0.0f64;
        let mut out = Vec::new();
        for (rank, m) in means.iter().enumerate() {
            let ratio = m / (base + EPS);
            max = max.max(ratio);
            if ratio > t && excess_ok(*m, base) {
                out.push(AxisFinding {
                    rank,
                    mean: *m,
                    ratio,
                });
            }
        }
        (out, max)
    };
    let (mut senders, max_col_ratio) = axis(&col_means, col_base, cfg.threshold_col);
    let (mut receivers, max_row_ratio) = axis(&row_means, row_base, cfg.threshold_row);
    let mut paths = Vec::new();
    for i in 0..n {
        for j in 0..n {
            let v = m.get(i, j);
            let ratio = v / (point_base + EPS);
            let suppressed =
                receivers.iter().any(|r| r.rank == i) || senders.iter().any(|s| s.rank == j);
            if ratio > cfg.threshold_point
                && !suppressed
                && cells.counts(i, j)
                && excess_ok(v, point_base)
            {
                paths.push(PointFinding {
                    waiter: i,
                    peer: j,
                    value: v,
                    ratio,
                });
            }
        }
    }
    if cfg.path_reclassify {
        reclassify(m, &mut senders, &mut receivers, &mut paths, point_base);
    }
    Detection {
        mu,
        senders,
        receivers,
        paths,
        max_col_ratio,
        max_row_ratio,
    }
}

/// E3: a flagged row i and column j whose cell holds half of both sums or more are one slow
/// path `j -> i` (a severe single-path slowdown raises its row and column past the
/// thresholds and suppresses its own point in compat mode).
fn reclassify(
    m: &WaitMatrix,
    senders: &mut Vec<AxisFinding>,
    receivers: &mut Vec<AxisFinding>,
    paths: &mut Vec<PointFinding>,
    point_base: f64,
) {
    let n = m.n() as f64;
    let mut pairs = Vec::new();
    for r in receivers.iter() {
        for s in senders.iter() {
            let v = m.get(r.rank, s.rank);
            if v >= 0.5 * n * r.mean && v >= 0.5 * n * s.mean {
                pairs.push((r.rank, s.rank, v));
            }
        }
    }
    for (i, j, v) in pairs {
        receivers.retain(|r| r.rank != i);
        senders.retain(|s| s.rank != j);
        paths.push(PointFinding {
            waiter: i,
            peer: j,
            value: v,
            ratio: v / (point_base + EPS),
        });
    }
    paths.sort_by_key(|p| (p.waiter, p.peer));
    paths.dedup_by_key(|p| (p.waiter, p.peer));
}

#[cfg(test)]
mod tests;

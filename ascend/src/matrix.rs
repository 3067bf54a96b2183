//! [`WaitMatrix`]: one EP group's wait times over one window. Row `i` is the waiting rank,
//! column `j` the peer it waited for: `M[i][j]` = how long rank `i` waited for data from rank
//! `j` (DeepEP cycles or MC2 µs, summed over the window's calls). An abnormal column is a slow
//! sender, an abnormal row a slow receiver, an abnormal cell a slow path `j -> i`.

use serde::{Deserialize, Serialize};

/// An N×N non-negative matrix, row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitMatrix {
    n: usize,
    cells: Vec<f64>,
}

impl WaitMatrix {
    /// All zero.
    pub fn zeros(n: usize) -> WaitMatrix {
        WaitMatrix {
            n,
            cells: vec![0.0; n * n],
        }
    }

    /// From rows (each of length `rows.len()`); `None` when not square.
    pub fn from_rows(rows: &[Vec<f64>]) -> Option<WaitMatrix> {
        let n = rows.len();
        if rows.iter().any(|r| r.len() != n) {
            return None;
        }
        Some(WaitMatrix {
            n,
            cells: rows.iter().flatten().copied().collect(),
        })
    }

    /// `f(i, j)` for every cell.
    pub fn from_fn(n: usize, f: impl Fn(usize, usize) -> f64) -> WaitMatrix {
        let mut m = WaitMatrix::zeros(n);
        for i in 0..n {
            for j in 0..n {
                m.cells[i * n + j] = f(i, j);
            }
        }
        m
    }

    /// The EP size N.
    pub fn n(&self) -> usize {
        self.n
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.cells[i * self.n + j]
    }

    pub fn set(&mut self, i: usize, j: usize, v: f64) {
        self.cells[i * self.n + j] = v;
    }

    pub fn add(&mut self, i: usize, j: usize, v: f64) {
        self.cells[i * self.n + j] += v;
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f64] {
        &self.cells[i * self.n..(i + 1) * self.n]
    }

    /// Every cell, row-major.
    pub fn cells(&self) -> &[f64] {
        &self.cells
    }

    /// Element-wise sum with `o` (the aggregation over windows); `false` when the sizes differ.
    pub fn accumulate(&mut self, o: &WaitMatrix) -> bool {
        if o.n != self.n {
            return false;
        }
        for (a, b) in self.cells.iter_mut().zip(&o.cells) {
            *a += b;
        }
        true
    }
}

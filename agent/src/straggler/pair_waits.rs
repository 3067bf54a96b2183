//! Fast per-pair bookkeeping of the analysis: the step's wait intervals ordered by pair
//! (counting sort over the dense pair space when it is small enough), and the net waits summed
//! over steps per (cause, victim) (a dense matrix up to [`DENSE_MAX_RANKS`] ranks, else a map
//! with a cheap hasher).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Ranks up to which the per-pair tables are dense (2048² cells).
pub(crate) const DENSE_MAX_RANKS: usize = 2048;

/// One wait interval of a member pair: `key` = `((lo · n + hi) << 1) | d` over the step's dense
/// rank indices, `d = 0` when `hi` makes `lo` wait, `1` when `lo` makes `hi` wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Interval {
    pub key: u64,
    pub start: u64,
    pub end: u64,
}

/// Orders `iv` by (key, start). `n`: the step's ranks (key space `2 n²`); `counts` is scratch
/// reused across steps.
pub(crate) fn sort_intervals(iv: &mut Vec<Interval>, n: usize, counts: &mut Vec<u32>) {
    let space = 2 * n * n;
    if n > DENSE_MAX_RANKS || iv.len() < 4096 || space > 8 * iv.len() + (1 << 20) {
        iv.sort_unstable_by_key(|a| (a.key, a.start));
        return;
    }
    // Counting sort by key, then each key's few intervals by start.
    counts.clear();
    counts.resize(space + 1, 0);
    for x in iv.iter() {
        counts[x.key as usize + 1] += 1;
    }
    for k in 1..counts.len() {
        counts[k] += counts[k - 1];
    }
    let mut out = vec![Interval::default(); iv.len()];
    for x in iv.iter() {
        let at = &mut counts[x.key as usize];
        out[*at as usize] = *x;
        *at += 1;
    }
    let mut k = 0;
    while k < out.len() {
        let mut h = k + 1;
        while h < out.len() && out[h].key == out[k].key {
            h += 1;
        }
        if h - k > 1 {
            out[k..h].sort_unstable_by_key(|a| a.start);
        }
        k = h;
    }
    *iv = out;
}

/// FxHash-like hasher for integer keys.
#[derive(Default)]
pub(crate) struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_isize(&mut self, x: isize) {
        self.write_u64(x as u64);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// Net waits summed over steps: (cause, victim) over the job's dense rank indices ->
/// (µs, steps with a positive net wait).
pub(crate) enum PairSums {
    Dense {
        n: usize,
        wait: Vec<u64>,
        steps: Vec<u32>,
    },
    Sparse {
        n: usize,
        map: HashMap<u64, (u64, u64), BuildHasherDefault<Fx>>,
    },
}

impl PairSums {
    /// Tables for `n` ranks.
    pub fn new(n: usize) -> PairSums {
        if n <= DENSE_MAX_RANKS {
            PairSums::Dense {
                n,
                wait: vec![0; n * n],
                steps: vec![0; n * n],
            }
        } else {
            PairSums::Sparse {
                n,
                map: HashMap::default(),
            }
        }
    }

    /// One step's net wait `w` of `victim` caused by `cause`.
    pub fn add(&mut self, cause: usize, victim: usize, w: u64) {
        match self {
            PairSums::Dense { n, wait, steps } => {
                let i = cause * *n + victim;
                wait[i] += w;
                steps[i] += 1;
            }
            PairSums::Sparse { n, map } => {
                let e = map.entry((cause * *n + victim) as u64).or_default();
                e.0 += w;
                e.1 += 1;
            }
        }
    }

    /// Every (cause, victim, µs, steps) with a positive sum.
    pub fn for_each(&self, mut f: impl FnMut(usize, usize, u64, u64)) {
        match self {
            PairSums::Dense { n, wait, steps } => {
                for (i, (&w, &s)) in wait.iter().zip(steps).enumerate() {
                    if s > 0 {
                        f(i / n, i % n, w, u64::from(s));
                    }
                }
            }
            PairSums::Sparse { n, map } => {
                for (&k, &(w, s)) in map {
                    f(k as usize / n, k as usize % n, w, s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_sort_matches_comparison_sort() {
        let n = 64;
        let mut x = 12345u64;
        let mut iv: Vec<Interval> = (0..20_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = (x >> 20) % (2 * n * n) as u64;
                let start = (x >> 40) % 1000;
                Interval {
                    key,
                    start,
                    end: start + 5,
                }
            })
            .collect();
        let mut want = iv.clone();
        want.sort_unstable_by_key(|a| (a.key, a.start));
        sort_intervals(&mut iv, n, &mut Vec::new());
        let k = |v: &[Interval]| v.iter().map(|a| (a.key, a.start)).collect::<Vec<_>>();
        assert_eq!(k(&iv), k(&want));
    }

    #[test]
    fn dense_and_sparse_sums_agree() {
        let mut d = PairSums::new(3);
        let mut s = PairSums::Sparse {
            n: 3,
            map: HashMap::default(),
        };
        for p in [&mut d, &mut s] {
            p.add(1, 0, 60);
            p.add(1, 0, 40);
            p.add(2, 1, 5);
        }
        let all = |p: &PairSums| {
            let mut v = Vec::new();
            p.for_each(|c, w, us, n| v.push((c, w, us, n)));
            v.sort();
            v
        };
        assert_eq!(all(&d), vec![(1, 0, 100, 2), (2, 1, 5, 1)]);
        assert_eq!(all(&d), all(&s));
    }
}

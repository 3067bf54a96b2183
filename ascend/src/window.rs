//! One window's rows assembled across the EP group (spec §5.2). A window is keyed by
//! `(ep_group_id, instance_id, phase, window_seq)`; producers advance `window_seq` at the same
//! step boundary on every rank (or from a common time origin). A window is analysed only whole:
//! when a rank's row has not come `timeout` after the first row, the window yields
//! [`Assembled::Incomplete`] naming the missing rows — a hang or dead-rank signal — and no
//! detection runs (partial rows would distort the mean). [`Aggregator`] optionally sums the last
//! K windows (K = 1 by default, as DeepXTrace).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::decode::Phase;
use super::matrix::WaitMatrix;

/// A window of one EP group's phase.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WindowKey {
    pub ep_group_id: u64,
    pub instance_id: String,
    pub phase: Phase,
    pub window_seq: u64,
}

/// One rank's decoded row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub rank: u32,
    pub values: Vec<f64>,
    pub steps: u32,
    pub t_start_ns: u64,
    pub t_end_ns: u64,
}

/// What a window became.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Assembled {
    Complete {
        key: WindowKey,
        matrix: WaitMatrix,
        /// The most steps a row covered.
        steps: u64,
        t_start_ns: u64,
        t_end_ns: u64,
    },
    Incomplete {
        key: WindowKey,
        n: u32,
        missing_rows: Vec<u32>,
        t_start_ns: u64,
        t_end_ns: u64,
    },
}

#[derive(Debug)]
struct Pending {
    n: u32,
    first_seen_ns: u64,
    rows: BTreeMap<u32, Row>,
}

/// The assembler. Bounded: [`WindowAssembler::MAX_PENDING`] windows wait at once (the oldest
/// is given up as incomplete), late rows of a finished window are counted and dropped.
#[derive(Debug)]
pub struct WindowAssembler {
    timeout_ns: u64,
    pending: BTreeMap<WindowKey, Pending>,
    finished: VecDeque<WindowKey>,
    finished_set: BTreeSet<WindowKey>,
    /// Rows refused: a finished window's, a size that disagrees with the window's, a rank out
    /// of range, a duplicate.
    pub refused: u64,
}

impl WindowAssembler {
    pub const MAX_PENDING: usize = 4096;
    const MAX_FINISHED: usize = 4096;

    /// Windows wait `timeout_ns` after their first row for the others.
    pub fn new(timeout_ns: u64) -> WindowAssembler {
        WindowAssembler {
            timeout_ns,
            pending: BTreeMap::new(),
            finished: VecDeque::new(),
            finished_set: BTreeSet::new(),
            refused: 0,
        }
    }

    /// Rank `row.rank`'s row of window `key` of an EP group of `n`, seen at `now_ns`; the
    /// window when it is whole (and what the bound gave up).
    pub fn insert(&mut self, key: WindowKey, n: u32, row: Row, now_ns: u64) -> Vec<Assembled> {
        let mut out = Vec::new();
        if self.finished_set.contains(&key) || row.rank >= n || row.values.len() != n as usize {
            self.refused += 1;
            return out;
        }
        if !self.pending.contains_key(&key) && self.pending.len() >= Self::MAX_PENDING {
            if let Some(oldest) = self.oldest() {
                out.extend(self.give_up(&oldest));
            }
        }
        let p = self.pending.entry(key.clone()).or_insert_with(|| Pending {
            n,
            first_seen_ns: now_ns,
            rows: BTreeMap::new(),
        });
        if p.n != n || p.rows.contains_key(&row.rank) {
            self.refused += 1;
            return out;
        }
        p.rows.insert(row.rank, row);
        if p.rows.len() == n as usize {
            if let Some(p) = self.pending.remove(&key) {
                self.finish(&key);
                out.push(complete(key, p));
            }
        }
        out
    }

    /// The windows whose rows did not all come within the timeout, as of `now_ns`.
    pub fn expire(&mut self, now_ns: u64) -> Vec<Assembled> {
        let late: Vec<WindowKey> = self
            .pending
            .iter()
            .filter(|(_, p)| now_ns.saturating_sub(p.first_seen_ns) >= self.timeout_ns)
            .map(|(k, _)| k.clone())
            .collect();
        late.iter().filter_map(|k| self.give_up(k)).collect()
    }

    /// Windows waiting for rows.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn oldest(&self) -> Option<WindowKey> {
        self.pending
            .iter()
            .min_by_key(|(_, p)| p.first_seen_ns)
            .map(|(k, _)| k.clone())
    }

    fn give_up(&mut self, key: &WindowKey) -> Option<Assembled> {
        let p = self.pending.remove(key)?;
        self.finish(key);
        Some(Assembled::Incomplete {
            key: key.clone(),
            n: p.n,
            missing_rows: (0..p.n).filter(|r| !p.rows.contains_key(r)).collect(),
            t_start_ns: p.rows.values().map(|r| r.t_start_ns).min().unwrap_or(0),
            t_end_ns: p.rows.values().map(|r| r.t_end_ns).max().unwrap_or(0),
        })
    }

    fn finish(&mut self, key: &WindowKey) {
        if self.finished.len() >= Self::MAX_FINISHED {
            if let Some(k) = self.finished.pop_front() {
                self.finished_set.remove(&k);
            }
        }
        self.finished.push_back(key.clone());
        self.finished_set.insert(key.clone());
    }
}

fn complete(key: WindowKey, p: Pending) -> Assembled {
    let rows: Vec<Vec<f64>> = p.rows.values().map(|r| r.values.clone()).collect();
    Assembled::Complete {
        key,
        matrix: WaitMatrix::from_rows(&rows).unwrap_or_else(|| WaitMatrix::zeros(p.n as usize)),
        steps: p
            .rows
            .values()
            .map(|r| u64::from(r.steps))
            .max()
            .unwrap_or(0),
        t_start_ns: p.rows.values().map(|r| r.t_start_ns).min().unwrap_or(0),
        t_end_ns: p.rows.values().map(|r| r.t_end_ns).max().unwrap_or(0),
    }
}

type SeriesKey = (u64, String, Phase);

/// The sum of the last `k` whole windows of each EP group's phase.
#[derive(Debug)]
pub struct Aggregator {
    k: usize,
    recent: HashMap<SeriesKey, VecDeque<(WaitMatrix, u64)>>,
}

impl Aggregator {
    pub fn new(k: usize) -> Aggregator {
        Aggregator {
            k: k.max(1),
            recent: HashMap::new(),
        }
    }

    /// Add window `key`'s matrix (over `steps`); the sum of the last K and their steps.
    pub fn push(&mut self, key: &WindowKey, m: &WaitMatrix, steps: u64) -> (WaitMatrix, u64) {
        let q = self
            .recent
            .entry((key.ep_group_id, key.instance_id.clone(), key.phase))
            .or_default();
        if q.back().is_some_and(|(b, _)| b.n() != m.n()) {
            q.clear();
        }
        q.push_back((m.clone(), steps));
        while q.len() > self.k {
            q.pop_front();
        }
        let mut sum = WaitMatrix::zeros(m.n());
        let mut total = 0;
        for (w, s) in q.iter() {
            sum.accumulate(w);
            total += s;
        }
        (sum, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seq: u64) -> WindowKey {
        WindowKey {
            ep_group_id: 1,
            instance_id: "x".into(),
            phase: Phase::Combine,
            window_seq: seq,
        }
    }

    fn row(rank: u32, n: usize, v: f64) -> Row {
        Row {
            rank,
            values: vec![v; n],
            steps: 10,
            t_start_ns: 100 + u64::from(rank),
            t_end_ns: 200 + u64::from(rank),
        }
    }

    #[test]
    fn a_window_is_whole_when_every_rank_reported() {
        let mut a = WindowAssembler::new(1000);
        for r in 0..3 {
            assert!(a.insert(key(0), 4, row(r, 4, f64::from(r)), 5).is_empty());
        }
        let out = a.insert(key(0), 4, row(3, 4, 3.0), 6);
        let Some(Assembled::Complete {
            matrix,
            steps,
            t_start_ns,
            t_end_ns,
            ..
        }) = out.first()
        else {
            panic!("{out:?}")
        };
        assert_eq!((matrix.get(2, 0), matrix.get(3, 3)), (2.0, 3.0));
        assert_eq!((*steps, *t_start_ns, *t_end_ns), (10, 100, 203));
        // A late duplicate of a finished window is refused.
        assert!(a.insert(key(0), 4, row(1, 4, 1.0), 7).is_empty());
        assert_eq!(a.refused, 1);
        assert!(a.expire(10_000).is_empty());
    }

    #[test]
    fn s12_a_missing_row_is_an_incomplete_window_after_the_timeout() {
        let mut a = WindowAssembler::new(1000);
        for r in (0..16).filter(|r| *r != 7) {
            a.insert(key(3), 16, row(r, 16, 1.0), 50);
        }
        assert!(a.expire(1049).is_empty(), "not yet");
        let out = a.expire(1050);
        assert_eq!(out.len(), 1);
        let Assembled::Incomplete {
            missing_rows,
            key: k,
            ..
        } = &out[0]
        else {
            panic!("{out:?}")
        };
        assert_eq!((missing_rows.as_slice(), k.window_seq), (&[7][..], 3));
        assert_eq!(a.pending(), 0);
        // Rank 7's row arriving afterwards changes nothing.
        assert!(a.insert(key(3), 16, row(7, 16, 1.0), 1100).is_empty());
    }

    #[test]
    fn rows_that_disagree_are_refused_and_k_windows_add_up() {
        let mut a = WindowAssembler::new(1000);
        a.insert(key(0), 2, row(0, 2, 1.0), 0);
        a.insert(key(0), 3, row(1, 3, 1.0), 0);
        a.insert(key(0), 2, row(0, 2, 1.0), 0);
        a.insert(key(0), 2, row(5, 2, 1.0), 0);
        assert_eq!(a.refused, 3);
        let mut g = Aggregator::new(2);
        let m = |v| WaitMatrix::from_fn(2, |_, _| v);
        assert_eq!(g.push(&key(0), &m(1.0), 10).0.get(0, 0), 1.0);
        assert_eq!(g.push(&key(1), &m(2.0), 10), (m(3.0), 20));
        assert_eq!(g.push(&key(2), &m(4.0), 10), (m(6.0), 20));
    }
}

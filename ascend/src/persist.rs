//! E2 (not in DeepXTrace): a finding alerts only when it recurs in `m` of the last `n` windows
//! of its EP group's phase (2 of 3 suggested), so one noisy window does not page anybody.

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::decode::Phase;
use super::detect::Detection;

/// What a finding is about, across windows.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FindingKey {
    Sender(usize),
    Receiver(usize),
    Path { waiter: usize, peer: usize },
}

/// The keys of `d`'s findings.
pub fn keys(d: &Detection) -> BTreeSet<FindingKey> {
    d.senders
        .iter()
        .map(|s| FindingKey::Sender(s.rank))
        .chain(d.receivers.iter().map(|r| FindingKey::Receiver(r.rank)))
        .chain(d.paths.iter().map(|p| FindingKey::Path {
            waiter: p.waiter,
            peer: p.peer,
        }))
        .collect()
}

/// The recent windows' findings per `(ep_group_id, instance_id, phase)`.
#[derive(Debug)]
pub struct Persistence {
    m: usize,
    n: usize,
    history: HashMap<(u64, String, Phase), VecDeque<BTreeSet<FindingKey>>>,
}

impl Persistence {
    /// Series followed at most (the oldest are forgotten beyond).
    pub const MAX_SERIES: usize = 4096;

    pub fn new(m: usize, n: usize) -> Persistence {
        let n = n.max(1);
        Persistence {
            m: m.clamp(1, n),
            n,
            history: HashMap::new(),
        }
    }

    /// Note window `d` of a series and keep only its findings seen in `m` of the last `n`
    /// windows (this one included).
    pub fn filter(&mut self, series: (u64, String, Phase), d: &mut Detection) {
        if !self.history.contains_key(&series) && self.history.len() >= Self::MAX_SERIES {
            self.history.clear();
        }
        let q = self.history.entry(series).or_default();
        q.push_back(keys(d));
        while q.len() > self.n {
            q.pop_front();
        }
        let seen = |k: &FindingKey| q.iter().filter(|w| w.contains(k)).count() >= self.m;
        d.senders.retain(|s| seen(&FindingKey::Sender(s.rank)));
        d.receivers.retain(|r| seen(&FindingKey::Receiver(r.rank)));
        d.paths.retain(|p| {
            seen(&FindingKey::Path {
                waiter: p.waiter,
                peer: p.peer,
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{detect, DetectConfig};
    use crate::matrix::WaitMatrix;

    #[test]
    fn e2_a_sender_alerts_from_its_second_window_of_three() {
        let healthy = WaitMatrix::from_fn(8, |_, _| 100.0);
        let slow = WaitMatrix::from_fn(8, |i, j| if j == 2 && i != 2 { 1e5 } else { 100.0 });
        let mut p = Persistence::new(2, 3);
        let s = || (1u64, "x".to_string(), Phase::Dispatch);
        let mut run = |m: &WaitMatrix| {
            let mut d = detect(m, &DetectConfig::default(), 1);
            p.filter(s(), &mut d);
            d.senders.iter().map(|x| x.rank).collect::<Vec<_>>()
        };
        assert_eq!(run(&slow), Vec::<usize>::new(), "once is not enough");
        assert_eq!(run(&healthy), Vec::<usize>::new());
        assert_eq!(run(&slow), [2], "2 of the last 3");
        assert_eq!(
            run(&healthy),
            Vec::<usize>::new(),
            "a healthy window has none"
        );
        assert_eq!(run(&healthy), Vec::<usize>::new());
        assert_eq!(run(&slow), Vec::<usize>::new(), "1 of the last 3 again");
    }
}

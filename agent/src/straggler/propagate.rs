//! Optional pre-processing (NOT part of DESIGN.md §5's formula, not applied by [`super::analyze`]
//! or the CLI): discount from each arrival the time the rank already spent blocked earlier in
//! the same step.
//!
//! With the exact formula a delay propagates: a rank that waited 8 ms in a receive from a slow
//! peer arrives 8 ms late at its next collective and is charged as a cause there, sometimes with
//! a higher index than the slow rank (measured on the test bed: 16 ranks, megatron, slow rank
//! 5: the PP peers of its stage rank first). Here each arrival becomes
//! `start − |∪ [a_j, min(A_j, start)]|` over the rank's earlier arrivals `j` of the step, `A_j`
//! being the last member's arrival of `j`'s instance (the time until which the rank was blocked
//! in it); concurrent blocked intervals count once. Ranks that never wait keep their arrivals.

use super::model::{InstanceKey, RankStep};

/// Rewrites the arrivals of `steps` (any order, several steps) as described in the module docs.
pub fn discount_blocked(steps: &mut [RankStep]) {
    let mut order: Vec<usize> = (0..steps.len()).collect();
    order.sort_by_key(|&i| steps[i].step);
    let mut g = 0;
    while g < order.len() {
        let s = steps[order[g]].step;
        let mut h = g + 1;
        while h < order.len() && steps[order[h]].step == s {
            h += 1;
        }
        one_step(steps, &order[g..h]);
        g = h;
    }
}

/// `idx`: the rank-steps of one step.
fn one_step(steps: &mut [RankStep], idx: &[usize]) {
    // (key, start, which rank-step, which arrival)
    let mut arr: Vec<(InstanceKey, u64, u32, u32)> = Vec::new();
    for (x, &i) in idx.iter().enumerate() {
        for (k, a) in steps[i].arrivals.iter().enumerate() {
            arr.push((a.key, a.start_us, x as u32, k as u32));
        }
    }
    arr.sort_unstable_by_key(|a| (a.0, a.1));
    // Per rank-step: (start, blocked until, arrival index).
    let mut per: Vec<Vec<(u64, u64, u32)>> = vec![Vec::new(); idx.len()];
    let mut g = 0;
    while g < arr.len() {
        let mut h = g + 1;
        while h < arr.len() && arr[h].0 == arr[g].0 {
            h += 1;
        }
        let last = arr[h - 1].1;
        for a in &arr[g..h] {
            let until = if h - g >= 2 { last } else { a.1 };
            per[a.2 as usize].push((a.1, until, a.3));
        }
        g = h;
    }
    for (x, mut v) in per.into_iter().enumerate() {
        v.sort_unstable();
        // The union of the blocked intervals so far: closed segments + the last one.
        let (mut closed, mut cur): (u64, Option<(u64, u64)>) = (0, None);
        let arrivals = &mut steps[idx[x]].arrivals;
        for (a, until, k) in v {
            let blocked = closed + cur.map_or(0, |(s, e)| e.min(a) - s);
            arrivals[k as usize].start_us = a - blocked.min(a);
            if until > a {
                cur = match cur {
                    Some((s, e)) if a <= e => Some((s, e.max(until))),
                    Some((s, e)) => {
                        closed += e - s;
                        Some((a, until))
                    }
                    None => Some((a, until)),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::Arrival;
    use super::*;

    fn a(comm: u64, seq: u64, start_us: u64) -> Arrival {
        Arrival {
            key: InstanceKey::Coll { comm, func: 5, seq },
            start_us,
            dur_us: 1,
        }
    }

    fn rs(rank: i64, arrivals: Vec<Arrival>) -> RankStep {
        RankStep {
            rank,
            host: "h".into(),
            step: 0,
            duration_us: 100,
            coverage_complete: true,
            err_us: 0,
            arrivals,
        }
    }

    #[test]
    fn a_delay_is_charged_to_its_source_only() {
        // r0 is late (40) at op A with r1; r1, blocked 40 in A, arrives 40 late at op B with
        // r2 (comm 2). Exact formula: r1 makes r2 wait 40. Discounted: r1's B arrival is 10.
        let mut s = vec![
            rs(0, vec![a(1, 0, 40)]),
            rs(1, vec![a(1, 0, 0), a(2, 0, 50)]),
            rs(2, vec![a(2, 0, 10)]),
        ];
        let exact = super::super::analyze_step(0, &s);
        assert_eq!(exact.net, vec![(0, 1, 40), (1, 2, 40)]);
        discount_blocked(&mut s);
        assert_eq!(s[1].arrivals[1].start_us, 10);
        assert_eq!(s[0].arrivals[0].start_us, 40);
        let d = super::super::analyze_step(0, &s);
        assert_eq!(d.net, vec![(0, 1, 40)]);
    }

    #[test]
    fn concurrent_blocked_intervals_count_once() {
        // r1 blocked in [0,30] and [10,40] (two instances): 40 blocked before its arrival at 60.
        let mut s = vec![
            rs(0, vec![a(1, 0, 30), a(3, 0, 40)]),
            rs(1, vec![a(1, 0, 0), a(3, 0, 10), a(2, 0, 60)]),
        ];
        discount_blocked(&mut s);
        assert_eq!(s[1].arrivals[2].start_us, 20);
        assert_eq!(s[1].arrivals[1].start_us, 0);
    }
}

//! What-if: the step time the job would have had without one rank's excess. The step is
//! replayed forward over the same happens-before graph the backward pass uses: each rank's
//! compute gaps as measured, a collective (or transfer) ends when its last member arrives plus
//! its transfer time (its shortest duration), a unit ends with its last operation. Run once with
//! the measured gaps and once with the rank's excess self time taken out of the gaps where it
//! grew; the difference of the two makespans is what fixing that rank saves (both runs use the
//! same model, so its errors cancel).

use super::units::StepUnits;

/// The simulated makespan of the step (µs), with `less` (dense rank, µs per unit) taken out of
/// that rank's gaps; `order` is the forward processing order of the instances.
fn makespan(su: &StepUnits, order: &[u32], less: Option<(usize, &[f64])>) -> f64 {
    // Every rank's units in one flat table: rank i's unit u at base[i] + u.
    let mut base = Vec::with_capacity(su.ranks.len() + 1);
    base.push(0usize);
    for r in &su.ranks {
        base.push(base.last().copied().unwrap_or(0) + r.units.len());
    }
    let mut end = vec![f64::NAN; base.last().copied().unwrap_or(0)];
    let arrival = |end: &[f64], i: usize, u: usize| -> f64 {
        let r = &su.ranks[i];
        let prev_real = if u == 0 { r.t0 } else { r.units[u - 1].end };
        let mut gap = r.units[u].start.saturating_sub(prev_real) as f64;
        if let Some((l, cut)) = less {
            if l == i {
                gap = (gap - cut[u]).max(0.0);
            }
        }
        let prev = if u == 0 {
            r.t0 as f64
        } else {
            end[base[i] + u - 1]
        };
        prev + gap
    };
    for &id in order {
        let inst = &su.instances[id as usize];
        let transfer = inst.members.iter().map(|m| m.3).min().unwrap_or(0) as f64;
        let last = inst
            .members
            .iter()
            .map(|m| arrival(&end, m.0 as usize, m.1 as usize))
            .fold(f64::MIN, f64::max);
        let done = last + transfer;
        for m in &inst.members {
            let e = &mut end[base[m.0 as usize] + m.1 as usize];
            *e = if e.is_nan() { done } else { e.max(done) };
        }
    }
    let t0 = su.ranks.iter().map(|r| r.t0).min().unwrap_or(0) as f64;
    base.windows(2)
        .filter(|w| w[1] > w[0])
        .map(|w| end[w[1] - 1])
        .filter(|e| !e.is_nan())
        .fold(t0, f64::max)
        - t0
}

/// Per unit of rank `l`: the excess self time that grew in the gap before it (a running
/// maximum, so jitter is not counted twice).
fn cuts(su: &StepUnits, l: usize) -> Vec<f64> {
    let mut best = 0.0f64;
    su.ranks[l]
        .units
        .iter()
        .map(|u| {
            let grew = (u.x - best).max(0.0);
            best = best.max(u.x);
            grew
        })
        .collect()
}

/// (simulated step µs, simulated step µs without each of `ranks`' excess).
pub(crate) fn without(su: &StepUnits, backward: &[u32], ranks: &[usize]) -> (f64, Vec<f64>) {
    let forward: Vec<u32> = backward.iter().rev().copied().collect();
    let base = makespan(su, &forward, None);
    let outs = ranks
        .iter()
        .map(|&l| {
            let c = cuts(su, l);
            makespan(su, &forward, Some((l, &c)))
        })
        .collect();
    (base, outs)
}

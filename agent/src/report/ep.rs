//! The report's MoE EP section from a job's EP windows: per EP group and phase the window to
//! look at (the one whose finding is strongest, else the latest whole one) as a wait matrix of
//! ratios to its mean cell, with what the detector flagged; and a line per window with a
//! finding or missing a rank.

use std::collections::BTreeMap;

use comminsight_ascend::decode::Phase;
use comminsight_ascend::report::Finding;

use super::model::{EpMatrices, EpWaitView, MAX_EP_LINES};
use crate::moe::windows::EpWindow;

/// Largest EP group drawn cell by cell (its matrix is N² numbers in the page).
pub const MAX_DRAWN_N: usize = 512;

/// The strongest ratio of a window's findings (0: none).
fn strength(w: &EpWindow) -> f64 {
    w.event
        .findings
        .iter()
        .map(|f| match f {
            Finding::SenderSlow { ratio, .. }
            | Finding::ReceiverSlow { ratio, .. }
            | Finding::PathSlow { ratio, .. } => *ratio,
        })
        .fold(0.0, f64::max)
}

/// The section of `ws` (`None`: the job has no EP window).
pub fn view(ws: &[EpWindow]) -> Option<EpMatrices> {
    if ws.is_empty() {
        return None;
    }
    let mut pick: BTreeMap<(u64, String, u8), &EpWindow> = BTreeMap::new();
    for w in ws.iter().filter(|w| w.matrix.is_some()) {
        let e = &w.event;
        let key = (e.ep_group_id, e.instance_id.clone(), e.phase as u8);
        let better = |old: &EpWindow| {
            (strength(w), w.event.window_seq) > (strength(old), old.event.window_seq)
        };
        if pick.get(&key).is_none_or(|old| better(old)) {
            pick.insert(key, w);
        }
    }
    let flagged: Vec<&EpWindow> = ws.iter().filter(|w| w.is_finding()).collect();
    Some(EpMatrices {
        matrices: Vec::new(),
        waits: pick.values().filter_map(|w| wait_view(w)).collect(),
        lines: flagged
            .iter()
            .take(MAX_EP_LINES)
            .map(|w| w.event.summary())
            .collect(),
        windows: ws.len() as u64,
        findings: flagged.len() as u64,
    })
}

fn wait_view(w: &EpWindow) -> Option<EpWaitView> {
    let m = w.matrix.as_ref()?;
    let n = m.n();
    if n == 0 || n > MAX_DRAWN_N {
        return None;
    }
    let mu = m.cells().iter().sum::<f64>() / (n * n) as f64;
    let ratio = (0..n)
        .map(|i| {
            m.row(i)
                .iter()
                .map(|c| (c / (mu + 1e-8) * 10.0).round().clamp(0.0, 1e9) as u32)
                .collect()
        })
        .collect();
    let mut v = EpWaitView {
        title: w.event.summary(),
        phase: match w.event.phase {
            Phase::Dispatch => "dispatch",
            Phase::Combine => "combine",
        }
        .into(),
        window_seq: w.event.window_seq,
        ratio,
        ..EpWaitView::default()
    };
    for f in &w.event.findings {
        match f {
            Finding::SenderSlow { rank, .. } => v.senders.push(*rank),
            Finding::ReceiverSlow { rank, .. } => v.receivers.push(*rank),
            Finding::PathSlow { waiter, peer, .. } => v.paths.push([*waiter, *peer]),
        }
    }
    Some(v)
}

//! MoE EP findings on the timeline: each window with a finding (as `comminsight-agent moe` finds
//! it) becomes instants at the window's end on the "MoE EP" track of the ranks it names — the
//! slow sender, the slow receiver, the waiter of a slow path (naming the peer), and each rank a
//! window never got a row from. EP-group ranks are mapped to the drawn global ranks through the
//! streams their rows came from.

use std::collections::BTreeMap;
use std::io::Write;

use comminsight_ascend::decode::Phase;
use comminsight_ascend::report::Finding;

use super::draw::rank_uuid;
use super::writer::{ArgValue, TraceWriter};
use crate::moe::windows::EpWindow;
use crate::moe::{EpRow, MoeConfig};
use crate::stream::StreamId;

const EP_UUID: u64 = 15 << 48;

/// The job's EP windows and the stream each EP-group rank's rows came from.
#[derive(Default)]
pub struct EpMarks {
    windows: Vec<EpWindow>,
    streams: BTreeMap<(u64, u32), StreamId>,
}

impl EpMarks {
    /// The windows of `rows` (with the stream of each) under `cfg`.
    pub fn new(rows: Vec<(StreamId, EpRow)>, cfg: &MoeConfig) -> EpMarks {
        let mut streams = BTreeMap::new();
        let rows = rows
            .into_iter()
            .map(|(id, r)| {
                streams.insert((r.key.ep_group_id, r.row.rank), id);
                r
            })
            .collect();
        let (windows, _) = crate::offline::moe::windows_of(rows, cfg);
        EpMarks { windows, streams }
    }

    /// Draw the marks of windows ending in `[w0, w1]` (µs) on the ranks of `drawn` (stream ->
    /// global rank); returns how many instants were written.
    pub fn draw<W: Write>(
        &self,
        w: &mut TraceWriter<W>,
        drawn: &BTreeMap<StreamId, i64>,
        (w0, w1): (u64, u64),
    ) -> std::io::Result<u64> {
        let mut tracks: BTreeMap<i64, u64> = BTreeMap::new();
        let mut n = 0;
        for win in self.windows.iter().filter(|x| x.is_finding()) {
            let e = &win.event;
            if !(w0..=w1).contains(&(e.ts_ns / 1000)) {
                continue;
            }
            let phase = match e.phase {
                Phase::Dispatch => "dispatch",
                Phase::Combine => "combine",
            };
            let group = e.ep_group_id;
            for (ep_rank, name, ratio) in marks(win) {
                let Some(&rank) = self
                    .streams
                    .get(&(group, ep_rank))
                    .and_then(|id| drawn.get(id))
                else {
                    continue;
                };
                let track = match tracks.get(&rank) {
                    Some(t) => *t,
                    None => {
                        let t = EP_UUID + rank_uuid(rank);
                        w.child_track(t, rank_uuid(rank), &format!("rank {rank} · MoE EP"))?;
                        tracks.insert(rank, t);
                        t
                    }
                };
                let args = [
                    ("ep_group", ArgValue::Str(format!("{group:#018x}"))),
                    ("phase", ArgValue::Str(phase.into())),
                    ("window", ArgValue::Uint(e.window_seq)),
                    ("ep_rank", ArgValue::Uint(u64::from(ep_rank))),
                    ("ratio", ArgValue::Double(ratio)),
                ];
                let label = format!("{name} ({phase} window {})", e.window_seq);
                w.instant(track, e.ts_ns, &label, &args)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// `(EP rank, what, ratio)` of each mark of a window.
fn marks(win: &EpWindow) -> Vec<(u32, String, f64)> {
    let mut out: Vec<(u32, String, f64)> = win
        .event
        .findings
        .iter()
        .map(|f| match f {
            Finding::SenderSlow { rank, ratio, .. } => {
                (*rank as u32, "slow EP sender".to_string(), *ratio)
            }
            Finding::ReceiverSlow { rank, ratio, .. } => {
                (*rank as u32, "slow EP receiver".to_string(), *ratio)
            }
            Finding::PathSlow {
                waiter,
                peer,
                ratio,
                ..
            } => (
                *waiter as u32,
                format!("slow EP path from EP rank {peer}"),
                *ratio,
            ),
        })
        .collect();
    if let Some(i) = &win.event.incomplete_window {
        out.extend(
            i.missing_rows
                .iter()
                .map(|r| (*r, "no EP report".to_string(), 0.0)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use comminsight_ascend::window::{Row, WindowKey};

    use super::*;

    /// Window `seq` of a 4-rank group (rank r on stream pid 100 + r): everybody waits 10 on
    /// each peer, 100 on rank 2 in window 1; rank 3 never reports window 2.
    fn rows() -> Vec<(StreamId, EpRow)> {
        let mut out = Vec::new();
        for seq in 0..3u64 {
            for r in 0..4u32 {
                if seq == 2 && r == 3 {
                    continue;
                }
                let row = EpRow {
                    job: "j".into(),
                    key: WindowKey {
                        ep_group_id: 5,
                        instance_id: "i".into(),
                        phase: Phase::Dispatch,
                        window_seq: seq,
                    },
                    n: 4,
                    source: comminsight_ascend::decode::Source::DeepepLl,
                    hierarchical: false,
                    row: Row {
                        rank: r,
                        values: (0..4)
                            .map(|j| if seq == 1 && j == 2 { 100.0 } else { 10.0 })
                            .collect(),
                        steps: 1,
                        t_start_ns: seq * 1_000_000_000,
                        t_end_ns: (seq + 1) * 1_000_000_000,
                    },
                };
                out.push((StreamId::new("j", "h", &(100 + r).to_string()), row));
            }
        }
        out
    }

    #[test]
    fn findings_become_instants_on_the_global_ranks_of_their_ep_ranks() {
        let marks = EpMarks::new(rows(), &MoeConfig::default());
        // EP rank r is global rank 10 + r; global rank 13 (EP 3) is drawn too.
        let drawn: BTreeMap<StreamId, i64> = (0..4)
            .map(|r| (StreamId::new("j", "h", &(100 + r).to_string()), 10 + r))
            .collect();
        let mut w = TraceWriter::new(Vec::new());
        assert_eq!(marks.draw(&mut w, &drawn, (0, u64::MAX)).unwrap(), 2);
        let bytes = w.finish().unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("rank 12 · MoE EP"), "the slow sender's track");
        assert!(text.contains("slow EP sender (dispatch window 1)"));
        assert!(text.contains("rank 13 · MoE EP") && text.contains("no EP report"));
        // Outside the window (µs): nothing.
        let mut w = TraceWriter::new(Vec::new());
        assert_eq!(marks.draw(&mut w, &drawn, (0, 1_000)).unwrap(), 0);
        // Ranks not drawn: nothing.
        let mut w = TraceWriter::new(Vec::new());
        let none = BTreeMap::new();
        assert_eq!(marks.draw(&mut w, &none, (0, u64::MAX)).unwrap(), 0);
    }
}

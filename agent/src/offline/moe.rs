//! `comminsight-agent moe DIR`: the MoE EP windows of an input. One engine pass turns every
//! rank stream's `ep_stats` records into rows; the rows, in window-end order (the records'
//! own times, so the result does not depend on the order the streams are read in), are
//! assembled and analysed with `[moe]` exactly as the job master does live: a window a rank
//! never reported is incomplete once later rows are `assemble_timeout_s` past it, or at the
//! end of the input.

use super::{Input, PassStats};
use crate::engine::{Builtins, Engine, Output};
use crate::moe::windows::{EpWindow, MoeWindows};
use crate::moe::{EpRow, MoeConfig};

/// What one input gave.
#[derive(Debug, Default)]
pub struct MoeResult {
    pub windows: Vec<EpWindow>,
    /// Rows the assembler refused (a finished window's, sizes that disagree) and rows the
    /// decoder dropped (parts that disagree, counters that could not be decoded).
    pub refused: u64,
    pub dropped: u64,
    pub pass: PassStats,
}

/// The windows of `input` (of `job` only, when given).
pub fn windows(input: &Input, cfg: &MoeConfig, job: Option<&str>) -> MoeResult {
    let mut engine = Engine::new(Builtins {
        moe: true,
        ..Builtins::default()
    });
    let mut rows: Vec<EpRow> = Vec::new();
    let pass = input.run(&mut engine, &mut [], &mut |o| {
        if let Output::EpRow { row: r, .. } = o {
            if job.is_none_or(|j| r.job == j) {
                rows.push(*r);
            }
        }
    });
    let (windows, refused) = windows_of(rows, cfg);
    MoeResult {
        windows,
        refused,
        dropped: engine.moe_dropped(),
        pass,
    }
}

/// The windows of an input's `rows` (any order), and the rows the assembler refused: rows in
/// window-end order, each window incomplete once later rows are `assemble_timeout_s` past it
/// or at the end.
pub fn windows_of(mut rows: Vec<EpRow>, cfg: &MoeConfig) -> (Vec<EpWindow>, u64) {
    rows.sort_by(|a, b| {
        (a.row.t_end_ns, &a.job, &a.key, a.row.rank).cmp(&(
            b.row.t_end_ns,
            &b.job,
            &b.key,
            b.row.rank,
        ))
    });
    let mut w = MoeWindows::new(cfg);
    let mut out = Vec::new();
    for r in rows {
        let t = r.row.t_end_ns;
        out.extend(w.row(r, t));
        out.extend(w.expire(t));
    }
    out.extend(w.flush());
    (out, w.refused())
}

/// The windows of `rows` some EP rank never reported, with the global ranks of the missing
/// (from the streams their other rows came from, `topo`'s `proc_start` ranks).
pub fn missing(
    rows: Vec<(crate::stream::StreamId, EpRow)>,
    cfg: &MoeConfig,
    topo: &crate::roles::TopologyCollector,
) -> Vec<crate::hang::model::EpMissing> {
    use std::collections::BTreeMap;
    let mut streams = BTreeMap::new();
    let rows = rows
        .into_iter()
        .map(|(id, r)| {
            streams.insert((r.job.clone(), r.key.ep_group_id, r.row.rank), id);
            r
        })
        .collect();
    let global = |job: &str, group: u64, ep_rank: u32| -> i64 {
        streams
            .get(&(job.to_string(), group, ep_rank))
            .and_then(|id| {
                let p = topo
                    .jobs()
                    .get(job)?
                    .procs
                    .get(&format!("{}/{}", id.host, id.pid))?;
                Some(i64::from(p.global_rank))
            })
            .unwrap_or(-1)
    };
    windows_of(rows, cfg)
        .0
        .into_iter()
        .filter_map(|w| {
            let m = w.event.incomplete_window.clone()?.missing_rows;
            let e = &w.event;
            Some(crate::hang::model::EpMissing {
                missing_ranks: m
                    .iter()
                    .map(|r| global(&w.job, e.ep_group_id, *r))
                    .collect(),
                job: w.job.clone(),
                ep_group: format!("{:#018x}", e.ep_group_id),
                phase: e.phase.title().to_lowercase(),
                window_seq: e.window_seq,
                ts_ns: e.ts_ns,
                missing_ep_ranks: m,
            })
        })
        .collect()
}

//! MoE expert-parallel slow ranks (issue 21): the `ep_stats` records a rank's producers write
//! (DeepEP / Ascend MC2 wait counters, `docs/contracts.md` "EP wait records") become rows
//! ([`EpRows`], the engine's analysis: parts of a row joined, counters decoded), and rows of
//! every rank of an EP group become windows analysed with DeepXTrace's detector
//! ([`windows::MoeWindows`], the `comminsight-ascend` library): offline over an input, live on
//! the job master. `[moe]` ([`MoeConfig`]) sets the thresholds and our extensions.

pub mod windows;

use std::collections::BTreeMap;

use comminsight_ascend::decode::{CounterKind, Phase, RowDecoder, RowRecord, Source};
use comminsight_ascend::window::{Row, WindowKey};
use comminsight_wire::moe::{ep_flags, ep_phase, ep_source, uuid_string, EpStats};
use serde::{Deserialize, Serialize};

use crate::stream::StreamId;

/// The `[moe]` configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MoeConfig {
    /// Analyse the EP wait records at all.
    pub enabled: bool,
    /// DeepXTrace's thresholds (its `DEEPEP_DIAGNOSE_THRESHOLD_COL` / `_ROW` / `_POINT`).
    pub threshold_col: f64,
    pub threshold_row: f64,
    pub threshold_point: f64,
    /// The point baseline leaves zero cells out: `auto` (MC2's hierarchical layout only, whose
    /// structural zeros would make false points), `on`, `off` (DeepXTrace's default).
    pub exclude_zeros: String,
    /// How long a window waits for every rank's row (seconds): then it is `incomplete`.
    pub assemble_timeout_s: u64,
    /// Windows summed before detection (DeepXTrace: 1).
    pub aggregate_windows: usize,
    /// E1 (not in DeepXTrace): a finding needs this excess per step (ms; MC2 µs directly,
    /// DeepEP cycles at 2 GHz); 0 = off.
    pub min_excess_ms: f64,
    /// E2 (not in DeepXTrace): a finding needs `persistence_m` of the last `persistence_n`
    /// windows; 0 = off.
    pub persistence_m: usize,
    pub persistence_n: usize,
    /// E3 (not in DeepXTrace): a flagged row and column meeting in one dominant cell are one
    /// slow path.
    pub path_reclassify: bool,
    /// E4 (not in DeepXTrace): medians as the row and column baselines.
    pub robust_baseline: bool,
    /// E5 (not in DeepXTrace): for MC2's hierarchical layout, means over the cells it can fill.
    pub topology_mask: bool,
}

impl Default for MoeConfig {
    fn default() -> Self {
        MoeConfig {
            enabled: true,
            threshold_col: 3.0,
            threshold_row: 3.0,
            threshold_point: 5.0,
            exclude_zeros: "auto".into(),
            assemble_timeout_s: 40,
            aggregate_windows: 1,
            min_excess_ms: 0.0,
            persistence_m: 0,
            persistence_n: 3,
            path_reclassify: false,
            robust_baseline: false,
            topology_mask: false,
        }
    }
}

/// The values `exclude_zeros` takes.
pub const EXCLUDE_ZEROS: [&str; 3] = ["auto", "on", "off"];

/// One rank's decoded row of one window, what the master (or an offline command) assembles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpRow {
    pub job: String,
    pub key: WindowKey,
    pub n: u32,
    pub source: Source,
    /// MC2's hierarchical layout.
    pub hierarchical: bool,
    pub row: Row,
}

/// The values of one row not all here yet.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Partial {
    head: Option<EpStatsHead>,
    values: Vec<Option<u64>>,
}

/// The fields every part of a row repeats.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct EpStatsHead {
    t_start_ns: u64,
    t_end_ns: u64,
    steps: u32,
    scale_bits: u32,
    source: u8,
    flags: u8,
}

type PartKey = (StreamId, u64, [u8; 16], u8, u64, u16);

/// The engine's analysis: `ep_stats` parts joined into rows and decoded (the engine hands each
/// row on as `Output::EpRow`).
/// Bounded: [`EpRows::MAX_PARTIAL`] rows wait for parts at once (the oldest are dropped).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct EpRows {
    #[serde(with = "crate::util::serde_pairs")]
    partial: BTreeMap<PartKey, Partial>,
    #[serde(skip)]
    decoder: RowDecoder,
    /// Rows dropped: parts that disagree, the bound, counters that could not be decoded.
    pub dropped: u64,
}

impl EpRows {
    pub const MAX_PARTIAL: usize = 4096;

    /// One `ep_stats` record of stream `id`; the row it completed, decoded.
    pub fn part(&mut self, id: &StreamId, e: &EpStats) -> Option<EpRow> {
        let key = (
            id.clone(),
            e.ep_group_id,
            e.instance,
            e.phase,
            e.window_seq,
            e.rank,
        );
        let head = EpStatsHead {
            t_start_ns: e.t_start_ns,
            t_end_ns: e.t_end_ns,
            steps: e.steps,
            scale_bits: e.scale_bits,
            source: e.source,
            flags: e.ep_flags,
        };
        if !self.partial.contains_key(&key) && self.partial.len() >= Self::MAX_PARTIAL {
            self.partial.pop_first();
            self.dropped += 1;
        }
        let p = self.partial.entry(key.clone()).or_default();
        if p.values.len() != usize::from(e.ep_size) || p.head.as_ref().is_some_and(|h| *h != head) {
            if p.head.is_some() {
                self.dropped += 1;
            }
            *p = Partial {
                head: Some(head),
                values: vec![None; usize::from(e.ep_size)],
            };
        }
        let first = usize::from(e.first);
        for (k, v) in e.values.iter().take(usize::from(e.count)).enumerate() {
            if let Some(slot) = p.values.get_mut(first + k) {
                *slot = Some(*v);
            }
        }
        if !p.values.iter().all(Option::is_some) {
            return None;
        }
        let p = self.partial.remove(&key)?;
        self.row(id, e, p)
    }

    fn row(&mut self, id: &StreamId, e: &EpStats, p: Partial) -> Option<EpRow> {
        let h = p.head?;
        let source = if h.source == ep_source::MC2 {
            Source::Mc2
        } else {
            Source::DeepepLl
        };
        let rec = RowRecord {
            ep_group_id: e.ep_group_id,
            instance_id: uuid_string(&e.instance),
            ep_size: u32::from(e.ep_size),
            rank: u32::from(e.rank),
            phase: phase_of(e.phase),
            source,
            counter_kind: if h.flags & ep_flags::CUMULATIVE != 0 {
                CounterKind::Cumulative
            } else {
                CounterKind::Delta
            },
            window_seq: e.window_seq,
            steps: h.steps,
            t_start_ns: h.t_start_ns,
            t_end_ns: h.t_end_ns,
            values: p
                .values
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect(),
            scale: e.scale().map(f64::from),
        };
        let values = match self.decoder.decode(&rec, false) {
            Ok(v) => v,
            Err(comminsight_ascend::decode::DecodeError::Baseline { .. }) => return None,
            Err(err) => {
                self.dropped += 1;
                tracing::debug!("{}: ep_stats: {err}", id);
                return None;
            }
        };
        Some(EpRow {
            job: id.job.clone(),
            key: WindowKey {
                ep_group_id: rec.ep_group_id,
                instance_id: rec.instance_id,
                phase: rec.phase,
                window_seq: rec.window_seq,
            },
            n: rec.ep_size,
            source,
            hierarchical: h.flags & ep_flags::HIERARCHICAL != 0,
            row: Row {
                rank: rec.rank,
                values,
                steps: rec.steps,
                t_start_ns: rec.t_start_ns,
                t_end_ns: rec.t_end_ns,
            },
        })
    }

    /// Forget stream `id`'s rows in progress.
    pub fn forget(&mut self, id: &StreamId) {
        self.partial.retain(|k, _| &k.0 != id);
    }
}

fn phase_of(p: u8) -> Phase {
    if p == ep_phase::COMBINE {
        Phase::Combine
    } else {
        Phase::Dispatch
    }
}

#[cfg(test)]
mod tests;

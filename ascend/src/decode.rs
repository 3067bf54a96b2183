//! The producers' counters as one window's row of wait times (spec §5.1).
//!
//! * **Ascend MC2** (`performance_info`, source [`Source::Mc2`]): µs accumulated with int32
//!   atomics into the *low 32 bits* of each int64 slot; the high word is never written. Values
//!   are read as `v & 0xFFFF_FFFF`; a cumulative counter's delta is `(cur − prev) mod 2^32`, so
//!   a wrap is differenced, not negative. A window longer than 30 minutes is refused: a wrap
//!   (2^32 µs ≈ 71.6 min, 2^31 ≈ 35.8 min read signed) would be ambiguous.
//! * **DeepEP** low-latency wait stats (source [`Source::DeepepLl`]): u64 SM cycles; a
//!   cumulative counter's delta is `cur − prev`, and a counter that went back (another tool
//!   reset it) drops the window and resynchronises on the new value.
//! * A cumulative counter's first record only sets the baseline.
//! * An optional per-row scale (ns per unit, e.g. from the rank's SM clock) converts cycles to
//!   time; compat mode leaves it out (the detector is scale-invariant for a common unit only).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The phase of the MoE all-to-all a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Dispatch,
    Combine,
}

impl Phase {
    /// DeepXTrace's word for it in its log line.
    pub fn title(self) -> &'static str {
        match self {
            Phase::Dispatch => "Dispatch",
            Phase::Combine => "Combine",
        }
    }
}

/// Which kernels filled the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// DeepEP low-latency dispatch / combine: SM cycles, u64.
    DeepepLl,
    /// Ascend MC2 `performance_info`: µs in the low 32 bits.
    Mc2,
}

/// Whether a record's values are the window's own or running totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterKind {
    Delta,
    Cumulative,
}

/// The longest window an MC2 cumulative counter can be differenced over (30 min).
pub const MC2_MAX_WINDOW_NS: u64 = 30 * 60 * 1_000_000_000;

/// One rank's counters for one phase and window, as a producer reports them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowRecord {
    pub ep_group_id: u64,
    pub instance_id: String,
    pub ep_size: u32,
    /// The rank in the EP group.
    pub rank: u32,
    pub phase: Phase,
    pub source: Source,
    pub counter_kind: CounterKind,
    pub window_seq: u64,
    /// Steps (calls) the window covers.
    pub steps: u32,
    pub t_start_ns: u64,
    pub t_end_ns: u64,
    /// Per peer, `ep_size` values.
    pub values: Vec<u64>,
    /// ns per unit for this row (`None`: 1).
    #[serde(default)]
    pub scale: Option<f64>,
}

/// Why a record gives no row.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("rank {rank} of EP group {group:#x}: {got} values for an EP size of {n}")]
    Size {
        group: u64,
        rank: u32,
        got: usize,
        n: u32,
    },
    #[error("rank {rank} of EP group {group:#x}: rank outside the EP size {n}")]
    Rank { group: u64, rank: u32, n: u32 },
    #[error("rank {rank} of EP group {group:#x}: a {span_s} s MC2 window is over 30 min, a counter wrap would be ambiguous")]
    WrapAmbiguous { group: u64, rank: u32, span_s: u64 },
    #[error("rank {rank} of EP group {group:#x}: a DeepEP counter went back (reset by another tool); window dropped, resynchronised")]
    Reset { group: u64, rank: u32 },
    #[error("rank {rank} of EP group {group:#x}: first cumulative record, kept as the baseline")]
    Baseline { group: u64, rank: u32 },
}

/// The value of an MC2 slot: its low 32 bits.
pub fn mc2_value(raw: u64) -> u64 {
    raw & 0xFFFF_FFFF
}

/// The delta of an MC2 cumulative slot from `prev` to `cur` (both raw), wrap-safe.
pub fn mc2_delta(prev: u64, cur: u64) -> u64 {
    mc2_value(cur).wrapping_sub(mc2_value(prev)) & 0xFFFF_FFFF
}

type RowKey = (u64, String, Phase, u32);

/// Turns records into rows; keeps the previous values of cumulative counters.
#[derive(Debug, Default)]
pub struct RowDecoder {
    prev: HashMap<RowKey, Vec<u64>>,
}

impl RowDecoder {
    /// Rows kept at most (groups × instances × phases × ranks).
    pub const MAX_ROWS: usize = 1 << 16;

    /// The window's row of `r` (in its unit, or scaled with `use_scale`).
    pub fn decode(&mut self, r: &RowRecord, use_scale: bool) -> Result<Vec<f64>, DecodeError> {
        let (group, rank, n) = (r.ep_group_id, r.rank, r.ep_size);
        if r.values.len() != n as usize {
            return Err(DecodeError::Size {
                group,
                rank,
                got: r.values.len(),
                n,
            });
        }
        if rank >= n {
            return Err(DecodeError::Rank { group, rank, n });
        }
        let span = r.t_end_ns.saturating_sub(r.t_start_ns);
        if r.source == Source::Mc2 && span > MC2_MAX_WINDOW_NS {
            return Err(DecodeError::WrapAmbiguous {
                group,
                rank,
                span_s: span / 1_000_000_000,
            });
        }
        let raw: Vec<u64> = match r.source {
            Source::Mc2 => r.values.iter().map(|v| mc2_value(*v)).collect(),
            Source::DeepepLl => r.values.clone(),
        };
        let deltas = match r.counter_kind {
            CounterKind::Delta => raw,
            CounterKind::Cumulative => self.cumulative(r, raw)?,
        };
        let scale = if use_scale {
            r.scale.filter(|s| s.is_finite() && *s > 0.0).unwrap_or(1.0)
        } else {
            1.0
        };
        Ok(deltas.into_iter().map(|d| d as f64 * scale).collect())
    }

    fn cumulative(&mut self, r: &RowRecord, cur: Vec<u64>) -> Result<Vec<u64>, DecodeError> {
        let (group, rank) = (r.ep_group_id, r.rank);
        let key = (group, r.instance_id.clone(), r.phase, rank);
        if !self.prev.contains_key(&key) && self.prev.len() >= Self::MAX_ROWS {
            self.prev.clear();
        }
        let Some(prev) = self.prev.insert(key, cur.clone()) else {
            return Err(DecodeError::Baseline { group, rank });
        };
        match r.source {
            Source::Mc2 => Ok(prev
                .iter()
                .zip(&cur)
                .map(|(p, c)| mc2_delta(*p, *c))
                .collect()),
            Source::DeepepLl => prev
                .iter()
                .zip(&cur)
                .map(|(p, c)| c.checked_sub(*p).ok_or(DecodeError::Reset { group, rank }))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(source: Source, kind: CounterKind, values: Vec<u64>) -> RowRecord {
        RowRecord {
            ep_group_id: 7,
            instance_id: "i".into(),
            ep_size: values.len() as u32,
            rank: 0,
            phase: Phase::Dispatch,
            source,
            counter_kind: kind,
            window_seq: 0,
            steps: 1,
            t_start_ns: 0,
            t_end_ns: 1_000_000_000,
            values,
            scale: Some(0.5),
        }
    }

    #[test]
    fn s11_mc2_reads_the_low_word_and_differences_a_wrap() {
        assert_eq!(mc2_value(0x0000_0000_FFFF_FFFB), 4_294_967_291);
        assert_eq!(
            mc2_value(0xDEAD_BEEF_0000_0010),
            16,
            "the high word is never written"
        );
        assert_eq!(mc2_delta(0xFFFF_FF00, 0x100), 512);
        let mut d = RowDecoder::default();
        let r0 = rec(Source::Mc2, CounterKind::Cumulative, vec![0xFFFF_FF00, 5]);
        assert!(matches!(
            d.decode(&r0, false),
            Err(DecodeError::Baseline { .. })
        ));
        let r1 = rec(
            Source::Mc2,
            CounterKind::Cumulative,
            vec![0x100, 0x8000_0000_0000_0009],
        );
        assert_eq!(d.decode(&r1, false).unwrap(), [512.0, 4.0]);
        let delta = rec(
            Source::Mc2,
            CounterKind::Delta,
            vec![0x0000_0000_FFFF_FFFB, 1],
        );
        assert_eq!(d.decode(&delta, false).unwrap(), [4_294_967_291.0, 1.0]);
    }

    #[test]
    fn mc2_windows_over_30_minutes_are_refused() {
        let mut r = rec(Source::Mc2, CounterKind::Delta, vec![1, 2]);
        r.t_end_ns = MC2_MAX_WINDOW_NS + 1;
        let e = RowDecoder::default().decode(&r, false).unwrap_err();
        assert!(
            matches!(e, DecodeError::WrapAmbiguous { span_s: 1800, .. }),
            "{e}"
        );
        r.source = Source::DeepepLl;
        assert!(
            RowDecoder::default().decode(&r, false).is_ok(),
            "u64 cycles do not wrap"
        );
    }

    #[test]
    fn deepep_cumulative_resets_resynchronise_and_scale_is_optional() {
        let mut d = RowDecoder::default();
        let c = |v| rec(Source::DeepepLl, CounterKind::Cumulative, v);
        assert!(d.decode(&c(vec![100, 100]), false).is_err());
        assert_eq!(d.decode(&c(vec![150, 400]), true).unwrap(), [25.0, 150.0]);
        assert!(matches!(
            d.decode(&c(vec![10, 500]), false),
            Err(DecodeError::Reset { .. })
        ));
        assert_eq!(d.decode(&c(vec![30, 510]), false).unwrap(), [20.0, 10.0]);
        let short = rec(Source::DeepepLl, CounterKind::Delta, vec![1, 2]);
        let mut bad = short.clone();
        bad.ep_size = 3;
        assert!(matches!(
            d.decode(&bad, false),
            Err(DecodeError::Size { .. })
        ));
        bad = short;
        bad.rank = 2;
        assert!(matches!(
            d.decode(&bad, false),
            Err(DecodeError::Rank { .. })
        ));
    }
}

//! The MoE expert-parallel wait-counter record (issue 21, `docs/contracts.md` "EP wait
//! records"): `ep_stats` (19), written into a rank's stream by the producers (the Python
//! reporter for DeepEP / Ascend MC2). One rank's counters for one phase and window are
//! `ep_size` values; a record carries [`EP_VALUES_PER_RECORD`] of them from `first` on, so a
//! row is `ceil(ep_size / 5)` records with the same key, which the agent joins.

/// Values one record carries.
pub const EP_VALUES_PER_RECORD: usize = 5;
/// The largest EP group a record may describe.
pub const MAX_EP_SIZE: u16 = 4096;

/// [`EpStats::phase`].
pub mod ep_phase {
    pub const DISPATCH: u8 = 0;
    pub const COMBINE: u8 = 1;
}

/// [`EpStats::source`]: which kernels filled the counters.
pub mod ep_source {
    /// DeepEP low-latency dispatch / combine (`*_wait_recv_cost_stats`): u64 SM cycles.
    pub const DEEPEP_LL: u8 = 1;
    /// Ascend MC2 `performance_info`: µs in the low 32 bits of each slot.
    pub const MC2: u8 = 2;
}

/// [`EpStats::flags`].
pub mod ep_flags {
    /// The values are running totals (else: the window's own).
    pub const CUMULATIVE: u8 = 1 << 0;
    /// MC2's hierarchical layout (`commAlg="hierarchy"`, 8 ranks a server): cells outside a
    /// rank's server and same-index cards are structural zeros.
    pub const HIERARCHICAL: u8 = 1 << 1;
}

/// One part of one rank's wait counters for one phase and window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpStats {
    /// The EP group (a hash the producer derives from its members; stable across ranks).
    pub ep_group_id: u64,
    /// DeepXTrace's `instance_id` (a UUID rank 0 broadcast).
    pub instance: [u8; 16],
    pub window_seq: u64,
    /// The window, host time (ns since the epoch).
    pub t_start_ns: u64,
    pub t_end_ns: u64,
    /// Steps (calls) in the window.
    pub steps: u32,
    /// ns per unit of this rank's counters (an f32's bits; 0: none given).
    pub scale_bits: u32,
    pub ep_size: u16,
    /// The writer's rank in the EP group (the row).
    pub rank: u16,
    /// The peer of `values[0]`.
    pub first: u16,
    /// Values used (1..=5).
    pub count: u8,
    /// [`ep_phase`].
    pub phase: u8,
    /// [`ep_source`].
    pub source: u8,
    /// [`ep_flags`].
    pub ep_flags: u8,
    /// Per peer `first..first + count`: wait time in the source's unit.
    pub values: [u64; EP_VALUES_PER_RECORD],
}

impl EpStats {
    /// The per-row scale, if the producer gave one.
    pub fn scale(&self) -> Option<f32> {
        let s = f32::from_bits(self.scale_bits);
        (self.scale_bits != 0 && s.is_finite() && s > 0.0).then_some(s)
    }

    /// The records of one rank's row `values` (all of them, `values.len()` = the EP size),
    /// each a copy of `head` with its part of the values.
    pub fn split(head: &EpStats, values: &[u64]) -> Vec<EpStats> {
        values
            .chunks(EP_VALUES_PER_RECORD)
            .enumerate()
            .map(|(k, c)| {
                let mut r = head.clone();
                r.ep_size = values.len().min(usize::from(u16::MAX)) as u16;
                r.first = (k * EP_VALUES_PER_RECORD) as u16;
                r.count = c.len() as u8;
                r.values = [0; EP_VALUES_PER_RECORD];
                r.values[..c.len()].copy_from_slice(c);
                r
            })
            .collect()
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of 16 bytes.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 16 bytes of a UUID written with or without dashes (any case); `None` otherwise.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (k, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_splits_into_records_of_five_and_uuids_round_trip() {
        let head = EpStats {
            ep_group_id: 9,
            rank: 3,
            ..EpStats::default()
        };
        let v: Vec<u64> = (0..12).collect();
        let recs = EpStats::split(&head, &v);
        assert_eq!(recs.len(), 3);
        assert_eq!((recs[2].first, recs[2].count, recs[2].ep_size), (10, 2, 12));
        assert_eq!(recs[2].values, [10, 11, 0, 0, 0]);
        let u = parse_uuid("6A1E2C3D-0000-4000-8000-00000000002a").unwrap();
        assert_eq!(uuid_string(&u), "6a1e2c3d-0000-4000-8000-00000000002a");
        assert_eq!(parse_uuid("6a1e"), None);
        let s = EpStats {
            scale_bits: 0.5f32.to_bits(),
            ..EpStats::default()
        };
        assert_eq!(s.scale(), Some(0.5));
        assert_eq!(EpStats::default().scale(), None);
    }
}

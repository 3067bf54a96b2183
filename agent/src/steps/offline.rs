//! The step engine's default reorder window (the offline rebuild itself is
//! [`crate::offline::steps`]).

/// Default reorder window: operations may arrive this late (µs) without changing the result.
pub const SAFE_WINDOW_US: u64 = 2_000_000;

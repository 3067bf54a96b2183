//! Small helpers every layer may use (they depend on nothing else in the crate).

pub mod fs;
pub mod serde_pairs;
pub mod time;

//! Small helpers every layer may use (they depend on nothing else in the crate).

pub mod backoff;
pub mod fs;
pub mod log_limit;
pub mod serde_pairs;
#[cfg(test)]
pub(crate) mod testbed;
pub mod time;

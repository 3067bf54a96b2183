//! Profiler plugin support: ABI mirrors, NCCL's loader, and event emission.

pub mod abi;
pub mod emit;
pub mod loader;
pub mod mask;

pub use emit::{Ctx, Ev, H};

//! Profiler plugin support: one `#[repr(C)]` module per ABI version (`v4`, `v5` = v6 without CE), the
//! shared parts (`abi`), NCCL's loader (`loader`), activation rules (`mask`) and emission (`emit`),
//! generic over the version's [`emit::Descriptor`].

pub mod abi;
pub mod emit;
pub mod loader;
pub mod mask;
pub mod v4;
pub mod v5;

pub use emit::{Ctx, Ev, H};

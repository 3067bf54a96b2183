//! MoE expert-parallel wait matrices (`../shared/research/deepxtrace-spec.md` §5): the counters
//! DeepEP's low-latency kernels and Ascend's MC2 operators accumulate per peer ([`decode`]),
//! assembled per window across the EP group ([`window`]), and DeepXTrace's slow-rank detector
//! with our extensions ([`detect`], [`persist`]); [`report`] renders what a window gave.

pub mod decode;
pub mod detect;
pub mod matrix;
pub mod persist;
pub mod report;
pub mod window;

pub use detect::{detect, DetectConfig, Detection};
pub use matrix::WaitMatrix;

//! CommInsight CPU test bed: the job runner.
//!
//! A scenario ([`scenario`]) describes a parallel layout ([`layout`]), a Megatron-like step
//! ([`plan`]) and faults ([`fault`]). [`runner`] starts one Python rank process per rank
//! (`python/rank_driver.py`, NCCL through ctypes) against the libnccl stand-in and the profiler
//! plugin, optionally in network namespaces ([`netns`]); [`truth`] merges what the ranks report into
//! `truth.json`. [`synthetic`] writes the records of thousands of ranks directly from a simulation
//! ([`sim`]) of the same plans. [`cli`] is the `comminsight-testbed` command line; [`eval`] its
//! `eval hang` (the randomised evaluation of the hang analysis, `cargo xtask eval hang`) and `eval
//! straggler` (the same for the straggler index, `cargo xtask eval straggler`).
//!
//! ```
//! use comminsight_testbed::layout::{Layout, Role};
//! let l = Layout::new(2, 1, 2, 2, 1); // tp, cp, dp, pp, ep; Megatron order tp-cp-ep-dp-pp
//! assert_eq!(l.group_of(5, Role::Tp).ranks, vec![4, 5]);
//! ```

pub mod cli;
pub mod eval;
pub mod fault;
pub mod layout;
pub mod moe;
pub mod netns;
pub mod plan;
pub mod runner;
pub mod scenario;
pub mod sim;
pub mod synthetic;
mod sys;
pub mod truth;

//! Hang and failure localisation: per comm instance, who entered, who is absent and since when;
//! the wait-for graph across comms and hosts; its sinks are the source ranks.
//!
//! * [`model`]: snapshots (what an agent knows, sent to the master and archived) and verdicts.
//! * [`config`]: `[hang]` of the agent's configuration and the analysis settings from it.
//! * [`analyze`]: snapshot -> verdicts; `settings` (when a wait is a hang), `context` (the
//!   snapshot indexed by rank and comm), `waitfor` (the wait-for graph's verdict) and
//!   `mismatch` (count / function mismatches) are its parts.

pub mod analyze;
pub mod config;
mod context;
pub mod graph;
pub mod merge;
mod mismatch;
pub mod model;
pub mod resolved;
mod settings;
pub mod tracker;
mod waitfor;

pub use analyze::{analyze, Analysis, HangSettings};
pub use config::HangConfig;
pub use model::{HangReport, JobSnapshot, Verdict, VerdictKind};
pub use tracker::HangTracker;

#[cfg(test)]
mod tests;

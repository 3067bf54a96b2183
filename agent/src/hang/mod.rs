//! Hang and failure localisation: per comm instance, who entered, who is absent and since when;
//! the wait-for graph across comms and hosts; its sinks are the source ranks.
//!
//! * [`model`]: snapshots (what an agent knows, sent to the master and archived) and verdicts.
//! * [`config`]: `[hang]` of the agent's configuration and the analysis settings from it.

pub mod analyze;
pub mod config;
pub mod graph;
pub mod merge;
pub mod model;
pub mod resolved;
pub mod tracker;

pub use analyze::{analyze, Analysis, HangSettings};
pub use config::HangConfig;
pub use model::{HangReport, JobSnapshot, Verdict, VerdictKind};
pub use tracker::HangTracker;

#[cfg(test)]
mod tests;

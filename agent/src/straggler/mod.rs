//! The straggler index (DESIGN.md §5, issue 7): who makes the others wait, per step and over
//! steps, from matched operation instances on the aligned clock.
//!
//! * [`model`]: inputs ([`RankStep`]) and the report ([`StragglerReport`]).

pub mod model;

pub use model::{
    Arrival, InstanceKey, PeerWait, RankIndex, RankStep, RankSummary, StepIndex, StragglerClass,
    StragglerReport,
};

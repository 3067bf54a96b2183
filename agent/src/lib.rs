//! CommInsight host agent and offline CLI.
//!
//! The daemon (`comminsight-agent run`) is shaped as sources -> transforms -> sinks:
//! * [`sources`]: the plugins' live rings and segment files, one exactly-once cursor per process;
//! * [`clock`]: per-process calibration and the host offset against the job master ([`master`]);
//! * [`metrics`]: per-communicator operation metrics; [`sinks`]: OTLP export;
//! * [`archive`]: compressed raw segments, Parquet, retention and object-store upload;
//! * [`pipeline`]: the live topology; [`replay`]: the same stages offline.
//!
//! ```no_run
//! let recs = comminsight_agent::inspect::load(std::path::Path::new("out/inspector_logs")).unwrap();
//! println!("{} records from {} segment files", recs.records.len(), recs.files);
//! ```

pub mod archive;
pub mod cli;
pub mod clock;
pub mod config;
pub mod doctor;
pub mod engine;
pub mod hang;
pub mod inspect;
pub mod master;
pub mod metrics;
pub mod offline;
pub mod pipeline;
pub mod report;
pub mod roles;
pub mod sdnotify;
pub mod sinks;
pub mod sources;
pub mod stacks;
pub mod steps;
pub mod straggler;
pub mod stream;
pub mod trace;
pub mod util;

pub use config::AgentConfig;
pub use stream::{Alignment, StreamId};

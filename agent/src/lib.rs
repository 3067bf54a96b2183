//! CommInsight host agent and offline CLI.
//!
//! Today: reading the plugin's record streams ([`inspect`]) behind `comminsight-agent dump`
//! and `comminsight-agent encode`. The daemon (`run`), replay and the analyses arrive with later issues.
//!
//! ```no_run
//! let recs = comminsight_agent::inspect::load(std::path::Path::new("out/inspector_logs")).unwrap();
//! println!("{} records from {} segment files", recs.records.len(), recs.files);
//! ```

pub mod cli;
pub mod inspect;

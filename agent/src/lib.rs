//! CommInsight host agent and offline CLI.
//!
//! One engine ([`engine::Engine`]) runs the analyses — operation metrics, communicator roles,
//! the hang tracker, the step engine, the straggler arrivals — on the same records the same way
//! online and offline (DESIGN.md §3, rule 2):
//! * the daemon (`comminsight-agent run`): [`sources`] (exactly-once cursors over the plugins'
//!   rings and segments) -> the engine -> the sinks ([`sinks`], [`archive`], the job master
//!   [`master`]), with [`clock`] alignment and the live hang path;
//! * the offline commands ([`offline`]): one [`offline::Input`] (archives staged once) -> the
//!   same engine -> the results ([`report`], [`trace`], and the steps, roles, hang and straggler
//!   reports), with the site's settings ([`config`]).
//!
//! `docs/architecture.md` draws the data flow and says where a new kind of evidence plugs in.
//!
//! ```no_run
//! use comminsight_agent::offline::{straggler, Input, Settings};
//! let input = Input::open(std::path::Path::new("/var/lib/comminsight/archive")).unwrap();
//! for r in straggler::reports(&input, &Settings::default(), &Default::default()).unwrap() {
//!     println!("{}: top rank {:?}", r.job, r.ranks.first().map(|x| x.rank));
//! }
//! ```

pub mod archive;
pub mod cli;
pub mod clock;
pub mod config;
pub mod doctor;
pub(crate) mod dump;
pub mod engine;
pub mod hang;
pub mod host;
pub mod http;
pub mod interop;
pub mod master;
pub mod metrics;
pub mod moe;
pub mod offline;
pub(crate) mod pipeline;
pub mod probes;
pub mod report;
pub mod roles;
pub(crate) mod sdnotify;
pub mod sinks;
pub mod sources;
pub mod stacks;
pub mod steps;
pub mod straggler;
pub mod stream;
pub mod telemetry;
pub mod trace;
pub(crate) mod util;

pub use config::AgentConfig;
pub use stream::{Alignment, StreamId};

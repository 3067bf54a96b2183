//! Importers: evidence other tools already wrote, turned into CommInsight records so that the
//! agent's offline commands (`hang`, `steps`, `straggler`, `trace`, `report`) run on it with the
//! same code as on the plugin's segments (issue 22).
//!
//! * [`flight_recorder`]: PyTorch NCCL Flight Recorder dumps (pickle, read by [`pickle`] without
//!   executing anything, or their JSON form), format 2.x.
//! * [`kineto`]: Kineto / Chrome JSON traces from `torch.profiler` (plain or gzip), streamed.
//! * [`inspector`]: NCCL Inspector JSON lines, streamed.
//! * [`detect`]: which of these a file is.
//! * [`out`]: the segment streams an import writes (`<OUT>/<job>/<host>/<pid>/seg-*.cis`, every
//!   segment marked with its `SOURCE_*`).
//!
//! Every importer reads what is valid and counts what it skipped ([`Skips`]); an error that
//! stops a file names the file and what is wrong ([`ImportError`]).

pub mod detect;
mod error;
pub mod flight_recorder;
pub mod inspector;
pub mod kineto;
pub mod out;
pub mod pickle;

pub use detect::{detect, Format};
pub use error::{ImportError, ImportSummary, Skips};

//! CommInsight wire format (DESIGN.md §4).
//!
//! * [`record`]: the versioned 128-byte record and its kinds.
//! * [`names`]: one-byte codes for NCCL's function / datatype / algorithm / protocol strings.
//! * [`json`] (feature `json`): the JSON-lines rendering and its lossless inverse.
//! * [`ring`]: the shared-memory ring between the plugin's producers, its drain thread and
//!   any number of late-attaching readers.
//! * [`segment`]: sealed segment files (`inspector_logs`), writer with rotation and retention,
//!   and reader.
//!
//! ```
//! use comminsight_wire::record::{Body, CommFini, Record};
//! let rec = Record::new(Body::CommFini(CommFini { comm_hash: 7, ..Default::default() }));
//! assert_eq!(Record::decode(&rec.encode()).unwrap(), rec);
//! ```

mod body;
mod codec;
#[cfg(feature = "json")]
pub mod json;
pub mod names;
pub mod record;
pub mod ring;
pub mod segment;
mod sys;
#[cfg(test)]
mod testutil;

pub use names::{Algo, DataType, Func, Proto};
pub use record::{Body, Kind, RawRecord, Record, RECORD_SIZE};

//! CommInsight wire format (DESIGN.md §4).
//!
//! * [`record`]: the versioned 128-byte record and its kinds.
//! * [`roles`]: communicator roles (dp, tp, pp, ep, cp, global) and the names that carry them.
//! * [`bounds`]: what a record may say; every decode checks it (a record outside is corrupt).
//! * [`host`]: the host-context bodies the agent writes (threads, queue pairs, TCP, ports).
//! * [`moe`]: the MoE expert-parallel wait counters a rank's producers write (`ep_stats`).
//! * [`names`]: one-byte codes for NCCL's function / datatype / algorithm / protocol strings.
//! * [`json`] (feature `json`): the JSON-lines rendering and its lossless inverse.
//! * [`ring`]: the shared-memory MPSC ring ([`ring::ShmRing`]) between the plugin's producer
//!   threads and its drain thread, and [`ring::RingReader`] for read-only followers in other
//!   processes (the agent) that attach at any time and count what they missed.
//! * [`segment`]: segment files (`inspector_logs`): [`segment::SegmentWriter`] with rotation by
//!   size and age, preamble repeats and retention, which stops for good on the first I/O error;
//!   [`segment::find_segments`] and [`segment::read_segment`] for readers.
//!
//! * [`fsafe`]: opening files other users can plant (no symbolic links below a configured
//!   directory, non-blocking, `fstat`-checked type and owner) and creating files exclusively.
//!
//! All `unsafe` code (mmap, munmap, the atomic view of a mapping, a few syscalls) lives in the
//! private `sys` module and in `fsafe` (its `openat2` / `openat` / `renameat` calls).
//!
//! ```
//! use comminsight_wire::record::{Body, CommFini, Record};
//! let rec = Record::new(Body::CommFini(CommFini { comm_hash: 7, ..Default::default() }));
//! assert_eq!(Record::decode(&rec.encode()).unwrap(), rec);
//!
//! // A private (anonymous-memory) ring: producers push, the drain thread pops.
//! let ring = comminsight_wire::ring::ShmRing::private(64).unwrap();
//! assert!(ring.push(&rec.encode()));
//! let mut out = Vec::new();
//! assert_eq!(ring.pop_into(&mut out, 16), 1);
//! assert_eq!(out[0].seq(), 0); // the ring numbers records
//! ```

mod body;
pub mod bounds;
mod codec;
pub mod fsafe;
pub mod gpu;
pub mod host;
#[cfg(feature = "json")]
pub mod json;
pub mod moe;
pub mod names;
pub mod record;
pub mod ring;
pub mod roles;
pub mod segment;
mod sys;
#[cfg(test)]
mod testutil;

pub use names::{Algo, DataType, Func, Proto};
pub use record::{Body, Kind, RawRecord, Record, RECORD_SIZE};

//! `libcomminsight-preload.so`: an `LD_PRELOAD` shim that names NCCL communicators by role.
//!
//! It interposes NCCL's comm-creating entry points (`ncclCommInitRank[Config|Scalable]`,
//! `ncclCommSplit`, `ncclCommShrink`, `ncclCommGrow`; `ncclCommInitAll` only forwards) and, when the
//! caller gave no `commName`, passes a copy of the caller's config with the name of the process
//! group the process announced (`comminsight_announce_group`, called by the Python inject) or of
//! `COMMINSIGHT_COMM_ROLE`. NCCL's operations are not interposed at all. See preload/README.md.
//!
//! HCCL (Ascend, no profiler ABI): [`hccl_ffi`] interposes HCCL's comm and operation entry points
//! and records them through the CommInsight plugin ([`recorder`], its real profiler table),
//! keeping ops open until their stream passes them ([`acl`]); [`hccl`] is the safe part.
//!
//! Modules: [`config`] (`ncclConfig_t` bytes), [`state`] (announcements, matching, names,
//! warnings), [`shim`] (per-call decisions), [`env`] (constructor decisions), [`sym`] and
//! [`ffi`] (the only `unsafe`: symbol lookup, C entry points).

pub mod acl;
pub mod config;
pub mod env;
pub mod ffi;
pub mod hccl;
pub mod hccl_ffi;
pub mod recorder;
pub mod shim;
pub mod state;
pub mod sym;

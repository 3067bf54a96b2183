//! CPU stand-in for `libnccl.so.2` (DESIGN.md §6): NCCL's public C API subset over TCP between host
//! processes, with profiler plugins loaded and driven as NCCL does. Contract: docs/contracts.md.
//!
//! * [`ffi`]: every exported C symbol (`ncclAllReduce`, …, `ncclTestbed*`).
//! * [`comm`], [`group`], [`worker`], [`exec`], [`algo`]: communicators, groups, the single stream.
//! * [`net`]: the TCP transport and bootstrap.
//! * [`profiler`]: plugin loading (per NCCL release) and event emission (v4, v5, v6).

pub mod algo;
pub mod comm;
pub mod env;
pub mod exec;
pub mod ffi;
pub mod group;
pub mod hash;
pub mod log;
pub mod mem;
pub mod net;
pub mod profiler;
pub mod reduce;
pub mod task;
pub mod types;
pub mod worker;

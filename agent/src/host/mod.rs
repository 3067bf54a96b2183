//! The host's own view below NCCL: the engine's analysis of the host-context records
//! ([`context`]), the daemon's recorder that writes them ([`recorder`]), and NIC / RDMA port
//! counters from sysfs ([`ports`]).
pub mod context;
pub mod ports;

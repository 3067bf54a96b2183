//! The host's own view below NCCL: the daemon's [`recorder`] that follows the rank processes
//! and writes what the host knows about them (thread states from the eBPF probes or
//! [`schedstat`], QP events, TCP retransmits, NIC / RDMA port counters from [`ports`]) as
//! host-context records ([`records`]) into host streams, and the engine's analysis of those
//! records ([`context`]), its queue pairs joined to communicators and peers ([`qps`]), and the
//! rank windows of it the straggler classes read ([`windows`]).
pub mod context;
pub mod gpu;
pub mod ports;
pub mod qps;
pub mod recorder;
pub mod records;
pub mod schedstat;
pub mod windows;

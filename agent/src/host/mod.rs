//! The host's own view below NCCL that needs no BPF: NIC / RDMA port counters from sysfs.
pub mod ports;

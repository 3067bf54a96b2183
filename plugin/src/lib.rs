//! NCCL profiler plugin (being written).

//! libnccl stand-in (being written).

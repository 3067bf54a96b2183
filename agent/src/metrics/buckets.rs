//! Fixed label buckets and NCCL Inspector's bandwidth formulas (pure arithmetic).

use comminsight_wire::names::Func;
use comminsight_wire::record::{OpRecord, Timing};

/// Upper bounds (µs, inclusive) of the execution-time histogram; one more bucket above the last.
pub const DURATION_BOUNDS_US: [u64; 12] = [
    10, 50, 100, 500, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000,
];

/// Number of histogram buckets (`DURATION_BOUNDS_US.len() + 1`, the last one unbounded).
pub const DURATION_BUCKETS: usize = DURATION_BOUNDS_US.len() + 1;

/// Message-size bucket names: powers of 4 from `<=1KiB` to `<=1GiB`, then `>1GiB`.
pub const SIZE_BUCKETS: [&str; 12] = [
    "<=1KiB", "<=4KiB", "<=16KiB", "<=64KiB", "<=256KiB", "<=1MiB", "<=4MiB", "<=16MiB", "<=64MiB",
    "<=256MiB", "<=1GiB", ">1GiB",
];

/// Index into [`SIZE_BUCKETS`] of a message of `bytes` bytes.
pub fn size_bucket(bytes: u64) -> u8 {
    if bytes <= 1024 {
        return 0;
    }
    // Bits needed for `bytes - 1`: bytes <= 2^bits. Bucket k holds (2^(10+2(k-1)), 2^(10+2k)].
    let bits = 64 - (bytes - 1).leading_zeros();
    let k = (bits - 10).div_ceil(2);
    k.min(SIZE_BUCKETS.len() as u32 - 1) as u8
}

/// Index of the histogram bucket holding `ns` (bucket i: `ns <= DURATION_BOUNDS_US[i] µs`).
pub fn duration_bucket(ns: u64) -> usize {
    DURATION_BOUNDS_US.partition_point(|&b| b * 1000 < ns)
}

/// The operation's execution time in ns: the GPU kernel span when the plugin timed the kernels
/// with GPU timers (`timing = kernel_gpu`), else the host span `end_ns - start_ns` (kernel
/// channel times on the host, or the Coll/P2p event). Inspector's exec time
/// (`calculateMaxKernelExecTimeUsecs` in plugins/profiler/inspector/inspector.cc) prefers the
/// same sources in the same order (GPU kernel timers, CPU kernel timers, collective CPU time).
pub fn exec_ns(op: &OpRecord) -> u64 {
    if op.timing == Timing::KernelGpu && op.gpu_end_ns > op.gpu_start_ns {
        return op.gpu_end_ns - op.gpu_start_ns;
    }
    op.end_ns.saturating_sub(op.start_ns)
}

/// `AllGatherV` (no named constant in the wire crate).
const ALL_GATHER_V: Func = Func(12);

/// Traffic bytes and bus factor (numerator, denominator) of one operation, as NCCL Inspector's
/// `inspectorComputeOpBw` (plugins/profiler/inspector/inspector.cc) computes them:
/// `msgSizeBytes = count * typeSize` (our `bytes`); P2P: traffic = bytes, factor 1;
/// Reduce/Broadcast: bytes, 1; AllReduce: bytes, 2(n-1)/n; ReduceScatter and AllGather(V):
/// bytes * n, (n-1)/n; SendRecv/Send/Recv: bytes, 1; anything else (AlltoAll, Gather, Scatter):
/// 0, 0. `algbw = traffic / time`, `busbw = algbw * factor`. An unknown `nranks` (0: no
/// `comm_init` seen) gives no traffic for the n-dependent cases.
pub fn traffic(is_p2p: bool, func: Func, bytes: u64, nranks: u32) -> (u64, u64, u64) {
    let n = nranks as u64;
    if is_p2p {
        return (bytes, 1, 1);
    }
    match func {
        Func::REDUCE | Func::BROADCAST | Func::SEND_RECV | Func::SEND | Func::RECV => (bytes, 1, 1),
        Func::ALL_REDUCE if n > 0 => (bytes, 2 * (n - 1), n),
        Func::REDUCE_SCATTER | Func::ALL_GATHER | ALL_GATHER_V if n > 0 => {
            (bytes.saturating_mul(n), n - 1, n)
        }
        _ => (0, 0, 1),
    }
}

/// `traffic * num / den` without overflow (bus bytes; integer so sums do not depend on order).
pub fn bus_bytes(traffic: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return 0;
    }
    (traffic as u128 * num as u128 / den as u128).min(u64::MAX as u128) as u64
}

/// GB/s (`1e9` bytes per second) of `bytes` moved in `ns` nanoseconds; 0 when no time elapsed.
pub fn gbs(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        bytes as f64 / ns as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_buckets_are_powers_of_four() {
        assert_eq!(SIZE_BUCKETS[size_bucket(0) as usize], "<=1KiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(1024) as usize], "<=1KiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(1025) as usize], "<=4KiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(4096) as usize], "<=4KiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(4097) as usize], "<=16KiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(64 << 10) as usize], "<=64KiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(1 << 20) as usize], "<=1MiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(1 << 30) as usize], "<=1GiB");
        assert_eq!(SIZE_BUCKETS[size_bucket((1 << 30) + 1) as usize], ">1GiB");
        assert_eq!(SIZE_BUCKETS[size_bucket(u64::MAX) as usize], ">1GiB");
    }

    #[test]
    fn duration_buckets_are_inclusive_upper_bounds() {
        assert_eq!(duration_bucket(0), 0);
        assert_eq!(duration_bucket(10_000), 0);
        assert_eq!(duration_bucket(10_001), 1);
        assert_eq!(duration_bucket(5_000_000_000), 11);
        assert_eq!(duration_bucket(5_000_000_001), 12);
        assert_eq!(DURATION_BUCKETS, 13);
    }

    #[test]
    fn inspector_bus_factors() {
        assert_eq!(traffic(false, Func::ALL_REDUCE, 100, 8), (100, 14, 8));
        assert_eq!(traffic(false, Func::ALL_GATHER, 100, 8), (800, 7, 8));
        assert_eq!(traffic(false, Func::REDUCE_SCATTER, 100, 4), (400, 3, 4));
        assert_eq!(traffic(false, Func(12), 100, 4), (400, 3, 4)); // AllGatherV
        assert_eq!(traffic(false, Func::BROADCAST, 100, 8), (100, 1, 1));
        assert_eq!(traffic(true, Func::SEND, 100, 8), (100, 1, 1));
        assert_eq!(traffic(false, Func::ALL_TO_ALL, 100, 8), (0, 0, 1));
        assert_eq!(traffic(false, Func::ALL_REDUCE, 100, 0), (0, 0, 1));
        assert_eq!(bus_bytes(800, 7, 8), 700);
        assert_eq!(bus_bytes(u64::MAX, 2, 1), u64::MAX);
        assert_eq!(gbs(2_000, 1_000), 2.0);
        assert_eq!(gbs(2_000, 0), 0.0);
    }

    #[test]
    fn exec_time_prefers_gpu_timers() {
        let mut op = OpRecord {
            start_ns: 100,
            end_ns: 1_100,
            gpu_start_ns: 5_000,
            gpu_end_ns: 5_400,
            timing: Timing::KernelGpu,
            ..Default::default()
        };
        assert_eq!(exec_ns(&op), 400);
        op.timing = Timing::KernelCpu;
        assert_eq!(exec_ns(&op), 1_000);
        op.end_ns = 0;
        assert_eq!(exec_ns(&op), 0);
    }
}

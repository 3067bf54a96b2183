//! The agent's own counters, updated by the pipeline with relaxed atomics and read by the
//! OTLP sink when it exports.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters and gauges about the agent itself (`comminsight.agent.*`).
#[derive(Debug, Default)]
pub struct SelfMetrics {
    /// Records ingested from every source (counter).
    pub records: AtomicU64,
    /// Bytes of records ingested (counter).
    pub bytes: AtomicU64,
    /// How far the newest ingested record lags behind the wall clock (ms, gauge).
    pub lag_ms: AtomicU64,
    /// Resident set size of the agent (bytes, gauge); see [`SelfMetrics::sample_rss`].
    pub rss_bytes: AtomicU64,
    /// Failed sink operations (exports, uploads; counter).
    pub sink_errors: AtomicU64,
    /// Sealed segments waiting to be archived or uploaded (gauge).
    pub archive_backlog: AtomicU64,
    /// Log records dropped because the OTLP backlog was full (counter).
    pub logs_dropped: AtomicU64,
}

/// A plain copy of [`SelfMetrics`] at one instant (same fields, same meaning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelfMetricsValues {
    pub records: u64,
    pub bytes: u64,
    pub lag_ms: u64,
    pub rss_bytes: u64,
    pub sink_errors: u64,
    pub archive_backlog: u64,
    pub logs_dropped: u64,
}

impl SelfMetrics {
    /// Count `n` records of `bytes` bytes ingested.
    pub fn add_records(&self, n: u64, bytes: u64) {
        self.records.fetch_add(n, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The current values.
    pub fn values(&self) -> SelfMetricsValues {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SelfMetricsValues {
            records: r(&self.records),
            bytes: r(&self.bytes),
            lag_ms: r(&self.lag_ms),
            rss_bytes: r(&self.rss_bytes),
            sink_errors: r(&self.sink_errors),
            archive_backlog: r(&self.archive_backlog),
            logs_dropped: r(&self.logs_dropped),
        }
    }

    /// Refresh `rss_bytes` from `/proc/self/statm` (resident pages times the page size);
    /// leaves it unchanged where that file cannot be read.
    pub fn sample_rss(&self) {
        if let Some(rss) = read_rss_bytes() {
            self.rss_bytes.store(rss, Ordering::Relaxed);
        }
    }
}

/// This process' resident set size from `/proc/self/statm`, if readable.
pub fn read_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_and_rss_is_sampled() {
        let m = SelfMetrics::default();
        m.add_records(3, 384);
        m.add_records(1, 128);
        m.sample_rss();
        let v = m.values();
        assert_eq!((v.records, v.bytes), (4, 512));
        assert!(v.rss_bytes > 1 << 20, "rss {}", v.rss_bytes);
    }
}

//! NCCL Inspector-compatible output (`COMMINSIGHT_INSPECTOR_COMPAT=1`): the same JSON Lines file,
//! directory, keys and bandwidth formulas as Inspector's JSON mode (research/nccl-abi.md §4), so a
//! site that switches profiler plugins keeps its per-op records. Written by the drain thread only.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use comminsight_wire::names::Func;
use comminsight_wire::record::{OpRecord, Timing};

/// Inspector's output format version string.
pub const FORMAT_VERSION: &str = "v4.0";
/// What we put in `git_rev`.
pub const GIT_REV: &str = concat!("comminsight-", env!("CARGO_PKG_VERSION"));

/// The communicator part of a line (`header`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommHeader {
    pub comm_hash: u64,
    pub name: String,
    pub rank: i32,
    pub nranks: u32,
    pub nnodes: u32,
}

/// (traffic multiplier of the message size, busbw factor) — nccl-tests' formulas as Inspector
/// uses them.
pub fn bw_factors(func: Func, nranks: u32) -> (f64, f64) {
    let n = f64::from(nranks.max(1));
    match func.name() {
        "AllReduce" => (1.0, 2.0 * (n - 1.0) / n),
        "ReduceScatter" | "AllGather" | "AllGatherV" => (n, (n - 1.0) / n),
        "Broadcast" | "Reduce" => (1.0, 1.0),
        "Send" | "Recv" | "SendRecv" => (1.0, 1.0),
        _ => (1.0, 0.0),
    }
}

/// (algbw, busbw) in GB/s for `bytes` moved in `exec_us`.
pub fn bandwidth(func: Func, nranks: u32, bytes: u64, exec_us: f64) -> (f64, f64) {
    if exec_us <= 0.0 {
        return (0.0, 0.0);
    }
    let (mult, factor) = bw_factors(func, nranks);
    let algbw = bytes as f64 * mult / 1e9 / (exec_us / 1e6);
    (algbw, algbw * factor)
}

/// Execution time (ns) and its source, or `None` when the op has no usable timing.
/// `max_channel_ns`: the longest per-channel GPU duration (Inspector's definition) when known;
/// otherwise the GPU span (last channel stop − first channel start) is used.
pub fn exec_ns(op: &OpRecord, max_channel_ns: Option<u64>) -> Option<(u64, Timing)> {
    match op.timing {
        Timing::KernelGpu if op.gpu_end_ns >= op.gpu_start_ns && op.gpu_start_ns != 0 => {
            let span = op.gpu_end_ns - op.gpu_start_ns;
            let exec = match max_channel_ns {
                Some(m) if m != 0 && m <= span && span < 1 << 32 => m,
                _ => span,
            };
            Some((exec, Timing::KernelGpu))
        }
        Timing::KernelCpu if op.end_ns >= op.start_ns => {
            Some((op.end_ns - op.start_ns, Timing::KernelCpu))
        }
        Timing::Enqueue | Timing::CollectiveCpu if op.end_ns >= op.enqueue_ns && op.end_ns != 0 => {
            Some((op.end_ns - op.enqueue_ns, Timing::CollectiveCpu))
        }
        _ => None,
    }
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One Inspector JSON line (without the newline).
pub fn format_line(
    h: &CommHeader,
    op: &OpRecord,
    is_p2p: bool,
    exec: (u64, Timing),
    dump_timestamp_us: u64,
    hostname: &str,
    pid: u32,
) -> String {
    let mut s = String::with_capacity(400);
    let _ = write!(
        s,
        "{{\"header\":{{\"id\":\"0x{:x}\",\"comm_name\":",
        h.comm_hash
    );
    json_str(
        &mut s,
        if h.name.is_empty() {
            "unknown"
        } else {
            &h.name
        },
    );
    let _ = write!(
        s,
        ",\"rank\":{},\"n_ranks\":{},\"nnodes\":{}}},\"metadata\":{{\"inspector_output_format_version\":\"{FORMAT_VERSION}\",\"git_rev\":\"{GIT_REV}\",\"rec_mechanism\":\"nccl_profiler_interface\",\"dump_timestamp_us\":{dump_timestamp_us},\"hostname\":",
        h.rank, h.nranks, h.nnodes
    );
    json_str(&mut s, hostname);
    let exec_us = exec.0 as f64 / 1000.0;
    let (algbw, busbw) = bandwidth(op.func, h.nranks, op.bytes, exec_us);
    let p = if is_p2p { "p2p" } else { "coll" };
    let _ = write!(s, ",\"pid\":{pid}}},\"{p}_perf\":{{\"{p}\":");
    json_str(&mut s, op.func.name());
    let _ = write!(s, ",\"{p}_sn\":{}", op.coll_sn);
    if is_p2p {
        let _ = write!(s, ",\"p2p_peer\":{}", op.peer);
    }
    let _ = write!(
        s,
        ",\"{p}_msg_size_bytes\":{},\"{p}_exec_time_us\":{},\"{p}_timing_source\":\"{}\",\"{p}_algobw_gbs\":{:.2},\"{p}_busbw_gbs\":{:.2}}}}}",
        op.bytes,
        exec.0 / 1000,
        exec.1.name(),
        algbw,
        busbw
    );
    s
}

/// Appends lines to `<dir>/<hostname>-pid<pid>.log`; the first I/O error stops it for good.
pub struct InspectorWriter {
    path: PathBuf,
    file: Option<File>,
    failed: bool,
    pub min_size: u64,
    pub p2p: bool,
    pub require_kernel: bool,
    pub hostname: String,
    pub pid: u32,
    pub lines: u64,
}

impl InspectorWriter {
    pub fn new(dir: &Path, hostname: &str, pid: u32) -> InspectorWriter {
        InspectorWriter {
            path: dir.join(format!("{hostname}-pid{pid}.log")),
            file: None,
            failed: false,
            min_size: crate::config::DEFAULT_INSPECTOR_MIN_SIZE,
            p2p: true,
            require_kernel: true,
            hostname: hostname.to_string(),
            pid,
            lines: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The line Inspector would write for this op, if it would write one.
    pub fn line_for(
        &self,
        h: &CommHeader,
        op: &OpRecord,
        is_p2p: bool,
        now_us: u64,
        max_channel_ns: Option<u64>,
    ) -> Option<String> {
        if (is_p2p && !self.p2p) || op.bytes < self.min_size {
            return None;
        }
        let exec = exec_ns(op, max_channel_ns)?;
        if self.require_kernel && exec.1 != Timing::KernelGpu {
            return None;
        }
        Some(format_line(
            h,
            op,
            is_p2p,
            exec,
            now_us,
            &self.hostname,
            self.pid,
        ))
    }

    /// Append lines. Returns false on (first or earlier) I/O failure.
    pub fn write_lines(&mut self, text: &str) -> bool {
        if self.failed {
            return false;
        }
        if text.is_empty() {
            return true;
        }
        if self.file.is_none() {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            let opened = std::fs::create_dir_all(dir).and_then(|_| {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o644)
                    .open(&self.path)
            });
            match opened {
                Ok(f) => self.file = Some(f),
                Err(_) => {
                    self.failed = true;
                    return false;
                }
            }
        }
        let ok = self
            .file
            .as_mut()
            .is_some_and(|f| f.write_all(text.as_bytes()).is_ok());
        if !ok {
            self.failed = true;
            self.file = None;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comminsight_wire::names::DataType;

    fn op(func: Func, bytes: u64, exec_ns: u64) -> OpRecord {
        OpRecord {
            func,
            bytes,
            count: bytes / 4,
            datatype: DataType::from_name("ncclFloat32"),
            coll_sn: 1407,
            gpu_start_ns: 1_000_000,
            gpu_end_ns: 1_000_000 + exec_ns,
            timing: Timing::KernelGpu,
            peer: -1,
            ..Default::default()
        }
    }

    #[test]
    fn line_matches_inspector_keys_and_numbers_exactly() {
        let h = CommHeader {
            comm_hash: 0xabc,
            name: String::new(),
            rank: 2,
            nranks: 8,
            nnodes: 1,
        };
        let o = op(Func::ALL_REDUCE, 17_179_869_184, 61_974_000);
        let line = format_line(
            &h,
            &o,
            false,
            exec_ns(&o, None).unwrap(),
            5,
            "node1",
            1639453,
        );
        let want = format!(
            "{}{}{}{}{}",
            "{\"header\":{\"id\":\"0xabc\",\"comm_name\":\"unknown\",\"rank\":2,\"n_ranks\":8,\"nnodes\":1},",
            "\"metadata\":{\"inspector_output_format_version\":\"v4.0\",\"git_rev\":\"",
            GIT_REV,
            "\",\"rec_mechanism\":\"nccl_profiler_interface\",\"dump_timestamp_us\":5,\"hostname\":\"node1\",\"pid\":1639453},",
            "\"coll_perf\":{\"coll\":\"AllReduce\",\"coll_sn\":1407,\"coll_msg_size_bytes\":17179869184,\"coll_exec_time_us\":61974,\"coll_timing_source\":\"kernel_gpu\",\"coll_algobw_gbs\":277.21,\"coll_busbw_gbs\":485.12}}"
        );
        assert_eq!(line, want);
    }

    #[test]
    fn p2p_lines_use_p2p_keys() {
        let h = CommHeader {
            comm_hash: 1,
            name: "pp\"0".into(),
            rank: 0,
            nranks: 2,
            nnodes: 2,
        };
        let mut o = op(Func::SEND, 1 << 20, 1_000_000);
        o.peer = 1;
        o.coll_sn = 3;
        let line = format_line(&h, &o, true, exec_ns(&o, None).unwrap(), 0, "h", 1);
        assert!(line.contains("\"comm_name\":\"pp\\\"0\""));
        assert!(line.contains(
            "\"p2p_perf\":{\"p2p\":\"Send\",\"p2p_sn\":3,\"p2p_peer\":1,\"p2p_msg_size_bytes\":1048576,\"p2p_exec_time_us\":1000,\"p2p_timing_source\":\"kernel_gpu\",\"p2p_algobw_gbs\":1.05,\"p2p_busbw_gbs\":1.05}}"
        ), "{line}");
    }

    #[test]
    fn busbw_factors_follow_nccl_tests() {
        let n = 8;
        assert_eq!(bw_factors(Func::ALL_REDUCE, n), (1.0, 1.75));
        assert_eq!(bw_factors(Func::ALL_GATHER, n), (8.0, 0.875));
        assert_eq!(bw_factors(Func::REDUCE_SCATTER, n), (8.0, 0.875));
        assert_eq!(bw_factors(Func::BROADCAST, n), (1.0, 1.0));
        assert_eq!(bw_factors(Func::REDUCE, n), (1.0, 1.0));
        assert_eq!(bw_factors(Func::SEND, n), (1.0, 1.0));
        assert_eq!(bw_factors(Func::RECV, n), (1.0, 1.0));
        assert_eq!(bw_factors(Func::ALL_TO_ALL, n).1, 0.0);
        // AllGather of 1 MB per rank over 8 ranks in 1 ms: algbw = 8 MB / 1 ms = 8.39 GB/s.
        let (a, b) = bandwidth(Func::ALL_GATHER, 8, 1 << 20, 1000.0);
        assert!((a - 8.388608).abs() < 1e-9 && (b - 8.388608 * 0.875).abs() < 1e-9);
    }

    #[test]
    fn small_ops_and_non_kernel_timings_are_filtered_like_inspector() {
        let dir = std::env::temp_dir().join(format!("ci-insp-{}", std::process::id()));
        let w = InspectorWriter::new(&dir, "h", 1);
        let h = CommHeader::default();
        assert!(w
            .line_for(&h, &op(Func::ALL_REDUCE, 4096, 1000), false, 0, None)
            .is_none());
        assert!(w
            .line_for(&h, &op(Func::ALL_REDUCE, 8192, 1000), false, 0, None)
            .is_some());
        let mut cpu = op(Func::ALL_REDUCE, 1 << 20, 1000);
        cpu.timing = Timing::KernelCpu;
        cpu.start_ns = 10;
        cpu.end_ns = 20;
        assert!(w.line_for(&h, &cpu, false, 0, None).is_none());
        let mut w2 = InspectorWriter::new(&dir, "h", 1);
        w2.require_kernel = false;
        assert!(w2
            .line_for(&h, &cpu, false, 0, None)
            .unwrap()
            .contains("\"coll_timing_source\":\"kernel_cpu\""));
        assert!(w2.write_lines("x\n"));
        assert_eq!(
            std::fs::read_to_string(dir.join("h-pid1.log")).unwrap(),
            "x\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn exec_time_is_the_longest_channel_when_known_else_the_gpu_span() {
        let o = op(Func::ALL_REDUCE, 1 << 20, 2_000_000);
        assert_eq!(exec_ns(&o, None), Some((2_000_000, Timing::KernelGpu)));
        assert_eq!(
            exec_ns(&o, Some(1_500_000)),
            Some((1_500_000, Timing::KernelGpu))
        );
        assert_eq!(exec_ns(&o, Some(0)).unwrap().0, 2_000_000);
        let long = op(Func::ALL_REDUCE, 1 << 20, 5 << 30);
        assert_eq!(
            exec_ns(&long, Some(7)).unwrap().0,
            5 << 30,
            "32-bit channel times wrap: use the span"
        );
    }
}

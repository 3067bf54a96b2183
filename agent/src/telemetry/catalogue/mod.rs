//! Every instrument the agent exports, with its OpenTelemetry name, kind, unit and attributes:
//! the one table that OTLP, the Prometheus endpoint and `docs/telemetry.md` are made from.
//!
//! Conventions (OpenTelemetry semantic conventions for metrics): dot-separated names under
//! `comminsight.`, no unit in the name, UCUM units (`s`, `By`, `By/s`, `1`, `{operation}`),
//! durations in seconds, ratios in `1`, native histograms. The Prometheus names follow the
//! OpenTelemetry-to-Prometheus translation that Prometheus' and Mimir's OTLP receivers apply
//! (dots to `_`, unit suffix, `_total` on counters), so a dashboard works on either path.

mod moe;
pub use moe::*;

/// What kind of instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic cumulative sum.
    Counter,
    /// Last value.
    Gauge,
    /// Cumulative explicit-bucket histogram.
    Histogram,
}

/// One exported instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instrument {
    /// OpenTelemetry name.
    pub name: &'static str,
    /// Kind.
    pub kind: Kind,
    /// UCUM unit.
    pub unit: &'static str,
    /// What it measures.
    pub description: &'static str,
    /// Attribute keys of its data points (OpenTelemetry names).
    pub attributes: &'static [&'static str],
}

/// Job id attribute (the streams' `<job>`).
pub const JOB: &str = "comminsight.job.id";
/// Host attribute on every series, so hosts stay apart where resource attributes are not copied.
pub const HOST: &str = "host.name";
/// Communicator name (from `comm_init`; the preload shim names them by role).
pub const COMM: &str = "comminsight.comm.name";
/// NCCL function.
pub const FUNC: &str = "comminsight.op.func";
/// Message-size bucket.
pub const SIZE: &str = "comminsight.op.size_bucket";
/// NCCL algorithm.
pub const ALGO: &str = "comminsight.op.algo";
/// NCCL protocol.
pub const PROTO: &str = "comminsight.op.proto";
/// Global rank.
pub const RANK: &str = "comminsight.rank";

/// Scheduler state of a thread (`on_cpu`, `runnable`, `blocked`, `blocked_io`; disjoint).
pub const THREAD_STATE: &str = "comminsight.thread.state";
/// NIC / RDMA device of a port (`mlx5_0`, `eth0`).
pub const PORT_DEVICE: &str = "comminsight.port.device";
/// Port number on its device (1 for an Ethernet interface).
pub const PORT_NUMBER: &str = "comminsight.port.number";

/// Attributes of the per-series instruments.
pub const SERIES_ATTRS: &[&str] = &[JOB, HOST, COMM, FUNC, SIZE, ALGO, PROTO];
/// Attributes of the per-job instruments.
pub const JOB_ATTRS: &[&str] = &[JOB, HOST];
/// Attributes of the per-rank instruments.
pub const RANK_ATTRS: &[&str] = &[JOB, RANK, HOST];
/// Attributes of the per-rank thread-state instrument.
pub const RANK_STATE_ATTRS: &[&str] = &[JOB, RANK, HOST, THREAD_STATE];
/// Attributes of the per-port instruments.
pub const PORT_ATTRS: &[&str] = &[HOST, PORT_DEVICE, PORT_NUMBER];
/// Attributes of the agent's own instruments.
pub const AGENT_ATTRS: &[&str] = &[HOST];

const fn series(name: &'static str, kind: Kind, unit: &'static str, d: &'static str) -> Instrument {
    Instrument {
        name,
        kind,
        unit,
        description: d,
        attributes: SERIES_ATTRS,
    }
}

const fn job(name: &'static str, unit: &'static str, d: &'static str) -> Instrument {
    Instrument {
        name,
        kind: Kind::Counter,
        unit,
        description: d,
        attributes: JOB_ATTRS,
    }
}

const fn agent(name: &'static str, kind: Kind, unit: &'static str, d: &'static str) -> Instrument {
    Instrument {
        name,
        kind,
        unit,
        description: d,
        attributes: AGENT_ATTRS,
    }
}

const fn rank(name: &'static str, d: &'static str) -> Instrument {
    Instrument {
        name,
        kind: Kind::Gauge,
        unit: "1",
        description: d,
        attributes: RANK_ATTRS,
    }
}

const fn host_inst(
    name: &'static str,
    kind: Kind,
    unit: &'static str,
    attributes: &'static [&'static str],
    d: &'static str,
) -> Instrument {
    Instrument {
        name,
        kind,
        unit,
        description: d,
        attributes,
    }
}

/// Execution time of completed NCCL operations.
pub const OP_DURATION: Instrument = series(
    "comminsight.op.duration",
    Kind::Histogram,
    "s",
    "Execution time of completed NCCL operations (count = operations)",
);
/// Message bytes.
pub const OP_PAYLOAD: Instrument = series(
    "comminsight.op.payload",
    Kind::Counter,
    "By",
    "Message bytes of completed operations (count * type size)",
);
/// Inspector traffic bytes.
pub const OP_TRAFFIC: Instrument = series(
    "comminsight.op.traffic",
    Kind::Counter,
    "By",
    "NCCL Inspector traffic bytes (algorithm-bandwidth numerator; divide its rate by the duration sum's)",
);
/// Bus traffic bytes.
pub const OP_BUS_TRAFFIC: Instrument = series(
    "comminsight.op.bus_traffic",
    Kind::Counter,
    "By",
    "Traffic bytes times the bus factor (bus-bandwidth numerator)",
);
/// Unfinished operations.
pub const OP_INCOMPLETE: Instrument = series(
    "comminsight.op.incomplete",
    Kind::Counter,
    "{operation}",
    "Operations unfinished when their process exited",
);
/// Algorithm bandwidth gauge.
pub const OP_ALGBW: Instrument = series(
    "comminsight.op.algbw",
    Kind::Gauge,
    "By/s",
    "NCCL Inspector algorithm bandwidth over the whole series",
);
/// Bus bandwidth gauge.
pub const OP_BUSBW: Instrument = series(
    "comminsight.op.busbw",
    Kind::Gauge,
    "By/s",
    "NCCL Inspector bus bandwidth over the whole series",
);
/// Overdue operations.
pub const OP_OVERDUE: Instrument = job(
    "comminsight.op.overdue",
    "{operation}",
    "Distinct operations the plugin reported overdue",
);
/// Plugin drops.
pub const PLUGIN_DROPPED: Instrument = job(
    "comminsight.plugin.dropped",
    "{record}",
    "Records the plugin dropped (ring full, no operation slot)",
);
/// Records lost between plugin and agent.
pub const STREAM_LOST: Instrument = job(
    "comminsight.stream.lost",
    "{record}",
    "Records missing from the streams (sequence gaps)",
);
/// Operations folded into `other`.
pub const OP_FOLDED: Instrument = job(
    "comminsight.op.folded",
    "{operation}",
    "Operations counted under comm name \"other\" because the series limit was reached",
);
/// Seed straggler index.
pub const STRAGGLER_INDEX: Instrument = rank(
    "comminsight.straggler.index",
    "Mean wait the rank caused its peers in its latest analysed step, as a fraction of the step time",
);
/// Root-cause straggler index.
pub const STRAGGLER_ROOT_INDEX: Instrument = rank(
    "comminsight.straggler.root_index",
    "Waiting the rank's own slowness started in its latest analysed step, as a fraction of the step time",
);
/// Main-thread time per scheduler state.
pub const HOST_THREAD_TIME: Instrument = host_inst(
    "comminsight.host.thread.time",
    Kind::Counter,
    "s",
    RANK_STATE_ATTRS,
    "Time the rank's main thread spent in each scheduler state since the agent first saw it (eBPF sched tracepoints or schedstat)",
);
/// TCP retransmits per rank.
pub const HOST_TCP_RETRANSMITS: Instrument = host_inst(
    "comminsight.host.tcp.retransmits",
    Kind::Counter,
    "{segment}",
    RANK_ATTRS,
    "TCP segments the rank's sockets retransmitted (eBPF tcp:tcp_retransmit_skb)",
);
/// Port bytes received.
pub const HOST_PORT_RECEIVED: Instrument = host_inst(
    "comminsight.host.port.received",
    Kind::Counter,
    "By",
    PORT_ATTRS,
    "Bytes the NIC / RDMA port received since the agent started sampling it (sysfs counters)",
);
/// Port bytes sent.
pub const HOST_PORT_TRANSMITTED: Instrument = host_inst(
    "comminsight.host.port.transmitted",
    Kind::Counter,
    "By",
    PORT_ATTRS,
    "Bytes the NIC / RDMA port transmitted since the agent started sampling it (sysfs counters)",
);
/// Port errors.
pub const HOST_PORT_ERRORS: Instrument = host_inst(
    "comminsight.host.port.errors",
    Kind::Counter,
    "{error}",
    PORT_ATTRS,
    "Errors the port's counters added (symbol, receive, discard, link-integrity; drops and errors on Ethernet)",
);
/// Link-down events.
pub const HOST_PORT_LINK_DOWNED: Instrument = host_inst(
    "comminsight.host.port.link_downed",
    Kind::Counter,
    "{event}",
    PORT_ATTRS,
    "Times the port's link went down",
);
/// Port state.
pub const HOST_PORT_UP: Instrument = host_inst(
    "comminsight.host.port.up",
    Kind::Gauge,
    "{link}",
    PORT_ATTRS,
    "1 when the port's link was up at its latest sample, else 0",
);
/// Records ingested.
pub const AGENT_RECORDS: Instrument = agent(
    "comminsight.agent.records",
    Kind::Counter,
    "{record}",
    "Records the agent ingested from every source",
);
/// Bytes ingested.
pub const AGENT_RECEIVED: Instrument = agent(
    "comminsight.agent.received",
    Kind::Counter,
    "By",
    "Bytes of records the agent ingested",
);
/// Sink errors.
pub const AGENT_SINK_ERRORS: Instrument = agent(
    "comminsight.agent.sink.errors",
    Kind::Counter,
    "{error}",
    "Failed sink operations (exports, uploads)",
);
/// Dropped log records.
pub const AGENT_LOGS_DROPPED: Instrument = agent(
    "comminsight.agent.logs.dropped",
    Kind::Counter,
    "{record}",
    "Log records dropped because the OTLP backlog was full",
);
/// Ingest lag.
pub const AGENT_LAG: Instrument = agent(
    "comminsight.agent.lag",
    Kind::Gauge,
    "s",
    "How far the newest ingested record lags behind the wall clock",
);
/// Resident memory.
pub const AGENT_MEMORY_RSS: Instrument = agent(
    "comminsight.agent.memory.rss",
    Kind::Gauge,
    "By",
    "Resident set size of the agent",
);
/// Archive backlog.
pub const AGENT_ARCHIVE_BACKLOG: Instrument = agent(
    "comminsight.agent.archive.backlog",
    Kind::Gauge,
    "{segment}",
    "Sealed segments waiting to be archived or uploaded",
);

// GPU instruments (issue 20), their points in `super::gpu`.

/// `hw.id`: the GPU's UUID (else its PCI address).
pub const HW_ID: &str = "hw.id";
/// `hw.type`: `gpu`.
pub const HW_TYPE: &str = "hw.type";
/// The GPU's PCI address (`dddd:bb:dd.f`).
pub const GPU_PCI: &str = "comminsight.gpu.pci";
/// `error.type` of `hw.errors`: `ecc_corrected`, `ecc_uncorrected`, `pcie_replay`; of NVLink
/// errors: `crc_flit`, `crc_data`, `replay`, `recovery`.
pub const ERROR_TYPE: &str = "error.type";
/// Which clock: `sm`, `memory`.
pub const CLOCK: &str = "comminsight.gpu.clock_type";
/// Why the clocks were held down: `sw_power_cap`, `hw_slowdown`, `hw_thermal`,
/// `hw_power_brake`, `sw_thermal`.
pub const REASON: &str = "comminsight.gpu.throttle_reason";
/// `network.io.direction`: `transmit`, `receive`.
pub const DIRECTION: &str = "network.io.direction";
/// NVLink number (-1: the totals over all links a DCGM scrape gives).
pub const LINK: &str = "comminsight.gpu.nvlink";

/// Attributes of the per-GPU instruments.
pub const GPU_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI];
pub const GPU_ERR_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, ERROR_TYPE];
pub const GPU_CLOCK_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, CLOCK];
pub const GPU_REASON_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, REASON];
pub const GPU_DIR_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, DIRECTION];
pub const LINK_DIR_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, LINK, DIRECTION];
pub const LINK_ERR_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, LINK, ERROR_TYPE];
pub const LINK_ATTRS: &[&str] = &[JOB, RANK, HOST, HW_ID, HW_TYPE, GPU_PCI, LINK];

const fn gpu_inst(
    name: &'static str,
    kind: Kind,
    unit: &'static str,
    attributes: &'static [&'static str],
    description: &'static str,
) -> Instrument {
    Instrument {
        name,
        kind,
        unit,
        description,
        attributes,
    }
}

pub const GPU_UTILIZATION: Instrument = gpu_inst(
    "hw.gpu.utilization",
    Kind::Gauge,
    "1",
    GPU_ATTRS,
    "Fraction of the latest sample period the GPU's SMs were busy (NVML utilization.gpu)",
);
pub const GPU_MEMORY_UTILIZATION: Instrument = gpu_inst("hw.gpu.memory.utilization", Kind::Gauge, "1", GPU_ATTRS, "Fraction of the latest sample period the GPU memory was read or written (NVML utilization.memory)");
pub const GPU_MEMORY_USAGE: Instrument = gpu_inst(
    "hw.gpu.memory.usage",
    Kind::Gauge,
    "By",
    GPU_ATTRS,
    "GPU memory in use",
);
pub const GPU_POWER: Instrument = gpu_inst(
    "hw.power",
    Kind::Gauge,
    "W",
    GPU_ATTRS,
    "Power the GPU draws (hw.type gpu)",
);
pub const GPU_ENERGY: Instrument = gpu_inst(
    "hw.energy",
    Kind::Counter,
    "J",
    GPU_ATTRS,
    "Energy the GPU used since the agent started sampling it (hw.type gpu)",
);
pub const GPU_ERRORS: Instrument = gpu_inst("hw.errors", Kind::Counter, "{error}", GPU_ERR_ATTRS, "GPU errors since the agent started sampling it: ECC corrected / uncorrected (volatile), PCIe replays (hw.type gpu)");
pub const GPU_CLOCK: Instrument = gpu_inst(
    "comminsight.gpu.clock",
    Kind::Gauge,
    "MHz",
    GPU_CLOCK_ATTRS,
    "SM and memory clocks at the latest sample",
);
pub const GPU_THROTTLE_TIME: Instrument = gpu_inst("comminsight.gpu.throttle.time", Kind::Counter, "s", GPU_REASON_ATTRS, "Time a slowdown reason held the GPU's clocks down (NVML clock-event durations, or the reasons active at each sample)");
pub const GPU_TEMPERATURE: Instrument = gpu_inst(
    "comminsight.gpu.temperature",
    Kind::Gauge,
    "Cel",
    GPU_ATTRS,
    "GPU die temperature at the latest sample",
);
pub const GPU_PCIE_THROUGHPUT: Instrument = gpu_inst(
    "comminsight.gpu.pcie.throughput",
    Kind::Gauge,
    "By/s",
    GPU_DIR_ATTRS,
    "PCIe throughput at the latest sample (NVML's 20 ms window; DCGM_FI_PROF_PCIE_TX/RX_BYTES from DCGM)",
);
pub const GPU_NVLINK_IO: Instrument = gpu_inst(
    "comminsight.gpu.nvlink.io",
    Kind::Counter,
    "By",
    LINK_DIR_ATTRS,
    "Data bytes over each NVLink since the agent started sampling it (link -1: all links, from DCGM_FI_PROF_NVLINK_TX/RX_BYTES)",
);
pub const GPU_NVLINK_ERRORS: Instrument = gpu_inst("comminsight.gpu.nvlink.errors", Kind::Counter, "{error}", LINK_ERR_ATTRS, "NVLink data-link errors (CRC flit / data, replay, recovery) since the agent started sampling it");
pub const GPU_NVLINK_UP: Instrument = gpu_inst(
    "comminsight.gpu.nvlink.up",
    Kind::Gauge,
    "{link}",
    LINK_ATTRS,
    "1 when the NVLink was active at the latest sample, else 0",
);
pub const GPU_SM_ACTIVE: Instrument = gpu_inst(
    "comminsight.gpu.sm.active",
    Kind::Gauge,
    "1",
    GPU_ATTRS,
    "Fraction of cycles an SM had at least one warp assigned at the latest DCGM scrape (DCGM_FI_PROF_SM_ACTIVE)",
);
pub const GPU_RETIRED_PAGES: Instrument = gpu_inst(
    "comminsight.gpu.memory.retired_pages",
    Kind::Gauge,
    "{page}",
    GPU_ATTRS,
    "GPU memory pages retired (all causes) at the latest sample",
);
pub const GPU_REMAPPED_ROWS: Instrument = gpu_inst(
    "comminsight.gpu.memory.remapped_rows",
    Kind::Gauge,
    "{row}",
    GPU_ATTRS,
    "GPU memory rows remapped (correctable and uncorrectable) at the latest sample",
);
pub const GPU_XID: Instrument = gpu_inst(
    "comminsight.gpu.xid",
    Kind::Gauge,
    "{xid}",
    GPU_ATTRS,
    "The latest XID the GPU raised (0: none), like DCGM_FI_DEV_XID_ERRORS",
);

/// Every instrument, in export order.
pub const INSTRUMENTS: &[Instrument] = &[
    OP_DURATION,
    OP_PAYLOAD,
    OP_TRAFFIC,
    OP_BUS_TRAFFIC,
    OP_INCOMPLETE,
    OP_ALGBW,
    OP_BUSBW,
    OP_OVERDUE,
    PLUGIN_DROPPED,
    STREAM_LOST,
    OP_FOLDED,
    STRAGGLER_INDEX,
    STRAGGLER_ROOT_INDEX,
    HOST_THREAD_TIME,
    HOST_TCP_RETRANSMITS,
    HOST_PORT_RECEIVED,
    HOST_PORT_TRANSMITTED,
    HOST_PORT_ERRORS,
    HOST_PORT_LINK_DOWNED,
    HOST_PORT_UP,
    GPU_UTILIZATION,
    GPU_MEMORY_UTILIZATION,
    GPU_MEMORY_USAGE,
    GPU_POWER,
    GPU_ENERGY,
    GPU_ERRORS,
    GPU_CLOCK,
    GPU_THROTTLE_TIME,
    GPU_TEMPERATURE,
    GPU_PCIE_THROUGHPUT,
    GPU_NVLINK_IO,
    GPU_NVLINK_ERRORS,
    GPU_NVLINK_UP,
    GPU_SM_ACTIVE,
    GPU_RETIRED_PAGES,
    GPU_REMAPPED_ROWS,
    GPU_XID,
    MOE_WAIT_RATIO,
    MOE_FINDINGS,
    MOE_CELL_RATIO,
    AGENT_RECORDS,
    AGENT_RECEIVED,
    AGENT_SINK_ERRORS,
    AGENT_LOGS_DROPPED,
    AGENT_LAG,
    AGENT_MEMORY_RSS,
    AGENT_ARCHIVE_BACKLOG,
];

/// A Prometheus name for an OpenTelemetry name or attribute key: characters outside
/// `[a-zA-Z0-9_:]` become `_`.
pub fn prometheus_key(otel: &str) -> String {
    otel.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The unit suffix the OpenTelemetry-to-Prometheus translation appends (`None`: no suffix;
/// annotations in braces carry none).
pub fn prometheus_unit(unit: &str, kind: Kind) -> Option<&'static str> {
    match unit {
        "s" => Some("seconds"),
        "By" => Some("bytes"),
        "By/s" => Some("bytes_per_second"),
        "1" if kind == Kind::Gauge => Some("ratio"),
        _ => None,
    }
}

impl Instrument {
    /// The metric family's Prometheus name (without the `_bucket` / `_sum` / `_count`
    /// suffixes of a histogram), e.g. `comminsight_op_duration_seconds`,
    /// `comminsight_op_payload_bytes_total`.
    pub fn prometheus_name(&self) -> String {
        let mut n = prometheus_key(self.name);
        if let Some(u) = prometheus_unit(self.unit, self.kind) {
            n.push('_');
            n.push_str(u);
        }
        if self.kind == Kind::Counter {
            n.push_str("_total");
        }
        n
    }
}

/// `docs/telemetry.md`'s instrument table (a test keeps the file equal to it).
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| OpenTelemetry name | Prometheus name | kind | unit | attributes | description |\n|---|---|---|---|---|---|\n",
    );
    for i in INSTRUMENTS {
        let kind = match i.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {kind} | `{}` | {} | {} |\n",
            i.name,
            i.prometheus_name(),
            i.unit,
            i.attributes
                .iter()
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(", "),
            i.description
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_names_follow_the_otlp_translation() {
        assert_eq!(
            OP_DURATION.prometheus_name(),
            "comminsight_op_duration_seconds"
        );
        assert_eq!(
            OP_PAYLOAD.prometheus_name(),
            "comminsight_op_payload_bytes_total"
        );
        assert_eq!(OP_OVERDUE.prometheus_name(), "comminsight_op_overdue_total");
        assert_eq!(
            STRAGGLER_ROOT_INDEX.prometheus_name(),
            "comminsight_straggler_root_index_ratio"
        );
        assert_eq!(
            OP_BUSBW.prometheus_name(),
            "comminsight_op_busbw_bytes_per_second"
        );
        assert_eq!(
            AGENT_ARCHIVE_BACKLOG.prometheus_name(),
            "comminsight_agent_archive_backlog"
        );
    }

    #[test]
    fn names_are_unique_and_conventional() {
        let mut seen = std::collections::BTreeSet::new();
        for i in INSTRUMENTS {
            assert!(seen.insert(i.prometheus_name()), "{} twice", i.name);
            // Ours under `comminsight.`; OpenTelemetry's hardware conventions under `hw.`.
            assert!(
                i.name.starts_with("comminsight.") || i.name.starts_with("hw."),
                "{}",
                i.name
            );
            assert!(
                !i.name.contains("bytes") && !i.name.ends_with("_ms") && !i.name.contains("_us"),
                "unit in the name {}",
                i.name
            );
            assert!(!i.unit.is_empty(), "{} has no unit", i.name);
            assert!(
                i.attributes.contains(&HOST),
                "{} has no host attribute",
                i.name
            );
        }
    }
}

//! Sinks: where the agent's results leave it. OTLP ([`otlp`]): metrics read from the
//! [`crate::metrics::MetricsAggregator`] and log records ([`LogEvent`]) for findings; the step
//! files ([`step_journal`]); hang evidence files ([`evidence`]); the live straggler index with
//! its gauge, alerts and report files ([`straggler`]). The daemon reaches them through its
//! router (`pipeline/router.rs`), offline commands through their own outputs.

pub mod evidence;
pub mod moe;
pub mod otlp;
pub mod step_journal;
pub mod straggler;

pub use otlp::{OtlpSink, SinkStats};

use comminsight_wire::record::Overdue;

/// Why a sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The configured endpoint is not a URL the exporter accepts.
    #[error("[otlp] {key} = {value:?} is not a valid endpoint URL ({reason}); set it to e.g. http://127.0.0.1:4318")]
    BadEndpoint {
        /// The config key (`endpoint`, `metrics_endpoint`, `logs_endpoint`).
        key: &'static str,
        /// The URL it gave.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The OTLP exporter could not be built.
    #[error("cannot build the OTLP {signal} exporter for {endpoint:?}: {reason}; check [otlp] protocol and endpoint")]
    Exporter {
        /// `metrics` or `logs`.
        signal: &'static str,
        /// The URL it was built for.
        endpoint: String,
        /// The exporter's error.
        reason: String,
    },
    /// `[otlp] ca_file` cannot be used.
    #[error("[otlp] ca_file = {path:?}: {reason}; give a readable PEM file of the CA that signs the backend's certificate, or leave it empty for the system's roots")]
    CaFile {
        /// The configured path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An `[otlp] headers` entry is not `name=value`.
    #[error("[otlp] headers: {header:?} is not \"name=value\" with a valid HTTP header name and value; write e.g. \"authorization=Bearer TOKEN\"")]
    BadHeader {
        /// The entry's name part (values may be secrets: never printed).
        header: String,
    },
    /// `OTEL_RESOURCE_ATTRIBUTES` is malformed.
    #[error(transparent)]
    Resource(#[from] crate::telemetry::resource::ResourceError),
    /// A thread or runtime of the sink could not be started.
    #[error("cannot start the OTLP sink's {what}: {source}; check the process' thread limits")]
    Thread {
        /// The thread or runtime.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Severity of a log record (OTLP severity numbers 1, 5, 9, 13, 17, 21).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Severity {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Fatal,
}

/// A log-record attribute value.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum AttrValue {
    /// A string (OTLP `stringValue`).
    Str(String),
    /// An integer (OTLP `intValue`).
    I64(i64),
    /// A float (OTLP `doubleValue`).
    F64(f64),
    /// A boolean (OTLP `boolValue`).
    Bool(bool),
    /// A list of integers (OTLP `arrayValue` of `intValue`s), e.g. rank lists.
    I64s(Vec<i64>),
}

impl From<&str> for AttrValue {
    fn from(s: &str) -> Self {
        AttrValue::Str(s.to_owned())
    }
}
impl From<String> for AttrValue {
    fn from(s: String) -> Self {
        AttrValue::Str(s)
    }
}
impl From<i64> for AttrValue {
    fn from(v: i64) -> Self {
        AttrValue::I64(v)
    }
}
impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::F64(v)
    }
}
impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}

/// `event_name` of an overdue-operation record.
pub const EVENT_OVERDUE: &str = "comminsight.op.overdue";
/// `event_name` of a hang / failure / mismatch verdict.
pub const EVENT_HANG: &str = "comminsight.hang.verdict";
/// `event_name` of a straggler alert.
pub const EVENT_STRAGGLER: &str = "comminsight.straggler.alert";
/// `event_name` of an MoE EP window with a finding or missing a rank.
pub const EVENT_MOE: &str = "comminsight.moe.window";

/// One finding or notable event, exported as an OTLP log record.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LogEvent {
    /// OTLP `event_name`: what kind of event (`comminsight.op.overdue`, ...; see
    /// `docs/telemetry.md`).
    #[serde(default)]
    pub event_name: String,
    /// OTLP severity.
    pub severity: Severity,
    /// One human-readable line.
    pub body: String,
    /// Structured attributes, keys under `comminsight.` (plus `host.name`: the host the event
    /// is about).
    pub attributes: Vec<(String, AttrValue)>,
    /// When it happened (ns since the Unix epoch, aligned clock); 0 = when emitted.
    pub time_ns: u64,
}

impl LogEvent {
    /// The log record of an `overdue` record of job `job` on `host` (its communicator's name
    /// when known): severity warn, attributes under `comminsight.`.
    pub fn overdue(job: &str, host: &str, comm_name: Option<&str>, o: &Overdue) -> LogEvent {
        let kind = if o.is_p2p != 0 { "p2p" } else { "collective" };
        let comm = comm_name.unwrap_or(crate::metrics::UNKNOWN_COMM);
        let phase = match o.phase {
            0 => "enqueued",
            1 => "running",
            _ => "partly done",
        };
        let body = format!(
            "{} {kind} on comm {comm} (0x{:016x}) seq {} rank {} overdue: {} after {} ms",
            o.func, o.comm_hash, o.coll_sn, o.rank, phase, o.age_ms
        );
        let attributes = vec![
            ("comminsight.job.id".to_owned(), job.into()),
            ("host.name".to_owned(), host.into()),
            ("comminsight.comm.name".to_owned(), comm.into()),
            (
                "comminsight.comm.hash".to_owned(),
                format!("0x{:016x}", o.comm_hash).into(),
            ),
            ("comminsight.op.func".to_owned(), o.func.name().into()),
            ("comminsight.op.seq".to_owned(), (o.coll_sn as i64).into()),
            ("comminsight.op.kind".to_owned(), kind.into()),
            ("comminsight.rank".to_owned(), (o.rank as i64).into()),
            ("comminsight.op.peer".to_owned(), (o.peer as i64).into()),
            ("comminsight.op.payload".to_owned(), (o.bytes as i64).into()),
            (
                "comminsight.op.age".to_owned(),
                (f64::from(o.age_ms) / 1e3).into(),
            ),
            ("comminsight.op.phase".to_owned(), phase.into()),
            ("comminsight.op.repeat".to_owned(), (o.repeat as i64).into()),
        ];
        LogEvent {
            event_name: EVENT_OVERDUE.into(),
            severity: Severity::Warn,
            body,
            attributes,
            time_ns: o.now_ns,
        }
    }

    /// The log record of a hang / failure / mismatch verdict seen by `host` (the master's or
    /// one agent's view): severity error, structured attributes under `comminsight.hang.`.
    pub fn verdict(host: &str, v: &crate::hang::Verdict) -> LogEvent {
        let kind = match v.kind {
            crate::hang::VerdictKind::Hang => "hang",
            crate::hang::VerdictKind::Failure => "failure",
            crate::hang::VerdictKind::Mismatch => "mismatch",
        };
        let attributes = vec![
            ("comminsight.job.id".to_owned(), v.job.clone().into()),
            ("host.name".to_owned(), host.into()),
            ("comminsight.hang.kind".to_owned(), kind.into()),
            (
                "comminsight.hang.source_ranks".to_owned(),
                AttrValue::I64s(v.source_ranks.clone()),
            ),
            (
                "comminsight.comm.hash".to_owned(),
                format!("0x{:016x}", v.comm.hash).into(),
            ),
            (
                "comminsight.comm.name".to_owned(),
                v.comm.name.clone().into(),
            ),
            (
                "comminsight.comm.role".to_owned(),
                v.comm.role.clone().into(),
            ),
            ("comminsight.op.func".to_owned(), v.func.clone().into()),
            ("comminsight.op.seq".to_owned(), (v.seq as i64).into()),
            (
                "comminsight.hang.entered_ranks".to_owned(),
                (v.entered_ranks.len() as i64).into(),
            ),
            (
                "comminsight.hang.absent_ranks".to_owned(),
                AttrValue::I64s(v.absent_ranks.clone()),
            ),
            (
                "comminsight.hang.duration".to_owned(),
                (v.since_us as f64 / 1e6).into(),
            ),
            (
                "comminsight.hang.missing_hosts".to_owned(),
                v.evidence
                    .get("missing_hosts")
                    .map(|m| m.to_string())
                    .unwrap_or_default()
                    .into(),
            ),
        ];
        LogEvent {
            event_name: EVENT_HANG.into(),
            severity: Severity::Error,
            body: v.one_line(),
            attributes,
            time_ns: 0,
        }
    }

    /// The log record of a rank crossing the straggler threshold in m of its last n steps:
    /// severity warn, attributes under `comminsight.straggler.`.
    pub fn straggler(host: &str, a: &crate::straggler::live::Alert) -> LogEvent {
        let body = format!(
            "straggler: rank {} ({}) of job {} above index {} in {} of its last {} steps (step {}: index {:.1})",
            a.rank, a.host, a.job, a.threshold, a.over, a.window, a.step, a.index
        );
        let attributes = vec![
            ("comminsight.job.id".to_owned(), a.job.clone().into()),
            ("host.name".to_owned(), a.host.clone().into()),
            ("comminsight.reporter".to_owned(), host.into()),
            ("comminsight.rank".to_owned(), a.rank.into()),
            (
                "comminsight.straggler.step".to_owned(),
                (a.step as i64).into(),
            ),
            (
                "comminsight.straggler.index".to_owned(),
                (a.index / 100.0).into(),
            ),
            (
                "comminsight.straggler.root_index".to_owned(),
                (a.root_index / 100.0).into(),
            ),
            (
                "comminsight.straggler.threshold".to_owned(),
                (a.threshold / 100.0).into(),
            ),
            (
                "comminsight.straggler.steps_over".to_owned(),
                (a.over as i64).into(),
            ),
            (
                "comminsight.straggler.window".to_owned(),
                (a.window as i64).into(),
            ),
        ];
        LogEvent {
            event_name: EVENT_STRAGGLER.into(),
            severity: Severity::Warn,
            body,
            attributes,
            time_ns: 0,
        }
    }

    /// The log record of an MoE EP window of `job` with a finding or missing a rank: severity
    /// warn, the ranks of each kind of finding under `comminsight.moe.`.
    pub fn ep_window(host: &str, job: &str, e: &comminsight_ascend::report::EpEvent) -> LogEvent {
        use comminsight_ascend::report::Finding;
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        let mut paths = Vec::new();
        for f in &e.findings {
            match f {
                Finding::SenderSlow { rank, .. } => senders.push(*rank as i64),
                Finding::ReceiverSlow { rank, .. } => receivers.push(*rank as i64),
                Finding::PathSlow { waiter, peer, .. } => {
                    paths.push(format!("{peer}->{waiter}"));
                }
            }
        }
        let mut attributes: Vec<(String, AttrValue)> = vec![
            ("comminsight.job.id".to_owned(), job.into()),
            ("comminsight.reporter".to_owned(), host.into()),
            (
                "comminsight.moe.ep_group".to_owned(),
                format!("{:#018x}", e.ep_group_id).into(),
            ),
            (
                "comminsight.moe.instance".to_owned(),
                e.instance_id.clone().into(),
            ),
            (
                "comminsight.moe.phase".to_owned(),
                e.phase.title().to_lowercase().into(),
            ),
            (
                "comminsight.moe.window".to_owned(),
                (e.window_seq as i64).into(),
            ),
            ("comminsight.moe.ep_size".to_owned(), (e.n as i64).into()),
            (
                "comminsight.moe.sender_slow".to_owned(),
                AttrValue::I64s(senders),
            ),
            (
                "comminsight.moe.receiver_slow".to_owned(),
                AttrValue::I64s(receivers),
            ),
            (
                "comminsight.moe.path_slow".to_owned(),
                paths.join(",").into(),
            ),
        ];
        if let Some(i) = &e.incomplete_window {
            let missing = i.missing_rows.iter().map(|r| i64::from(*r)).collect();
            attributes.push((
                "comminsight.moe.missing_rows".to_owned(),
                AttrValue::I64s(missing),
            ));
        }
        LogEvent {
            event_name: EVENT_MOE.into(),
            severity: Severity::Warn,
            body: format!("MoE EP: job {job}: {}", e.summary()),
            attributes,
            time_ns: e.ts_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comminsight_wire::names::Func;

    #[test]
    fn overdue_event_names_the_operation() {
        let o = Overdue {
            comm_hash: 0xab,
            coll_sn: 7,
            rank: 3,
            age_ms: 31_000,
            func: Func::ALL_REDUCE,
            phase: 1,
            now_ns: 42,
            ..Default::default()
        };
        let e = LogEvent::overdue("j1", "h1", Some("dp"), &o);
        assert_eq!(e.severity, Severity::Warn);
        assert_eq!(e.time_ns, 42);
        assert_eq!(
            e.body,
            "AllReduce collective on comm dp (0x00000000000000ab) seq 7 rank 3 overdue: running after 31000 ms"
        );
        let get = |k: &str| e.attributes.iter().find(|a| a.0 == k).map(|a| a.1.clone());
        assert_eq!(get("comminsight.job.id"), Some("j1".into()));
        assert_eq!(get("comminsight.op.age"), Some(AttrValue::F64(31.0)));
        assert_eq!(e.event_name, EVENT_OVERDUE);
    }
}

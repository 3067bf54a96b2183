//! [`LogEvent`]s as an OTLP logs export request: `event_name`, severity, a one-line body,
//! attributes (rank lists as arrays). Pure: no I/O.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::sinks::{AttrValue, LogEvent, Severity};
use crate::telemetry::otlp::{kv, scope};

fn attr_value(v: &AttrValue) -> any_value::Value {
    match v {
        AttrValue::Str(s) => any_value::Value::StringValue(s.clone()),
        AttrValue::I64(i) => any_value::Value::IntValue(*i),
        AttrValue::F64(f) => any_value::Value::DoubleValue(*f),
        AttrValue::Bool(b) => any_value::Value::BoolValue(*b),
        AttrValue::I64s(list) => any_value::Value::ArrayValue(ArrayValue {
            values: list
                .iter()
                .map(|i| AnyValue {
                    value: Some(any_value::Value::IntValue(*i)),
                })
                .collect(),
        }),
    }
}

/// OTLP severity number and text.
fn severity(s: Severity) -> (i32, &'static str) {
    match s {
        Severity::Trace => (1, "TRACE"),
        Severity::Debug => (5, "DEBUG"),
        Severity::Info => (9, "INFO"),
        Severity::Warn => (13, "WARN"),
        Severity::Error => (17, "ERROR"),
        Severity::Fatal => (21, "FATAL"),
    }
}

/// One log record; `now_ns` is the observed time (and the event time when it has none).
pub fn log_record(e: &LogEvent, now_ns: u64) -> LogRecord {
    let (number, text) = severity(e.severity);
    LogRecord {
        time_unix_nano: if e.time_ns == 0 { now_ns } else { e.time_ns },
        observed_time_unix_nano: now_ns,
        severity_number: number,
        severity_text: text.into(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(e.body.clone())),
        }),
        attributes: e
            .attributes
            .iter()
            .map(|(k, v)| kv(k, attr_value(v)))
            .collect(),
        event_name: e.event_name.clone(),
        ..Default::default()
    }
}

/// The logs export request of `events`.
pub fn logs_request(
    resource: &Resource,
    events: &[LogEvent],
    now_ns: u64,
) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource.clone()),
            scope_logs: vec![ScopeLogs {
                scope: Some(scope()),
                log_records: events.iter().map(|e| log_record(e, now_ns)).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

//! The few Perfetto trace messages the agent writes, by hand with `prost` derive (no protoc).
//! Field numbers are Perfetto's (`protos/perfetto/trace/*.proto`, checked against the PyPI
//! `perfetto` 0.59.1 wheel's `perfetto_trace_pb2` descriptors).
//!
//! ```proto
//! message Trace { repeated TracePacket packet = 1; }
//! message TracePacket {
//!   optional uint64 timestamp = 8; optional uint32 trusted_packet_sequence_id = 10;
//!   optional TrackEvent track_event = 11; optional InternedData interned_data = 12;
//!   optional uint32 sequence_flags = 13; optional TrackDescriptor track_descriptor = 60;
//! }
//! message TrackDescriptor {
//!   optional uint64 uuid = 1; optional string name = 2; optional ProcessDescriptor process = 3;
//!   optional ThreadDescriptor thread = 4; optional uint64 parent_uuid = 5;
//!   optional CounterDescriptor counter = 8;
//! }
//! message ProcessDescriptor { optional int32 pid = 1; optional string process_name = 6; }
//! message ThreadDescriptor { optional int32 pid = 1; optional int32 tid = 2; optional string thread_name = 5; }
//! message CounterDescriptor { optional string unit_name = 6; }
//! message TrackEvent {
//!   repeated DebugAnnotation debug_annotations = 4; optional Type type = 9;
//!   optional uint64 name_iid = 10; optional uint64 track_uuid = 11; optional string name = 23;
//!   optional int64 counter_value = 30; optional double double_counter_value = 44;
//!   repeated fixed64 flow_ids = 47;
//! }
//! message DebugAnnotation {
//!   optional uint64 name_iid = 1; optional uint64 uint_value = 3; optional int64 int_value = 4;
//!   optional double double_value = 5; optional string string_value = 6; optional string name = 10;
//!   optional uint64 string_value_iid = 17;
//! }
//! message InternedData {
//!   repeated EventName event_names = 2; repeated DebugAnnotationName debug_annotation_names = 3;
//!   repeated InternedString debug_annotation_string_values = 29;
//! }
//! message InternedString { optional uint64 iid = 1; optional bytes str = 2; }
//! message EventName { optional uint64 iid = 1; optional string name = 2; }
//! message DebugAnnotationName { optional uint64 iid = 1; optional string name = 2; }
//! ```

/// `TracePacket.sequence_flags`: the sequence's interned state starts (over) here.
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
/// `TracePacket.sequence_flags`: the packet refers to interned state.
pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;

/// `TrackEvent.Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    /// Not set.
    Unspecified = 0,
    /// A slice opens on the track.
    SliceBegin = 1,
    /// The innermost open slice of the track closes.
    SliceEnd = 2,
    /// A zero-duration event.
    Instant = 3,
    /// A counter value (counter tracks).
    Counter = 4,
}

/// One packet of the trace (only the fields the agent writes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TracePacket {
    /// Nanoseconds (the default clock, here the job's aligned realtime).
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    /// The writer's sequence (interned names are per sequence).
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    /// A slice begin / end or a counter value.
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    /// Names interned from this packet on.
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    /// `SEQ_*` flags.
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    /// A track's identity.
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
}

/// A track: a process, a thread, a child track or a counter.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackDescriptor {
    /// Unique in the trace.
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    /// Display name (child and counter tracks).
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    /// A process track.
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    /// A thread track.
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    /// The track it is drawn under.
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    /// A counter track.
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

/// A process track's identity.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessDescriptor {
    /// Process id (the agent numbers hosts).
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// Display name.
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

/// A thread track's identity.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadDescriptor {
    /// Its process.
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    /// Thread id (the agent numbers ranks).
    #[prost(int32, optional, tag = "2")]
    pub tid: Option<i32>,
    /// Display name.
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

/// A counter track's unit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CounterDescriptor {
    /// Free-form unit (e.g. `bytes/s`).
    #[prost(string, optional, tag = "6")]
    pub unit_name: Option<String>,
}

/// One event on a track.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackEvent {
    /// Arguments shown with the slice.
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// Begin, end, instant or counter.
    #[prost(enumeration = "EventType", optional, tag = "9")]
    pub r#type: Option<i32>,
    /// Interned name (`InternedData.event_names`).
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    /// The track.
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    /// Name, when not interned.
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    /// Integer counter value.
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
    /// Floating-point counter value.
    #[prost(double, optional, tag = "44")]
    pub double_counter_value: Option<f64>,
    /// Flows this slice takes part in (same id on every slice of a flow).
    #[prost(fixed64, repeated, packed = "false", tag = "47")]
    pub flow_ids: Vec<u64>,
}

/// One argument of a slice.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DebugAnnotation {
    /// Interned name (`InternedData.debug_annotation_names`).
    #[prost(uint64, optional, tag = "1")]
    pub name_iid: Option<u64>,
    /// Unsigned value.
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    /// Signed value.
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    /// Floating-point value.
    #[prost(double, optional, tag = "5")]
    pub double_value: Option<f64>,
    /// Text value.
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    /// Name, when not interned.
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
    /// Interned text value (`InternedData.debug_annotation_string_values`).
    #[prost(uint64, optional, tag = "17")]
    pub string_value_iid: Option<u64>,
}

/// Names interned on the sequence.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedData {
    /// Event names.
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<InternedString>,
    /// Argument names.
    #[prost(message, repeated, tag = "3")]
    pub debug_annotation_names: Vec<InternedString>,
    /// Argument text values (`InternedString`: iid 1, bytes `str` 2).
    #[prost(message, repeated, tag = "29")]
    pub debug_annotation_string_values: Vec<InternedBytes>,
}

/// `InternedString`: an id and its bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedBytes {
    /// Id, from 1.
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// The string's bytes.
    #[prost(bytes = "vec", optional, tag = "2")]
    pub str: Option<Vec<u8>>,
}

/// `EventName` / `DebugAnnotationName`: an id and its string (same layout).
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedString {
    /// Id, from 1.
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// The string.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

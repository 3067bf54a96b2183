//! The link's protobuf messages, written by hand (no build script, no protoc).
//!
//! ```proto
//! package comminsight.link.v1;
//! service Link {
//!   rpc Time(TimeRequest) returns (TimeReply);
//!   rpc Push(PushRequest) returns (PushReply);
//! }
//! message TimeRequest { uint64 t1 = 1; }
//! message TimeReply { uint64 t1 = 1; uint64 t2 = 2; uint64 t3 = 3; }
//! message PushRequest { string kind = 1; string job = 2; string host = 3; uint64 seq = 4; bytes payload = 5; }
//! message PushReply {}
//! ```

/// The service's full name.
pub const SERVICE: &str = "comminsight.link.v1.Link";
/// The path of `Time` on the wire.
pub const TIME_PATH: &str = "/comminsight.link.v1.Link/Time";
/// The path of `Push` on the wire.
pub const PUSH_PATH: &str = "/comminsight.link.v1.Link/Push";
/// Metadata key carrying the calling agent's host name (used for `last_seen`).
pub const HOST_HEADER: &str = "comminsight-host";

/// `Time` request: the client's send time.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeRequest {
    /// Client realtime when sent (ns).
    #[prost(uint64, tag = "1")]
    pub t1: u64,
}

/// `Time` reply: the echoed `t1`, the master's receive (`t2`) and send (`t3`) times.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeReply {
    /// Echo of the request's `t1`.
    #[prost(uint64, tag = "1")]
    pub t1: u64,
    /// Master realtime when received (ns).
    #[prost(uint64, tag = "2")]
    pub t2: u64,
    /// Master realtime when answered (ns).
    #[prost(uint64, tag = "3")]
    pub t3: u64,
}

/// `Push` request: one message of an agent's outbox.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    /// `hang` (a JSON `JobSnapshot`) or `steps` (JSON lines of step summaries).
    #[prost(string, tag = "1")]
    pub kind: String,
    /// The job the payload belongs to.
    #[prost(string, tag = "2")]
    pub job: String,
    /// The sending agent's host.
    #[prost(string, tag = "3")]
    pub host: String,
    /// The sender's outbox sequence number (monotonic per sender; resends keep it).
    #[prost(uint64, tag = "4")]
    pub seq: u64,
    /// The payload, opaque to the link.
    #[prost(bytes = "vec", tag = "5")]
    pub payload: Vec<u8>,
}

/// `Push` reply: empty; OK means the message is stored durably.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushReply {}

/// The kinds a master stores.
pub const KINDS: &[&str] = &["hang", "steps"];

/// Why `s` cannot be a job or host name on the link (it becomes a path component on the
/// master): empty, too long, a dot name, or characters other than `[A-Za-z0-9._:@+=-]`.
pub fn name_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 200 {
        return Some("is longer than 200 bytes");
    }
    if s.starts_with('.') {
        return Some("starts with '.'");
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || "._:@+=-".contains(c);
    if !s.chars().all(ok) {
        return Some("has characters other than letters, digits and ._:@+=-");
    }
    None
}

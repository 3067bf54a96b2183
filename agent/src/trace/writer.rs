//! A streaming Perfetto trace writer: each packet is appended to the output as one
//! length-delimited field 1 of `Trace` as soon as it is made (nothing is kept but the interning
//! tables), so a trace of any size is written in constant memory.
//!
//! Every packet is on one sequence ([`SEQUENCE_ID`]). The first one clears the incremental state;
//! event and argument names are interned on first use (the packet that first uses a name carries
//! it in `interned_data`), which keeps per-op slices to a few dozen bytes.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use super::perfetto::{
    CounterDescriptor, DebugAnnotation, EventType, InternedBytes, InternedData, InternedString,
    ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent,
    SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE,
};

/// The trusted packet sequence every packet of the agent's traces is on.
pub const SEQUENCE_ID: u32 = 1;

/// A slice argument's value.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgValue {
    /// Unsigned integer.
    Uint(u64),
    /// Signed integer.
    Int(i64),
    /// Floating point.
    Double(f64),
    /// Text.
    Str(String),
}

/// Writes packets to `W` (wrap files in a `BufWriter`).
pub struct TraceWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    event_names: HashMap<String, u64>,
    arg_names: HashMap<&'static str, u64>,
    arg_strings: HashMap<String, u64>,
    started: bool,
    packets: u64,
    bytes: u64,
}

impl<W: Write> TraceWriter<W> {
    /// A writer appending to `out`.
    pub fn new(out: W) -> TraceWriter<W> {
        TraceWriter {
            out,
            buf: Vec::with_capacity(256),
            event_names: HashMap::new(),
            arg_names: HashMap::new(),
            arg_strings: HashMap::new(),
            started: false,
            packets: 0,
            bytes: 0,
        }
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Flush and return the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// Append one packet (sequence id filled in; flags on the first packet and on those that
    /// use interned names).
    fn packet(&mut self, mut p: TracePacket, interned: bool) -> std::io::Result<()> {
        p.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        p.sequence_flags = if !self.started {
            Some(SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE)
        } else if interned {
            Some(SEQ_NEEDS_INCREMENTAL_STATE)
        } else {
            None
        };
        self.started = true;
        self.buf.clear();
        // Field 1 (Trace.packet), wire type 2 (length-delimited).
        self.buf.push(0x0a);
        prost::encoding::encode_varint(p.encoded_len() as u64, &mut self.buf);
        p.encode(&mut self.buf)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        self.out.write_all(&self.buf)?;
        self.packets += 1;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// A process track (one per host).
    pub fn process_track(&mut self, uuid: u64, pid: i32, name: &str) -> std::io::Result<()> {
        self.packet(
            TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    process: Some(ProcessDescriptor {
                        pid: Some(pid),
                        process_name: Some(name.to_string()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )
    }

    /// A thread track (one per rank) of process `pid` under the process track `parent`.
    pub fn thread_track(
        &mut self,
        uuid: u64,
        parent: u64,
        pid: i32,
        tid: i32,
        name: &str,
    ) -> std::io::Result<()> {
        self.packet(
            TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(parent),
                    thread: Some(ThreadDescriptor {
                        pid: Some(pid),
                        tid: Some(tid),
                        thread_name: Some(name.to_string()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )
    }

    /// A named child track under `parent` (e.g. a rank's overlapping operations).
    pub fn child_track(&mut self, uuid: u64, parent: u64, name: &str) -> std::io::Result<()> {
        self.packet(
            TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(parent),
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )
    }

    /// A counter track under `parent` with a free-form unit.
    pub fn counter_track(
        &mut self,
        uuid: u64,
        parent: u64,
        name: &str,
        unit: &str,
    ) -> std::io::Result<()> {
        self.packet(
            TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(parent),
                    name: Some(name.to_string()),
                    counter: Some(CounterDescriptor {
                        unit_name: Some(unit.to_string()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )
    }

    /// Open a slice on `track` at `ts_ns`. `intern`: the name repeats (op and phase names) and
    /// is interned; otherwise (step numbers) it is written inline.
    pub fn begin(
        &mut self,
        track: u64,
        ts_ns: u64,
        name: &str,
        intern: bool,
        args: &[(&'static str, ArgValue)],
        flows: &[u64],
    ) -> std::io::Result<()> {
        self.event(
            EventType::SliceBegin,
            (track, ts_ns),
            name,
            intern,
            args,
            flows,
        )
    }

    /// A zero-duration event on `track` at `ts_ns` (name interned).
    pub fn instant(
        &mut self,
        track: u64,
        ts_ns: u64,
        name: &str,
        args: &[(&'static str, ArgValue)],
    ) -> std::io::Result<()> {
        self.event(EventType::Instant, (track, ts_ns), name, true, args, &[])
    }

    /// A track event of `kind` on `(track, ts_ns)`.
    fn event(
        &mut self,
        kind: EventType,
        (track, ts_ns): (u64, u64),
        name: &str,
        intern: bool,
        args: &[(&'static str, ArgValue)],
        flows: &[u64],
    ) -> std::io::Result<()> {
        let mut interned = InternedData::default();
        let (name_iid, name) = if intern {
            let iid = match self.event_names.get(name) {
                Some(i) => *i,
                None => {
                    let i = self.event_names.len() as u64 + 1;
                    self.event_names.insert(name.to_string(), i);
                    interned.event_names.push(InternedString {
                        iid: Some(i),
                        name: Some(name.to_string()),
                    });
                    i
                }
            };
            (Some(iid), None)
        } else {
            (None, Some(name.to_string()))
        };
        let mut annotations = Vec::with_capacity(args.len());
        for (k, v) in args {
            let iid = match self.arg_names.get(k) {
                Some(i) => *i,
                None => {
                    let i = self.arg_names.len() as u64 + 1;
                    self.arg_names.insert(k, i);
                    interned.debug_annotation_names.push(InternedString {
                        iid: Some(i),
                        name: Some((*k).to_string()),
                    });
                    i
                }
            };
            let mut a = DebugAnnotation {
                name_iid: Some(iid),
                ..Default::default()
            };
            match v {
                ArgValue::Uint(x) => a.uint_value = Some(*x),
                ArgValue::Int(x) => a.int_value = Some(*x),
                ArgValue::Double(x) => a.double_value = Some(*x),
                ArgValue::Str(s) => {
                    let iid = match self.arg_strings.get(s) {
                        Some(i) => *i,
                        None => {
                            let i = self.arg_strings.len() as u64 + 1;
                            self.arg_strings.insert(s.clone(), i);
                            interned.debug_annotation_string_values.push(InternedBytes {
                                iid: Some(i),
                                str: Some(s.as_bytes().to_vec()),
                            });
                            i
                        }
                    };
                    a.string_value_iid = Some(iid);
                }
            }
            annotations.push(a);
        }
        let has_interned = !interned.event_names.is_empty()
            || !interned.debug_annotation_names.is_empty()
            || !interned.debug_annotation_string_values.is_empty();
        self.packet(
            TracePacket {
                timestamp: Some(ts_ns),
                track_event: Some(TrackEvent {
                    debug_annotations: annotations,
                    r#type: Some(kind as i32),
                    name_iid,
                    track_uuid: Some(track),
                    name,
                    flow_ids: flows.to_vec(),
                    ..Default::default()
                }),
                interned_data: has_interned.then_some(interned),
                ..Default::default()
            },
            true,
        )
    }

    /// Close the innermost open slice of `track` at `ts_ns`.
    pub fn end(&mut self, track: u64, ts_ns: u64) -> std::io::Result<()> {
        self.packet(
            TracePacket {
                timestamp: Some(ts_ns),
                track_event: Some(TrackEvent {
                    r#type: Some(EventType::SliceEnd as i32),
                    track_uuid: Some(track),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )
    }

    /// A counter value on counter track `track` at `ts_ns`.
    pub fn counter(&mut self, track: u64, ts_ns: u64, value: f64) -> std::io::Result<()> {
        self.packet(
            TracePacket {
                timestamp: Some(ts_ns),
                track_event: Some(TrackEvent {
                    r#type: Some(EventType::Counter as i32),
                    track_uuid: Some(track),
                    double_counter_value: Some(value),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-checked bytes: a process track, then a slice begin (interned name and argument,
    /// one flow) and its end.
    #[test]
    fn encodes_the_documented_bytes() {
        let mut w = TraceWriter::new(Vec::new());
        w.process_track(5, 7, "h").unwrap();
        w.begin(5, 1000, "A", true, &[("n", ArgValue::Uint(3))], &[9])
            .unwrap();
        w.end(5, 2000).unwrap();
        assert_eq!(w.packets(), 3);
        let bytes = w.finish().unwrap();
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            // packet 1: Trace.packet (field 1, length-delimited), 16 bytes
            0x0a, 16,
            0x50, 1,             // trusted_packet_sequence_id (10, varint) = 1
            0x68, 3,             // sequence_flags (13) = CLEARED | NEEDS
            0xe2, 0x03, 9,       // track_descriptor (60, len): 9 bytes
            0x08, 5,             //   uuid (1) = 5
            0x1a, 5,             //   process (3): 5 bytes
            0x08, 7,             //     pid (1) = 7
            0x32, 1, b'h',       //     process_name (6) = "h"
            // packet 2: 47 bytes
            0x0a, 47,
            0x40, 0xe8, 0x07,    // timestamp (8) = 1000
            0x50, 1,             // trusted_packet_sequence_id = 1
            0x5a, 22,            // track_event (11): 22 bytes
            0x22, 4,             //   debug_annotations (4): 4 bytes
            0x08, 1, 0x18, 3,    //     name_iid (1) = 1, uint_value (3) = 3
            0x48, 1,             //   type (9) = SLICE_BEGIN
            0x50, 1,             //   name_iid (10) = 1
            0x58, 5,             //   track_uuid (11) = 5
            0xf9, 0x02, 9, 0, 0, 0, 0, 0, 0, 0, // flow_ids (47, fixed64) = 9
            0x62, 14,            // interned_data (12): 14 bytes
            0x12, 5, 0x08, 1, 0x12, 1, b'A', //   event_names (2): {iid 1, name "A"}
            0x1a, 5, 0x08, 1, 0x12, 1, b'n', //   debug_annotation_names (3): {iid 1, "n"}
            0x68, 2,             // sequence_flags = NEEDS_INCREMENTAL_STATE
            // packet 3: 11 bytes (no flags: it uses no interned state)
            0x0a, 11,
            0x40, 0xd0, 0x0f,    // timestamp = 2000
            0x50, 1,
            0x5a, 4, 0x48, 2, 0x58, 5, // track_event: type = SLICE_END, track_uuid = 5
        ];
        assert_eq!(bytes, want);
    }

    #[test]
    fn names_are_interned_once() {
        let mut w = TraceWriter::new(Vec::new());
        w.begin(
            1,
            0,
            "AllReduce",
            true,
            &[("bytes", ArgValue::Uint(1))],
            &[],
        )
        .unwrap();
        let first = w.bytes();
        w.end(1, 1).unwrap();
        let before = w.bytes();
        w.begin(
            1,
            2,
            "AllReduce",
            true,
            &[("bytes", ArgValue::Uint(1))],
            &[],
        )
        .unwrap();
        // The second begin carries no interned strings.
        assert!(w.bytes() - before < first - 6);
    }
}

//! Binary encoding and decoding of [`Record`]s: little-endian field writers and readers over the
//! 112-byte body, with fixed-size string fields (a length byte then the bytes).

mod gpu;
mod host;
mod moe;

use crate::body::*;
use crate::names::{Algo, DataType, Func, Proto};
use crate::record::{
    DecodeError, Kind, RawRecord, Record, BODY_SIZE, FLAG_TRUNCATED, HEADER_SIZE, MAGIC,
    RECORD_SIZE, RECORD_VERSION,
};

/// A string stored in a fixed-size field: at most `N` bytes, cut at a UTF-8 boundary.
fn fit_str(s: &str, max: usize) -> (&str, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

/// Little-endian writer over a body.
struct W<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl W<'_> {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.b[self.at] = v;
        self.at += 1;
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.b[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
        self
    }
    /// A length byte then a fixed field of `n` bytes; returns whether it was truncated.
    fn str_field(&mut self, s: &str, n: usize) -> bool {
        let (fit, cut) = fit_str(s, n.min(255));
        self.u8(fit.len() as u8);
        self.b[self.at..self.at + fit.len()].copy_from_slice(fit.as_bytes());
        self.at += n;
        cut
    }
}

/// Little-endian reader over a body; `bad` names the first field whose raw bytes no encoder
/// writes (a string length beyond its field, an unknown code).
struct R<'a> {
    b: &'a [u8],
    at: usize,
    bad: Option<&'static str>,
}

impl R<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let v: [u8; N] = self.b[self.at..self.at + N].try_into().expect("in bounds");
        self.at += N;
        v
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn str_field(&mut self, n: usize) -> StrField {
        let len = self.u8() as usize;
        if len > n {
            self.bad.get_or_insert("string length beyond its field");
        }
        let s = &self.b[self.at..self.at + len.min(n)];
        self.at += n;
        StrField::from_bytes(s)
    }
}

fn str_bytes(s: &StrField) -> &str {
    // Fields built from &str are UTF-8; decoded fields may not be, and are written back verbatim.
    core::str::from_utf8(&s.0).unwrap_or("")
}

/// Write raw bytes of a decoded (possibly non-UTF-8) field back exactly.
fn put_str(w: &mut W<'_>, s: &StrField, n: usize) -> bool {
    if core::str::from_utf8(&s.0).is_ok() {
        w.str_field(str_bytes(s), n)
    } else {
        let len = s.0.len().min(n).min(255);
        w.u8(len as u8);
        w.b[w.at..w.at + len].copy_from_slice(&s.0[..len]);
        w.at += n;
        len < s.0.len()
    }
}

impl Record {
    /// `bodies` encoded one after another as records numbered from 0 (no flags): the contents
    /// of a segment when the first is its `SegmentHeader` (crafted inputs, tests, tools).
    pub fn encode_numbered(bodies: impl IntoIterator<Item = Body>) -> Vec<u8> {
        bodies
            .into_iter()
            .enumerate()
            .flat_map(|(i, body)| {
                Record {
                    seq: i as u64,
                    flags: 0,
                    body,
                }
                .encode()
                .0
            })
            .collect()
    }

    /// Encode into a raw record. Strings that do not fit are cut and `FLAG_TRUNCATED` is set.
    pub fn encode(&self) -> RawRecord {
        let mut raw = RawRecord::ZERO;
        let (head, body) = raw.0.split_at_mut(HEADER_SIZE);
        let mut w = W { b: body, at: 0 };
        let truncated = encode_body(&self.body, &mut w);
        debug_assert!(w.at <= BODY_SIZE);
        let flags = self.flags | if truncated { FLAG_TRUNCATED } else { 0 };
        let mut h = W { b: head, at: 0 };
        h.u16(MAGIC)
            .u8(RECORD_VERSION)
            .u8(self.kind() as u8)
            .u16(RECORD_SIZE as u16)
            .u16(flags)
            .u64(self.seq);
        raw
    }

    /// Decode a raw record, validating the header and the values ([`crate::bounds`]).
    pub fn decode(raw: &RawRecord) -> Result<Record, DecodeError> {
        let mut rec = Record::new(Body::Coll(OpRecord::default()));
        Record::decode_into(raw, &mut rec)?;
        Ok(rec)
    }

    /// [`Record::decode`] into `out`, reusing its storage: an operation record (most of a
    /// stream) decoded over an operation record is written field by field in place, so a reader
    /// decoding a batch into a reused buffer moves no record around. On a header error `out`
    /// is left as it was; a record whose values fail [`crate::bounds::check`] is an error too
    /// ([`DecodeError::Implausible`]) and leaves `out` holding it (the caller skips the slot).
    pub fn decode_into(raw: &RawRecord, out: &mut Record) -> Result<(), DecodeError> {
        let (kind, flags, seq) = decode_header(raw)?;
        let mut r = R {
            b: &raw.0[HEADER_SIZE..],
            at: 0,
            bad: None,
        };
        match kind {
            Kind::Coll | Kind::P2p => {
                let coll = kind == Kind::Coll;
                if !matches!(
                    (&out.body, coll),
                    (Body::Coll(_), true) | (Body::P2p(_), false)
                ) {
                    out.body = if coll {
                        Body::Coll(OpRecord::default())
                    } else {
                        Body::P2p(OpRecord::default())
                    };
                }
                if let Body::Coll(o) | Body::P2p(o) = &mut out.body {
                    decode_op_into(&mut r, o);
                }
            }
            _ => out.body = decode_body(kind, &mut r),
        }
        out.seq = seq;
        out.flags = flags;
        if let Some(what) = r.bad {
            return Err(DecodeError::Implausible(what));
        }
        crate::bounds::check(out)
    }
}

/// The header's kind, flags and seq, validated.
fn decode_header(raw: &RawRecord) -> Result<(Kind, u16, u64), DecodeError> {
    let mut h = R {
        b: &raw.0[..HEADER_SIZE],
        at: 0,
        bad: None,
    };
    let magic = h.u16();
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = h.u8();
    if version != RECORD_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let kind_b = h.u8();
    let kind = Kind::from_u8(kind_b).ok_or(DecodeError::UnknownKind(kind_b))?;
    let len = h.u16();
    if len as usize != RECORD_SIZE {
        return Err(DecodeError::BadLength(len));
    }
    let flags = h.u16();
    let seq = h.u64();
    Ok((kind, flags, seq))
}

const NAME_LEN: usize = 71;
const HOST_LEN: usize = 39;
const JOB_LEN: usize = 38;

fn encode_op(o: &OpRecord, w: &mut W<'_>) {
    w.u64(o.comm_hash)
        .u64(o.coll_sn)
        .u64(o.coll_local_sn)
        .u64(o.count)
        .u64(o.bytes)
        .u64(o.enqueue_ns)
        .u64(o.start_ns)
        .u64(o.end_ns)
        .u64(o.gpu_start_ns)
        .u64(o.gpu_end_ns)
        .u64(o.api_ns)
        .i32(o.rank)
        .i32(o.root)
        .i32(o.peer)
        .u8(o.func.0)
        .u8(o.datatype.0)
        .u8(o.algo.0)
        .u8(o.proto.0)
        .u8(o.nchannels)
        .u8(o.nwarps)
        .u8(o.timing as u8)
        .u8(o.channels_done);
}

fn decode_op(r: &mut R<'_>) -> OpRecord {
    let mut o = OpRecord::default();
    decode_op_into(r, &mut o);
    o
}

fn decode_op_into(r: &mut R<'_>, o: &mut OpRecord) {
    o.comm_hash = r.u64();
    o.coll_sn = r.u64();
    o.coll_local_sn = r.u64();
    o.count = r.u64();
    o.bytes = r.u64();
    o.enqueue_ns = r.u64();
    o.start_ns = r.u64();
    o.end_ns = r.u64();
    o.gpu_start_ns = r.u64();
    o.gpu_end_ns = r.u64();
    o.api_ns = r.u64();
    o.rank = r.i32();
    o.root = r.i32();
    o.peer = r.i32();
    o.func = Func(r.u8());
    o.datatype = DataType(r.u8());
    o.algo = Algo(r.u8());
    o.proto = Proto(r.u8());
    o.nchannels = r.u8();
    o.nwarps = r.u8();
    let timing = r.u8();
    if timing > crate::bounds::MAX_TIMING {
        r.bad.get_or_insert("op timing unknown");
    }
    o.timing = Timing::from_u8(timing);
    o.channels_done = r.u8();
}

/// Returns whether a string field was truncated.
fn encode_body(body: &Body, w: &mut W<'_>) -> bool {
    match body {
        Body::Segment(s) => {
            w.u32(s.format)
                .u32(s.record_size)
                .u64(s.segment_index)
                .u32(s.pid)
                .u8(s.source)
                .bytes(&[0; 3])
                .u64(s.created_real_ns)
                .u64(s.created_mono_ns);
            false
        }
        Body::ProcStart(p) => {
            w.u32(p.pid)
                .i32(p.rank)
                .i32(p.local_rank)
                .i32(p.world_size)
                .u64(p.mono_ns)
                .u64(p.real_ns)
                .u8(p.abi_version);
            let a = put_str(w, &p.host, HOST_LEN);
            let b = put_str(w, &p.job, JOB_LEN);
            a || b
        }
        Body::CommInit(c) => {
            w.u64(c.comm_hash)
                .u32(c.nranks)
                .i32(c.rank)
                .u32(c.nnodes)
                .i32(c.local_rank)
                .i32(c.device)
                .u8(c.abi_version)
                .bytes(&[0; 3])
                .u64(c.time_ns);
            put_str(w, &c.comm_name, NAME_LEN)
        }
        Body::CommFini(c) => {
            w.u64(c.comm_hash)
                .i32(c.rank)
                .u32(0)
                .u64(c.time_ns)
                .u64(c.ops)
                .u64(c.open_ops);
            false
        }
        Body::Coll(o) | Body::P2p(o) => {
            encode_op(o, w);
            false
        }
        Body::Proxy(p) => {
            w.u64(p.comm_hash)
                .u64(p.parent_local_sn)
                .u64(p.start_ns)
                .u64(p.end_ns)
                .u64(p.bytes)
                .u64(p.send_wait_ns)
                .u64(p.recv_wait_ns)
                .u32(p.pid)
                .i32(p.rank)
                .i32(p.peer)
                .i32(p.nsteps)
                .i32(p.chunk_size)
                .u32(p.steps_done)
                .u8(p.channel)
                .u8(p.is_send);
            false
        }
        Body::Net(n) => {
            w.u64(n.comm_hash)
                .u64(n.parent_local_sn)
                .u64(n.start_ns)
                .u64(n.end_ns)
                .u64(n.wr_id)
                .u64(n.length)
                .u32(n.net_type)
                .u32(n.net_version)
                .i32(n.rank)
                .i32(n.device)
                .u32(n.qp_num)
                .i32(n.opcode)
                .i32(n.fd)
                .i32(n.sock_op);
            false
        }
        Body::Overdue(o) => {
            w.u64(o.comm_hash)
                .u64(o.coll_sn)
                .u64(o.coll_local_sn)
                .u64(o.enqueue_ns)
                .u64(o.start_ns)
                .u64(o.now_ns)
                .u64(o.count)
                .u64(o.bytes)
                .u32(o.age_ms)
                .u32(o.repeat)
                .u32(o.threshold_ms)
                .i32(o.rank)
                .i32(o.peer)
                .u8(o.func.0)
                .u8(o.phase)
                .u8(o.channels_started)
                .u8(o.channels_done)
                .u8(o.is_p2p)
                .u8(o.nchannels);
            false
        }
        Body::Stats(s) => {
            w.u64(s.time_ns)
                .u64(s.mono_ns)
                .u64(s.real_ns)
                .u64(s.records_pushed)
                .u64(s.ring_drops)
                .u64(s.pool_drops)
                .u64(s.bytes_written)
                .u64(s.records_lost_io)
                .u64(s.events_ignored)
                .u64(s.overdue_emitted)
                .u32(s.segments_sealed)
                .u32(s.segments_deleted)
                .u32(s.io_errors)
                .u32(s.event_mask)
                .u8(s.writer_failed)
                // Body bytes 97..100 stay zero; 100..108 were zero before these counters
                // existed, so records of older plugins decode with both at 0.
                .bytes(&[0; 3])
                .u32(s.ctl_refused)
                .u32(s.mask_changes);
            false
        }
        Body::Thread(t) => host::encode_thread(t, w),
        Body::Qp(q) => host::encode_qp(q, w),
        Body::Tcp(t) => host::encode_tcp(t, w),
        Body::Port(p) => host::encode_port(p, w),
        Body::CommDevice(c) => gpu::encode_comm_device(c, w),
        Body::Gpu(g) => gpu::encode_gpu(g, w),
        Body::GpuLink(l) => gpu::encode_link(l, w),
        Body::Xid(x) => gpu::encode_xid(x, w),
        Body::EpStats(e) => moe::encode_ep_stats(e, w),
    }
}

fn decode_body(kind: Kind, r: &mut R<'_>) -> Body {
    match kind {
        Kind::Segment => {
            let format = r.u32();
            let record_size = r.u32();
            let segment_index = r.u64();
            let pid = r.u32();
            let source = r.u8();
            let _ = r.take::<3>();
            Body::Segment(SegmentHeader {
                format,
                record_size,
                segment_index,
                pid,
                source,
                created_real_ns: r.u64(),
                created_mono_ns: r.u64(),
            })
        }
        Kind::ProcStart => Body::ProcStart(ProcStart {
            pid: r.u32(),
            rank: r.i32(),
            local_rank: r.i32(),
            world_size: r.i32(),
            mono_ns: r.u64(),
            real_ns: r.u64(),
            abi_version: r.u8(),
            host: r.str_field(HOST_LEN),
            job: r.str_field(JOB_LEN),
        }),
        Kind::CommInit => {
            let comm_hash = r.u64();
            let nranks = r.u32();
            let rank = r.i32();
            let nnodes = r.u32();
            let local_rank = r.i32();
            let device = r.i32();
            let abi_version = r.u8();
            let _ = r.take::<3>();
            let time_ns = r.u64();
            Body::CommInit(CommInit {
                comm_hash,
                nranks,
                rank,
                nnodes,
                local_rank,
                device,
                abi_version,
                time_ns,
                comm_name: r.str_field(NAME_LEN),
            })
        }
        Kind::CommFini => {
            let comm_hash = r.u64();
            let rank = r.i32();
            let _ = r.u32();
            Body::CommFini(CommFini {
                comm_hash,
                rank,
                time_ns: r.u64(),
                ops: r.u64(),
                open_ops: r.u64(),
            })
        }
        Kind::Coll => Body::Coll(decode_op(r)),
        Kind::P2p => Body::P2p(decode_op(r)),
        Kind::Proxy => Body::Proxy(ProxyRecord {
            comm_hash: r.u64(),
            parent_local_sn: r.u64(),
            start_ns: r.u64(),
            end_ns: r.u64(),
            bytes: r.u64(),
            send_wait_ns: r.u64(),
            recv_wait_ns: r.u64(),
            pid: r.u32(),
            rank: r.i32(),
            peer: r.i32(),
            nsteps: r.i32(),
            chunk_size: r.i32(),
            steps_done: r.u32(),
            channel: r.u8(),
            is_send: r.u8(),
        }),
        Kind::Net => Body::Net(NetRecord {
            comm_hash: r.u64(),
            parent_local_sn: r.u64(),
            start_ns: r.u64(),
            end_ns: r.u64(),
            wr_id: r.u64(),
            length: r.u64(),
            net_type: r.u32(),
            net_version: r.u32(),
            rank: r.i32(),
            device: r.i32(),
            qp_num: r.u32(),
            opcode: r.i32(),
            fd: r.i32(),
            sock_op: r.i32(),
        }),
        Kind::Overdue => Body::Overdue(Overdue {
            comm_hash: r.u64(),
            coll_sn: r.u64(),
            coll_local_sn: r.u64(),
            enqueue_ns: r.u64(),
            start_ns: r.u64(),
            now_ns: r.u64(),
            count: r.u64(),
            bytes: r.u64(),
            age_ms: r.u32(),
            repeat: r.u32(),
            threshold_ms: r.u32(),
            rank: r.i32(),
            peer: r.i32(),
            func: Func(r.u8()),
            phase: r.u8(),
            channels_started: r.u8(),
            channels_done: r.u8(),
            is_p2p: r.u8(),
            nchannels: r.u8(),
        }),
        Kind::Stats => Body::Stats(Stats {
            time_ns: r.u64(),
            mono_ns: r.u64(),
            real_ns: r.u64(),
            records_pushed: r.u64(),
            ring_drops: r.u64(),
            pool_drops: r.u64(),
            bytes_written: r.u64(),
            records_lost_io: r.u64(),
            events_ignored: r.u64(),
            overdue_emitted: r.u64(),
            segments_sealed: r.u32(),
            segments_deleted: r.u32(),
            io_errors: r.u32(),
            event_mask: r.u32(),
            writer_failed: r.u8(),
            ctl_refused: {
                let _pad: [u8; 3] = r.take();
                r.u32()
            },
            mask_changes: r.u32(),
        }),
        Kind::Thread => host::decode_thread(r),
        Kind::Qp => host::decode_qp(r),
        Kind::Tcp => host::decode_tcp(r),
        Kind::Port => host::decode_port(r),
        Kind::CommDevice => gpu::decode_comm_device(r),
        Kind::Gpu => gpu::decode_gpu(r),
        Kind::GpuLink => gpu::decode_link(r),
        Kind::Xid => gpu::decode_xid(r),
        Kind::EpStats => moe::decode_ep_stats(r),
    }
}

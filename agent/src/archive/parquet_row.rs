//! The cells of one record's Parquet row, written straight into the row group's column buffers
//! (no per-row cell array, no string lookups: names are static strings, comm cells are shared).

use ::parquet::data_type::ByteArray;
use comminsight_wire::record::{Body, OpRecord, Overdue, Record, FLAG_REPEAT};

use super::parquet_cols::{col, Cols, Strs};
use crate::stream::Alignment;

use col::*;

/// A static name as a string cell: its bytes are not copied and its clone is not counted.
fn name(s: &'static str) -> ByteArray {
    ByteArray::from(bytes::Bytes::from_static(s.as_bytes()))
}

/// One row being filled: each cell set goes to its column; unset columns are null.
pub(super) struct Row<'a> {
    cols: &'a mut Cols,
    /// Bit i: column i has a value in this row.
    set: u64,
}

impl<'a> Row<'a> {
    fn new(cols: &'a mut Cols) -> Row<'a> {
        Row { cols, set: 0 }
    }

    fn mark(&mut self, i: usize) {
        debug_assert!(self.set & (1 << i) == 0, "column {i} set twice in a row");
        self.set |= 1 << i;
    }

    fn int(&mut self, i: usize, v: i64) {
        self.mark(i);
        self.cols.ints[i].push(v);
    }

    /// An unsigned value (stored as its INT64 bits, annotated unsigned).
    fn u(&mut self, i: usize, v: u64) {
        self.int(i, v as i64);
    }

    /// A host time: 0 = absent = null.
    fn t(&mut self, i: usize, ns: u64) {
        if ns != 0 {
            self.u(i, ns);
        }
    }

    fn s(&mut self, i: usize, v: ByteArray) {
        self.mark(i);
        self.cols.strs[i].push(v);
    }

    /// The row is complete: definition levels of the nullable columns.
    fn finish(self) {
        self.cols.end_row(self.set);
    }
}

/// Write the row of one record into `cols`; false (nothing written) for the segment header and
/// preamble repeats.
pub(super) fn push_row(
    cols: &mut Cols,
    rec: &Record,
    pid: Option<i64>,
    strs: &mut Strs,
    align: Alignment,
    gpu: Option<Alignment>,
) -> bool {
    if rec.flags & FLAG_REPEAT != 0 || matches!(rec.body, Body::Segment(_)) {
        return false;
    }
    let mut r = Row::new(cols);
    if let Some(p) = pid {
        r.int(PID, p);
    }
    r.u(SEQ, rec.seq);
    r.s(KIND, name(rec.kind().name()));
    r.int(FLAGS, i64::from(rec.flags));
    let (hash, start, end) = body_cells(&mut r, &rec.body, gpu);
    if let Some(h) = hash {
        let (hash, comm_name) = strs.comm(h);
        r.s(COMM_HASH, hash);
        if let Some(n) = comm_name {
            r.s(COMM_NAME, n);
        }
    }
    r.t(START_NS, start);
    r.t(END_NS, end);
    if start != 0 && end >= start {
        r.u(DURATION_NS, end - start);
    }
    r.t(ALIGNED_START_NS, align.apply(start));
    r.t(ALIGNED_END_NS, align.apply(end));
    r.u(CLOCK_ERR_NS, align.err_ns);
    if !matches!(rec.body, Body::Coll(_) | Body::P2p(_)) {
        let mut body = Vec::with_capacity(512);
        super::body_json::render(rec, &mut body);
        r.s(BODY_JSON, ByteArray::from(body));
    }
    r.finish();
    true
}

/// The cells of the fields of `body` that have their own columns; returns its comm hash and
/// its host (start, end) times (end 0 when it has none).
fn body_cells(r: &mut Row<'_>, body: &Body, gpu: Option<Alignment>) -> (Option<u64>, u64, u64) {
    let mut hash = None;
    let start: u64;
    let mut end = 0u64;
    match body {
        // Never a row (see `push_row`).
        Body::Segment(_) => start = 0,
        Body::ProcStart(p) => {
            r.int(RANK, i64::from(p.rank));
            start = p.real_ns;
        }
        Body::CommInit(c) => {
            hash = Some(c.comm_hash);
            r.int(RANK, i64::from(c.rank));
            start = c.time_ns;
        }
        Body::CommFini(c) => {
            hash = Some(c.comm_hash);
            r.int(RANK, i64::from(c.rank));
            start = c.time_ns;
        }
        Body::Coll(o) | Body::P2p(o) => {
            hash = Some(o.comm_hash);
            op_cells(r, o, gpu);
            (start, end) = (o.start_ns, o.end_ns);
        }
        Body::Proxy(p) => {
            hash = Some(p.comm_hash);
            r.int(RANK, i64::from(p.rank));
            r.int(PEER, i64::from(p.peer));
            r.u(BYTES, p.bytes);
            (start, end) = (p.start_ns, p.end_ns);
        }
        Body::Net(n) => {
            hash = Some(n.comm_hash);
            r.int(RANK, i64::from(n.rank));
            r.u(BYTES, n.length);
            (start, end) = (n.start_ns, n.end_ns);
        }
        Body::Overdue(o) => {
            hash = Some(o.comm_hash);
            overdue_cells(r, o);
            start = o.start_ns;
        }
        Body::Stats(s) => start = s.time_ns,
        // Host context (the agent's host stream): the interval, or the event's time.
        Body::Thread(t) => (start, end) = (t.time_ns.saturating_sub(t.interval_ns), t.time_ns),
        Body::Tcp(t) => (start, end) = (t.time_ns.saturating_sub(t.interval_ns), t.time_ns),
        Body::Port(p) => (start, end) = (p.time_ns.saturating_sub(p.interval_ns), p.time_ns),
        Body::Qp(q) => start = q.time_ns,
        Body::CommDevice(c) => {
            hash = Some(c.comm_hash);
            r.int(RANK, i64::from(c.rank));
            start = c.time_ns;
        }
        // GPU samples (the agent's host stream): the interval, or the event's time.
        Body::Gpu(g) => (start, end) = (g.time_ns.saturating_sub(g.interval_ns), g.time_ns),
        Body::GpuLink(l) => (start, end) = (l.time_ns.saturating_sub(l.interval_ns), l.time_ns),
        Body::Xid(x) => start = x.time_ns,
        // MoE EP wait counters: the window, the writer's EP rank.
        Body::EpStats(e) => {
            r.int(RANK, i64::from(e.rank));
            (start, end) = (e.t_start_ns, e.t_end_ns);
        }
    }
    (hash, start, end)
}

/// The cells of a `coll` / `p2p` op's own fields (its GPU times also aligned once `gpu`, the
/// process' GPU timer, is fitted).
fn op_cells(r: &mut Row<'_>, o: &OpRecord, gpu: Option<Alignment>) {
    r.int(RANK, i64::from(o.rank));
    r.int(PEER, i64::from(o.peer));
    r.int(ROOT, i64::from(o.root));
    r.s(FUNC, name(o.func.name()));
    r.s(ALGO, name(o.algo.name()));
    r.s(PROTO, name(o.proto.name()));
    r.s(DATATYPE, name(o.datatype.name()));
    r.u(COLL_SN, o.coll_sn);
    r.u(COLL_LOCAL_SN, o.coll_local_sn);
    r.u(COUNT, o.count);
    r.u(BYTES, o.bytes);
    r.int(NCHANNELS, i64::from(o.nchannels));
    r.s(TIMING, name(o.timing.name()));
    r.t(ENQUEUE_NS, o.enqueue_ns);
    r.t(GPU_START_NS, o.gpu_start_ns);
    r.t(GPU_END_NS, o.gpu_end_ns);
    r.t(API_NS, o.api_ns);
    r.int(NWARPS, i64::from(o.nwarps));
    r.int(CHANNELS_DONE, i64::from(o.channels_done));
    if let Some(g) = gpu {
        if o.gpu_start_ns != 0 || o.gpu_end_ns != 0 {
            r.t(ALIGNED_GPU_START_NS, g.apply(o.gpu_start_ns));
            r.t(ALIGNED_GPU_END_NS, g.apply(o.gpu_end_ns));
            r.u(GPU_CLOCK_ERR_NS, g.err_ns);
        }
    }
}

/// The cells of an `overdue` record's own fields.
fn overdue_cells(r: &mut Row<'_>, o: &Overdue) {
    r.int(RANK, i64::from(o.rank));
    r.int(PEER, i64::from(o.peer));
    r.s(FUNC, name(o.func.name()));
    r.u(COLL_SN, o.coll_sn);
    r.u(COLL_LOCAL_SN, o.coll_local_sn);
    r.u(COUNT, o.count);
    r.u(BYTES, o.bytes);
    r.int(NCHANNELS, i64::from(o.nchannels));
    r.t(ENQUEUE_NS, o.enqueue_ns);
}

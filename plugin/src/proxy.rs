//! ProxyOp / ProxyStep / NetPlugin events (off by default in the mask). One slot per ProxyOp
//! (its steps fold into it) and one per NetPlugin event, from a second slab.

use core::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use comminsight_wire::record::{Body, NetRecord, ProxyRecord, FLAG_PXN};

use crate::abi::{
    NetIbDescrV1, NetSockDescrV1, ProxyOpDescr, NET_TYPE_IB, NET_TYPE_MASK, NET_TYPE_SOCK,
    NET_VER_MASK, ST_PROXY_STEP_RECV_FLUSH_WAIT, ST_PROXY_STEP_RECV_GPU_WAIT,
    ST_PROXY_STEP_RECV_WAIT, ST_PROXY_STEP_SEND_GPU_WAIT, ST_PROXY_STEP_SEND_PEER_WAIT_V4,
    ST_PROXY_STEP_SEND_WAIT,
};
use crate::core::Shared;
use crate::handle::{Handle, TAG_NET, TAG_PROXY_OP, TAG_PROXY_STEP};
use crate::sys::Zeroable;

const LIVE: u64 = 1;
const KIND_NET: u64 = 2;
const PXN: u64 = 4;
const STEPS: usize = 16;
const TIME_MASK: u64 = (1 << 56) - 1;

/// A ProxyOp (with folded steps) or a NetPlugin event.
#[repr(C, align(64))]
pub struct ProxySlot {
    ctl: AtomicU64,
    comm_hash: AtomicU64,
    parent_sn: AtomicU64,
    start_ns: AtomicU64,
    /// pid << 32 | rank
    pid_rank: AtomicU64,
    /// ProxyOp: peer<<32|nsteps, chunk<<32|channel<<8|is_send. Net: wr_id, length, qp<<32|opcode,
    /// device<<32|fd, sock_op<<32|net_type<<16|net_version.
    f: [AtomicU64; 5],
    bytes: AtomicU64,
    send_wait: AtomicU64,
    recv_wait: AtomicU64,
    steps_done: AtomicU64,
    /// (state + 1) << 56 | (time − clock base), per `step % 16`.
    step_state: [AtomicU64; STEPS],
    step_size: [AtomicU64; STEPS],
}

// SAFETY: atomics only; all-zero is valid.
unsafe impl Zeroable for ProxySlot {}

fn live_slot(sh: &Shared, h: Handle) -> Option<&ProxySlot> {
    let s = sh.proxies.get(h.index)?;
    let c = s.ctl.load(Ordering::Acquire);
    ((c >> 32) as u32 == h.gen && c & LIVE != 0).then_some(s)
}

fn alloc(sh: &Shared, flags: u64) -> Option<(u32, u32, &ProxySlot)> {
    let Some(idx) = sh.proxies.alloc() else {
        sh.counters.proxy_drops.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let s = sh.proxies.get(idx)?;
    let gen = (s.ctl.load(Ordering::Acquire) >> 32) as u32;
    for a in [&s.bytes, &s.send_wait, &s.recv_wait, &s.steps_done] {
        a.store(0, Ordering::Relaxed);
    }
    for a in s
        .step_state
        .iter()
        .chain(s.step_size.iter())
        .chain(s.f.iter())
    {
        a.store(0, Ordering::Relaxed);
    }
    let _ = flags;
    Some((idx, gen, s))
}

fn publish(s: &ProxySlot, gen: u32, flags: u64) {
    s.ctl
        .store(u64::from(gen) << 32 | LIVE | flags, Ordering::Release);
}

/// Retire a live slot; returns the ctl value it had.
fn retire(sh: &Shared, h: Handle) -> Option<(u64, &ProxySlot)> {
    let s = sh.proxies.get(h.index)?;
    let mut c = s.ctl.load(Ordering::Acquire);
    loop {
        if (c >> 32) as u32 != h.gen || c & LIVE == 0 {
            return None;
        }
        let n = u64::from(h.gen.wrapping_add(1)) << 32;
        match s
            .ctl
            .compare_exchange(c, n, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some((c, s)),
            Err(x) => c = x,
        }
    }
}

/// ProxyOp start. `local` = the op was created by this process (PXN check already done by the
/// caller *before* anything foreign was touched); for a foreign op `comm_hash`/`parent_sn` are
/// unknown and `FLAG_PXN` is set.
pub fn start_proxy_op(
    sh: &Shared,
    d: &ProxyOpDescr,
    rank: i32,
    comm_hash: u64,
    parent_sn: u64,
    local: bool,
) -> *mut c_void {
    let flags = if local { 0 } else { PXN };
    let Some((idx, gen, s)) = alloc(sh, flags) else {
        return core::ptr::null_mut();
    };
    s.comm_hash.store(comm_hash, Ordering::Relaxed);
    s.parent_sn.store(parent_sn, Ordering::Relaxed);
    s.start_ns.store(sh.clock.now(), Ordering::Relaxed);
    s.pid_rank.store(
        u64::from(d.pid as u32) << 32 | u64::from(rank as u32),
        Ordering::Relaxed,
    );
    s.f[0].store(
        u64::from(d.peer as u32) << 32 | u64::from(d.n_steps as u32),
        Ordering::Relaxed,
    );
    s.f[1].store(
        u64::from(d.chunk_size as u32) << 32
            | u64::from(d.channel_id) << 8
            | u64::from(d.is_send != 0),
        Ordering::Relaxed,
    );
    publish(s, gen, flags);
    Handle::new(TAG_PROXY_OP, 0, idx, gen).to_ptr()
}

/// ProxyOp stop: emit the `proxy` record.
pub fn stop_proxy_op(sh: &Shared, h: Handle) {
    let Some((c, s)) = retire(sh, h) else {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let pid_rank = s.pid_rank.load(Ordering::Relaxed);
    let f0 = s.f[0].load(Ordering::Relaxed);
    let f1 = s.f[1].load(Ordering::Relaxed);
    let start_ns = s.start_ns.load(Ordering::Relaxed);
    let rec = ProxyRecord {
        comm_hash: s.comm_hash.load(Ordering::Relaxed),
        parent_local_sn: s.parent_sn.load(Ordering::Relaxed),
        start_ns,
        // Never before the start (see `op::read_record`).
        end_ns: sh.clock.now().max(start_ns),
        bytes: s.bytes.load(Ordering::Relaxed),
        send_wait_ns: s.send_wait.load(Ordering::Relaxed),
        recv_wait_ns: s.recv_wait.load(Ordering::Relaxed),
        pid: (pid_rank >> 32) as u32,
        rank: pid_rank as u32 as i32,
        peer: (f0 >> 32) as u32 as i32,
        nsteps: f0 as u32 as i32,
        chunk_size: (f1 >> 32) as u32 as i32,
        steps_done: s.steps_done.load(Ordering::Relaxed) as u32,
        channel: (f1 >> 8) as u8,
        is_send: (f1 & 1) as u8,
    };
    sh.proxies.free(h.index);
    sh.push_body(Body::Proxy(rec), if c & PXN != 0 { FLAG_PXN } else { 0 });
}

/// ProxyStep start under a ProxyOp handle.
pub fn start_proxy_step(sh: &Shared, parent: Handle, step: i32) -> *mut c_void {
    let Some(s) = live_slot(sh, parent).filter(|_| parent.tag == TAG_PROXY_OP) else {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return core::ptr::null_mut();
    };
    let e = (step as u32 as usize) % STEPS;
    let t = sh.clock.now().wrapping_sub(sh.clock.real0) & TIME_MASK;
    s.step_state[e].store(1 << 56 | t, Ordering::Relaxed);
    s.step_size[e].store(0, Ordering::Relaxed);
    Handle::new(TAG_PROXY_STEP, e as u8, parent.index, parent.gen).to_ptr()
}

fn is_send_wait(state: i32) -> bool {
    state == ST_PROXY_STEP_SEND_WAIT || state == ST_PROXY_STEP_SEND_PEER_WAIT_V4
}

fn is_recv_wait(state: i32) -> bool {
    state == ST_PROXY_STEP_RECV_WAIT
        || state == ST_PROXY_STEP_RECV_FLUSH_WAIT
        || state == ST_PROXY_STEP_RECV_GPU_WAIT
}

/// Close the step's current state at `t`, enter `next` (state + 1; 0 = step over).
fn fold(s: &ProxySlot, e: usize, t: u64, next: u64) {
    let prev = s.step_state[e].swap(if next == 0 { 0 } else { next << 56 | t }, Ordering::AcqRel);
    if prev == 0 {
        return;
    }
    let state = (prev >> 56) as i32 - 1;
    let dt = t.wrapping_sub(prev & TIME_MASK) & TIME_MASK;
    if dt > TIME_MASK / 2 {
        return;
    }
    if is_send_wait(state) {
        s.send_wait.fetch_add(dt, Ordering::Relaxed);
    } else if is_recv_wait(state) {
        s.recv_wait.fetch_add(dt, Ordering::Relaxed);
    }
}

/// ProxyStep state (8–12, 20) with `transSize`.
pub fn record_proxy_step(sh: &Shared, h: Handle, state: i32, trans_size: Option<usize>) {
    let Some(s) = live_slot(sh, h) else {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if !(ST_PROXY_STEP_SEND_GPU_WAIT..=ST_PROXY_STEP_RECV_GPU_WAIT).contains(&state)
        && state != ST_PROXY_STEP_SEND_PEER_WAIT_V4
    {
        return;
    }
    let e = usize::from(h.sub) % STEPS;
    let t = sh.clock.now().wrapping_sub(sh.clock.real0) & TIME_MASK;
    fold(s, e, t, state as u64 + 1);
    if let Some(n) = trans_size {
        s.step_size[e].store(n as u64, Ordering::Relaxed);
    }
}

/// ProxyStep stop: fold its wait time and size into the ProxyOp.
pub fn stop_proxy_step(sh: &Shared, h: Handle) {
    let Some(s) = live_slot(sh, h) else {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let e = usize::from(h.sub) % STEPS;
    if s.step_state[e].load(Ordering::Acquire) == 0 {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let t = sh.clock.now().wrapping_sub(sh.clock.real0) & TIME_MASK;
    fold(s, e, t, 0);
    s.bytes
        .fetch_add(s.step_size[e].swap(0, Ordering::Relaxed), Ordering::Relaxed);
    s.steps_done.fetch_add(1, Ordering::Relaxed);
}

/// What a NetPlugin event's parent tells us: (comm_hash, parent_local_sn, pxn).
fn net_parent(sh: &Shared, parent: Option<Handle>) -> (u64, u64, bool) {
    match parent.filter(|h| h.tag == TAG_PROXY_STEP || h.tag == TAG_PROXY_OP) {
        Some(h) => match live_slot(sh, h) {
            Some(s) => (
                s.comm_hash.load(Ordering::Relaxed),
                s.parent_sn.load(Ordering::Relaxed),
                s.ctl.load(Ordering::Relaxed) & PXN != 0,
            ),
            None => (0, u64::MAX, false),
        },
        None => (0, u64::MAX, false),
    }
}

/// NetPlugin start: copy the IB / socket descriptor `data` points to (valid during the call).
pub fn start_net(
    sh: &Shared,
    parent: Option<Handle>,
    rank: i32,
    id: i64,
    data: *mut c_void,
) -> *mut c_void {
    let (comm_hash, parent_sn, pxn) = net_parent(sh, parent);
    let flags = KIND_NET | if pxn { PXN } else { 0 };
    let Some((idx, gen, s)) = alloc(sh, flags) else {
        return core::ptr::null_mut();
    };
    let net_type = ((id & NET_TYPE_MASK) >> 16) as u64;
    let version = (id & NET_VER_MASK) as u64;
    let (mut wr_id, mut length, mut qp, mut opcode, mut device, mut fd, mut sock_op) =
        (0u64, 0u64, 0u32, 0i32, -1i32, -1i32, -1i32);
    if !data.is_null() && version == 1 {
        if id & NET_TYPE_MASK == NET_TYPE_IB {
            // SAFETY: NCCL's IB net plugin passes a live `ncclProfilerNetIbDescr_v1_t` (type IB,
            // version 1, as `id` says) valid for the duration of this call; we copy it out.
            let d: NetIbDescrV1 = unsafe { data.cast::<NetIbDescrV1>().read_unaligned() };
            wr_id = d.qp.wr_id;
            length = d.qp.length as u64;
            qp = d.qp.qp_num as u32;
            opcode = d.qp.opcode;
            device = d.qp.device;
        } else if id & NET_TYPE_MASK == NET_TYPE_SOCK {
            // SAFETY: as above for the socket plugin's `ncclProfilerNetSockDescr_v1_t`.
            let d: NetSockDescrV1 = unsafe { data.cast::<NetSockDescrV1>().read_unaligned() };
            length = d.sock.length as u64;
            fd = d.sock.fd;
            sock_op = d.sock.op;
        }
    }
    s.comm_hash.store(comm_hash, Ordering::Relaxed);
    s.parent_sn.store(parent_sn, Ordering::Relaxed);
    s.start_ns.store(sh.clock.now(), Ordering::Relaxed);
    s.pid_rank.store(u64::from(rank as u32), Ordering::Relaxed);
    s.f[0].store(wr_id, Ordering::Relaxed);
    s.f[1].store(length, Ordering::Relaxed);
    s.f[2].store(
        u64::from(qp) << 32 | u64::from(opcode as u32),
        Ordering::Relaxed,
    );
    s.f[3].store(
        u64::from(device as u32) << 32 | u64::from(fd as u32),
        Ordering::Relaxed,
    );
    s.f[4].store(
        u64::from(sock_op as u32) << 32 | (net_type & 0xffff) << 16 | (version & 0xffff),
        Ordering::Relaxed,
    );
    publish(s, gen, flags);
    Handle::new(TAG_NET, 0, idx, gen).to_ptr()
}

/// NetPlugin stop: emit the `net` record.
pub fn stop_net(sh: &Shared, h: Handle) {
    let Some((c, s)) = retire(sh, h) else {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let f: Vec<u64> = s.f.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let start_ns = s.start_ns.load(Ordering::Relaxed);
    let rec = NetRecord {
        comm_hash: s.comm_hash.load(Ordering::Relaxed),
        parent_local_sn: s.parent_sn.load(Ordering::Relaxed),
        start_ns,
        // Never before the start (see `op::read_record`).
        end_ns: sh.clock.now().max(start_ns),
        wr_id: f[0],
        length: f[1],
        net_type: ((f[4] >> 16) & 0xffff) as u32,
        net_version: (f[4] & 0xffff) as u32,
        rank: s.pid_rank.load(Ordering::Relaxed) as u32 as i32,
        device: (f[3] >> 32) as u32 as i32,
        qp_num: (f[2] >> 32) as u32,
        opcode: f[2] as u32 as i32,
        fd: f[3] as u32 as i32,
        sock_op: (f[4] >> 32) as u32 as i32,
    };
    sh.proxies.free(h.index);
    sh.push_body(Body::Net(rec), if c & PXN != 0 { FLAG_PXN } else { 0 });
}

/// Validate a handle of this slab (record states that carry nothing we keep).
pub fn touch(sh: &Shared, h: Handle) {
    if live_slot(sh, h).is_none() {
        sh.counters.events_ignored.fetch_add(1, Ordering::Relaxed);
    }
}

/// Retire every live proxy/net slot (last finalize, leak checks). Emits nothing.
pub fn sweep(sh: &Shared) -> u64 {
    let mut n = 0;
    for (idx, s) in sh.proxies.used() {
        let c = s.ctl.load(Ordering::Acquire);
        if c & LIVE != 0 {
            let h = Handle::new(TAG_PROXY_OP, 0, idx, (c >> 32) as u32);
            if retire(sh, h).is_some() {
                sh.proxies.free(idx);
                n += 1;
            }
        }
    }
    n
}

/// Live proxy/net slots.
pub fn live(sh: &Shared) -> usize {
    sh.proxies
        .used()
        .filter(|(_, s)| s.ctl.load(Ordering::Acquire) & LIVE != 0)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{NetIbDescrV1, NetIbQp, ST_PROXY_STEP_SEND_WAIT};
    use crate::core::stop_event;
    use crate::testutil::*;

    #[test]
    fn pxn_proxy_op_never_touches_the_foreign_context_or_parent() {
        let (sh, ring) = fixture(small_cfg());
        // A context and a parent from another process: dereferencing either would crash.
        let foreign_ctx = 0x10 as *mut c_void;
        let foreign_parent = 0xdead_0008 as *mut c_void;
        let d = proxy_op(foreign_parent, sh.pid as i32 + 1);
        // SAFETY: the PXN path must not dereference `foreign_ctx` (that is what is tested).
        let h = unsafe { crate::core::start_event(sh, foreign_ctx, &d) };
        assert!(!h.is_null());
        let s = start_proxy_step(sh, Handle::from_ptr(h).unwrap(), 0);
        stop_event(sh, s);
        stop_event(sh, h);
        let recs = records(&ring);
        assert_eq!(recs.len(), 1);
        assert_ne!(recs[0].flags & FLAG_PXN, 0);
        let Body::Proxy(p) = &recs[0].body else {
            panic!()
        };
        assert_eq!((p.comm_hash, p.parent_local_sn), (0, u64::MAX));
        assert_eq!(p.pid, sh.pid + 1);
        assert_eq!(p.steps_done, 1);
        assert_eq!(live(sh), 0);
    }

    #[test]
    fn local_proxy_op_folds_steps_and_net_events_copy_the_ib_descriptor() {
        let (sh, ring) = fixture(small_cfg());
        let ctx = context(sh, 0x77, 2, 4);
        let c = start(sh, &ctx, &coll(0, c"AllReduce", 1, 1));
        records(&ring);
        let op = start(sh, &ctx, &proxy_op(c, sh.pid as i32));
        let st = start(sh, &ctx, &proxy_step(op, 17));
        record(sh, st, ST_PROXY_STEP_SEND_WAIT, 4096);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut ib = NetIbDescrV1 {
            type_: 1,
            qp: NetIbQp {
                device: 1,
                wr_id: 99,
                opcode: 2,
                qp_num: 1234,
                length: 4096,
            },
        };
        let n = start(sh, &ctx, &net(st, NET_TYPE_IB | 1, (&raw mut ib).cast()));
        stop_event(sh, n);
        stop_event(sh, st);
        stop_event(sh, op);
        let recs = records(&ring);
        let Body::Net(nr) = &recs[0].body else {
            panic!("{recs:?}")
        };
        assert_eq!(
            (nr.qp_num, nr.wr_id, nr.length, nr.opcode, nr.device),
            (1234, 99, 4096, 2, 1)
        );
        assert_eq!(
            (
                nr.net_type,
                nr.net_version,
                nr.comm_hash,
                nr.parent_local_sn
            ),
            (1, 1, 0x77, 0)
        );
        let Body::Proxy(p) = &recs[1].body else {
            panic!()
        };
        assert_eq!(
            (p.comm_hash, p.parent_local_sn, p.bytes, p.steps_done),
            (0x77, 0, 4096, 1)
        );
        assert!(p.send_wait_ns >= 1_000_000, "{p:?}");
        assert_eq!((p.peer, p.nsteps, p.channel, p.is_send), (3, 4, 1, 1));
        assert_eq!(recs[1].flags & FLAG_PXN, 0);
    }
}

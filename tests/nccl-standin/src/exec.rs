//! Executes a launched job on the stream thread: moves the bytes, and plays NCCL's proxy-thread role
//! for the profiler (KernelCh per channel, ProxyOp/ProxyStep/NetPlugin for remote-host peers, ProxyCtrl).

use crate::algo::{self, Buf, Step, CHUNK};
use crate::comm::{Comm, Geo};
use crate::hash::mix;
use crate::net::{net, Kind, Wait};
use crate::profiler::abi::{SockDescr, SockInfo};
use crate::profiler::emit::{self, gpu_timer_ns, record, start, stop};
use crate::profiler::{mask, Ctx, Ev, H};
use crate::task::{Job, Task};
use crate::types::Func;
use std::collections::HashMap;

struct Run<'a> {
    comm: &'a Comm,
    geo: &'a Geo,
    ctx: Ctx,
    task: Task,
    nch: u8,
    kernel: Vec<H>,
    proxies: HashMap<(usize, bool), Vec<H>>,
    counters: HashMap<(usize, bool), usize>,
    /// Per peer: when the last frame received from it had arrived.
    arrived: HashMap<usize, std::time::Instant>,
}

impl<'a> Run<'a> {
    fn new(comm: &'a Comm, geo: &'a Geo, task: Task) -> Self {
        Self {
            comm,
            geo,
            ctx: comm.ctx(),
            task,
            nch: task.op.n_channels(),
            kernel: Vec::new(),
            proxies: HashMap::new(),
            counters: HashMap::new(),
            arrived: HashMap::new(),
        }
    }

    fn emits(&self) -> bool {
        !self.task.prof.lost && emit::active()
    }

    fn m(&self) -> i32 {
        self.task.prof.mask
    }

    /// The kernel starts on every channel.
    fn kernel_start(&mut self) {
        if self.emits() && mask::kernel_ch(self.m()) {
            for ch in 0..self.nch {
                let ev = Ev::KernelCh {
                    parent: self.task.prof.event,
                    ch,
                    ptimer: gpu_timer_ns(),
                };
                self.kernel.push(start(self.ctx, &ev));
            }
        }
    }

    fn kernel_stop(&mut self) {
        for h in self.kernel.drain(..) {
            record(h, 22, Some(gpu_timer_ns()));
            stop(h);
        }
    }

    /// ProxyOps for links to peers on other hosts, one per channel that carries steps.
    fn proxies_start(&mut self, links: &HashMap<(usize, bool), usize>) {
        if !self.emits() || !mask::proxy_op(self.m()) {
            return;
        }
        let mut keys: Vec<_> = links.keys().copied().collect();
        keys.sort_unstable();
        for (peer, send) in keys {
            if !self.geo.remote(peer) {
                continue;
            }
            let total = links[&(peer, send)];
            let mut hs = Vec::new();
            for ch in 0..self.nch {
                let nsteps = (0..total)
                    .filter(|k| k % self.nch as usize == ch as usize)
                    .count();
                if nsteps == 0 {
                    hs.push(H::NULL);
                    continue;
                }
                let ev = Ev::ProxyOp {
                    parent: self.task.prof.event,
                    rank: self.geo.rank as i32,
                    ch,
                    peer: peer as i32,
                    nsteps: nsteps as i32,
                    chunk: CHUNK as i32,
                    is_send: send,
                };
                let h = start(self.ctx, &ev);
                record(h, 19, Some(0));
                hs.push(h);
            }
            self.proxies.insert((peer, send), hs);
        }
    }

    fn proxies_stop(&mut self) {
        for (_, hs) in self.proxies.drain() {
            for h in hs {
                stop(h);
            }
        }
    }

    fn step_handle(&self, peer: usize, send: bool, k: usize) -> H {
        if !mask::proxy_step(self.m()) {
            return H::NULL;
        }
        let Some(hs) = self.proxies.get(&(peer, send)) else {
            return H::NULL;
        };
        let ch = k % self.nch as usize;
        if hs[ch].is_null() {
            return H::NULL;
        }
        let ev = Ev::ProxyStep {
            parent: hs[ch],
            rank: self.geo.rank as i32,
            step: (k / self.nch as usize) as i32,
        };
        start(self.ctx, &ev)
    }

    fn net_event(&self, step: H, fd: i32, op: i32, len: usize) {
        if step.is_null() || !mask::net_plugin(self.m()) {
            return;
        }
        let sock = SockDescr {
            ty: 1,
            sock: SockInfo {
                fd,
                op,
                length: len,
            },
        };
        let h = start(
            self.ctx,
            &Ev::NetPlugin {
                parent: step,
                rank: self.geo.rank as i32,
                sock: &sock,
            },
        );
        record(h, 21, Some(&sock as *const SockDescr as u64));
        stop(h);
    }

    fn send(&mut self, kind: Kind, peer: usize, tag: u64, data: &[u8]) -> Result<(), Wait> {
        let me = self.geo.rank as u32;
        for piece in pieces(data) {
            let k = next(&mut self.counters, (peer, true));
            let st = self.step_handle(peer, true, k);
            record(st, 8, Some(piece.len() as u64));
            record(st, 20, Some(piece.len() as u64));
            record(st, 9, Some(piece.len() as u64));
            let key = (self.geo.id, kind, me, peer as u32);
            let to = self.geo.peers[peer].addr;
            let fd = match net().send(to, key, tag.wrapping_add(k as u64), piece) {
                Ok(fd) => fd,
                Err(e) => {
                    network_error(self.comm, self.geo, peer, &e.to_string());
                    return Err(stall_until_abort(self.comm));
                }
            };
            self.net_event(st, fd, 0, piece.len());
            stop(st);
        }
        Ok(())
    }

    /// Receives `dst.len()` bytes from `peer` frame by frame, merging each frame into its place.
    fn recv_into(
        &mut self,
        kind: Kind,
        peer: usize,
        tag: u64,
        dst: &mut [u8],
        merge: &dyn Fn(&mut [u8], &[u8]),
    ) -> Result<(), Wait> {
        let me = self.geo.rank as u32;
        let total = dst.len();
        let mut off = 0;
        for _ in 0..algo::frames(total) {
            let k = next(&mut self.counters, (peer, false));
            let st = self.step_handle(peer, false, k);
            record(st, 10, Some(0));
            let key = (self.geo.id, kind, peer as u32, me);
            let (comm, geo) = (self.comm, self.geo);
            let gone = || {
                if geo.remote(peer) {
                    network_error(comm, geo, peer, "Connection closed by remote peer");
                }
            };
            let tag_k = Some(tag.wrapping_add(k as u64));
            let f = net().recv_or_gone(key, tag_k, &|| comm.is_aborted(), &gone)?;
            self.net_event(st, f.fd, 1, f.data.len());
            record(st, 11, Some(f.data.len() as u64));
            let at = self.arrived.entry(peer).or_insert(f.arrived);
            *at = (*at).max(f.arrived);
            let n = f.data.len().min(total - off);
            merge(&mut dst[off..off + n], &f.data[..n]);
            off += n;
            record(st, 12, Some(f.data.len() as u64));
            stop(st);
        }
        if off != total {
            crate::log::warn(&format!(
                "stand-in: expected {total} bytes from rank {peer}, got {off}"
            ));
        }
        Ok(())
    }
}

thread_local! {
    /// The stream's scratch buffers, reused across operations (no page faults per op).
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

fn copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// A network failure with `peer`: NCCL's proxy reports it as the comm's async error (ncclRemoteError
/// for a closed connection, ncclSystemError otherwise) while the kernel keeps waiting.
fn network_error(comm: &Comm, geo: &Geo, peer: usize, what: &str) {
    let code = if what.contains("closed") || what.contains("reset") || what.contains("Broken pipe")
    {
        crate::types::NcclError::Remote
    } else {
        crate::types::NcclError::System
    };
    if comm
        .async_err
        .swap(code.code(), std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        crate::log::warn(&format!(
            "NET/Socket : peer rank {peer} ({}): {what}; comm 0x{:x} async error {}",
            geo.peers[peer].addr,
            geo.id,
            code.code()
        ));
    }
}

/// Waits (as a stuck kernel) until the comm is aborted.
fn stall_until_abort(comm: &Comm) -> Wait {
    while !comm.is_aborted() {
        crate::worker::wait_progress();
    }
    Wait::Aborted
}

fn next(m: &mut HashMap<(usize, bool), usize>, k: (usize, bool)) -> usize {
    let e = m.entry(k).or_insert(0);
    let v = *e;
    *e += 1;
    v
}

fn pieces(data: &[u8]) -> Vec<&[u8]> {
    if data.is_empty() {
        return vec![data];
    }
    data.chunks(CHUNK).collect()
}

fn coll_tag(ord: u64, t: &Task) -> u64 {
    mix(ord
        ^ ((t.op.func as u64) << 56)
        ^ ((t.op.bytes() as u64) << 8)
        ^ (t.op.root as u32 as u64).rotate_left(40))
        & !0xffff_ffff
}

fn p2p_tag(ord: u64, bytes: usize, cts: bool) -> u64 {
    mix(ord ^ ((bytes as u64) << 16) ^ u64::from(cts)) & !0xffff_ffff
}

fn run_coll(comm: &Comm, geo: &Geo, task: Task) -> Result<(), Wait> {
    let (mut work, mut input) = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let r = run_coll_in(comm, geo, task, &mut work, &mut input);
    SCRATCH.with(|s| *s.borrow_mut() = (work, input));
    r
}

fn run_coll_in(
    comm: &Comm,
    geo: &Geo,
    task: Task,
    work: &mut Vec<u8>,
    input: &mut Vec<u8>,
) -> Result<(), Wait> {
    let op = task.op;
    let p = algo::plan(&op, geo.rank, geo.nranks);
    let ord = comm
        .coll_ord
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let tag = coll_tag(ord, &task);
    work.clear();
    work.resize(p.work_len, 0);
    // The send buffer is only read (the receive buffer is written at the end), so in-place works.
    let needs_input = p.steps.iter().any(|s| {
        matches!(
            s,
            Step::Local { .. }
                | Step::Send {
                    buf: Buf::Input,
                    ..
                }
        )
    });
    input.clear();
    if needs_input {
        input.resize(p.in_len, 0);
        crate::mem::read_into(op.send, input);
    }
    if let Some(at) = p.input_at {
        crate::mem::read_into(op.send, &mut work[at..at + p.in_len]);
    }
    let mut links: HashMap<(usize, bool), usize> = HashMap::new();
    for s in &p.steps {
        match *s {
            Step::Send { peer, len, .. } => {
                *links.entry((peer, true)).or_insert(0) += algo::frames(len)
            }
            Step::Recv { peer, len, .. } => {
                *links.entry((peer, false)).or_insert(0) += algo::frames(len)
            }
            Step::Local { .. } => {}
        }
    }
    let mut run = Run::new(comm, geo, task);
    run.kernel_start();
    run.proxies_start(&links);
    let (dt, rop) = (op.dt, op.op);
    let reduce = move |acc: &mut [u8], src: &[u8]| crate::reduce::reduce(acc, src, dt, rop);
    let mut recv_start = None;
    for s in &p.steps {
        match *s {
            Step::Send {
                peer,
                buf,
                off,
                len,
            } => {
                let src = match buf {
                    Buf::Input => &input[off..off + len],
                    Buf::Work => &work[off..off + len],
                };
                run.send(Kind::Coll, peer, tag, src)?;
            }
            Step::Recv {
                peer,
                off,
                len,
                reduce: r,
            } => {
                recv_start.get_or_insert_with(std::time::Instant::now);
                let merge: &dyn Fn(&mut [u8], &[u8]) = if r { &reduce } else { &copy };
                run.recv_into(Kind::Coll, peer, tag, &mut work[off..off + len], merge)?;
            }
            Step::Local { from, to, len } => {
                work[to..to + len].copy_from_slice(&input[from..from + len])
            }
        }
    }
    if let Some((off, len)) = p.out {
        let out = &mut work[off..off + len];
        if p.avg {
            crate::reduce::finish_avg(out, op.dt, geo.nranks);
        }
        crate::mem::write(op.recv, out);
    }
    if let (Func::AlltoAll, Some(t0)) = (op.func, recv_start) {
        comm.record_waits(geo.nranks, t0, &run.arrived);
    }
    run.proxies_stop();
    run.kernel_stop();
    Ok(())
}

fn run_p2p(comm: &Comm, geo: &Geo, tasks: &[Task]) -> Result<(), Wait> {
    let me = geo.rank as u32;
    let recv_start = std::time::Instant::now();
    let mut runs: Vec<(Run<'_>, u64)> = Vec::new();
    for t in tasks {
        let peer = t.op.root as usize;
        let ord = comm.next_p2p(peer, t.op.func == Func::Send);
        let mut r = Run::new(comm, geo, *t);
        r.kernel_start();
        let mut links = HashMap::new();
        links.insert((peer, t.op.func == Func::Send), algo::frames(t.op.bytes()));
        r.proxies_start(&links);
        runs.push((r, ord));
    }
    // Receivers post clear-to-send first: never blocks.
    for (r, ord) in runs.iter().filter(|(r, _)| r.task.op.func == Func::Recv) {
        let peer = r.task.op.root as usize;
        let tag = p2p_tag(*ord, r.task.op.bytes(), true);
        let key = (geo.id, Kind::P2pCts, me, peer as u32);
        if let Err(e) = net().send(geo.peers[peer].addr, key, tag, &[]) {
            network_error(comm, geo, peer, &e.to_string());
            return Err(stall_until_abort(comm));
        }
    }
    // Senders wait for their receiver (rendezvous), then stream the data.
    for (r, ord) in runs
        .iter_mut()
        .filter(|(r, _)| r.task.op.func == Func::Send)
    {
        let peer = r.task.op.root as usize;
        let bytes = r.task.op.bytes();
        let cts = (geo.id, Kind::P2pCts, peer as u32, me);
        let gone = || {
            if geo.remote(peer) {
                network_error(comm, geo, peer, "Connection closed by remote peer");
            }
        };
        net().recv_or_gone(
            cts,
            Some(p2p_tag(*ord, bytes, true)),
            &|| comm.is_aborted(),
            &gone,
        )?;
        let data = crate::mem::read(r.task.op.send, bytes);
        r.send(Kind::P2pData, peer, p2p_tag(*ord, bytes, false), &data)?;
        r.proxies_stop();
        r.kernel_stop();
    }
    for (r, ord) in runs
        .iter_mut()
        .filter(|(r, _)| r.task.op.func == Func::Recv)
    {
        let peer = r.task.op.root as usize;
        let bytes = r.task.op.bytes();
        let mut data = vec![0u8; bytes];
        r.recv_into(
            Kind::P2pData,
            peer,
            p2p_tag(*ord, bytes, false),
            &mut data,
            &copy,
        )?;
        crate::mem::write(r.task.op.recv, &data);
        r.proxies_stop();
        r.kernel_stop();
    }
    let arrived: HashMap<usize, std::time::Instant> =
        runs.iter().flat_map(|(r, _)| r.arrived.clone()).collect();
    if !arrived.is_empty() {
        comm.record_waits(geo.nranks, recv_start, &arrived);
    }
    Ok(())
}

/// One short ProxyCtrl event with `states` (NCCL's proxy progress thread emits them on sleep/wakeup,
/// op append and idle/active transitions); gated by the global mask at event time, as NCCL does.
pub fn proxy_ctrl(ctx: crate::profiler::Ctx, states: &[(i32, u64)]) {
    let m = crate::profiler::loader::EVENT_MASK.load(std::sync::atomic::Ordering::Relaxed);
    if !emit::active() || !mask::proxy_ctrl(m) {
        return;
    }
    let h = start(ctx, &Ev::ProxyCtrl);
    for &(s, a) in states {
        record(h, s, Some(a));
    }
    stop(h);
}

/// Runs one job (a launched plan of one comm). `woke` = the stream had been sleeping.
pub fn run_job(job: Job, woke: bool) {
    let comm = &*job.comm;
    let Some(geo) = comm.geo.get() else { return };
    if comm.is_aborted() {
        return;
    }
    let ctx = comm.ctx();
    if woke {
        proxy_ctrl(ctx, &[(15, 0), (16, 0)]); // Sleep, Wakeup
    }
    proxy_ctrl(ctx, &[(17, 0), (18, job.tasks.len() as u64)]); // Append, AppendEnd(appended)
    proxy_ctrl(ctx, &[(14, 0)]); // Active
    let p2p: Vec<Task> = job
        .tasks
        .iter()
        .filter(|t| t.op.is_p2p())
        .copied()
        .collect();
    let mut r = Ok(());
    if !p2p.is_empty() {
        r = run_p2p(comm, geo, &p2p);
    }
    for t in job.tasks.iter().filter(|t| !t.op.is_p2p()) {
        if r.is_err() {
            break;
        }
        r = run_coll(comm, geo, *t);
    }
    // aborted: events stay open, the context is finalized
    let _ = r;
}

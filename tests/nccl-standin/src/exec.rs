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
            let fd = net()
                .send(
                    self.geo.peers[peer].addr,
                    key,
                    tag.wrapping_add(k as u64),
                    piece,
                )
                .map_err(|e| {
                    crate::log::warn(&format!("stand-in: send to rank {peer} failed: {e}"));
                    Wait::Aborted
                })?;
            self.net_event(st, fd, 0, piece.len());
            stop(st);
        }
        Ok(())
    }

    fn recv(&mut self, kind: Kind, peer: usize, tag: u64, len: usize) -> Result<Vec<u8>, Wait> {
        let me = self.geo.rank as u32;
        let mut out = Vec::with_capacity(len);
        for _ in 0..algo::frames(len) {
            let k = next(&mut self.counters, (peer, false));
            let st = self.step_handle(peer, false, k);
            record(st, 10, Some(0));
            let key = (self.geo.id, kind, peer as u32, me);
            let comm = self.comm;
            let f = net().recv(key, Some(tag.wrapping_add(k as u64)), &|| comm.is_aborted())?;
            self.net_event(st, f.fd, 1, f.data.len());
            record(st, 11, Some(f.data.len() as u64));
            record(st, 12, Some(f.data.len() as u64));
            stop(st);
            out.extend_from_slice(&f.data);
        }
        if out.len() != len {
            crate::log::warn(&format!(
                "stand-in: expected {len} bytes from rank {peer}, got {}",
                out.len()
            ));
        }
        out.resize(len, 0);
        Ok(out)
    }
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
    let op = task.op;
    let p = algo::plan(&op, geo.rank, geo.nranks);
    let ord = comm
        .coll_ord
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let tag = coll_tag(ord, &task);
    let input = crate::mem::read(op.send, p.in_len);
    let mut work = vec![0u8; p.work_len];
    if let Some(at) = p.input_at {
        work[at..at + input.len()].copy_from_slice(&input);
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
                let chunk = src.to_vec();
                run.send(Kind::Coll, peer, tag, &chunk)?;
            }
            Step::Recv {
                peer,
                off,
                len,
                reduce,
            } => {
                let data = run.recv(Kind::Coll, peer, tag, len)?;
                if reduce {
                    crate::reduce::reduce(&mut work[off..off + len], &data, op.dt, op.op);
                } else {
                    work[off..off + len].copy_from_slice(&data);
                }
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
    run.proxies_stop();
    run.kernel_stop();
    Ok(())
}

fn run_p2p(comm: &Comm, geo: &Geo, tasks: &[Task]) -> Result<(), Wait> {
    let me = geo.rank as u32;
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
        net()
            .send(
                geo.peers[peer].addr,
                (geo.id, Kind::P2pCts, me, peer as u32),
                tag,
                &[],
            )
            .map_err(|_| Wait::Aborted)?;
    }
    // Senders wait for their receiver (rendezvous), then stream the data.
    for (r, ord) in runs
        .iter_mut()
        .filter(|(r, _)| r.task.op.func == Func::Send)
    {
        let peer = r.task.op.root as usize;
        let bytes = r.task.op.bytes();
        let cts = (geo.id, Kind::P2pCts, peer as u32, me);
        net().recv(cts, Some(p2p_tag(*ord, bytes, true)), &|| comm.is_aborted())?;
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
        let data = r.recv(Kind::P2pData, peer, p2p_tag(*ord, bytes, false), bytes)?;
        crate::mem::write(r.task.op.recv, &data);
        r.proxies_stop();
        r.kernel_stop();
    }
    Ok(())
}

/// Runs one job (a launched plan of one comm).
pub fn run_job(job: Job) {
    let comm = &*job.comm;
    let Some(geo) = comm.geo.get() else { return };
    if comm.is_aborted() {
        return;
    }
    let m = job
        .tasks
        .iter()
        .map(|t| t.prof.mask)
        .find(|m| *m != 0)
        .unwrap_or(0);
    let ctrl = if emit::active() && mask::proxy_ctrl(m) {
        let h = start(comm.ctx(), &Ev::ProxyCtrl);
        record(h, 16, Some(0));
        record(h, 17, Some(job.tasks.len() as u64));
        record(h, 18, Some(job.tasks.len() as u64));
        record(h, 14, Some(0));
        h
    } else {
        H::NULL
    };
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
    if r.is_err() || comm.is_aborted() {
        return; // aborted: events stay open, the context is finalized
    }
    record(ctrl, 13, Some(0));
    record(ctrl, 15, Some(0));
    stop(ctrl);
}

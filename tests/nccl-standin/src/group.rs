//! Thread-local group state (ncclGroupStart/End, implicit groups), NCCL's API-side profiler events
//! (GroupApi, CollApi/P2pApi) and the launch (KernelLaunch, Group, Coll/P2p start/stop; stop = enqueued).

use crate::comm::Comm;
use crate::hash::Rng;
use crate::profiler::emit::{active, record, start, stop};
use crate::profiler::loader::EVENT_MASK;
use crate::profiler::{mask, Ev, H};
use crate::task::{Job, Op, Task, TaskProf};
use crate::types::{DataType, Func, NcclError, NcclResult};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

#[derive(PartialEq, Eq, Clone, Copy)]
enum ApiState {
    Reset,
    Started,
    Stopped,
}

struct Group {
    depth: i32,
    prof_depth: i32,
    api_state: ApiState,
    group_api: H,
    tasks: Vec<(Arc<Comm>, Task)>,
    error: Option<NcclError>,
}

thread_local! {
    static G: RefCell<Group> = const { RefCell::new(Group {
        depth: 0, prof_depth: 0, api_state: ApiState::Reset, group_api: H::NULL, tasks: Vec::new(), error: None,
    }) };
}

fn loss_rng() -> &'static Mutex<Rng> {
    static R: std::sync::OnceLock<Mutex<Rng>> = std::sync::OnceLock::new();
    R.get_or_init(|| Mutex::new(Rng::new(crate::env::get().seed)))
}

fn draw_lost() -> bool {
    let pct = crate::env::get().loss_pct;
    pct > 0.0
        && loss_rng()
            .lock()
            .map(|mut r| r.chance(pct))
            .unwrap_or(false)
}

/// `ncclGroupStart`.
pub fn group_start() {
    G.with(|g| g.borrow_mut().depth += 1);
}

/// `ncclGroupEnd`.
pub fn group_end() -> NcclResult<()> {
    if G.with(|g| g.borrow().depth) == 0 {
        crate::log::warn("ncclGroupEnd: not in a group call.");
        return Err(NcclError::InvalidUsage);
    }
    end_internal()
}

fn end_internal() -> NcclResult<()> {
    let launch = G.with(|g| {
        let mut g = g.borrow_mut();
        if g.prof_depth > 0 {
            g.prof_depth -= 1;
        }
        if g.prof_depth == 0 && g.api_state == ApiState::Stopped {
            g.api_state = ApiState::Reset;
            record(g.group_api, 24, None);
        }
        g.depth -= 1;
        if g.depth > 0 {
            return None;
        }
        Some((std::mem::take(&mut g.tasks), g.error.take()))
    });
    let mut res = Ok(());
    if let Some((tasks, err)) = launch {
        match err {
            Some(e) => res = Err(e),
            None => res = launch_group(tasks),
        }
    }
    G.with(|g| {
        let mut g = g.borrow_mut();
        if !g.group_api.is_null() && g.prof_depth == 0 {
            stop(g.group_api);
            g.group_api = H::NULL;
        }
    });
    res
}

/// An API call (`ncclAllReduce`, `ncclSend`, …): implicit group, task append with API events.
pub fn enqueue(comm: &Arc<Comm>, op: Op) -> NcclResult<()> {
    match check_args(comm, &op) {
        Ok(nranks) => append(comm, op, nranks),
        Err(e) => {
            // NCCL's ncclGroupErrCheck: inside a group the error also fails the ncclGroupEnd.
            G.with(|g| {
                let mut g = g.borrow_mut();
                if g.depth > 0 && g.error.is_none() {
                    g.error = Some(e);
                }
            });
            Err(e)
        }
    }
}

fn check_args(comm: &Comm, op: &Op) -> NcclResult<usize> {
    let geo = comm.ensure_ready()?;
    if op.is_p2p() && (op.root < 0 || op.root as usize >= geo.nranks) {
        crate::log::warn(&format!(
            "{}: invalid peer {}",
            op.func.nccl_str().to_string_lossy(),
            op.root
        ));
        return Err(NcclError::InvalidArgument);
    }
    if matches!(op.func, Func::Broadcast | Func::Reduce)
        && (op.root < 0 || op.root as usize >= geo.nranks)
    {
        crate::log::warn(&format!("invalid root {}", op.root));
        return Err(NcclError::InvalidArgument);
    }
    Ok(geo.nranks)
}

fn append(comm: &Arc<Comm>, op: Op, nranks: usize) -> NcclResult<()> {
    crate::log::log(
        crate::log::LEVEL_INFO,
        crate::log::SUB_COLL,
        &format!(
            "{}: opCount {:x} sendbuff 0x{:x} recvbuff 0x{:x} count {} datatype {} op {:?} root {} comm {:p} [nranks={}]",
            op.func.nccl_str().to_string_lossy(),
            comm.coll_ord.load(Ordering::Relaxed),
            op.send,
            op.recv,
            op.count,
            op.dt.nccl_str().to_string_lossy(),
            op.op,
            op.root,
            &**comm,
            nranks
        ),
    );
    let ctx = comm.ctx();
    G.with(|g| {
        let mut g = g.borrow_mut();
        if g.prof_depth > 0 {
            g.prof_depth += 1;
        }
        g.depth += 1;
        if !op.is_p2p() && op.count == 0 {
            return; // NCCL discards empty collectives before any task or profiler event
        }
        let m = EVENT_MASK.load(Ordering::Relaxed);
        let plugin = active();
        if plugin && mask::group_api(m) && g.prof_depth == 0 {
            g.group_api = start(ctx, &Ev::GroupApi { depth: g.depth });
            g.prof_depth = g.depth;
            g.api_state = ApiState::Started;
        }
        if g.api_state == ApiState::Started {
            g.api_state = ApiState::Stopped;
            record(g.group_api, 23, None);
        }
        let lost = draw_lost();
        let mut prof = TaskProf {
            mask: m,
            lost,
            group_api: g.group_api,
            ..TaskProf::default()
        };
        if plugin && !lost {
            let parent = g.group_api;
            prof.api = if op.is_p2p() {
                if mask::p2p_api(m) {
                    start(
                        ctx,
                        &Ev::P2pApi {
                            parent,
                            func: op.func,
                            count: op.count,
                            dt: op.dt,
                        },
                    )
                } else {
                    H::NULL
                }
            } else if mask::coll_api(m) {
                start(
                    ctx,
                    &Ev::CollApi {
                        parent,
                        func: op.func,
                        count: op.count,
                        dt: op.dt,
                        root: op.root,
                    },
                )
            } else {
                H::NULL
            };
        }
        stop(prof.api);
        if op.func == Func::Broadcast && allgatherv_path() {
            // NCCL ≥ 2.29 queues Broadcast as an AllGatherV task and later rebuilds a zeroed coll task:
            // no activation mask, no CollApi link, so only GroupApi/CollApi events are ever delivered
            // (2.29.2 release notes; still so in 2.30.7). NCCL_ALLGATHERV_ENABLE=0 restores them.
            prof.mask = 0;
            prof.api = H::NULL;
        }
        g.tasks.push((comm.clone(), Task { op, prof }));
    });
    end_internal()
}

fn allgatherv_path() -> bool {
    crate::env::get().release == crate::env::Release::V2_30 && crate::env::get().allgatherv_enable
}

/// Launches the group: on this thread for blocking comms; for nonblocking comms on a group-launch
/// thread (as NCCL's `groupLaunchNonBlocking`), returning `ncclInProgress` until it is done.
fn launch_group(tasks: Vec<(Arc<Comm>, Task)>) -> NcclResult<()> {
    let nonblocking: Vec<Arc<Comm>> = tasks
        .iter()
        .filter(|(c, _)| c.config.blocking == 0)
        .map(|(c, _)| c.clone())
        .collect();
    if nonblocking.is_empty() {
        launch_all(tasks);
        return Ok(());
    }
    for c in &nonblocking {
        c.async_err
            .store(NcclError::InProgress.code(), Ordering::SeqCst);
    }
    let spawned = std::thread::Builder::new()
        .name("nccl-grouplaunch".into())
        .spawn(move || {
            launch_all(tasks);
            for c in &nonblocking {
                let _ = c.async_err.compare_exchange(
                    NcclError::InProgress.code(),
                    0,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        });
    match spawned {
        Ok(_) => Err(NcclError::InProgress),
        Err(_) => Err(NcclError::System),
    }
}

fn launch_all(tasks: Vec<(Arc<Comm>, Task)>) {
    // One plan per comm, in order of first appearance (NCCL launches per comm).
    let mut plans: Vec<(Arc<Comm>, Vec<Task>)> = Vec::new();
    for (c, t) in tasks {
        match plans.iter_mut().find(|(pc, _)| Arc::ptr_eq(pc, &c)) {
            Some((_, v)) => v.push(t),
            None => plans.push((c, vec![t])),
        }
    }
    for (comm, tasks) in plans {
        launch(comm, tasks);
    }
}

fn launch(comm: Arc<Comm>, mut tasks: Vec<Task>) {
    let ctx = comm.ctx();
    let m = tasks
        .iter()
        .map(|t| t.prof.mask)
        .find(|m| *m != 0)
        .unwrap_or(0);
    let gapi = tasks.first().map(|t| t.prof.group_api).unwrap_or(H::NULL);
    let plugin = active();
    if plugin && mask::kernel_launch(m) {
        let h = start(ctx, &Ev::KernelLaunch { parent: gapi });
        stop(h);
    }
    let group = if plugin && mask::group(m) {
        start(ctx, &Ev::Group)
    } else {
        H::NULL
    };
    let rank = comm.geo.get().map(|g| g.rank as i32).unwrap_or(0);
    // Collectives first in NCCL's task order, then p2p (as ncclProfilerStartTaskEvents walks them).
    for t in tasks.iter_mut().filter(|t| !t.op.is_p2p()) {
        let seq = comm
            .seq_of(t.op.func)
            .map(|s| s.fetch_add(1, Ordering::Relaxed))
            .unwrap_or(0);
        if plugin && !t.prof.lost && mask::coll(t.prof.mask) {
            let o = t.op;
            // NCCL stores AllGather/Broadcast tasks as bytes of ncclInt8 (collTaskAppend).
            let (count, dt) = match o.func {
                Func::AllGather | Func::Broadcast => (o.count * o.dt.size(), DataType::Int8),
                _ => (o.count, o.dt),
            };
            t.prof.event = start(
                ctx,
                &Ev::Coll {
                    parent: t.prof.api,
                    group,
                    rank,
                    seq,
                    func: o.func,
                    send: o.send,
                    recv: o.recv,
                    count,
                    root: o.root,
                    dt,
                    nch: o.n_channels(),
                },
            );
        }
    }
    for t in tasks.iter_mut().filter(|t| t.op.is_p2p()) {
        if plugin && !t.prof.lost && mask::p2p(t.prof.mask) {
            let o = t.op;
            let buff = if o.func == Func::Send { o.send } else { o.recv };
            t.prof.event = start(
                ctx,
                &Ev::P2p {
                    parent: t.prof.api,
                    group,
                    rank,
                    func: o.func,
                    buff,
                    dt: o.dt,
                    count: o.count,
                    peer: o.root,
                    nch: o.n_channels(),
                },
            );
        }
    }
    let handles: Vec<H> = tasks.iter().map(|t| t.prof.event).collect();
    crate::worker::submit(Job { comm, tasks });
    for h in handles {
        stop(h);
    }
    stop(group);
}

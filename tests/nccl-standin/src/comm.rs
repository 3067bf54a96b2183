//! Communicators: init through the bootstrap, split, destroy/abort, profiler init/finalize per comm.

use crate::hash;
use crate::log::{info, warn, SUB_INIT};
use crate::net::{bootstrap_init, net, Kind, Peer};
use crate::profiler::loader::{plugin_finalize, plugin_init, InitArgs};
use crate::profiler::Ctx;
use crate::types::{Config, Func, NcclError, NcclResult, UniqueId, SPLIT_NOCOLOR};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Geometry known once the bootstrap finished.
#[derive(Debug)]
pub struct Geo {
    /// commHash (also the wire comm id).
    pub id: u64,
    /// This rank.
    pub rank: usize,
    /// Ranks.
    pub nranks: usize,
    /// Every rank's process.
    pub peers: Vec<Peer>,
    /// Distinct hosts.
    pub n_nodes: usize,
}

impl Geo {
    /// Whether `peer` lives on another host (its traffic goes through the "network": ProxyOp events).
    pub fn remote(&self, peer: usize) -> bool {
        self.peers[peer].host != self.peers[self.rank].host
    }
}

/// A communicator (`ncclComm_t` points at one, created by `Arc::into_raw`).
pub struct Comm {
    /// Set when init completes.
    pub geo: OnceLock<Geo>,
    /// The normalized config (commName pointer kept as given).
    pub config: Config,
    /// Abort flag: blocked waits return.
    pub aborted: AtomicBool,
    /// `ncclCommGetAsyncError` value.
    pub async_err: AtomicI32,
    /// Profiler context from `init`.
    pub prof_ctx: AtomicUsize,
    /// Per-func sequence numbers (Broadcast, Reduce, AllGather, ReduceScatter, AllReduce, AlltoAll).
    pub seq: [AtomicU64; 6],
    /// Splits done from this comm.
    pub split_count: AtomicU32,
    /// Collectives executed (wire tags).
    pub coll_ord: AtomicU64,
    /// P2p ordinals per (peer, is_send).
    pub p2p_ord: Mutex<HashMap<(usize, bool), u64>>,
    /// Jobs submitted and not finished.
    pub pending: AtomicU64,
    /// The stream is executing a job of this comm (the "proxy thread" is using the profiler context).
    pub busy: AtomicBool,
    /// Whether the profiler context was finalized.
    finalized: AtomicBool,
    /// Last error text for `ncclGetLastError`.
    pub last_error: Mutex<String>,
    /// Per comm rank: ns from the receive start of this rank's last all-to-all / grouped
    /// send-recv with receives until that peer's data had arrived (0: already there, or no data
    /// from it); `ncclTestbedLastRecvTimes`.
    pub last_recv: Mutex<Vec<u64>>,
}

static LIVE: AtomicUsize = AtomicUsize::new(0);

impl Comm {
    fn new(config: Config) -> Self {
        LIVE.fetch_add(1, Ordering::SeqCst);
        Self {
            geo: OnceLock::new(),
            config,
            aborted: AtomicBool::new(false),
            async_err: AtomicI32::new(0),
            prof_ctx: AtomicUsize::new(0),
            seq: Default::default(),
            split_count: AtomicU32::new(0),
            coll_ord: AtomicU64::new(0),
            p2p_ord: Mutex::new(HashMap::new()),
            pending: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            finalized: AtomicBool::new(true),
            last_error: Mutex::new(String::new()),
            last_recv: Mutex::new(Vec::new()),
        }
    }

    /// Keep the per-peer waits of an operation whose receive started at `start` and whose
    /// peers' data arrived at `arrived` (by comm rank).
    pub fn record_waits(
        &self,
        nranks: usize,
        start: std::time::Instant,
        arrived: &HashMap<usize, std::time::Instant>,
    ) {
        let mut w = vec![0u64; nranks];
        for (&peer, &t) in arrived {
            if let Some(slot) = w.get_mut(peer) {
                *slot = t.saturating_duration_since(start).as_nanos() as u64;
            }
        }
        *self.last_recv.lock().unwrap_or_else(|e| e.into_inner()) = w;
    }

    /// Geometry, or `InvalidUsage`/`InProgress` when init has not completed.
    pub fn ready(&self) -> NcclResult<&Geo> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(NcclError::InvalidUsage);
        }
        match self.geo.get() {
            Some(g) => Ok(g),
            None => match self.async_err.load(Ordering::SeqCst) {
                7 => Err(NcclError::InProgress),
                _ => Err(NcclError::InvalidUsage),
            },
        }
    }

    /// NCCL's `ncclCommEnsureReady` (every collective/p2p call): a comm whose previous init or
    /// nonblocking launch has not returned `ncclSuccess` yet is an invalid argument; a comm in error
    /// reports that error.
    pub fn ensure_ready(&self) -> NcclResult<&Geo> {
        match self.async_err.load(Ordering::SeqCst) {
            0 => self.ready(),
            7 => {
                warn("Attempt to use communicator before the previous operation returned ncclSuccess");
                Err(NcclError::InvalidArgument)
            }
            e => Err(NcclError::from_code(e)),
        }
    }

    /// Profiler context.
    pub fn ctx(&self) -> Ctx {
        Ctx(self.prof_ctx.load(Ordering::Relaxed))
    }

    /// Whether aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Sequence counter of a collective.
    pub fn seq_of(&self, f: Func) -> Option<&AtomicU64> {
        self.seq.get(f.index())
    }

    /// Next p2p ordinal with `peer` in direction `send`.
    pub fn next_p2p(&self, peer: usize, send: bool) -> u64 {
        let mut m = self.p2p_ord.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry((peer, send)).or_insert(0);
        let v = *e;
        *e += 1;
        v
    }

    fn complete(&self, geo: Geo) {
        if self.is_aborted() {
            return; // aborted while a nonblocking init was running
        }
        let env = crate::env::get();
        let args = InitArgs {
            comm_hash: geo.id,
            comm_name: self.config.commName,
            n_nodes: geo.n_nodes as i32,
            nranks: geo.nranks as i32,
            rank: geo.rank as i32,
        };
        let line = format!(
            "comm {:p} rank {} nranks {} nNodes {} commId 0x{:x} - Init COMPLETE",
            self, geo.rank, geo.nranks, geo.n_nodes, geo.id
        );
        static VERSION_SHOWN: std::sync::Once = std::sync::Once::new();
        if geo.rank == 0 {
            VERSION_SHOWN.call_once(|| {
                let v = env.release.version_code();
                crate::log::log(
                    1,
                    !0,
                    &format!(
                        "NCCL version {}.{}.{}+standin (CPU test bed)",
                        v / 10000,
                        v / 100 % 100,
                        v % 100
                    ),
                );
            });
        }
        let ctx = plugin_init(env.release, env.profiler_plugin.as_deref(), &args);
        self.prof_ctx.store(ctx as usize, Ordering::SeqCst);
        self.finalized.store(false, Ordering::SeqCst);
        let _ = self.geo.set(geo); // the comm becomes usable only now
        info(SUB_INIT, &line);
        self.async_err.store(0, Ordering::SeqCst);
    }

    fn fail(&self, e: NcclError) {
        self.async_err.store(e.code(), Ordering::SeqCst);
    }

    /// Finalizes the profiler context once (destroy and abort).
    fn finalize_profiler(&self) {
        if !self.finalized.swap(true, Ordering::SeqCst) {
            let ctx = self.prof_ctx.swap(0, Ordering::SeqCst);
            plugin_finalize(crate::env::get().release, ctx);
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if LIVE.fetch_sub(1, Ordering::SeqCst) == 1 {
            net().close_all();
        }
    }
}

fn n_nodes(peers: &[Peer]) -> usize {
    peers
        .iter()
        .map(|p| p.host.as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// Runs `work` now (blocking comm) or on an async thread (nonblocking: returns `InProgress`).
fn run_init(
    comm: &Arc<Comm>,
    work: impl FnOnce(&Comm) -> NcclResult<Geo> + Send + 'static,
) -> NcclResult<()> {
    if comm.config.blocking == 1 {
        let g = work(comm)?;
        comm.complete(g);
        return Ok(());
    }
    comm.async_err
        .store(NcclError::InProgress.code(), Ordering::SeqCst);
    let c = comm.clone();
    std::thread::Builder::new()
        .name("nccl-asyncinit".into())
        .spawn(move || match work(&c) {
            Ok(g) => c.complete(g),
            Err(e) => c.fail(e),
        })
        .map_err(|_| NcclError::System)?;
    Err(NcclError::InProgress)
}

/// `ncclCommInitRank[Config]`. On `Err(InProgress)` the comm is still returned through `out`.
pub fn init(
    id: UniqueId,
    nranks: i32,
    rank: i32,
    config: Config,
    out: &mut Option<Arc<Comm>>,
) -> NcclResult<()> {
    if nranks < 1 || rank < 0 || rank >= nranks {
        warn(&format!("Invalid rank requested : {rank}/{nranks}"));
        return Err(NcclError::InvalidArgument);
    }
    let comm = Arc::new(Comm::new(config));
    *out = Some(comm.clone());
    let (nranks, rank) = (nranks as usize, rank as usize);
    run_init(&comm, move |c| {
        let (id, peers) = bootstrap_init(&id, nranks, rank, &|| c.is_aborted())?;
        Ok(Geo {
            id,
            rank,
            nranks,
            n_nodes: n_nodes(&peers),
            peers,
        })
    })
}

/// Exchanges (color, key) over the parent and computes the child's members (parent ranks, in child order).
fn split_members(
    parent: &Comm,
    pg: &Geo,
    count: u32,
    color: i32,
    key: i32,
) -> NcclResult<Vec<usize>> {
    let n = net();
    let mut payload = Vec::with_capacity(8);
    payload.extend_from_slice(&color.to_le_bytes());
    payload.extend_from_slice(&key.to_le_bytes());
    let me = pg.rank as u32;
    for (r, p) in pg.peers.iter().enumerate() {
        if r != pg.rank {
            n.send(
                p.addr,
                (pg.id, Kind::Split, me, r as u32),
                u64::from(count),
                &payload,
            )
            .map_err(|_| NcclError::Remote)?;
        }
    }
    let mut all = vec![(color, key); pg.nranks];
    for (r, slot) in all.iter_mut().enumerate() {
        if r == pg.rank {
            continue;
        }
        let f = n
            .recv(
                (pg.id, Kind::Split, r as u32, me),
                Some(u64::from(count)),
                &|| parent.is_aborted(),
            )
            .map_err(|_| NcclError::InvalidUsage)?;
        let c = i32::from_le_bytes(f.data[0..4].try_into().map_err(|_| NcclError::Internal)?);
        let k = i32::from_le_bytes(f.data[4..8].try_into().map_err(|_| NcclError::Internal)?);
        *slot = (c, k);
    }
    if color == SPLIT_NOCOLOR {
        return Ok(Vec::new());
    }
    let mut members: Vec<usize> = (0..pg.nranks).filter(|&r| all[r].0 == color).collect();
    members.sort_by_key(|&r| (all[r].1, r));
    Ok(members)
}

/// `ncclCommSplit`: `Ok(None)` for `NCCL_SPLIT_NOCOLOR`.
pub fn split(
    parent: &Arc<Comm>,
    color: i32,
    key: i32,
    config: Option<Config>,
    out: &mut Option<Arc<Comm>>,
) -> NcclResult<()> {
    let pg = parent.ready()?;
    if color < SPLIT_NOCOLOR {
        warn(&format!("ncclCommSplit: invalid color {color}"));
        return Err(NcclError::InvalidArgument);
    }
    let count = parent.split_count.fetch_add(1, Ordering::SeqCst);
    if color == SPLIT_NOCOLOR {
        split_members(parent, pg, count, color, key)?;
        return Ok(());
    }
    let comm = Arc::new(Comm::new(config.unwrap_or(parent.config)));
    *out = Some(comm.clone());
    let p = parent.clone();
    run_init(&comm, move |_c| {
        let pg = p.ready()?;
        let members = split_members(&p, pg, count, color, key)?;
        let rank = members
            .iter()
            .position(|&r| r == pg.rank)
            .ok_or(NcclError::Internal)?;
        let peers: Vec<Peer> = members.iter().map(|&r| pg.peers[r].clone()).collect();
        Ok(Geo {
            id: hash::split(pg.id, count, color),
            rank,
            nranks: peers.len(),
            n_nodes: n_nodes(&peers),
            peers,
        })
    })
}

/// `ncclCommShrink`: the parent's ranks minus `exclude` (in parent order). Only the remaining ranks
/// call it, so there is no exchange: each computes the same members; the child's hash is NCCL's
/// split digest of (parent hash, parent child count, color 0). `flags` (default / abort) are
/// accepted and ignored (the stand-in has no in-flight work to abort across comms).
pub fn shrink(
    parent: &Arc<Comm>,
    exclude: &[i32],
    config: Option<Config>,
    out: &mut Option<Arc<Comm>>,
) -> NcclResult<()> {
    let pg = parent.ready()?;
    if exclude.iter().any(|&r| r < 0 || r as usize >= pg.nranks) {
        warn(&format!(
            "ncclCommShrink: excluded rank out of range in {exclude:?}"
        ));
        return Err(NcclError::InvalidArgument);
    }
    if exclude.contains(&(pg.rank as i32)) {
        warn("ncclCommShrink: called by an excluded rank");
        return Err(NcclError::InvalidArgument);
    }
    let count = parent.split_count.fetch_add(1, Ordering::SeqCst);
    let comm = Arc::new(Comm::new(config.unwrap_or(parent.config)));
    *out = Some(comm.clone());
    let p = parent.clone();
    let exclude: HashSet<usize> = exclude.iter().map(|&r| r as usize).collect();
    run_init(&comm, move |_c| {
        let pg = p.ready()?;
        let members: Vec<usize> = (0..pg.nranks).filter(|r| !exclude.contains(r)).collect();
        let rank = members
            .iter()
            .position(|&r| r == pg.rank)
            .ok_or(NcclError::Internal)?;
        let peers: Vec<Peer> = members.iter().map(|&r| pg.peers[r].clone()).collect();
        Ok(Geo {
            id: hash::split(pg.id, count, 0),
            rank,
            nranks: peers.len(),
            n_nodes: n_nodes(&peers),
            peers,
        })
    })
}

/// `ncclCommDestroy`: flushes this comm's enqueued work (as NCCL's implicit finalize), then frees.
pub fn destroy(comm: Arc<Comm>) {
    while comm.pending.load(Ordering::SeqCst) > 0 && !comm.is_aborted() {
        crate::worker::wait_progress();
    }
    free(comm);
}

/// `ncclCommAbort`: stops the comm, wakes blocked waits, frees.
pub fn abort(comm: Arc<Comm>) {
    comm.aborted.store(true, Ordering::SeqCst);
    net().wake_all();
    free(comm);
}

fn free(comm: Arc<Comm>) {
    comm.aborted.store(true, Ordering::SeqCst);
    net().wake_all();
    // As NCCL joins its proxy thread before finalizing the profiler: wait until the stream has left
    // this comm's job (blocked waits notice the abort flag within one poll interval).
    while comm.busy.load(Ordering::SeqCst) {
        net().wake_all();
        crate::worker::wait_progress();
    }
    comm.finalize_profiler(); // once, and only if init had called the plugin's init
    if let Some(g) = comm.geo.get() {
        net().forget_comm(g.id);
        crate::log::info(
            crate::log::SUB_INIT,
            &format!("comm {:p} rank {} - Destroy COMPLETE", &*comm, g.rank),
        );
    }
}

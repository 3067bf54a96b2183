//! Lifecycle: the first `init` creates the shared state, the ring and the drain thread; the last
//! `finalize` flushes, seals, joins the thread and unlinks the ring before returning (NCCL then
//! `dlclose`s us; we are also pinned with RTLD_NODELETE). A later `init` starts everything again.
//! An `atexit` handler flushes and seals when the process exits without finalizing.

use ::core::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use comminsight_wire::record::{Body, ProcStart, StrField};
use comminsight_wire::ring::{capacity_for_bytes, ShmRing};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};

use crate::abi::{LogFn, LOG_INFO, LOG_WARN};
use crate::clock::Clock;
use crate::config::Config;
use crate::context::Context;
use crate::core::{self, InitArgs, Shared};
use crate::drain::Drain;
use crate::{op, proxy, shm, sys};

/// How long the exit handler waits for the drain thread's final flush.
const EXIT_WAIT: Duration = Duration::from_secs(5);
/// How long the last finalize waits for it when the library is pinned (a drain stuck in I/O,
/// e.g. on a hung NFS mount, must not hang the training process' communicator destroy; pinned
/// code stays mapped, so the thread can be left behind). Unpinned: joined, however long.
const FINALIZE_WAIT: Duration = Duration::from_secs(10);

struct Running {
    thread: Option<std::thread::JoinHandle<()>>,
    done: mpsc::Receiver<()>,
    stop: Arc<AtomicBool>,
    ring: Option<Arc<ShmRing>>,
}

#[derive(Default)]
struct Life {
    contexts: usize,
    running: Option<Running>,
    /// The ring of the previous run, kept alive one more run (late producers may still hold it).
    retired: Option<Arc<ShmRing>>,
    starts: u64,
    hooks: bool,
    /// RTLD_NODELETE took: our code outlives NCCL's dlclose.
    pinned: bool,
    exited: bool,
}

/// The plugin runtime (one static instance for the FFI; tests make their own).
pub struct Runtime {
    shared: AtomicPtr<Shared>,
    life: Mutex<Option<Life>>,
    /// Config to use instead of the environment (tests).
    preset: Option<Config>,
}

/// The instance behind the exported tables.
pub static RUNTIME: Runtime = Runtime::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

extern "C" fn exit_handler() {
    let _ = std::panic::catch_unwind(|| RUNTIME.at_exit());
}

impl Runtime {
    pub const fn new() -> Runtime {
        Runtime {
            shared: AtomicPtr::new(::core::ptr::null_mut()),
            life: Mutex::new(None),
            preset: None,
        }
    }

    /// A runtime with a fixed config (tests). Leaked: runtimes live as long as the process.
    pub fn with_config(cfg: Config) -> &'static Runtime {
        Box::leak(Box::new(Runtime {
            shared: AtomicPtr::new(::core::ptr::null_mut()),
            life: Mutex::new(None),
            preset: Some(cfg),
        }))
    }

    /// The shared state once the first `init` created it.
    #[inline]
    pub fn shared(&self) -> Option<&'static Shared> {
        let p = self.shared.load(Ordering::Acquire);
        // SAFETY: non-NULL values are leaked `Box<Shared>`s, never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    fn shared_or_create(&self, logfn: Option<LogFn>) -> Option<&'static Shared> {
        if let Some(s) = self.shared() {
            return Some(s);
        }
        let (cfg, warnings) = match &self.preset {
            Some(c) => (c.clone(), Vec::new()),
            None => Config::from_env(),
        };
        for w in &warnings {
            sys::log(logfn, LOG_WARN, w);
        }
        let mut cfg = cfg;
        if cfg.disable {
            cfg.max_inflight = 1; // nothing will be tracked: keep the slabs tiny
        }
        let Some(sh) = Shared::new(cfg, Clock::new()) else {
            sys::log(
                logfn,
                LOG_WARN,
                "CommInsight: cannot allocate the in-flight slabs; profiling off",
            );
            return None;
        };
        let p: &'static Shared = Box::leak(Box::new(sh));
        self.shared
            .store((p as *const Shared).cast_mut(), Ordering::Release);
        Some(p)
    }

    /// `init`: returns the context for NCCL (NULL = this communicator is not tracked).
    ///
    /// # Safety
    /// `a.comm_name` is NULL or a NUL-terminated string; `mask` is NULL or NCCL's mask int.
    pub unsafe fn init(
        &'static self,
        a: InitArgs,
        mask: *mut c_int,
        logfn: Option<LogFn>,
        hooks: bool,
    ) -> *mut c_void {
        let mut guard = lock(&self.life);
        let life = guard.get_or_insert_with(Life::default);
        let Some(sh) = self.shared_or_create(logfn) else {
            return ::core::ptr::null_mut();
        };
        sh.set_logfn(logfn);
        if sh.cfg.disable || life.exited {
            return ::core::ptr::null_mut();
        }
        if hooks && !life.hooks {
            life.hooks = true;
            life.pinned = sys::pin_library(crate::pin_anchor());
            if !life.pinned {
                sh.log(
                    LOG_INFO,
                    "CommInsight: could not pin the plugin (RTLD_NODELETE)",
                );
            }
            if !sys::at_exit(exit_handler) {
                sh.log(LOG_INFO, "CommInsight: atexit registration failed");
            }
        }
        if life.running.is_none() {
            self.start(sh, life, a.abi);
        }
        // SAFETY: forwarded caller contract on `comm_name`.
        let ctx: Box<Context> = unsafe { core::new_context(sh, &a) };
        life.contexts += 1;
        if !mask.is_null() {
            sh.mask_ptr.store(mask, Ordering::Release);
            sh.write_mask();
        }
        ctx.into_raw()
    }

    /// `finalize`.
    ///
    /// # Safety
    /// `ctx` is NULL or a context returned by `init` of this runtime, finalized once.
    pub unsafe fn finalize(&self, ctx: *mut c_void) {
        if ctx.is_null() {
            return;
        }
        let mut guard = lock(&self.life);
        let Some(sh) = self.shared() else { return };
        // SAFETY: caller's contract: `ctx` came from `Box::into_raw` in `init`, once.
        let ctx = unsafe { Box::from_raw(ctx.cast::<Context>()) };
        core::end_context(sh, &ctx);
        drop(ctx);
        let Some(life) = guard.as_mut() else { return };
        life.contexts = life.contexts.saturating_sub(1);
        if life.contexts == 0 {
            sh.mask_ptr
                .store(::core::ptr::null_mut(), Ordering::Release);
            proxy::sweep(sh);
            let wait = life.pinned.then_some(FINALIZE_WAIT);
            self.stop(sh, life, wait);
        }
    }

    fn start(&self, sh: &'static Shared, life: &mut Life, abi: u8) {
        life.starts += 1;
        let cap = capacity_for_bytes(sh.cfg.ring_bytes);
        let ring = shm::create_ring(sh, life.starts, cap);
        let Some(ring) = ring.map(Arc::new) else {
            sh.log(
                LOG_WARN,
                "CommInsight: cannot allocate a ring; records are dropped and counted",
            );
            return;
        };
        if let Some(old) = sh.swap_ring(Some(ring.clone())) {
            life.retired = Some(old);
        }
        sh.push_body(
            Body::ProcStart(ProcStart {
                pid: sh.pid,
                rank: sh.cfg.rank_env,
                local_rank: sh.cfg.local_rank_env,
                world_size: sh.cfg.world_size_env,
                mono_ns: sh.clock.mono0,
                real_ns: sh.clock.real0,
                abi_version: abi,
                host: StrField::from(sh.cfg.host.as_str()),
                job: StrField::from(sh.cfg.job.as_str()),
            }),
            0,
        );
        let sink = SegmentWriter::new(
            SegmentConfig {
                dir: sh.cfg.segment_dir(sh.pid),
                max_segment_bytes: sh.cfg.segment_bytes,
                max_segment_age: Duration::from_secs(sh.cfg.segment_secs),
                retention_bytes: sh.cfg.retention_bytes,
            },
            sh.pid,
        );
        // `<ring>.ctl` beside a shared ring; a private ring has no reader to control it.
        let ctl = ring.path().map(|p| {
            let mut p = p.as_os_str().to_owned();
            p.push(".ctl");
            PathBuf::from(p)
        });
        let drain = Drain::new(sh, ring.clone(), Box::new(sink), ctl);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("comminsight-drain".into())
            .spawn(move || {
                drain.run(stop2);
                let _ = tx.send(());
            });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                sh.log(
                    LOG_WARN,
                    &format!(
                        "CommInsight: cannot start the drain thread ({e}); nothing is written"
                    ),
                );
                None
            }
        };
        life.running = Some(Running {
            thread,
            done: rx,
            stop,
            ring: Some(ring),
        });
    }

    /// Detach the ring, let the drain thread flush + seal, join it, unlink the ring.
    fn stop(&self, sh: &Shared, life: &mut Life, wait: Option<Duration>) {
        let Some(mut run) = life.running.take() else {
            return;
        };
        let detached = sh.swap_ring(None);
        run.stop.store(true, Ordering::Release);
        if let Some(t) = run.thread.take() {
            t.thread().unpark();
            match wait {
                None => {
                    let _ = t.join();
                }
                Some(d) => {
                    if run.done.recv_timeout(d).is_ok() {
                        let _ = t.join();
                    } else {
                        // Left behind (only when pinned or exiting): count and say so.
                        sh.log(
                            LOG_WARN,
                            "CommInsight: drain thread did not finish in time; left running",
                        );
                    }
                }
            }
        }
        if let Some(r) = run.ring.take() {
            r.unlink();
        }
        life.retired = detached;
    }

    /// The exit handler: incomplete records for open ops, flush, seal, unlink.
    pub fn at_exit(&self) {
        let mut guard = match self.life.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let Some(life) = guard.as_mut() else { return };
        let Some(sh) = self.shared() else { return };
        if sys::pid() != sh.pid {
            // A forked copy exiting: the ring, the open ops and the drain thread (absent here)
            // belong to the parent, which is still running. Leave them alone.
            return;
        }
        life.exited = true;
        if life.running.is_some() {
            op::sweep(sh, None, false);
            self.stop(sh, life, Some(EXIT_WAIT));
        }
    }

    /// Live contexts, whether the drain runs, and the ring file (tests, diagnostics).
    pub fn state(&self) -> (usize, bool, Option<PathBuf>) {
        let g = lock(&self.life);
        match g.as_ref() {
            Some(l) => (
                l.contexts,
                l.running.as_ref().is_some_and(|r| r.thread.is_some()),
                l.running
                    .as_ref()
                    .and_then(|r| r.ring.as_ref())
                    .and_then(|r| r.path().map(PathBuf::from)),
            ),
            None => (0, false, None),
        }
    }

    /// Live op and proxy slots (leak checks).
    pub fn live_slots(&self) -> (usize, usize) {
        match self.shared() {
            Some(sh) => (op::live(sh), proxy::live(sh)),
            None => (0, 0),
        }
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comminsight_wire::record::Kind;
    use comminsight_wire::segment::{find_segments, read_segment};

    fn args(hash: u64) -> InitArgs {
        InitArgs {
            abi: 5,
            comm_hash: hash,
            comm_name: c"dp".as_ptr(),
            nnodes: 1,
            nranks: 2,
            rank: 0,
        }
    }

    #[test]
    fn last_finalize_joins_the_drain_seals_and_unlinks_and_init_restarts() {
        let root =
            std::env::temp_dir().join(format!("ci-rt-{}-{}", std::process::id(), sys::real_ns()));
        let mut cfg = Config::defaults();
        cfg.log_dir = root.join("logs");
        cfg.shm_dir = root.join("shm");
        cfg.job = "j".into();
        cfg.host = "h".into();
        cfg.max_inflight = 64;
        let rt = Runtime::with_config(cfg);
        let mut mask: c_int = 0;
        // SAFETY: static name, local mask int.
        let a = unsafe { rt.init(args(1), &raw mut mask, None, false) };
        // SAFETY: as above.
        let b = unsafe { rt.init(args(2), &raw mut mask, None, false) };
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(mask, 0x747);
        let (n, running, ring) = rt.state();
        let ring = ring.unwrap();
        assert_eq!((n, running), (2, true));
        assert!(ring.exists());
        assert_eq!(
            ring,
            root.join(format!(
                "shm/{}/j.h.{}.ring",
                sys::euid(),
                std::process::id()
            ))
        );
        // SAFETY: contexts from this runtime, finalized once.
        unsafe { rt.finalize(a) };
        assert_eq!(rt.state().0, 1);
        assert!(rt.state().1);
        // SAFETY: as above.
        unsafe { rt.finalize(b) };
        assert_eq!(rt.state(), (0, false, None));
        assert!(!ring.exists(), "ring unlinked at the last finalize");
        let dir = root.join("logs/j/h").join(std::process::id().to_string());
        let segs = find_segments(&dir).unwrap();
        assert_eq!(segs.len(), 1, "sealed before finalize returned");
        let recs = read_segment(&segs[0]).unwrap().records;
        let kinds: Vec<Kind> = recs.iter().map(|r| r.kind()).collect();
        assert_eq!(
            kinds,
            vec![
                Kind::Segment,
                Kind::ProcStart,
                Kind::CommInit,
                Kind::CommDevice,
                Kind::CommInit,
                Kind::CommDevice,
                Kind::CommFini,
                Kind::CommFini,
                Kind::Stats
            ]
        );
        // A later init starts everything again.
        // SAFETY: as above.
        let c = unsafe { rt.init(args(3), ::core::ptr::null_mut(), None, false) };
        let (_, running, ring2) = rt.state();
        assert!(running && ring2.as_ref().is_some_and(|p| p.exists()));
        // SAFETY: as above.
        unsafe { rt.finalize(c) };
        // SAFETY: NULL is a no-op.
        unsafe { rt.finalize(::core::ptr::null_mut()) };
        assert_eq!(rt.state(), (0, false, None));
        assert_eq!(find_segments(&dir).unwrap().len(), 2);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn disabled_runtime_opts_every_comm_out() {
        let mut cfg = Config::defaults();
        cfg.disable = true;
        let rt = Runtime::with_config(cfg);
        // SAFETY: static name.
        let a = unsafe { rt.init(args(1), ::core::ptr::null_mut(), None, false) };
        assert!(a.is_null());
        assert_eq!(rt.state(), (0, false, None));
    }
}

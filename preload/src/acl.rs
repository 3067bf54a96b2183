//! The event path: HCCL enqueues its operations on an `aclrtStream` and returns before the device
//! runs them. When AscendCL's event functions are loaded in the process (`aclrtCreateEvent`,
//! `aclrtRecordEvent`, `aclrtQueryEventStatus`, `aclrtDestroyEvent`; CANN's runtime API), the
//! shim records an event on the op's stream right after the real call and keeps the op open; a
//! background thread (never the caller) polls each stream's oldest event: the op at a stream's
//! head gets its KernelCh child started when the poller first sees it there (the stream is
//! working on it), and closed (KernelCh stop) when its event completes. Without those functions,
//! ops close when the call returns (`enqueue` timing). See preload/README.md, "HCCL".

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::hccl::{self, Begun, Counter};
use crate::sym::RealFn;

type CreateFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type RecordFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type QueryFn = unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetCtxFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type SetCtxFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ACL_EVENT_RECORDED_STATUS_COMPLETE`.
const COMPLETE: c_int = 1;
/// How often the poller looks at the streams while ops are pending.
pub const POLL: Duration = Duration::from_micros(500);

/// AscendCL's event functions, resolved once.
pub struct Acl {
    create: CreateFn,
    record: RecordFn,
    query: QueryFn,
    destroy: DestroyFn,
    get_ctx: Option<GetCtxFn>,
    set_ctx: Option<SetCtxFn>,
}

static ACL: OnceLock<Option<Acl>> = OnceLock::new();

fn lookup<T: Copy>(name: &'static std::ffi::CStr) -> Option<T> {
    let a = RealFn::new(name).get()?;
    debug_assert_eq!(size_of::<T>(), size_of::<usize>());
    // SAFETY: `T` is the `unsafe extern "C" fn` type of AscendCL's declaration of `name`, and `a`
    // is that function's address in a loaded library.
    Some(unsafe { std::mem::transmute_copy::<usize, T>(&a) })
}

/// The event functions, if the process has them (looked up once, at the first HCCL communicator;
/// `COMMINSIGHT_HCCL_EVENTS=0` turns the path off).
pub fn get() -> Option<&'static Acl> {
    ACL.get_or_init(|| {
        if std::env::var("COMMINSIGHT_HCCL_EVENTS").as_deref() == Ok("0") {
            return None;
        }
        Some(Acl {
            create: lookup(c"aclrtCreateEvent")?,
            record: lookup(c"aclrtRecordEvent")?,
            query: lookup(c"aclrtQueryEventStatus")?,
            destroy: lookup(c"aclrtDestroyEvent")?,
            get_ctx: lookup(c"aclrtGetCurrentContext"),
            set_ctx: lookup(c"aclrtSetCurrentContext"),
        })
    })
    .as_ref()
}

impl Acl {
    /// The calling thread's current AscendCL context (0: none or unknown).
    pub fn current_context(&self) -> usize {
        let Some(f) = self.get_ctx else { return 0 };
        let mut c: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c` is writable; AscendCL's `aclrtGetCurrentContext(aclrtContext*)`.
        if unsafe { f(&mut c) } == 0 {
            c as usize
        } else {
            0
        }
    }

    /// An event recorded on `stream` now (None: failed, counted).
    pub fn record(&self, stream: usize) -> Option<usize> {
        let mut e: *mut c_void = std::ptr::null_mut();
        // SAFETY: `e` is writable; `aclrtCreateEvent(aclrtEvent*)`.
        if unsafe { (self.create)(&mut e) } != 0 || e.is_null() {
            hccl::count(Counter::EventErrors);
            return None;
        }
        // SAFETY: `e` was just created; `stream` is the caller's stream handle (NULL = default).
        if unsafe { (self.record)(e, stream as *mut c_void) } != 0 {
            // SAFETY: `e` is ours, destroyed once.
            unsafe { (self.destroy)(e) };
            hccl::count(Counter::EventErrors);
            return None;
        }
        Some(e as usize)
    }

    /// Whether `event` completed (a failed query counts as completed, counted).
    fn done(&self, event: usize) -> bool {
        let mut s: c_int = 0;
        // SAFETY: `event` is a live event of ours; `s` is writable.
        let rc = unsafe { (self.query)(event as *mut c_void, &mut s) };
        if rc != 0 {
            hccl::count(Counter::QueryErrors);
            return true;
        }
        s == COMPLETE
    }

    fn destroy(&self, event: usize) {
        // SAFETY: `event` is a live event of ours, destroyed once.
        unsafe { (self.destroy)(event as *mut c_void) };
    }

    fn make_current(&self, ctx: usize) {
        if let (Some(f), true) = (self.set_ctx, ctx != 0) {
            // SAFETY: a context the caller's thread had current at the communicator's init.
            unsafe { f(ctx as *mut c_void) };
        }
    }
}

/// An op waiting for its stream.
struct Pending {
    op: Begun,
    event: usize,
    /// Its KernelCh handle once started (0: not yet at its stream's head).
    child: usize,
}

// SAFETY: plain handles and an `Arc` of atomics; the recorder's functions are thread-safe.
unsafe impl Send for Pending {}

struct Queue {
    /// New ops, and whether the poller waits on `cv` (nothing pending: only then is it woken,
    /// so a busy poller costs the caller no futex call).
    new: Mutex<(Vec<(usize, Pending)>, bool)>,
    cv: Condvar,
}

fn queue() -> &'static Queue {
    static Q: OnceLock<Queue> = OnceLock::new();
    Q.get_or_init(|| {
        let started = std::thread::Builder::new()
            .name("comminsight-hccl-poll".into())
            .spawn(poll_loop);
        if started.is_err() {
            hccl::warn_once("HCCL: cannot start the event poller; ops stay open".into());
        }
        Queue {
            new: Mutex::new((Vec::new(), false)),
            cv: Condvar::new(),
        }
    })
}

/// Hand `op` (its Coll / P2p already stopped) and its `event` on `stream` to the poller.
pub fn push(op: Begun, stream: usize, event: usize) {
    op.comm.pending.fetch_add(1, Ordering::Relaxed);
    let q = queue();
    let mut g = q.new.lock().unwrap_or_else(|p| p.into_inner());
    g.0.push((
        stream,
        Pending {
            op,
            event,
            child: 0,
        },
    ));
    let idle = g.1;
    drop(g);
    if idle {
        q.cv.notify_one();
    }
}

/// Wait (at most `max`) until the poller closed every op of `comm` handed to it.
pub fn wait_closed(comm: &hccl::CommState, max: Duration) {
    let t0 = std::time::Instant::now();
    while comm.pending.load(Ordering::Relaxed) > 0 && t0.elapsed() < max {
        std::thread::sleep(POLL);
    }
}

fn poll_loop() {
    let Some(acl) = get() else { return };
    let q = queue();
    let mut streams: HashMap<usize, VecDeque<Pending>> = HashMap::new();
    let mut current_ctx = 0usize;
    loop {
        {
            let mut g = q.new.lock().unwrap_or_else(|p| p.into_inner());
            while g.0.is_empty() && streams.is_empty() {
                g.1 = true;
                g = q.cv.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            g.1 = false;
            for (s, p) in g.0.drain(..) {
                streams.entry(s).or_default().push_back(p);
            }
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for fifo in streams.values_mut() {
                advance(acl, fifo, &mut current_ctx);
            }
        }));
        if r.is_err() {
            hccl::count(Counter::Panics);
        }
        streams.retain(|_, f| !f.is_empty());
        if !streams.is_empty() {
            std::thread::sleep(POLL);
        }
    }
}

/// Close the completed ops at the head of one stream; start the child of the new head.
fn advance(acl: &Acl, fifo: &mut VecDeque<Pending>, current_ctx: &mut usize) {
    while let Some(head) = fifo.front_mut() {
        if head.op.comm.acl_ctx != *current_ctx {
            acl.make_current(head.op.comm.acl_ctx);
            *current_ctx = head.op.comm.acl_ctx;
        }
        if head.child == 0 {
            head.child = hccl::start_child(&head.op).max(1);
        }
        if !acl.done(head.event) {
            return;
        }
        if head.child > 1 {
            head.op.rec.stop(head.child);
        }
        acl.destroy(head.event);
        head.op.comm.pending.fetch_sub(1, Ordering::Relaxed);
        hccl::count(Counter::EventClosed);
        fifo.pop_front();
    }
}

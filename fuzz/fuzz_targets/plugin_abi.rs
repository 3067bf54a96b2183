//! The plugin's exported profiler tables (`ncclProfiler_v4/v5/v6`) driven by call sequences
//! decoded from the fuzz input, on 2 to 4 threads at once (the input split between them): init
//! and finalize of up to four contexts per thread (through any version's table), startEvent with
//! raw descriptor bytes laid out from the ABI offsets (nccl-abi.md §2.6; the type field from the
//! valid set most of the time, garbage sometimes; the parent a live, stale, foreign or NULL
//! handle), stopEvent and recordEventState on live, stopped-twice, other threads' and NULL
//! handles. Checks: every call returns success and sets its out-pointers, nothing panics or
//! deadlocks, and once every context is finalized and every handle stopped no op or proxy slot
//! is left, no context counted and the drain thread is joined (an input running over a minute
//! aborts: a deadlock). The plugin's files (segments, ring) go to a private temporary directory
//! (tmpfs when there is one) set once per process.
#![no_main]

use core::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use libfuzzer_sys::fuzz_target;
use nccl_profiler_comminsight::abi::v4::DescrV4;
use nccl_profiler_comminsight::abi::v5::DescrV5;
use nccl_profiler_comminsight::abi::v6::DescrV6;
use nccl_profiler_comminsight::abi::StateArgs;
use nccl_profiler_comminsight::runtime::RUNTIME;
use nccl_profiler_comminsight::{ncclProfiler_v4, ncclProfiler_v5, ncclProfiler_v6};

static MASK: AtomicI32 = AtomicI32::new(0);

const STRINGS: &[&CStr] = &[
    c"AllReduce",
    c"AllGather",
    c"ReduceScatter",
    c"Broadcast",
    c"Reduce",
    c"Send",
    c"Recv",
    c"AlltoAll",
    c"ncclFloat32",
    c"ncclBfloat16",
    c"RING",
    c"TREE",
    c"SIMPLE",
    c"LL128",
    c"",
    c"NotAFunc",
];

/// The event types NCCL gives (v4..v6), then invalid ones.
const TYPES: &[u64] = &[
    1,
    2,
    4,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    0,
    3,
    1 << 20,
    1 << 63,
];

/// The fuzz input of one thread, read as numbers (zeros once it is used up).
struct Src<'a>(&'a [u8]);

impl Src<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u64(&mut self) -> u64 {
        let mut v = [0u8; 8];
        let n = self.0.len().min(8);
        v[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        u64::from_le_bytes(v)
    }
    fn below(&mut self, n: u64) -> u64 {
        u64::from(self.u8()) % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    fn string(&mut self) -> *const c_char {
        match self.u8() {
            255 => core::ptr::null(),
            b => STRINGS[usize::from(b) % STRINGS.len()].as_ptr(),
        }
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// 112 raw descriptor bytes.
#[repr(C, align(8))]
struct Raw([u8; 112]);

impl Raw {
    fn put<T: Copy>(&mut self, off: usize, v: T) {
        assert!(off + size_of::<T>() <= 112);
        // SAFETY: in bounds (checked); unaligned write of a plain value into our own buffer.
        unsafe { self.0.as_mut_ptr().add(off).cast::<T>().write_unaligned(v) };
    }
}

#[repr(C, align(8))]
struct IbDescr([u8; 40]);
#[repr(C, align(8))]
struct SockDescr([u8; 24]);
static IB: IbDescr = IbDescr([
    1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0xd2, 4, 0,
    0, 0, 16, 0, 0, 0, 0, 0, 0,
]);
static SOCK: SockDescr = SockDescr([
    2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0,
]);

/// A descriptor for ABI `abi` with `parent` as parentObj: garbage where the plugin must not
/// look, the fields of its type from the input where it does (pointers valid or NULL).
fn descr(s: &mut Src, abi: u8, parent: *mut c_void) -> Raw {
    let mut d = Raw([0; 112]);
    let fill = s.u64();
    for (i, b) in d.0.iter_mut().enumerate() {
        *b = (fill.rotate_left(i as u32 * 7) as u8) ^ (i as u8);
    }
    let ty = match s.u8() {
        255 => s.u64(), // any value at all
        b => TYPES[usize::from(b) % TYPES.len()],
    };
    // The type as the plugin reads it (v4: one byte; bytes 1..8 stay garbage).
    let ty = if abi == 4 {
        d.put(0, ty as u8);
        ty & 0xff
    } else {
        d.put(0, ty);
        ty
    };
    d.put(8, parent);
    d.put(16, s.below(64) as i32);
    let pid = std::process::id() as i32 + i32::from(s.chance(20));
    match ty {
        2 => {
            d.put(24, s.u64() % 1000); // seqNumber
            d.put(32, s.string()); // func
            d.put(40, 0usize); // sendBuff (never read)
            d.put(56, s.u64() as usize % (1 << 30)); // count
            d.put(64, s.below(8) as i32); // root
            d.put(72, s.string()); // datatype
            d.put(80, s.below(5) as u8); // nChannels
            d.put(88, s.string()); // algo
            d.put(96, s.string()); // proto
        }
        4 => {
            d.put(24, s.string());
            d.put(40, s.string());
            d.put(48, s.u64() as usize % (1 << 20));
            d.put(56, s.below(8) as i32 - 1);
            d.put(60, s.below(5) as u8);
        }
        8 => {
            d.put(24, pid);
            if !s.chance(10) {
                d.put(32, s.below(64) as i32 - 1);
            }
        }
        128 => {
            let ids = [(1i64 << 16) | 1, (2 << 16) | 1, (1 << 16) | 2, 0x7777];
            let id = ids[s.below(4) as usize];
            d.put(24, id);
            // Only IB|1 / SOCK|1 dereference data: the matching descriptor or NULL.
            let data: *const c_void = if s.chance(30) {
                core::ptr::null()
            } else if id == (1 << 16) | 1 {
                (&raw const IB).cast()
            } else if id == (2 << 16) | 1 {
                (&raw const SOCK).cast()
            } else {
                (&raw const SOCK).cast()
            };
            d.put(32, data);
        }
        // Copy-engine arms, API arms, KernelCh, steps: garbage is fine (nothing dereferenced).
        _ => {}
    }
    d
}

struct Ctx {
    ptr: *mut c_void,
    abi: u8,
}

fn init(s: &mut Src) -> Ctx {
    let abi = 4 + s.below(3) as u8;
    let mut ctx: *mut c_void = core::ptr::null_mut();
    let name = if s.chance(30) {
        core::ptr::null()
    } else {
        s.string()
    };
    let mask: *mut c_int = if s.chance(10) {
        core::ptr::null_mut()
    } else {
        MASK.as_ptr()
    };
    let (hash, nnodes, nranks, rank) = (
        s.u64(),
        s.below(4) as c_int,
        s.u8() as c_int - 5,
        s.below(64) as c_int - 1,
    );
    // SAFETY: arguments as NCCL passes them (valid out-pointer, C string or NULL, int or NULL).
    let rc = unsafe {
        match abi {
            4 => ncclProfiler_v4.init.unwrap()(
                &mut ctx, mask, name, hash, nnodes, nranks, rank, None,
            ),
            5 => ncclProfiler_v5.init.unwrap()(
                &mut ctx, hash, mask, name, nnodes, nranks, rank, None,
            ),
            _ => ncclProfiler_v6.init.unwrap()(
                &mut ctx, hash, mask, name, nnodes, nranks, rank, None,
            ),
        }
    };
    assert_eq!(rc, 0, "init failed");
    assert!(!ctx.is_null(), "init gave a NULL context");
    Ctx { ptr: ctx, abi }
}

fn start(abi: u8, ctx: *mut c_void, d: &mut Raw) -> *mut c_void {
    let mut h: *mut c_void = 0x10 as *mut c_void; // tag 0: never a handle the plugin issues
    let p = d.0.as_mut_ptr();
    // SAFETY: a descriptor laid out per §2.6 whose dereferenced pointers are valid or NULL.
    let rc = unsafe {
        match abi {
            4 => ncclProfiler_v4.start_event.unwrap()(ctx, &mut h, p.cast::<DescrV4>()),
            5 => ncclProfiler_v5.start_event.unwrap()(ctx, &mut h, p.cast::<DescrV5>()),
            _ => ncclProfiler_v6.start_event.unwrap()(ctx, &mut h, p.cast::<DescrV6>()),
        }
    };
    assert_eq!(rc, 0, "startEvent failed");
    assert_ne!(h as usize, 0x10, "startEvent must always set *eHandle");
    h
}

/// Calls any version's stopEvent (they are the same function behind three tables).
fn stop(which: u8, h: *mut c_void) {
    // SAFETY: an issued handle (maybe stopped, maybe of a finalized context) or NULL.
    let rc = unsafe {
        match which % 3 {
            0 => ncclProfiler_v4.stop_event.unwrap()(h),
            1 => ncclProfiler_v5.stop_event.unwrap()(h),
            _ => ncclProfiler_v6.stop_event.unwrap()(h),
        }
    };
    assert_eq!(rc, 0, "stopEvent failed");
}

fn finalize(which: u8, ctx: *mut c_void) {
    // SAFETY: a context from our init, finalized once, or NULL (a no-op).
    let rc = unsafe {
        match which % 3 {
            0 => ncclProfiler_v4.finalize.unwrap()(ctx),
            1 => ncclProfiler_v5.finalize.unwrap()(ctx),
            _ => ncclProfiler_v6.finalize.unwrap()(ctx),
        }
    };
    assert_eq!(rc, 0, "finalize failed");
}

/// Handles shared between the threads (a few, each maybe stopped already).
type Shared = Mutex<Vec<usize>>;

fn worker(mut s: Src, shared: &Shared) {
    let mut ctxs: Vec<Ctx> = Vec::new();
    let mut mine: Vec<usize> = Vec::new();
    let mut calls = 0;
    while !s.done() && calls < 256 {
        calls += 1;
        let pick = |s: &mut Src, mine: &Vec<usize>| -> *mut c_void {
            match s.u8() {
                0..=199 if !mine.is_empty() => mine[s.u8() as usize % mine.len()] as *mut c_void,
                200..=239 => {
                    let g = shared.lock().unwrap();
                    match g.len() {
                        0 => core::ptr::null_mut(),
                        n => g[s.u8() as usize % n] as *mut c_void,
                    }
                }
                _ => core::ptr::null_mut(),
            }
        };
        match s.u8() % 16 {
            0 if ctxs.len() < 4 => ctxs.push(init(&mut s)),
            1 if !ctxs.is_empty() => {
                // Finalize while events are open.
                let i = s.u8() as usize % ctxs.len();
                let c = ctxs.swap_remove(i);
                finalize(s.u8(), c.ptr);
            }
            2 => finalize(s.u8(), core::ptr::null_mut()),
            3..=8 => {
                let (ctx, abi) = match ctxs.get(s.u8() as usize % ctxs.len().max(1)) {
                    Some(c) if !s.chance(3) => (c.ptr, c.abi),
                    Some(c) => (core::ptr::null_mut(), c.abi),
                    None => (core::ptr::null_mut(), 4 + s.below(3) as u8),
                };
                let parent = pick(&mut s, &mine);
                let mut d = descr(&mut s, abi, parent);
                let h = start(abi, ctx, &mut d);
                if !h.is_null() {
                    mine.push(h as usize);
                    if s.chance(10) {
                        let mut g = shared.lock().unwrap();
                        if g.len() < 16 {
                            g.push(h as usize);
                        }
                    }
                }
            }
            9..=12 => {
                let h = pick(&mut s, &mine);
                stop(s.u8(), h);
                // Mostly forget it; sometimes keep it (stopped twice later).
                if !s.chance(20) {
                    if let Some(i) = mine.iter().position(|m| *m == h as usize) {
                        mine.swap_remove(i);
                    }
                }
            }
            _ => {
                let h = pick(&mut s, &mine);
                let state = s.below(32) as c_int - 1;
                let mut args = StateArgs {
                    kernel_ch_ptimer: s.u64(),
                };
                let a: *mut StateArgs = if s.chance(20) {
                    core::ptr::null_mut()
                } else {
                    &mut args
                };
                // SAFETY: an issued handle or NULL; args NULL or a valid union.
                let rc = unsafe {
                    match s.u8() % 3 {
                        0 => ncclProfiler_v4.record_event_state.unwrap()(h, state, a),
                        1 => ncclProfiler_v5.record_event_state.unwrap()(h, state, a),
                        _ => ncclProfiler_v6.record_event_state.unwrap()(h, state, a),
                    }
                };
                assert_eq!(rc, 0, "recordEventState failed");
            }
        }
    }
    for c in ctxs {
        finalize(0, c.ptr);
    }
    // Everything still open is stale now (its context is gone): stopping it is accepted.
    for h in mine {
        stop(2, h as *mut c_void);
    }
}

/// The plugin reads its environment once, at the first init: a private directory for its
/// segments and ring, small rings, every event type.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // tmpfs when there is one: sealing a segment syncs it.
        let shm = std::path::PathBuf::from("/dev/shm");
        let tmp = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let root = tmp.join(format!("ci-fuzz-plugin-{}", std::process::id()));
        std::env::set_var("COMMINSIGHT_LOG_DIR", root.join("logs"));
        std::env::set_var("COMMINSIGHT_SHM_DIR", root.join("shm"));
        std::env::set_var("COMMINSIGHT_RING_BYTES", "65536");
        std::env::set_var("COMMINSIGHT_MAX_INFLIGHT", "1024");
        std::env::set_var("COMMINSIGHT_EVENT_MASK", "0xffff");
        std::env::set_var("COMMINSIGHT_SEGMENT_BYTES", "262144");
        std::env::set_var("COMMINSIGHT_RETENTION_BYTES", "1048576");
        std::env::set_var("COMMINSIGHT_FLUSH_MS", "1");
        std::env::set_var("COMMINSIGHT_JOB_ID", "fuzz");
        std::env::set_var("COMMINSIGHT_HOSTNAME", "fuzz");
        std::env::remove_var("COMMINSIGHT_DISABLE");
        // A deadlock is a finding: abort (libFuzzer reports the input) when one input runs
        // for over a minute.
        std::thread::spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            let started = STARTED.load(Ordering::Relaxed);
            if started != 0 && now_s().saturating_sub(started) > 60 {
                eprintln!("plugin_abi: one input ran for over 60 s: deadlock?");
                std::process::abort();
            }
        });
    });
}

/// When the current input started (seconds since the epoch; 0: none running).
static STARTED: AtomicU64 = AtomicU64::new(0);

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fuzz_target!(|data: &[u8]| {
    setup();
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    STARTED.store(now_s(), Ordering::Relaxed);
    let threads = 2 + usize::from(first % 3);
    let shared: Shared = Mutex::new(Vec::new());
    let per = rest.len().div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for chunk in rest.chunks(per) {
            let shared = &shared;
            sc.spawn(move || worker(Src(chunk), shared));
        }
    });
    for h in shared.into_inner().unwrap() {
        stop(1, h as *mut c_void);
    }
    assert_eq!(RUNTIME.live_slots(), (0, 0), "every slot free again");
    assert_eq!(
        RUNTIME.state(),
        (0, false, None),
        "contexts freed, drain joined, ring gone"
    );
    STARTED.store(0, Ordering::Relaxed);
});

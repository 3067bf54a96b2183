//! Shared ABI driver for the plugin benches: `dlopen`s ANY NCCL profiler plugin by path and drives
//! it through its newest exported table (`ncclProfiler_v6` → v5 → v4) with raw descriptors written
//! at the offsets of research/nccl-abi.md §2.6 (no plugin types used).

#![allow(dead_code, reason = "each bench uses a different part of the driver")]

use core::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::path::PathBuf;

type Init6 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    *const c_void,
) -> c_int;
type Init4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    *const c_void,
) -> c_int;
type Start = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut u8) -> c_int;
type Stop = unsafe extern "C" fn(*mut c_void) -> c_int;
type Record = unsafe extern "C" fn(*mut c_void, c_int, *mut u64) -> c_int;
type Fin = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ncclProfiler_vN_t`: name + 5 function pointers (48 bytes in every version).
#[repr(C)]
pub struct Table {
    pub name: *const c_char,
    pub init: *const c_void,
    pub start: Start,
    pub stop: Stop,
    pub record: Record,
    pub finalize: Fin,
}

pub struct Plugin {
    pub table: &'static Table,
    pub abi: u8,
    pub ctx: *mut c_void,
}

// SAFETY: the context and table are only passed back to the plugin, whose entry points NCCL calls
// from any thread (research/nccl-abi.md, "What our plugin must get right" item 7).
unsafe impl Sync for Plugin {}
// SAFETY: as above.
unsafe impl Send for Plugin {}

impl Plugin {
    /// `finalize` the context (the plugin flushes, seals and joins its threads).
    pub fn finalize(&self) {
        // SAFETY: the context from init, finalized once by the caller.
        unsafe { (self.table.finalize)(self.ctx) };
    }
}

/// A logger that ignores its arguments (some plugins call `logfn` unconditionally).
extern "C" fn quiet_logger(_: c_int, _: c_ulong, _: *const c_char, _: c_int, _: *const c_char) {}

static mut MASK: c_int = 0;

fn default_plugin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    for dir in [
        deps.to_path_buf(),
        deps.parent().unwrap_or(deps).to_path_buf(),
    ] {
        let p = dir.join("libnccl_profiler_comminsight.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libnccl_profiler_comminsight.so not found next to {}; build it (cargo build --release -p comminsight-plugin) or set COMMINSIGHT_BENCH_PLUGIN",
        exe.display()
    );
}

pub fn load() -> Plugin {
    let path = std::env::var_os("COMMINSIGHT_BENCH_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(default_plugin);
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; dlopen runs the library's constructors (trusted plugin).
    let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "dlopen {} failed", path.display());
    for (sym, abi) in [
        (c"ncclProfiler_v6", 6u8),
        (c"ncclProfiler_v5", 5),
        (c"ncclProfiler_v4", 4),
    ] {
        // SAFETY: `lib` is a live handle; the symbol name is NUL-terminated.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        if p.is_null() {
            continue;
        }
        // SAFETY: the symbol is the plugin's static `ncclProfiler_vN_t` (48 bytes, §1.2); the
        // library is never closed, so the reference stays valid.
        let table: &'static Table = unsafe { &*(p as *const Table) };
        // SAFETY: the table's `name` is a static C string.
        let name = unsafe { CStr::from_ptr(table.name) }.to_string_lossy();
        eprintln!(
            "bench: {} exports {} (\"{name}\")",
            path.display(),
            sym.to_string_lossy()
        );
        let mut ctx: *mut c_void = core::ptr::null_mut();
        let logger = quiet_logger as *const c_void;
        // SAFETY: arguments as NCCL passes them; the init signature depends on the version (§1.2).
        // The logger is declared without the trailing `...`: with the SysV x86-64 ABI a callee that
        // ignores its arguments is called correctly either way.
        let rc = unsafe {
            let mask = &raw mut MASK;
            if abi == 4 {
                let f: Init4 = core::mem::transmute(table.init);
                f(&mut ctx, mask, c"bench".as_ptr(), 0x1234, 1, 8, 0, logger)
            } else {
                let f: Init6 = core::mem::transmute(table.init);
                f(&mut ctx, 0x1234, mask, c"bench".as_ptr(), 1, 8, 0, logger)
            }
        };
        assert_eq!(rc, 0, "init failed");
        // SAFETY: plain read of the mask the plugin wrote; no other thread touches it now.
        let mask = unsafe { (&raw const MASK).read_volatile() };
        eprintln!("bench: init ok, context {ctx:?}, event mask 0x{mask:x}");
        return Plugin { table, abi, ctx };
    }
    panic!("{} exports no ncclProfiler_v6/v5/v4", path.display());
}

/// A 112-byte descriptor written at §2.6 offsets.
#[repr(C, align(8))]
struct D([u8; 112]);

impl D {
    fn new(abi: u8, ty: u64, parent: *mut c_void) -> D {
        let mut d = D([0; 112]);
        if abi == 4 {
            d.put(0, ty as u8);
        } else {
            d.put(0, ty);
        }
        d.put(8, parent);
        d
    }
    fn put<T: Copy>(&mut self, off: usize, v: T) {
        assert!(off + size_of::<T>() <= 112);
        // SAFETY: in bounds; unaligned store into our own buffer.
        unsafe { self.0.as_mut_ptr().add(off).cast::<T>().write_unaligned(v) };
    }
}

impl Plugin {
    #[inline(always)]
    fn start(&self, d: &mut D) -> *mut c_void {
        let mut h = core::ptr::null_mut();
        // SAFETY: a live context, a writable handle slot and a well-formed descriptor.
        unsafe { (self.table.start)(self.ctx, &mut h, d.0.as_mut_ptr()) };
        h
    }
    #[inline(always)]
    fn stop(&self, h: *mut c_void) {
        // SAFETY: a handle the plugin returned (or NULL).
        unsafe { (self.table.stop)(h) };
    }
    #[inline(always)]
    fn record(&self, h: *mut c_void, state: c_int, arg: u64) {
        let mut a = arg;
        // SAFETY: a handle the plugin returned; an 8-byte state-args union.
        unsafe { (self.table.record)(h, state, &mut a) };
    }

    /// One collective: returns nothing, the plugin records it.
    #[inline(always)]
    pub fn collective(&self, seq: u64, t: u64) {
        let v5 = self.abi >= 5;
        let ga = if v5 {
            self.start(&mut D::new(self.abi, 1 << 8, core::ptr::null_mut()))
        } else {
            core::ptr::null_mut()
        };
        let ca = if v5 {
            let mut d = D::new(self.abi, 1 << 9, ga);
            d.put(24, c"AllReduce".as_ptr());
            d.put(32, 1usize << 20);
            d.put(40, c"ncclFloat32".as_ptr());
            self.start(&mut d)
        } else {
            core::ptr::null_mut()
        };
        if v5 {
            self.stop(ca);
        }
        let g = self.start(&mut D::new(self.abi, 1, core::ptr::null_mut()));
        let mut d = D::new(self.abi, 2, if v5 { ca } else { g });
        d.put(16, 0i32);
        d.put(24, seq);
        d.put(32, c"AllReduce".as_ptr());
        d.put(56, 1usize << 20);
        d.put(64, 0i32);
        d.put(72, c"ncclFloat32".as_ptr());
        d.put(80, 1u8);
        d.put(81, 16u8);
        d.put(88, c"RING".as_ptr());
        d.put(96, c"SIMPLE".as_ptr());
        if v5 {
            d.put(104, g);
        }
        let c = self.start(&mut d);
        self.stop(c);
        self.stop(g);
        if v5 {
            self.stop(ga);
        }
        self.kernel(c, t);
    }

    /// One send: the same shape with P2pApi / P2p.
    #[inline(always)]
    pub fn p2p(&self, t: u64) {
        let v5 = self.abi >= 5;
        let ga = if v5 {
            self.start(&mut D::new(self.abi, 1 << 8, core::ptr::null_mut()))
        } else {
            core::ptr::null_mut()
        };
        let pa = if v5 {
            let mut d = D::new(self.abi, 1 << 10, ga);
            d.put(24, c"Send".as_ptr());
            d.put(32, 1usize << 20);
            d.put(40, c"ncclInt8".as_ptr());
            self.start(&mut d)
        } else {
            core::ptr::null_mut()
        };
        if v5 {
            self.stop(pa);
        }
        let g = self.start(&mut D::new(self.abi, 1, core::ptr::null_mut()));
        let mut d = D::new(self.abi, 4, if v5 { pa } else { g });
        d.put(24, c"Send".as_ptr());
        d.put(40, c"ncclInt8".as_ptr());
        d.put(48, 1usize << 20);
        d.put(56, 1i32);
        d.put(60, 1u8);
        if v5 {
            d.put(64, g);
        }
        let p = self.start(&mut d);
        self.stop(p);
        self.stop(g);
        if v5 {
            self.stop(ga);
        }
        self.kernel(p, t);
    }

    #[inline(always)]
    fn kernel(&self, parent: *mut c_void, t: u64) {
        let mut d = D::new(self.abi, 1 << 6, parent);
        d.put(24, 0u8);
        d.put(32, t);
        let k = self.start(&mut d);
        self.record(k, 22, t + 5_000);
        self.stop(k);
    }
}

/// CLOCK_THREAD_CPUTIME_ID in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Point COMMINSIGHT_LOG_DIR / COMMINSIGHT_SHM_DIR (unless set) at a fresh directory (on /dev/shm
/// when present) and set the extra variables `extra` (unless set). Returns the directory when the
/// caller should remove it.
pub fn set_default_env(extra: &[(&str, &str)]) -> Option<PathBuf> {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("comminsight-bench-{}", std::process::id()));
    let mut owned = false;
    let mut vars: Vec<(&str, std::ffi::OsString)> = vec![
        ("COMMINSIGHT_LOG_DIR", dir.join("logs").into()),
        ("COMMINSIGHT_SHM_DIR", dir.join("shm").into()),
    ];
    vars.extend(extra.iter().map(|(k, v)| (*k, (*v).into())));
    for (k, v) in vars {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
            owned = true;
        }
    }
    owned.then_some(dir)
}

//! Loading the profiler plugin as NCCL does (nccl-abi.md §1.3/§1.4): per-release name resolution,
//! `dlopen(RTLD_NOW|RTLD_LOCAL)`, versioned symbol probe, process-wide refcount under a mutex, `init`
//! once per comm with that version's argument order, `finalize` at comm free, `dlclose` at refcount 0.

use super::abi::Table;
use super::v4::InitV4;
use super::v5::InitV5;
use crate::env::Release;
use crate::log::{info, warn, SUB_DESTROY, SUB_ENV, SUB_INIT};
use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// NCCL's global `int ncclProfilerEventMask`, handed to every `init`, read relaxed at API time.
pub static EVENT_MASK: AtomicI32 = AtomicI32::new(0);

/// What `NCCL_PROFILER_PLUGIN` resolves to.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Profiling disabled (`none` on 2.28+).
    Disabled,
    /// Names to `dlopen` in order; `None` = `dlopen(NULL)` (STATIC_PLUGIN).
    Try(Vec<Option<String>>),
}

/// NCCL's `tryOpenLib` STATIC_PLUGIN test: `strncasecmp(name, "STATIC_PLUGIN", strlen(name)) == 0`
/// (so any case-insensitive prefix of it, e.g. "static", also means the main program).
fn static_or(name: String) -> Option<String> {
    const S: &str = "STATIC_PLUGIN";
    let is_prefix =
        !name.is_empty() && name.len() <= S.len() && S[..name.len()].eq_ignore_ascii_case(&name);
    if is_prefix {
        None
    } else {
        Some(name)
    }
}

fn is_lib_so(x: &str) -> bool {
    x.len() >= "libX.so".len() && x.starts_with("lib") && x.ends_with(".so")
}

/// Name resolution of `release` for the value of `NCCL_PROFILER_PLUGIN`.
pub fn resolve(release: Release, var: Option<&str>) -> Resolution {
    const DEFAULT: &str = "libnccl-profiler.so";
    let x = match var {
        Some(x) if !x.is_empty() => x,
        _ => return Resolution::Try(vec![static_or(DEFAULT.into())]),
    };
    match release {
        Release::V2_27 => {
            if is_lib_so(x) {
                Resolution::Try(vec![static_or(x.into())])
            } else {
                Resolution::Try(vec![static_or(format!("libnccl-profiler-{x}.so"))])
            }
        }
        Release::V2_28 | Release::V2_30 => {
            if x.eq_ignore_ascii_case("none") {
                return Resolution::Disabled;
            }
            let mut v = vec![static_or(x.into())];
            let lib_named = x.starts_with("lib") && x.len() >= 3 && x.ends_with(".so");
            if !x.contains('/') && !lib_named {
                v.push(static_or(format!("libnccl-profiler-{x}.so")));
            }
            Resolution::Try(v)
        }
    }
}

/// Symbols probed, in order, per release.
pub fn probe_order(release: Release) -> &'static [(u32, &'static CStr)] {
    const ALL: [(u32, &CStr); 6] = [
        (6, c"ncclProfiler_v6"),
        (5, c"ncclProfiler_v5"),
        (4, c"ncclProfiler_v4"),
        (3, c"ncclProfiler_v3"),
        (2, c"ncclProfiler_v2"),
        (1, c"ncclProfiler_v1"),
    ];
    match release {
        Release::V2_30 => &ALL,
        Release::V2_28 => &ALL[1..],
        Release::V2_27 => &ALL[2..],
    }
}

/// A loaded plugin (NCCL's `ncclProfiler`).
pub struct Plugin {
    /// ABI version (4, 5, 6).
    pub version: u32,
    /// Its function table (copied from the plugin's data symbol).
    pub table: Table,
    /// Its `name`.
    pub name: String,
}

// SAFETY: the table holds the plugin's static name and function pointers, valid while the library is
// loaded (we only dlclose when no comm uses it any more); the plugin contract makes them thread-safe.
unsafe impl Send for Plugin {}
// SAFETY: see `Send`.
unsafe impl Sync for Plugin {}

#[derive(PartialEq, Eq)]
enum Status {
    Ready,
    Failed,
    Success,
}

struct State {
    status: Status,
    refcount: i32,
    lib: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    status: Status::Ready,
    refcount: 0,
    lib: 0,
});
static CURRENT: RwLock<Option<Arc<Plugin>>> = RwLock::new(None);

/// The plugin events go to (NCCL's global `ncclProfiler`), if any.
pub fn current() -> Option<Arc<Plugin>> {
    CURRENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

fn set_current(p: Option<Arc<Plugin>>) {
    *CURRENT.write().unwrap_or_else(|e| e.into_inner()) = p;
}

/// ABI version of the current plugin, 0 when none.
pub fn loaded_abi() -> c_int {
    current().map(|p| p.version as c_int).unwrap_or(0)
}

fn dlopen(name: Option<&str>) -> Result<*mut c_void, String> {
    let c = name.map(|n| CString::new(n).unwrap_or_default());
    let p = c.as_ref().map(|c| c.as_ptr()).unwrap_or(std::ptr::null());
    // SAFETY: p is NULL or a NUL-terminated string alive for the call.
    let h = unsafe { libc::dlopen(p, libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a valid C string.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            String::from("unknown dlopen error")
        } else {
            // SAFETY: non-null C string from dlerror.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        return Err(msg);
    }
    Ok(h)
}

fn dlclose(h: usize) {
    if h != 0 {
        // SAFETY: h came from a successful dlopen and is closed once.
        unsafe { libc::dlclose(h as *mut c_void) };
    }
}

fn probe(lib: *mut c_void, release: Release) -> Option<(u32, Table)> {
    for (v, sym) in probe_order(release) {
        // SAFETY: lib is a live handle; sym is NUL-terminated.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        if p.is_null() {
            continue;
        }
        // SAFETY: the plugin exports this symbol as a 48-byte `ncclProfiler_vN_t` (all versions share
        // the 6-pointer shape); we copy it.
        let t = unsafe { std::ptr::read_unaligned(p.cast::<Table>()) };
        return Some((*v, t));
    }
    None
}

fn load(release: Release, var: Option<&str>) {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if st.status == Status::Failed {
        return;
    }
    if st.status == Status::Success {
        st.refcount += 1;
        return;
    }
    if let Some(x) = var {
        info(
            SUB_ENV,
            &format!("NCCL_PROFILER_PLUGIN set by environment to {x}"),
        );
    }
    let names = match resolve(release, var) {
        Resolution::Disabled => {
            st.status = Status::Failed;
            return;
        }
        Resolution::Try(n) => n,
    };
    let mut opened = None;
    let mut missing = Vec::new();
    for n in &names {
        match dlopen(n.as_deref()) {
            Ok(h) => {
                if var.is_some() {
                    info(
                        SUB_INIT,
                        &format!(
                            "PROFILER/Plugin: Plugin name set by env to {}",
                            n.as_deref().unwrap_or("STATIC_PLUGIN")
                        ),
                    );
                }
                opened = Some((h, n.clone()));
                break;
            }
            Err(e) => {
                let n = n.as_deref().unwrap_or("(main program)");
                if e.contains("No such file") {
                    missing.push(n.to_string());
                } else {
                    info(SUB_INIT, &format!("PROFILER/Plugin: {e}"));
                }
            }
        }
    }
    let Some((lib, path)) = opened else {
        if !missing.is_empty() {
            info(
                SUB_INIT,
                &format!("PROFILER/Plugin: Could not find: {}.", missing.join(" ")),
            );
        }
        st.status = Status::Failed;
        return;
    };
    let shown = path.clone().unwrap_or_else(|| "STATIC_PLUGIN".into());
    let Some((version, table)) = probe(lib, release) else {
        info(
            SUB_INIT,
            &format!("External profiler plugin {shown} is unsupported"),
        );
        dlclose(lib as usize);
        st.status = Status::Failed;
        return;
    };
    let name = if table.name.is_null() {
        String::from("(unnamed)")
    } else {
        // SAFETY: the plugin's `name` is a static NUL-terminated string.
        unsafe { CStr::from_ptr(table.name) }
            .to_string_lossy()
            .into_owned()
    };
    if version < 4 {
        warn(&format!(
            "PROFILER/Plugin: {name} exports only profiler ABI v{version}; this stand-in drives v4-v6 only, profiler disabled"
        ));
        dlclose(lib as usize);
        st.status = Status::Failed;
        return;
    }
    info(
        SUB_INIT | SUB_ENV,
        &format!("PROFILER/Plugin: Loaded {name} (v{version})"),
    );
    info(
        SUB_INIT,
        &format!("Successfully loaded external profiler plugin {shown}"),
    );
    st.refcount += 1;
    st.status = Status::Success;
    st.lib = lib as usize;
    set_current(Some(Arc::new(Plugin {
        version,
        table,
        name,
    })));
}

fn unload() {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    st.refcount -= 1;
    if st.refcount == 0 {
        if let Some(p) = current() {
            info(
                SUB_DESTROY,
                &format!("PROFILER/Plugin: Closing profiler plugin {}", p.name),
            );
        }
        set_current(None);
        dlclose(st.lib);
        st.lib = 0;
        st.status = Status::Ready;
    }
}

fn mask_names(mask: i32) -> String {
    const N: [&str; 15] = [
        "Group",
        "Coll",
        "P2p",
        "ProxyOp",
        "ProxyStep",
        "ProxyCtrl",
        "KernelCh",
        "NetPlugin",
        "GroupApi",
        "CollApi",
        "P2pApi",
        "KernelLaunch",
        "CeColl",
        "CeSync",
        "CeBatch",
    ];
    N.iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Comm geometry handed to `init`.
pub struct InitArgs {
    /// commHash / commId.
    pub comm_hash: u64,
    /// `config.commName` pointer (may be NULL).
    pub comm_name: *const std::ffi::c_char,
    /// Distinct hosts.
    pub n_nodes: i32,
    /// Ranks.
    pub nranks: i32,
    /// This rank.
    pub rank: i32,
}

/// `ncclProfilerPluginInit(comm)`: returns the comm's profiler context (NULL when none).
pub fn plugin_init(release: Release, var: Option<&str>, a: &InitArgs) -> *mut c_void {
    load(release, var);
    let Some(p) = current() else {
        return std::ptr::null_mut();
    };
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let logfn = crate::log::debug_logger();
    let mask = EVENT_MASK.as_ptr();
    let Some(init) = p.table.init else {
        return ctx;
    };
    let err = if p.version == 4 {
        // SAFETY: v4 plugins declare init with exactly this signature (nccl-abi.md §1.2).
        let f: InitV4 = unsafe { std::mem::transmute::<unsafe extern "C" fn(), InitV4>(init) };
        // SAFETY: valid out-pointers; commName is the caller's pointer as NCCL passes it.
        unsafe {
            f(
                &mut ctx,
                mask,
                a.comm_name,
                a.comm_hash,
                a.n_nodes,
                a.nranks,
                a.rank,
                logfn,
            )
        }
    } else {
        // SAFETY: v5/v6 plugins declare init with exactly this signature (nccl-abi.md §1.2).
        let f: InitV5 = unsafe { std::mem::transmute::<unsafe extern "C" fn(), InitV5>(init) };
        // SAFETY: as above.
        unsafe {
            f(
                &mut ctx,
                a.comm_hash,
                mask,
                a.comm_name,
                a.n_nodes,
                a.nranks,
                a.rank,
                logfn,
            )
        }
    };
    if err == 0 && p.version == 5 && release == Release::V2_30 {
        // NCCL >= 2.29's v5 adapter clears the v6-only CE bits after a successful init.
        EVENT_MASK.fetch_and(!super::abi::bits::CE_ALL, Ordering::Relaxed);
    }
    if err != 0 {
        match release {
            Release::V2_27 => {
                warn(&format!(
                    "Profiler init failed with error ({err}). Continue without profiler."
                ));
                set_current(None);
            }
            Release::V2_28 => info(
                SUB_INIT,
                &format!("Profiler init failed with error '{err}'. Continue without profiler."),
            ),
            Release::V2_30 => {
                unload();
                info(
                    SUB_INIT,
                    &format!("Profiler init failed with error '{err}'. Continue without profiler."),
                );
            }
        }
    }
    if release != Release::V2_27 {
        let m = EVENT_MASK.load(Ordering::Relaxed);
        if m != 0 {
            info(
                SUB_INIT,
                &format!(
                    "Profiler event mask: 0x{m:x} ({m}) - Enabled: {} ",
                    mask_names(m)
                ),
            );
        }
    }
    ctx
}

/// `ncclProfilerPluginFinalize(comm)`.
pub fn plugin_finalize(release: Release, ctx: usize) {
    let ctx = ctx as *mut c_void;
    if let Some(p) = current() {
        if release == Release::V2_27 || !ctx.is_null() {
            if let Some(f) = p.table.finalize {
                // SAFETY: plugin's finalize with the context its init produced.
                unsafe { f(ctx) };
            }
        }
    }
    unload();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[Option<&str>]) -> Resolution {
        Resolution::Try(v.iter().map(|s| s.map(String::from)).collect())
    }

    #[test]
    fn unset_means_default_name_in_every_release() {
        for r in [Release::V2_27, Release::V2_28, Release::V2_30] {
            assert_eq!(resolve(r, None), t(&[Some("libnccl-profiler.so")]));
            assert_eq!(resolve(r, Some("")), t(&[Some("libnccl-profiler.so")]));
        }
    }

    #[test]
    fn newer_releases_try_verbatim_then_prefixed() {
        let r = Release::V2_30;
        assert_eq!(resolve(r, Some("none")), Resolution::Disabled);
        assert_eq!(resolve(r, Some("NONE")), Resolution::Disabled);
        assert_eq!(
            resolve(r, Some("x")),
            t(&[Some("x"), Some("libnccl-profiler-x.so")])
        );
        assert_eq!(resolve(r, Some("/a/libp.so")), t(&[Some("/a/libp.so")]));
        assert_eq!(resolve(r, Some("libp.so")), t(&[Some("libp.so")]));
        assert_eq!(
            resolve(r, Some("STATIC_PLUGIN")),
            t(&[None, Some("libnccl-profiler-STATIC_PLUGIN.so")])
        );
        assert_eq!(
            resolve(r, Some("static")),
            t(&[None, Some("libnccl-profiler-static.so")])
        );
    }

    #[test]
    fn release_2_27_uses_the_lib_so_rule() {
        let r = Release::V2_27;
        assert_eq!(
            resolve(r, Some("none")),
            t(&[Some("libnccl-profiler-none.so")])
        );
        assert_eq!(resolve(r, Some("libp.so")), t(&[Some("libp.so")]));
        assert_eq!(
            resolve(r, Some("/a/libp.so")),
            t(&[Some("libnccl-profiler-/a/libp.so.so")])
        );
        assert_eq!(
            resolve(r, Some("STATIC_PLUGIN")),
            t(&[Some("libnccl-profiler-STATIC_PLUGIN.so")])
        );
    }

    #[test]
    fn probe_orders_per_release() {
        let v = |r| probe_order(r).iter().map(|(v, _)| *v).collect::<Vec<_>>();
        assert_eq!(v(Release::V2_30), [6, 5, 4, 3, 2, 1]);
        assert_eq!(v(Release::V2_28), [5, 4, 3, 2, 1]);
        assert_eq!(v(Release::V2_27), [4, 3, 2, 1]);
    }
}

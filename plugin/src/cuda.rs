//! Which GPU a communicator's rank runs on (the `comm_device` record), asked of the CUDA already
//! loaded in the process, once per communicator at `init` (off the hot path), the way NCCL's
//! own Inspector plugin asks: `cudaGetDevice` for the ordinal, then the driver's
//! `cuDeviceGet` / `cuDeviceGetPCIBusId` / `cuDeviceGetUuid` for the PCI address and UUID.
//!
//! Nothing is linked and nothing is loaded: the runtime symbols are looked up in the global
//! scope (`RTLD_DEFAULT`: PyTorch's `libcudart`), the driver through `dlopen("libcuda.so.1",
//! RTLD_NOLOAD)` (the runtime loads the driver privately, so its symbols are not global), and
//! `cuInit` is never called: in a process without CUDA, or before the runtime initialised the
//! driver, the answers are simply missing (`device` -1 or `pci` 0). NCCL calls the profiler's
//! `init` on a thread whose current device is the communicator's (it sets it before), so
//! `cudaGetDevice` names the right ordinal; without a runtime the driver's `cuCtxGetDevice` of
//! the current context is used.

use ::core::ffi::{c_char, c_int, c_void, CStr};

use comminsight_wire::gpu::{device_source, pci};

/// What CUDA said about the calling thread's device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal; -1 unknown.
    pub ordinal: i32,
    /// `comminsight_wire::gpu::pci`; 0 unknown.
    pub pci: u64,
    pub uuid: [u8; 16],
    /// `device_source`.
    pub source: u8,
}

type GetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;
type RtPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuPciBusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuUuid = unsafe extern "C" fn(*mut u8, c_int) -> c_int;

/// `dlsym(handle, name)`, NULL when absent.
fn sym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a valid handle (RTLD_DEFAULT or one dlopen returned) and a
    // NUL-terminated name only reads the loader's tables.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

/// Ask CUDA about the calling thread's device. Never loads a library, never initialises CUDA.
pub fn current_device() -> DeviceInfo {
    let mut info = DeviceInfo {
        ordinal: -1,
        ..DeviceInfo::default()
    };
    let rt_get = sym(libc::RTLD_DEFAULT, c"cudaGetDevice");
    if !rt_get.is_null() {
        // SAFETY: the CUDA runtime defines cudaGetDevice as `cudaError_t (int*)`.
        let f: GetDevice = unsafe { ::core::mem::transmute::<*mut c_void, GetDevice>(rt_get) };
        let mut d: c_int = -1;
        // SAFETY: f writes one int through a valid pointer.
        if unsafe { f(&mut d) } == 0 && d >= 0 {
            info.ordinal = d;
            info.source = device_source::RUNTIME;
        }
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded; it loads nothing.
    let drv = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if !drv.is_null() {
        from_driver(drv, &mut info);
        // SAFETY: drv came from dlopen above; this only drops the reference it added.
        unsafe { libc::dlclose(drv) };
    }
    if info.pci == 0 && info.source == device_source::RUNTIME {
        let f = sym(libc::RTLD_DEFAULT, c"cudaDeviceGetPCIBusId");
        if !f.is_null() {
            // SAFETY: `cudaError_t cudaDeviceGetPCIBusId(char*, int len, int device)`.
            let f: RtPciBusId = unsafe { ::core::mem::transmute::<*mut c_void, RtPciBusId>(f) };
            info.pci = bus_id(|buf, len| {
                // SAFETY: buf is valid for len bytes.
                unsafe { f(buf, len, info.ordinal) }
            });
        }
    }
    info
}

/// The driver's answers: the ordinal (when the runtime gave none: the current context's
/// device), PCI address and UUID.
fn from_driver(drv: *mut c_void, info: &mut DeviceInfo) {
    if info.ordinal < 0 {
        let ctx_dev = sym(drv, c"cuCtxGetDevice");
        if ctx_dev.is_null() {
            return;
        }
        // SAFETY: `CUresult cuCtxGetDevice(CUdevice*)`, CUdevice being an int.
        let f: GetDevice = unsafe { ::core::mem::transmute::<*mut c_void, GetDevice>(ctx_dev) };
        let mut d: c_int = -1;
        // SAFETY: f writes one int through a valid pointer.
        if unsafe { f(&mut d) } != 0 || d < 0 {
            return;
        }
        info.ordinal = d;
        info.source = device_source::DRIVER;
    }
    let get = sym(drv, c"cuDeviceGet");
    if get.is_null() {
        return;
    }
    // SAFETY: `CUresult cuDeviceGet(CUdevice*, int ordinal)`.
    let get: CuDeviceGet = unsafe { ::core::mem::transmute::<*mut c_void, CuDeviceGet>(get) };
    let mut dev: c_int = -1;
    // SAFETY: writes one int; fails (CUDA_ERROR_NOT_INITIALIZED) before cuInit, harmlessly.
    if unsafe { get(&mut dev, info.ordinal) } != 0 {
        return;
    }
    let bus = sym(drv, c"cuDeviceGetPCIBusId");
    if !bus.is_null() {
        // SAFETY: `CUresult cuDeviceGetPCIBusId(char*, int len, CUdevice)`.
        let f: CuPciBusId = unsafe { ::core::mem::transmute::<*mut c_void, CuPciBusId>(bus) };
        info.pci = bus_id(|buf, len| {
            // SAFETY: buf is valid for len bytes.
            unsafe { f(buf, len, dev) }
        });
    }
    let mut u = sym(drv, c"cuDeviceGetUuid_v2");
    if u.is_null() {
        u = sym(drv, c"cuDeviceGetUuid");
    }
    if !u.is_null() {
        // SAFETY: `CUresult cuDeviceGetUuid[_v2](CUuuid*, CUdevice)`, CUuuid being 16 bytes.
        let f: CuUuid = unsafe { ::core::mem::transmute::<*mut c_void, CuUuid>(u) };
        let mut uuid = [0u8; 16];
        // SAFETY: writes 16 bytes into uuid.
        if unsafe { f(uuid.as_mut_ptr(), dev) } == 0 {
            info.uuid = uuid;
        }
    }
}

/// Call a `(char* buf, int len)` bus-id getter and parse what it wrote; 0 on failure.
fn bus_id(call: impl FnOnce(*mut c_char, c_int) -> c_int) -> u64 {
    let mut buf = [0 as c_char; 32];
    if call(buf.as_mut_ptr(), buf.len() as c_int - 1) != 0 {
        return 0;
    }
    // SAFETY: the buffer is NUL-terminated (its last byte is never written).
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    s.to_str().ok().and_then(pci::parse).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_cuda_gets_no_device_and_loads_nothing() {
        let d = current_device();
        assert_eq!(d.ordinal, -1);
        assert_eq!(d.source, device_source::NONE);
        assert_eq!(d.pci, 0);
        // SAFETY: RTLD_NOLOAD loads nothing.
        let h = unsafe {
            libc::dlopen(
                c"libcuda.so.1".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            )
        };
        assert!(h.is_null(), "asking must not load the driver");
    }
}

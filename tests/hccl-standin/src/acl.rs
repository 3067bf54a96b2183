//! The AscendCL part the test bed needs (CANN runtime API signatures): streams and events on the
//! NCCL stand-in's single in-order stream. An event recorded now completes once the stream has
//! finished every job submitted before it (`worker::position`), exactly as `aclrtRecordEvent` on
//! a device stream. Contexts are a per-process dummy.

#![allow(non_snake_case, reason = "AscendCL's C names")]

use std::ffi::{c_int, c_void};

use nccl::worker;

/// `ACL_SUCCESS`.
const ACL_SUCCESS: c_int = 0;
/// `ACL_ERROR_INVALID_PARAM`.
const ACL_ERROR_INVALID_PARAM: c_int = 100_000;
/// `ACL_EVENT_RECORDED_STATUS_NOT_READY` / `_COMPLETE`.
const NOT_READY: c_int = 0;
const COMPLETE: c_int = 1;

/// An event: the stream position it waits for (0 = never recorded: not ready).
struct Event {
    target: std::sync::atomic::AtomicU64,
}

/// The one context of the process (any non-NULL address).
static CONTEXT: u8 = 0;

/// `aclrtCreateEvent(aclrtEvent* event)`.
///
/// # Safety
/// `event` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEvent(event: *mut *mut c_void) -> c_int {
    if event.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    let e = Box::new(Event {
        target: std::sync::atomic::AtomicU64::new(0),
    });
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { *event = Box::into_raw(e).cast() };
    ACL_SUCCESS
}

/// `aclrtRecordEvent(aclrtEvent event, aclrtStream stream)`: any stream is the process' one.
///
/// # Safety
/// `event` from `aclrtCreateEvent`, not destroyed.
#[no_mangle]
pub unsafe extern "C" fn aclrtRecordEvent(event: *mut c_void, _stream: *mut c_void) -> c_int {
    if event.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: a live event of ours (caller's contract).
    let e = unsafe { &*event.cast::<Event>() };
    // Submitted jobs + 1, so that 0 keeps meaning "never recorded".
    let (submitted, _) = worker::position();
    e.target
        .store(submitted + 1, std::sync::atomic::Ordering::Release);
    ACL_SUCCESS
}

/// `aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus* status)`.
///
/// # Safety
/// `event` live; `status` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn aclrtQueryEventStatus(event: *mut c_void, status: *mut c_int) -> c_int {
    if event.is_null() || status.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: a live event of ours (caller's contract).
    let e = unsafe { &*event.cast::<Event>() };
    let t = e.target.load(std::sync::atomic::Ordering::Acquire);
    let (_, completed) = worker::position();
    let s = if t != 0 && completed + 1 >= t {
        COMPLETE
    } else {
        NOT_READY
    };
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { *status = s };
    ACL_SUCCESS
}

/// `aclrtDestroyEvent(aclrtEvent event)`.
///
/// # Safety
/// `event` from `aclrtCreateEvent`, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyEvent(event: *mut c_void) -> c_int {
    if event.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: made by `Box::into_raw` in aclrtCreateEvent, destroyed once (caller's contract).
    drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    ACL_SUCCESS
}

/// `aclrtCreateStream(aclrtStream* stream)`: a handle naming the process' one stream.
///
/// # Safety
/// `stream` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut *mut c_void) -> c_int {
    if stream.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: checked non-NULL.
    unsafe { *stream = (&raw const CONTEXT).cast_mut().cast() };
    ACL_SUCCESS
}

/// `aclrtDestroyStream(aclrtStream stream)`.
#[no_mangle]
pub extern "C" fn aclrtDestroyStream(_stream: *mut c_void) -> c_int {
    ACL_SUCCESS
}

/// `aclrtSynchronizeStream(aclrtStream stream)`: waits for everything submitted so far.
#[no_mangle]
pub extern "C" fn aclrtSynchronizeStream(_stream: *mut c_void) -> c_int {
    worker::synchronize();
    ACL_SUCCESS
}

/// `aclrtGetCurrentContext(aclrtContext* context)`.
///
/// # Safety
/// `context` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetCurrentContext(context: *mut *mut c_void) -> c_int {
    if context.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: checked non-NULL.
    unsafe { *context = (&raw const CONTEXT).cast_mut().cast() };
    ACL_SUCCESS
}

/// `aclrtSetCurrentContext(aclrtContext context)`.
#[no_mangle]
pub extern "C" fn aclrtSetCurrentContext(context: *mut c_void) -> c_int {
    if context.is_null() {
        ACL_ERROR_INVALID_PARAM
    } else {
        ACL_SUCCESS
    }
}

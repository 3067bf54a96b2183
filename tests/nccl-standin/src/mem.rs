//! The only place that touches application buffers (host memory standing in for device memory).

/// Copies `len` bytes from the application's address `addr`.
pub fn read(addr: usize, len: usize) -> Vec<u8> {
    if len == 0 || addr == 0 {
        return vec![0; len];
    }
    let mut v = vec![0u8; len];
    // SAFETY: the application passed `addr` as a buffer of at least `len` bytes valid until the
    // operation completes (NCCL's contract); we copy into our own vector.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
    v
}

/// Copies `data` to the application's address `addr`.
pub fn write(addr: usize, data: &[u8]) {
    if data.is_empty() || addr == 0 {
        return;
    }
    // SAFETY: as in `read`: a writable application buffer of at least `data.len()` bytes; `data` is our
    // own vector, so the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}

/// Copies `dst.len()` bytes from the application's address `addr` into `dst`.
pub fn read_into(addr: usize, dst: &mut [u8]) {
    if dst.is_empty() || addr == 0 {
        return;
    }
    // SAFETY: as in `read`; `dst` is our own buffer, disjoint from application memory.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
}

//! Communicators that are not NCCL's: the LD_PRELOAD shim's HCCL interposition (preload/README.md,
//! "HCCL") opens each HCCL communicator through this entry point, then drives it through the
//! ordinary `ncclProfiler_v6` table (Coll / P2p / KernelCh starts and stops, `finalize`), so the
//! records, the ring, the segments, the op tracking and the `overdue` reports are this plugin's.
//!
//! The only difference from NCCL's `init`: the flags given here (today `FLAG_HCCL`) mark every
//! record of the communicator (`comm_init`, `comm_device`, `coll`, `p2p`, `overdue`,
//! `comm_fini`). Contract: docs/contracts.md, "HCCL source".

use ::core::ffi::{c_char, c_int, c_void};

use comminsight_wire::record::FLAG_HCCL;

use crate::abi::{NcclResult, NCCL_SUCCESS};
use crate::context::with_init_flags;

/// Version of this entry point's contract.
pub const EXTERNAL_ABI: c_int = 1;

/// `comminsight_external_init_v1`: NCCL's v6 `init(ctx, commId, mask, commName, nNodes, nranks,
/// rank, logfn)` without the logger, plus `flags` (record header flags; only `FLAG_HCCL` is
/// accepted, other bits are ignored). `*ctx` is the context to pass to the v6 table's
/// `startEvent` / `finalize` (NULL: not tracked). Always returns `ncclSuccess` (0).
///
/// # Safety
/// As NCCL's `init`: `ctx` writable or NULL, `mask` NULL or a writable int that outlives the
/// communicator, `name` NULL or a NUL-terminated string.
#[no_mangle]
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub unsafe extern "C" fn comminsight_external_init_v1(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    flags: u32,
) -> NcclResult {
    let Some(init) = crate::ncclProfiler_v6.init else {
        return NCCL_SUCCESS;
    };
    let flags = (flags as u16) & FLAG_HCCL;
    // SAFETY: the caller's arguments, forwarded to our own v6 `init` (which catches panics).
    with_init_flags(flags, || unsafe {
        init(ctx, comm_id, mask, name, nnodes, nranks, rank, None)
    })
}

/// `comminsight_external_version`: [`EXTERNAL_ABI`].
#[no_mangle]
pub extern "C" fn comminsight_external_version() -> c_int {
    EXTERNAL_ABI
}

#[cfg(test)]
mod tests {
    use comminsight_wire::record::{Body, FLAG_HCCL, FLAG_INCOMPLETE};

    use crate::context::with_init_flags;
    use crate::testutil::*;

    #[test]
    fn a_flagged_context_flags_every_record_and_others_stay_plain() {
        let (sh, ring) = fixture(small_cfg());
        let hccl = with_init_flags(FLAG_HCCL, || context(sh, 7, 0, 2));
        let nccl = context(sh, 8, 0, 2);
        assert_eq!((hccl.flags, nccl.flags), (FLAG_HCCL, 0));
        for ctx in [&hccl, &nccl] {
            let h = start(sh, ctx, &coll(0, c"AllReduce", 16, 0));
            crate::core::stop_event(sh, h);
        }
        // An op left open: its incomplete record at finalize carries the flag too.
        start(sh, &hccl, &coll(1, c"AllReduce", 16, 1));
        crate::core::end_context(sh, &hccl);
        crate::core::end_context(sh, &nccl);
        let mut seen = 0;
        for r in records(&ring) {
            let hash = match &r.body {
                Body::CommInit(c) => c.comm_hash,
                Body::CommDevice(c) => c.comm_hash,
                Body::Coll(o) => o.comm_hash,
                Body::CommFini(c) => c.comm_hash,
                _ => continue,
            };
            let want = if hash == 7 { FLAG_HCCL } else { 0 };
            assert_eq!(r.flags & FLAG_HCCL, want, "{r:?}");
            if hash == 7 && r.flags & FLAG_INCOMPLETE != 0 {
                seen += 1;
            }
        }
        assert_eq!(seen, 1, "the open HCCL op's incomplete record");
    }
}

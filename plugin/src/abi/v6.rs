//! ABI v6 (NCCL 2.29+): v5 plus copy-engine collective arms; same 112-byte descriptor.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

use super::v5::{
    common_event, descr_rows, Coll, CollApi, GroupApi, KernelCh, KernelLaunch, NetPlugin, P2p,
    P2pApi, ProxyOp, ProxyStep,
};
use super::{CollDescr, Descr, Event, NcclResult, P2pDescr, ProxyOpDescr};

/// `ceColl` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeColl {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub sync_strategy: *const c_char,
    pub intra_batch_sync: u8,
    pub batch_size: u32,
    pub num_batches: u32,
    pub ce_seq_num: u32,
    pub stream: *mut c_void,
}

/// `ceCollSync` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeCollSync {
    pub is_complete: u8,
    pub n_ranks: c_int,
}

/// `ceCollBatch` arm.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeCollBatch {
    pub num_ops: c_int,
    pub total_bytes: usize,
    pub use_intra_sync: u8,
}

/// The anonymous union of `ncclProfilerEventDescr_v6_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union U {
    pub group_api: GroupApi,
    pub coll_api: CollApi,
    pub p2p_api: P2pApi,
    pub kernel_launch: KernelLaunch,
    pub coll: Coll,
    pub p2p: P2p,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pub kernel_ch: KernelCh,
    pub net_plugin: NetPlugin,
    pub ce_coll: CeColl,
    pub ce_coll_sync: CeCollSync,
    pub ce_coll_batch: CeCollBatch,
}

/// `ncclProfilerEventDescr_v6_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DescrV6 {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: U,
}

/// `init` (v6) has the v5 signature.
pub type InitFn = super::v5::InitFn;
/// `startEvent` (v6).
pub type StartFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut DescrV6) -> NcclResult;
/// `ncclProfiler_v6_t`.
pub type ProfilerV6 = super::ProfilerTable<InitFn, StartFn, super::RecordFn>;

descr_rows!(DESCR_V6, "ncclProfilerEventDescr_v6_t", DescrV6, 112, [
    ("ceColl", offset_of!(DescrV6, u), CeColl, 24, 88),
    ("ceColl.seqNumber", offset_of!(DescrV6, u) + offset_of!(CeColl, seq_number), u64, 24, 8),
    ("ceColl.func", offset_of!(DescrV6, u) + offset_of!(CeColl, func), *const c_char, 32, 8),
    ("ceColl.sendBuff", offset_of!(DescrV6, u) + offset_of!(CeColl, send_buff), *const c_void, 40, 8),
    ("ceColl.recvBuff", offset_of!(DescrV6, u) + offset_of!(CeColl, recv_buff), *mut c_void, 48, 8),
    ("ceColl.count", offset_of!(DescrV6, u) + offset_of!(CeColl, count), usize, 56, 8),
    ("ceColl.root", offset_of!(DescrV6, u) + offset_of!(CeColl, root), c_int, 64, 4),
    ("ceColl.datatype", offset_of!(DescrV6, u) + offset_of!(CeColl, datatype), *const c_char, 72, 8),
    ("ceColl.syncStrategy", offset_of!(DescrV6, u) + offset_of!(CeColl, sync_strategy), *const c_char, 80, 8),
    ("ceColl.intraBatchSync", offset_of!(DescrV6, u) + offset_of!(CeColl, intra_batch_sync), u8, 88, 1),
    ("ceColl.batchSize", offset_of!(DescrV6, u) + offset_of!(CeColl, batch_size), u32, 92, 4),
    ("ceColl.numBatches", offset_of!(DescrV6, u) + offset_of!(CeColl, num_batches), u32, 96, 4),
    ("ceColl.ceSeqNum", offset_of!(DescrV6, u) + offset_of!(CeColl, ce_seq_num), u32, 100, 4),
    ("ceColl.stream", offset_of!(DescrV6, u) + offset_of!(CeColl, stream), *mut c_void, 104, 8),
    ("ceCollSync", offset_of!(DescrV6, u), CeCollSync, 24, 8),
    ("ceCollSync.isComplete", offset_of!(DescrV6, u) + offset_of!(CeCollSync, is_complete), u8, 24, 1),
    ("ceCollSync.nRanks", offset_of!(DescrV6, u) + offset_of!(CeCollSync, n_ranks), c_int, 28, 4),
    ("ceCollBatch", offset_of!(DescrV6, u), CeCollBatch, 24, 24),
    ("ceCollBatch.numOps", offset_of!(DescrV6, u) + offset_of!(CeCollBatch, num_ops), c_int, 24, 4),
    ("ceCollBatch.totalBytes", offset_of!(DescrV6, u) + offset_of!(CeCollBatch, total_bytes), usize, 32, 8),
    ("ceCollBatch.useIntraSync", offset_of!(DescrV6, u) + offset_of!(CeCollBatch, use_intra_sync), u8, 40, 1),
]);

super::layout!(PROFILER_V6, "ncclProfiler_v6_t", ProfilerV6, 48, 8, [
    ("name", offset_of!(ProfilerV6, name), *const c_char, 0, 8),
    ("init", offset_of!(ProfilerV6, init), Option<InitFn>, 8, 8),
    ("startEvent", offset_of!(ProfilerV6, start_event), Option<StartFn>, 16, 8),
    ("stopEvent", offset_of!(ProfilerV6, stop_event), Option<super::StopFn>, 24, 8),
    ("recordEventState", offset_of!(ProfilerV6, record_event_state), Option<super::RecordFn>, 32, 8),
    ("finalize", offset_of!(ProfilerV6, finalize), Option<super::FinalizeFn>, 40, 8),
]);

const _: () = assert!(size_of::<U>() == 88);

impl Descr for DescrV6 {
    const ABI: u8 = 6;
    fn type_bits(&self) -> u64 {
        self.type_
    }
    fn parent(&self) -> *mut c_void {
        self.parent_obj
    }
    fn rank(&self) -> c_int {
        self.rank
    }
    fn event(&self) -> Event {
        common_event!(self.type_, &self.u)
    }
}

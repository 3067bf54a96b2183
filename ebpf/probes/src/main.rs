//! CommInsight's BPF programs (see `ebpf/README.md`): ibverbs control-path uprobes, scheduler
//! tracepoints accounting the threads of tracked processes into `THREADS`, and TCP tracepoints.
//! Only processes the agent put into `PIDS` are reported (filtered here, in the kernel).
//!
//! Every program returns 0 and never fails the traced call: a read that faults leaves zeros, a
//! full ring buffer drops the record and counts it (`COUNTS`, `lost`).
#![no_std]
#![no_main]

mod sched;
mod tcp;
mod verbs;

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{HashMap, LruHashMap, PerCpuArray, RingBuf};
use comminsight_ebpf_common::{ProbeCounts, ThreadTimes, Tracked, VerbsEvent, EVENT_ABI};

/// The layout version of `comminsight-ebpf-common` this object was built with.
#[no_mangle]
static ABI_VERSION: u32 = EVENT_ABI;

/// Processes to report, by tgid.
#[map]
static PIDS: HashMap<u32, Tracked> = HashMap::with_max_entries(4096, 0);

/// Scheduler totals per tracked thread, by tid.
#[map]
static THREADS: HashMap<u32, ThreadTimes> = HashMap::with_max_entries(65536, 0);

/// Arguments of an ibverbs call in flight, by `tid << 32 | function`.
#[map]
static VERBS_ENTRY: HashMap<u64, VerbsEvent> = HashMap::with_max_entries(16384, 0);

/// TCP sockets of tracked processes, by kernel socket address -> owner tgid: a state change
/// that runs in softirq context (a SYN-ACK, FIN or RST from the peer) has some other task as
/// `current`, and is reported when its socket is here. Least recently used entries go first.
#[map]
static TCP_SOCKS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(65536, 0);

/// Local ports tracked processes listen on -> owner tgid: a passive open's new socket moves
/// to ESTABLISHED in softirq context and is reported (and added to `TCP_SOCKS`) by its port.
#[map]
static LISTEN_PORTS: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// Records for the agent: ibverbs calls and TCP events.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Hits and lost records, per verbs function (index = function id); index 0 counts the
/// scheduler programs' runs on tracked threads, index 31 TCP.
#[map]
static COUNTS: PerCpuArray<ProbeCounts> = PerCpuArray::with_max_entries(32, 0);

/// Index of the scheduler's counters in `COUNTS`.
const COUNT_SCHED: u32 = 0;
/// Index of the TCP programs' counters in `COUNTS`.
const COUNT_TCP: u32 = 31;

/// The current (tgid, tid).
#[inline(always)]
fn current() -> (u32, u32) {
    let v = bpf_get_current_pid_tgid();
    ((v >> 32) as u32, v as u32)
}

/// The tracking entry of process `tgid`, when it is tracked for `kind`.
#[inline(always)]
fn tracked(tgid: u32, kind: u32) -> bool {
    // SAFETY: the value is only read, and map values stay valid for the program's run.
    match unsafe { PIDS.get(&tgid) } {
        Some(t) => t.kinds & (1 << kind) != 0,
        None => false,
    }
}

/// Count a hit (and a lost record) at `COUNTS[idx]`.
#[inline(always)]
fn count(idx: u32, lost: bool) {
    if let Some(c) = COUNTS.get_ptr_mut(idx) {
        // SAFETY: a per-CPU array slot: only this CPU's program run touches it now.
        unsafe {
            (*c).hits += 1;
            if lost {
                (*c).lost += 1;
            }
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

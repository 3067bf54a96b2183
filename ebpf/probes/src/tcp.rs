//! TCP: every retransmit (the RTO timer runs in softirq context, so the socket's owner is found
//! by the agent from the addresses, not from the current task) and the state changes of the
//! tracked processes' TCP sockets: those that run in a tracked task (connect, listen, close),
//! and those that run in softirq context on a socket a tracked task changed before
//! (`TCP_SOCKS`: ESTABLISHED on the SYN-ACK, CLOSE_WAIT on the peer's FIN, CLOSE on a reset)
//! or on a new socket of a port a tracked task listens on (`LISTEN_PORTS`: a passive open). The
//! event's pid is the owner's.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use aya_ebpf::macros::tracepoint;
use aya_ebpf::programs::TracePointContext;
use comminsight_ebpf_common::{kind, tcp, EventHeader, TcpEvent};

use crate::{count, current, tracked, COUNT_TCP, EVENTS, LISTEN_PORTS, TCP_SOCKS};

const IPPROTO_TCP: u16 = 6;
/// Kernel `TCP_CLOSE` and `LISTEN_PORTS` state numbers.
const TCP_CLOSE: u32 = 7;
const TCP_LISTEN_STATE: u32 = 10;
const AF_INET6: u16 = 10;

/// Read `T` at `off` of the tracepoint record; zero when out of range.
#[inline(always)]
fn at<T: Default>(ctx: &TracePointContext, off: usize) -> T {
    // SAFETY: offsets are those of this kernel's format files (checked by the agent).
    unsafe { ctx.read_at(off) }.unwrap_or_default()
}

#[inline(always)]
fn emit(e: &TcpEvent) {
    let lost = EVENTS.output::<TcpEvent>(e, 0).is_err();
    count(COUNT_TCP, lost);
}

#[inline(always)]
fn header(what: u32) -> EventHeader {
    let (pid, tid) = current();
    EventHeader {
        kind: kind::TCP,
        tid,
        pid,
        what,
        // SAFETY: bpf_ktime_get_ns has no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
    }
}

/// `tcp:tcp_retransmit_skb`: state @24, sport @28, dport @30, family @32, saddr @34, daddr @38,
/// saddr_v6 @42, daddr_v6 @58.
#[tracepoint]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let family: u16 = at(&ctx, 32);
    let mut e = TcpEvent {
        hdr: header(tcp::RETRANSMIT),
        family,
        sport: at(&ctx, 28),
        dport: at(&ctx, 30),
        old_state: at::<i32>(&ctx, 24) as u32,
        ..TcpEvent::default()
    };
    e.new_state = e.old_state;
    if family == AF_INET6 {
        e.saddr = at(&ctx, 42);
        e.daddr = at(&ctx, 58);
    } else {
        let s: [u8; 4] = at(&ctx, 34);
        let d: [u8; 4] = at(&ctx, 38);
        e.saddr[..4].copy_from_slice(&s);
        e.daddr[..4].copy_from_slice(&d);
    }
    emit(&e);
    0
}

/// `sock:inet_sock_set_state`: oldstate @16, newstate @20, sport @24, dport @26, family @28,
/// protocol @30, saddr @32, daddr @36, saddr_v6 @40, daddr_v6 @56.
#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let proto: u16 = at(&ctx, 30);
    if proto != IPPROTO_TCP {
        return 0;
    }
    let sk: u64 = at(&ctx, 8);
    let sport: u16 = at(&ctx, 24);
    let old_state = at::<i32>(&ctx, 16) as u32;
    let new_state = at::<i32>(&ctx, 20) as u32;
    let Some(owner) = owner(sk, sport) else {
        return 0;
    };
    // Follow the socket until it closes; a listener's port while it listens.
    if new_state == TCP_CLOSE {
        let _ = TCP_SOCKS.remove(&sk);
    } else {
        let _ = TCP_SOCKS.insert(&sk, &owner, 0);
    }
    if new_state == TCP_LISTEN_STATE && sport != 0 {
        let _ = LISTEN_PORTS.insert(&u32::from(sport), &owner, 0);
    } else if old_state == TCP_LISTEN_STATE {
        let _ = LISTEN_PORTS.remove(&u32::from(sport));
    }
    let family: u16 = at(&ctx, 28);
    let mut hdr = header(tcp::STATE);
    if hdr.pid != owner {
        hdr.pid = owner;
        hdr.tid = 0;
    }
    let mut e = TcpEvent {
        hdr,
        family,
        sport,
        dport: at(&ctx, 26),
        old_state,
        new_state,
        ..TcpEvent::default()
    };
    if family == AF_INET6 {
        e.saddr = at(&ctx, 40);
        e.daddr = at(&ctx, 56);
    } else {
        let s: [u8; 4] = at(&ctx, 32);
        let d: [u8; 4] = at(&ctx, 36);
        e.saddr[..4].copy_from_slice(&s);
        e.daddr[..4].copy_from_slice(&d);
    }
    emit(&e);
    0
}

/// The tracked process a state change of socket `sk` (local port `sport`) belongs to: the
/// current task's when it is tracked, else the owner `TCP_SOCKS` or `LISTEN_PORTS` remembers.
#[inline(always)]
fn owner(sk: u64, sport: u16) -> Option<u32> {
    let (tgid, _) = current();
    if tracked(tgid, kind::TCP) {
        return Some(tgid);
    }
    // SAFETY: the values are only read, and map values stay valid for the program's run.
    if let Some(o) = unsafe { TCP_SOCKS.get(&sk) } {
        return Some(*o);
    }
    // SAFETY: as above.
    unsafe { LISTEN_PORTS.get(&u32::from(sport)) }.copied()
}

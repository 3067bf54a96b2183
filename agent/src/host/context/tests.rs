use comminsight_wire::host::{qp_event, qp_state, thread_source, thread_state};
use comminsight_wire::record::{Body, HostPort, HostQp, HostTcp, HostThread, Record};

use super::*;

fn host_id() -> StreamId {
    StreamId::new("j", "h", "host-9")
}

fn feed(h: &mut HostContext, bodies: Vec<Body>) {
    let id = host_id();
    let align = Alignment {
        offset_ns: 1_000,
        err_ns: 0,
    };
    for b in bodies {
        h.apply(&id, &Record::new(b).body, &align, &mut Vec::new());
    }
}

fn thread(pid: u32, tid: u32, end_s: u64, state: u8, on: u64, run: u64, blk: u64) -> Body {
    Body::Thread(HostThread {
        time_ns: end_s * 1_000_000_000,
        interval_ns: 1_000_000_000,
        on_cpu_ns: on,
        runnable_ns: run,
        blocked_ns: blk,
        state,
        state_since_ns: 2_000_000_000,
        pid,
        tid,
        source: thread_source::EBPF,
        comm: "python3".into(),
        syscall: if state == thread_state::BLOCKED {
            "futex".into()
        } else {
            "".into()
        },
        ..HostThread::default()
    })
}

#[test]
fn thread_view_puts_the_main_thread_first_with_its_shares() {
    let mut h = HostContext::default();
    feed(
        &mut h,
        vec![
            thread(10, 11, 5, thread_state::ON_CPU, 900_000_000, 0, 100_000_000),
            thread(10, 10, 5, thread_state::BLOCKED, 0, 0, 1_000_000_000),
            thread(
                20,
                20,
                5,
                thread_state::RUNNABLE,
                400_000_000,
                600_000_000,
                0,
            ),
        ],
    );
    let v = h.view("j", "h", 10, 0).unwrap();
    assert_eq!(v.threads[0].tid, 10);
    assert_eq!(v.threads[0].state, "blocked");
    assert_eq!(v.threads[0].syscall, "futex");
    assert_eq!(v.threads[0].since_us, 2_000_001);
    assert_eq!(v.threads[0].last.blocked_pct, 100.0);
    assert_eq!(v.threads[1].last.on_cpu_pct, 90.0);
    assert_eq!(v.total.on_cpu_pct, 45.0);
    let r = h.view("j", "h", 20, 5).unwrap();
    assert_eq!(r.threads[0].last.runnable_pct, 60.0);
    assert_eq!(r.threads[0].since_us, 2_000_006);
    assert!(h.view("j", "h", 30, 0).is_none());
    assert!(h.view("other", "h", 10, 0).is_none());
    h.forget_proc("j", "h", 10);
    assert!(h.view("j", "h", 10, 0).is_none());
}

fn qp(event: u8, old: u8, new: u8, t_s: u64) -> Body {
    Body::Qp(HostQp {
        time_ns: t_s * 1_000_000_000,
        pid: 10,
        qp_num: 0x1a2b,
        dest_qp_num: if new == 2 { 0x77 } else { 0 },
        event,
        old_state: old,
        new_state: new,
        port: 1,
        device: "mlx5_0".into(),
        ..HostQp::default()
    })
}

#[test]
fn qp_history_and_error_flag() {
    let mut h = HostContext::default();
    feed(
        &mut h,
        vec![
            qp(qp_event::CREATE, qp_state::UNKNOWN, 0, 1),
            qp(qp_event::MODIFY, 0, 1, 2),
            qp(qp_event::MODIFY, 1, 2, 3),
            qp(qp_event::MODIFY, 2, 3, 4),
            qp(qp_event::ERROR, 3, qp_state::ERR, 5),
            qp(qp_event::DESTROY, qp_state::ERR, qp_state::UNKNOWN, 6),
        ],
    );
    let v = h.view("j", "h", 10, 0).unwrap();
    let q = &v.qps[0];
    let states: Vec<&str> = q.history.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(states, ["RESET", "INIT", "RTR", "RTS", "ERR"]);
    assert!(q.errored && q.destroyed);
    assert_eq!(q.dest_qp_num, 0x77);
    assert_eq!(q.state, "ERR");
    assert_eq!(q.created_us, 1_000_001);
}

#[test]
fn tcp_retransmits_add_up_per_connection() {
    let mut h = HostContext::default();
    let addr = |last: u8| {
        std::net::Ipv4Addr::new(10, 9, 0, last)
            .to_ipv6_mapped()
            .octets()
    };
    let rec = |n: u32, t_s: u64| {
        Body::Tcp(HostTcp {
            time_ns: t_s * 1_000_000_000,
            interval_ns: 1_000_000_000,
            pid: 10,
            retransmits: n,
            sport: 5000,
            dport: 6000,
            family: 4,
            saddr: addr(1),
            daddr: addr(2),
            ..HostTcp::default()
        })
    };
    feed(&mut h, vec![rec(3, 3), rec(4, 3), rec(0, 5), rec(6, 9)]);
    let v = h.view("j", "h", 10, 0).unwrap();
    assert_eq!(v.tcp.len(), 1);
    assert_eq!(v.tcp[0].retransmits, 13);
    assert_eq!(v.tcp[0].local, "10.9.0.1:5000");
    assert_eq!(v.tcp[0].remote, "10.9.0.2:6000");
    // Over a window: the records that end in it.
    let w = |a: u64, b: u64| h.tcp_retransmits_window("j", "h", 10, a * 1_000_000, b * 1_000_000);
    let conn = |n: u64| vec![("10.9.0.1:5000".to_string(), "10.9.0.2:6000".to_string(), n)];
    assert_eq!(w(0, 4), Some(conn(7)));
    assert_eq!(w(4, 10), Some(conn(6)));
    assert_eq!(w(4, 8), Some(vec![]));
    assert_eq!(h.tcp_retransmits_window("j", "h", 11, 0, u64::MAX), None);
}

#[test]
fn threads_are_bounded_and_the_main_thread_is_kept() {
    let mut h = HostContext::default();
    let mut bodies = vec![thread(10, 10, 1, thread_state::BLOCKED, 0, 0, 1)];
    for tid in 0..(MAX_THREADS as u32 + 10) {
        bodies.push(thread(
            10,
            1000 + tid,
            1,
            thread_state::ON_CPU,
            u64::from(tid) + 1,
            0,
            0,
        ));
    }
    feed(&mut h, bodies);
    let p = &h.procs[&("j".to_string(), "h".to_string(), 10)];
    assert_eq!(p.threads.len(), MAX_THREADS);
    assert!(p.threads.contains_key(&10));
    let back: HostContext = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
    assert_eq!(back, h);
}

fn port(device: &str, t_s: u64, errors: u64, link_downed: u32) -> Body {
    Body::Port(HostPort {
        time_ns: t_s * 1_000_000_000,
        interval_ns: 1_000_000_000,
        tx_bytes: 100,
        errors,
        link_downed,
        port: if device.starts_with("mlx") { 1 } else { 0 },
        up: 1,
        device: device.into(),
        ..HostPort::default()
    })
}

/// Feed `bodies` as the host stream of `job` and return the samples made, by pid.
fn feed_job(h: &mut HostContext, job: &str, bodies: Vec<Body>) -> Vec<(u32, HostSample)> {
    let id = StreamId::new(job, "h", "host-9");
    let mut out = Vec::new();
    for b in bodies {
        h.apply(&id, &Record::new(b).body, &Alignment::default(), &mut out);
    }
    out
}

#[test]
fn port_errors_go_to_the_ranks_whose_queue_pairs_use_the_port() {
    let mut h = HostContext::default();
    let on = thread_state::ON_CPU;
    // Rank processes 10 (a QP on mlx5_0/1) and 20 (a QP on mlx5_1/1) of job j.
    let mut other_qp = qp(qp_event::CREATE, qp_state::UNKNOWN, 0, 1);
    if let Body::Qp(q) = &mut other_qp {
        q.pid = 20;
        q.qp_num = 0x99;
        q.device = "mlx5_1".into();
    }
    let samples = feed_job(
        &mut h,
        "j",
        vec![
            thread(10, 10, 1, on, 1, 0, 0),
            thread(20, 20, 1, on, 1, 0, 0),
            qp(qp_event::CREATE, qp_state::UNKNOWN, 0, 1),
            other_qp,
            port("mlx5_0", 2, 0, 0),
            port("mlx5_0", 3, 40, 1),
            port("eth0", 3, 7, 0),
        ],
    );
    let errs: Vec<u32> = samples
        .iter()
        .filter(|(_, s)| matches!(s.what, SampleKind::PortErrors { .. }))
        .map(|(pid, _)| *pid)
        .collect();
    // mlx5_0's errors go to pid 10 only; eth0 carries no QP of the job: nobody's.
    assert_eq!(errs, [10]);
    let w = h.port_errors_window("j", "h", 10, 0, u64::MAX).unwrap();
    assert_eq!((w[0].errors, w[0].link_downed), (40, 1));
    assert!(h
        .port_errors_window("j", "h", 20, 0, u64::MAX)
        .unwrap()
        .is_empty());
}

#[test]
fn without_queue_pairs_a_port_errs_for_every_rank_of_the_host_but_not_lo() {
    let mut h = HostContext::default();
    let on = thread_state::ON_CPU;
    let mk = || {
        vec![
            thread(10, 10, 1, on, 1, 0, 0),
            thread(20, 20, 1, on, 1, 0, 0),
            port("eth0", 3, 5, 0),
            port("lo", 3, 9, 0),
        ]
    };
    let a = feed_job(&mut h, "j", mk());
    let pids: Vec<u32> = a
        .iter()
        .filter(|(_, s)| matches!(s.what, SampleKind::PortErrors { .. }))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(pids, [10, 20]);
    // The same sample in a second job's host stream: its ranks get it, the port counts it once.
    let mut b = mk();
    b.retain(|x| matches!(x, Body::Port(_)));
    let k = feed_job(&mut h, "k", b);
    assert!(k.is_empty(), "job k has no rank process on h yet");
    let eth0 = h
        .ports("h")
        .into_iter()
        .find(|p| p.device == "eth0")
        .unwrap();
    assert_eq!((eth0.errors, eth0.tx_bytes), (5, 100));
}

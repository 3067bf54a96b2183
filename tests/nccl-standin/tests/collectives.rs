//! Multi-process tests: numeric correctness of every collective and send/recv over 8 rank processes,
//! split, abort unblocking a hung op, a mismatched collective stalling (not crashing).

mod common;

use common::*;
use nccl::ffi::{
    ncclAllGather, ncclAllReduce, ncclAlltoAll, ncclBroadcast, ncclCommAbort, ncclCommCount,
    ncclCommGetAsyncError, ncclCommSplit, ncclCommUserRank, ncclGroupEnd, ncclGroupStart,
    ncclReduce, ncclReduceScatter, ncclTestbedCommHash,
};
use std::time::Duration;

#[test]
fn child_entry() {
    let Ok(s) = std::env::var("NCCL_STANDIN_CHILD") else {
        return;
    };
    let code = match s.as_str() {
        "colls" => colls(),
        "p2p" => p2p(),
        "split" => split(),
        "abort" => abort(),
        "mismatch" => mismatch(),
        "nonblocking" => nonblocking(),
        "deadpeer" => deadpeer(),
        "grouperr" => grouperr(),
        _ => 99,
    };
    std::process::exit(code);
}

fn colls() -> i32 {
    let m = me();
    let (r, n) = (m.rank as usize, m.nranks as usize);
    let c = init(m.ids[0], n as i32, r as i32);
    let nul = std::ptr::null_mut();
    // AllReduce f32 sum, several frames per segment.
    let cnt = 100_003;
    let s1: Vec<f32> = (0..cnt).map(|i| (r * 1000 + i % 1000) as f32).collect();
    let mut r1 = vec![0f32; cnt];
    allreduce(c, &s1, &mut r1, FLOAT32, SUM);
    // AllReduce f64 avg, in place.
    let mut io2: Vec<f64> = (0..1000).map(|i| r as f64 + i as f64).collect();
    // SAFETY: in-place buffer lives until sync.
    check(
        unsafe {
            ncclAllReduce(
                io2.as_ptr().cast(),
                io2.as_mut_ptr().cast(),
                io2.len(),
                FLOAT64,
                AVG,
                c,
                nul,
            )
        },
        "avg",
    );
    // AllReduce i32 max, i64 prod, u8 min.
    let s3: Vec<i32> = (0..997).map(|i| ((r * 7 + i) % 13) as i32).collect();
    let mut r3 = vec![0i32; 997];
    allreduce(c, &s3, &mut r3, INT32, MAX);
    let s4: Vec<i64> = (0..64).map(|i| ((r + i) % 3 + 1) as i64).collect();
    let mut r4 = vec![0i64; 64];
    allreduce(c, &s4, &mut r4, INT64, PROD);
    let s5: Vec<u8> = (0..300).map(|i| ((r * 31 + i) % 251) as u8).collect();
    let mut r5 = vec![0u8; 300];
    allreduce(c, &s5, &mut r5, UINT8, MIN);
    // Broadcast from root 3 (multi-chunk pipeline).
    let bc = 50_000;
    let s6: Vec<f32> = if r == 3 {
        (0..bc).map(|i| i as f32 * 0.5).collect()
    } else {
        vec![-1.0; bc]
    };
    let mut r6 = vec![0f32; bc];
    // SAFETY: buffers live until sync.
    check(
        unsafe {
            ncclBroadcast(
                s6.as_ptr().cast(),
                r6.as_mut_ptr().cast(),
                bc,
                FLOAT32,
                3,
                c,
                nul,
            )
        },
        "bcast",
    );
    // Reduce to root 5.
    let s7: Vec<i64> = (0..40_000).map(|i| ((r + 1) * i) as i64).collect();
    let mut r7 = vec![0i64; 40_000];
    // SAFETY: buffers live until sync.
    check(
        unsafe {
            ncclReduce(
                s7.as_ptr().cast(),
                r7.as_mut_ptr().cast(),
                s7.len(),
                INT64,
                SUM,
                5,
                c,
                nul,
            )
        },
        "reduce",
    );
    // AllGather.
    let s8: Vec<i32> = (0..1001).map(|i| (r * 10_000 + i) as i32).collect();
    let mut r8 = vec![0i32; 1001 * n];
    // SAFETY: buffers live until sync.
    check(
        unsafe {
            ncclAllGather(
                s8.as_ptr().cast(),
                r8.as_mut_ptr().cast(),
                1001,
                INT32,
                c,
                nul,
            )
        },
        "allgather",
    );
    // ReduceScatter.
    let rc = 777;
    let s9: Vec<f64> = (0..rc * n).map(|j| (r + j) as f64).collect();
    let mut r9 = vec![0f64; rc];
    // SAFETY: buffers live until sync.
    check(
        unsafe {
            ncclReduceScatter(
                s9.as_ptr().cast(),
                r9.as_mut_ptr().cast(),
                rc,
                FLOAT64,
                SUM,
                c,
                nul,
            )
        },
        "rs",
    );
    // AlltoAll.
    let blk = 333;
    let s10: Vec<i32> = (0..blk * n)
        .map(|j| (r * 1_000_000 + (j / blk) * 1000 + j % blk) as i32)
        .collect();
    let mut r10 = vec![0i32; blk * n];
    // SAFETY: buffers live until sync.
    check(
        unsafe {
            ncclAlltoAll(
                s10.as_ptr().cast(),
                r10.as_mut_ptr().cast(),
                blk,
                INT32,
                c,
                nul,
            )
        },
        "a2a",
    );
    sync(c);

    for (i, v) in r1.iter().enumerate() {
        assert_eq!(
            *v,
            (1000 * (n * (n - 1) / 2) + n * (i % 1000)) as f32,
            "allreduce sum [{i}]"
        );
    }
    for (i, v) in io2.iter().enumerate() {
        assert_eq!(*v, (n - 1) as f64 / 2.0 + i as f64, "avg [{i}]");
    }
    for (i, v) in r3.iter().enumerate() {
        assert_eq!(
            *v,
            (0..n).map(|q| ((q * 7 + i) % 13) as i32).max().unwrap(),
            "max [{i}]"
        );
    }
    for (i, v) in r4.iter().enumerate() {
        assert_eq!(
            *v,
            (0..n).map(|q| ((q + i) % 3 + 1) as i64).product::<i64>(),
            "prod [{i}]"
        );
    }
    for (i, v) in r5.iter().enumerate() {
        assert_eq!(
            *v,
            (0..n).map(|q| ((q * 31 + i) % 251) as u8).min().unwrap(),
            "min [{i}]"
        );
    }
    for (i, v) in r6.iter().enumerate() {
        assert_eq!(*v, i as f32 * 0.5, "bcast [{i}]");
    }
    if r == 5 {
        for (i, v) in r7.iter().enumerate() {
            assert_eq!(*v, (n * (n + 1) / 2 * i) as i64, "reduce [{i}]");
        }
    } else {
        assert!(r7.iter().all(|v| *v == 0), "reduce wrote a non-root buffer");
    }
    for (j, v) in r8.iter().enumerate() {
        assert_eq!(
            *v,
            ((j / 1001) * 10_000 + j % 1001) as i32,
            "allgather [{j}]"
        );
    }
    for (i, v) in r9.iter().enumerate() {
        assert_eq!(
            *v,
            (n * (n - 1) / 2 + n * (r * rc + i)) as f64,
            "reducescatter [{i}]"
        );
    }
    for (j, v) in r10.iter().enumerate() {
        assert_eq!(
            *v,
            ((j / blk) * 1_000_000 + r * 1000 + j % blk) as i32,
            "alltoall [{j}]"
        );
    }
    destroy(c);
    println!("COLLS_OK");
    0
}

fn p2p() -> i32 {
    let m = me();
    let (r, n) = (m.rank, m.nranks);
    let c = init(m.ids[0], n, r);
    // Ring shift in a group (would deadlock without grouping for rendezvous sends).
    let s: Vec<f32> = (0..70_000).map(|i| (r * 100_000 + i) as f32).collect();
    let mut d = vec![0f32; 70_000];
    check(ncclGroupStart(), "gs");
    send(c, &s, FLOAT32, (r + 1) % n);
    recv(c, &mut d, FLOAT32, (r + n - 1) % n);
    check(ncclGroupEnd(), "ge");
    // All pairs, sizes depend on the pair, plus a send to self.
    let outs: Vec<Vec<i32>> = (0..n)
        .map(|p| (0..(r + p + 1)).map(|i| r * 1000 + p * 10 + i).collect())
        .collect();
    let mut ins: Vec<Vec<i32>> = (0..n).map(|p| vec![0; (r + p + 1) as usize]).collect();
    check(ncclGroupStart(), "gs");
    for p in 0..n {
        send(c, &outs[p as usize], INT32, p);
        recv(c, &mut ins[p as usize], INT32, p);
    }
    check(ncclGroupEnd(), "ge");
    sync(c);
    let prev = (r + n - 1) % n;
    for (i, v) in d.iter().enumerate() {
        assert_eq!(*v, (prev * 100_000 + i as i32) as f32, "ring [{i}]");
    }
    for p in 0..n {
        let want: Vec<i32> = (0..(r + p + 1)).map(|i| p * 1000 + r * 10 + i).collect();
        assert_eq!(ins[p as usize], want, "from {p}");
    }
    destroy(c);
    println!("P2P_OK");
    0
}

fn split() -> i32 {
    let m = me();
    let (r, n) = (m.rank, m.nranks);
    let c = init(m.ids[0], n, r);
    let color = if r == n - 1 { -1 } else { r % 2 };
    let mut child: CommT = std::ptr::null();
    // SAFETY: valid comm and out-pointer; NULL config inherits.
    check(
        unsafe { ncclCommSplit(c, color, -r, &mut child, std::ptr::null_mut()) },
        "split",
    );
    if color < 0 {
        assert!(child.is_null(), "NOCOLOR must yield NULL");
        println!("NOCOLOR");
        destroy(c);
        return 0;
    }
    let members: Vec<i32> = {
        let mut v: Vec<i32> = (0..n - 1).filter(|q| q % 2 == color).collect();
        v.sort_by_key(|q| -q);
        v
    };
    let (mut cnt, mut urank) = (0, 0);
    // SAFETY: valid comm and out-pointers.
    unsafe {
        check(ncclCommCount(child, &mut cnt), "count");
        check(ncclCommUserRank(child, &mut urank), "rank");
    }
    assert_eq!(cnt as usize, members.len());
    assert_eq!(
        urank,
        members.iter().position(|q| *q == r).unwrap() as i32,
        "key orders ranks"
    );
    let s = vec![r as f64; 10];
    let mut d = vec![0f64; 10];
    allreduce(child, &s, &mut d, FLOAT64, SUM);
    sync(child);
    assert!(
        d.iter().all(|v| *v == members.iter().sum::<i32>() as f64),
        "{d:?}"
    );
    // SAFETY: valid comms.
    let (hp, hc) = unsafe { (ncclTestbedCommHash(c), ncclTestbedCommHash(child)) };
    assert_ne!(hp, hc);
    println!("HASH {color} {hc:x}");
    destroy(child);
    destroy(c);
    0
}

fn abort() -> i32 {
    let m = me();
    let c = init(m.ids[0], 2, m.rank);
    if m.rank == 1 {
        // Never posts the matching receive; stays alive until rank 0 is done.
        let done = m.dir.join("done");
        let t = std::time::Instant::now();
        while !done.exists() && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        destroy(c);
        return 0;
    }
    let s = vec![1f32; 16];
    send(c, &s, FLOAT32, 1);
    let p = SendPtr(c);
    let rx = finishes_within(Duration::ZERO, move || {
        let p = p;
        sync(p.0);
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(700)).is_err(),
        "send without a receiver must not complete"
    );
    // SAFETY: valid comm, freed once.
    check(unsafe { ncclCommAbort(c) }, "abort");
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "abort must unblock the hung op"
    );
    std::fs::write(m.dir.join("done"), b"").unwrap();
    println!("ABORT_OK");
    0
}

fn mismatch() -> i32 {
    let m = me();
    let c = init(m.ids[0], 2, m.rank);
    let cnt = if m.rank == 0 { 1000 } else { 2000 };
    let s = vec![1f32; cnt];
    let mut d = vec![0f32; cnt];
    allreduce(c, &s, &mut d, FLOAT32, SUM);
    let p = SendPtr(c);
    let rx = finishes_within(Duration::ZERO, move || {
        let p = p;
        sync(p.0);
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(1500)).is_err(),
        "mismatched collective must stall"
    );
    println!("STALLED");
    // SAFETY: valid comm, freed once.
    check(unsafe { ncclCommAbort(c) }, "abort");
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "abort must unblock the stalled op"
    );
    drop(d);
    0
}

fn nonblocking() -> i32 {
    let m = me();
    let mut cfg = nccl::types::Config::initializer();
    cfg.blocking = 0;
    cfg.commName = c"nb-comm".as_ptr();
    let (rc, c) = init_config(m.ids[0], m.nranks, m.rank, &mut cfg);
    assert!(
        rc == 7 || rc == 0,
        "nonblocking init returns ncclInProgress (or success), got {rc}"
    );
    assert!(!c.is_null());
    let mut st = 7;
    while st == 7 {
        // SAFETY: valid comm and out-pointer.
        check(unsafe { ncclCommGetAsyncError(c, &mut st) }, "async");
        std::thread::yield_now();
    }
    assert_eq!(st, 0);
    let s = [2i32; 5];
    let mut d = vec![0i32; 5];
    // SAFETY: buffers live until the sync below.
    let rc = unsafe {
        ncclAllReduce(
            s.as_ptr().cast(),
            d.as_mut_ptr().cast(),
            5,
            INT32,
            SUM,
            c,
            std::ptr::null_mut(),
        )
    };
    assert!(
        rc == 7 || rc == 0,
        "nonblocking launch returns ncclInProgress, got {rc}"
    );
    let mut st = 7;
    while st == 7 {
        // SAFETY: valid comm and out-pointer.
        check(unsafe { ncclCommGetAsyncError(c, &mut st) }, "async");
        std::thread::yield_now();
    }
    assert_eq!(st, 0);
    sync(c);
    assert_eq!(d, vec![2 * m.nranks; 5]);
    destroy(c);
    0
}

fn deadpeer() -> i32 {
    let m = me();
    let c = init(m.ids[0], 2, m.rank);
    let s = vec![1f32; 1000];
    let mut d = vec![0f32; 1000];
    allreduce(c, &s, &mut d, FLOAT32, SUM);
    sync(c);
    if m.rank == 1 {
        std::process::exit(0); // dies without destroying: its sockets close
    }
    allreduce(c, &s, &mut d, FLOAT32, SUM);
    let t = std::time::Instant::now();
    let mut st = 0;
    while st == 0 && t.elapsed() < Duration::from_secs(30) {
        // SAFETY: valid comm and out-pointer.
        check(unsafe { ncclCommGetAsyncError(c, &mut st) }, "async");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(st, 6, "ncclRemoteError after the remote peer died");
    // SAFETY: valid comm, freed once.
    check(unsafe { ncclCommAbort(c) }, "abort");
    println!("REMOTE_ERROR_OK");
    0
}

fn grouperr() -> i32 {
    let m = me();
    let c = init(m.ids[0], 1, 0);
    let s = vec![1f32; 4];
    let mut d = vec![0f32; 4];
    check(ncclGroupStart(), "gs");
    allreduce(c, &s, &mut d, FLOAT32, SUM);
    // SAFETY: valid comm; invalid peer on purpose.
    let rc =
        unsafe { nccl::ffi::ncclSend(s.as_ptr().cast(), 4, FLOAT32, 5, c, std::ptr::null_mut()) };
    assert_eq!(rc, 4, "invalid peer is ncclInvalidArgument");
    assert_eq!(ncclGroupEnd(), 4, "the group fails as a whole");
    sync(c);
    assert_eq!(d, vec![0f32; 4], "nothing of the failed group ran");
    allreduce(c, &s, &mut d, FLOAT32, SUM);
    sync(c);
    assert_eq!(d, s, "a single-rank allreduce copies");
    destroy(c);
    0
}

fn none(_: usize) -> Vec<(String, String)> {
    Vec::new()
}

#[test]
fn every_collective_is_numerically_right_over_8_processes() {
    let dir = scratch("colls");
    let mut r = Ranks::spawn("colls", 8, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(180));
}

#[test]
fn grouped_send_recv_moves_the_right_bytes_over_8_processes() {
    let dir = scratch("p2p");
    let mut r = Ranks::spawn("p2p", 8, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(180));
}

#[test]
fn split_groups_by_color_orders_by_key_and_nocolor_gets_null() {
    let dir = scratch("split");
    let mut r = Ranks::spawn("split", 8, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(120));
    let mut hashes = std::collections::HashMap::new();
    for q in 0..8 {
        for l in r
            .out(q)
            .lines()
            .filter_map(|l| l.find("HASH ").map(|i| &l[i..]))
        {
            let mut it = l.split_whitespace().skip(1);
            let (color, h) = (
                it.next().unwrap().to_string(),
                it.next().unwrap().to_string(),
            );
            hashes
                .entry(color)
                .or_insert_with(std::collections::HashSet::new)
                .insert(h);
        }
    }
    assert_eq!(hashes.len(), 2, "{hashes:?}");
    assert!(
        hashes.values().all(|s| s.len() == 1),
        "one hash per color: {hashes:?}"
    );
    assert!(r.out(7).contains("NOCOLOR"));
}

#[test]
fn abort_unblocks_a_send_whose_receiver_never_posts() {
    let dir = scratch("abort");
    let mut r = Ranks::spawn("abort", 2, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(90));
    assert!(r.out(0).contains("ABORT_OK"));
}

#[test]
fn mismatched_collective_stalls_and_warns_instead_of_crashing() {
    let dir = scratch("mismatch");
    let env = [("NCCL_DEBUG", "WARN".to_string())];
    let mut r = Ranks::spawn("mismatch", 2, &[new_id_hex()], &dir, &env, &none);
    r.expect_success(Duration::from_secs(90));
    assert!(r.out(0).contains("STALLED") && r.out(1).contains("STALLED"));
    let warned = (0..2)
        .filter(|q| r.err(*q).contains("mismatched operation"))
        .count();
    assert!(
        warned >= 1,
        "a WARN line names the mismatch:\n{}\n{}",
        r.err(0),
        r.err(1)
    );
    for q in 0..2 {
        assert!(
            r.err(q).matches("mismatched operation").count() <= 1,
            "WARN once per mailbox"
        );
    }
}

#[test]
fn nonblocking_init_reports_in_progress_then_success() {
    let dir = scratch("nb");
    let mut r = Ranks::spawn("nonblocking", 4, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(90));
}

#[test]
fn a_dead_peer_on_another_host_becomes_an_async_remote_error() {
    let dir = scratch("deadpeer");
    let hosts = |r: usize| vec![("COMMINSIGHT_TESTBED_HOST".to_string(), format!("host{r}"))];
    let mut r = Ranks::spawn("deadpeer", 2, &[new_id_hex()], &dir, &[], &hosts);
    r.expect_success(Duration::from_secs(90));
    assert!(r.out(0).contains("REMOTE_ERROR_OK"));
}

#[test]
fn an_error_inside_a_group_fails_the_group_end_and_drops_the_group() {
    let dir = scratch("grouperr");
    let mut r = Ranks::spawn("grouperr", 1, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(60));
}

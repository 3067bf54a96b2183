//! `ncclTestbedLastRecvTimes` (the stand-in for a MoE kernel's per-peer spin timer) over 4 rank
//! processes: rank 2 enters the all-to-all 400 ms late, so every other rank waited about that
//! long for rank 2's data and little for the rest; rank 2 found everyone's data already there.

mod common;

use common::*;
use nccl::ffi::{ncclAlltoAll, ncclTestbedLastRecvTimes};
use std::time::Duration;

const LATE: usize = 2;
const LATE_MS: u64 = 400;

#[test]
fn child_entry() {
    let Ok(s) = std::env::var("NCCL_STANDIN_CHILD") else {
        return;
    };
    let code = match s.as_str() {
        "late_sender" => late_sender(),
        _ => 99,
    };
    std::process::exit(code);
}

fn late_sender() -> i32 {
    let m = me();
    let (r, n) = (m.rank as usize, m.nranks as usize);
    let c = init(m.ids[0], n as i32, r as i32);
    let mut out = vec![u64::MAX; n];
    // SAFETY: valid comm and n writable values; no all-to-all yet.
    let none = unsafe { ncclTestbedLastRecvTimes(c, out.as_mut_ptr(), n as i32) };
    assert_eq!(none, -1);
    if r == LATE {
        std::thread::sleep(Duration::from_millis(LATE_MS));
    }
    let blk = 4096;
    let s: Vec<i32> = (0..blk * n).map(|i| (r * 100_000 + i) as i32).collect();
    let mut d = vec![0i32; blk * n];
    // SAFETY: buffers live until the sync below.
    check(
        unsafe {
            ncclAlltoAll(
                s.as_ptr().cast(),
                d.as_mut_ptr().cast(),
                blk,
                INT32,
                c,
                std::ptr::null_mut(),
            )
        },
        "a2a",
    );
    sync(c);
    // SAFETY: valid comm and n writable values.
    let k = unsafe { ncclTestbedLastRecvTimes(c, out.as_mut_ptr(), n as i32) };
    assert_eq!(k, n as i32);
    let ms: Vec<u64> = out.iter().map(|ns| ns / 1_000_000).collect();
    println!("rank {r}: waited (ms) {ms:?}");
    assert_eq!(out[r], 0, "no wait on itself");
    for (j, &w) in ms.iter().enumerate() {
        if r != LATE && j == LATE {
            assert!(w >= LATE_MS / 2, "rank {r} waited {w} ms for the late rank");
        } else {
            assert!(w < LATE_MS / 2, "rank {r} waited {w} ms for rank {j}");
        }
    }
    destroy(c);
    0
}

#[test]
fn each_rank_waited_for_the_late_senders_data_only() {
    let dir = scratch("recv_times");
    let none = |_: usize| Vec::new();
    let mut r = Ranks::spawn("late_sender", 4, &[new_id_hex()], &dir, &[], &none);
    r.expect_success(Duration::from_secs(120));
}

//! Completion logic, ordinals, drops and finalize sweeps.

use super::*;
use crate::abi::{EV_COLL, ST_KERNEL_CH_STOP};
use crate::core::stop_event;
use crate::testutil::*;
use comminsight_wire::record::{Body, Record};

fn ops(recs: &[Record]) -> Vec<(OpRecord, bool, u16)> {
    recs.iter()
        .filter_map(|r| match &r.body {
            Body::Coll(o) => Some((o.clone(), false, r.flags)),
            Body::P2p(o) => Some((o.clone(), true, r.flags)),
            _ => None,
        })
        .collect()
}

#[test]
fn coll_stopped_before_its_kernel_channels_completes_at_the_last_channel_stop() {
    let (sh, ring) = fixture(small_cfg());
    let ctx = context(sh, 0xabc, 3, 8);
    records(&ring);
    let c = start(sh, &ctx, &coll(41, c"AllReduce", 1024, 2));
    assert!(!c.is_null());
    stop_event(sh, c);
    assert!(ops(&records(&ring)).is_empty(), "enqueued is not complete");
    let k0 = start(sh, &ctx, &kernel_ch(c, 0, 1_000));
    let k1 = start(sh, &ctx, &kernel_ch(c, 1, 900));
    record(sh, k0, ST_KERNEL_CH_STOP, 5_000);
    record(sh, k1, ST_KERNEL_CH_STOP, 6_000);
    stop_event(sh, k0);
    assert!(ops(&records(&ring)).is_empty(), "one channel still running");
    stop_event(sh, k1);
    let got = ops(&records(&ring));
    assert_eq!(got.len(), 1);
    let (o, p2p, flags) = &got[0];
    assert!(!p2p);
    assert_eq!(*flags, 0);
    assert_eq!(o.comm_hash, 0xabc);
    assert_eq!(o.rank, 3);
    assert_eq!(o.coll_sn, 41);
    assert_eq!(o.coll_local_sn, 0);
    assert_eq!(o.func, Func::ALL_REDUCE);
    assert_eq!(o.bytes, 4096);
    assert_eq!(o.algo.name(), "RING");
    assert_eq!(o.proto.name(), "SIMPLE");
    assert_eq!((o.nchannels, o.channels_done, o.nwarps), (2, 2, 8));
    assert_eq!(o.timing, Timing::KernelGpu);
    assert_eq!((o.gpu_start_ns, o.gpu_end_ns), (900, 6_000));
    assert!(o.enqueue_ns <= o.start_ns && o.start_ns <= o.end_ns);
    assert_eq!(live(sh), 0);
    // Every handle of the op is stale now.
    let before = sh.counters.events_ignored.load(Ordering::Relaxed);
    stop_event(sh, c);
    stop_event(sh, k1);
    assert_eq!(
        sh.counters.events_ignored.load(Ordering::Relaxed),
        before + 2
    );
}

#[test]
fn coll_stopped_after_its_kernel_channels_completes_at_coll_stop() {
    let (sh, ring) = fixture(small_cfg());
    let ctx = context(sh, 1, 0, 2);
    let c = start(sh, &ctx, &coll(0, c"AllGather", 10, 1));
    let k = start(sh, &ctx, &kernel_ch(c, 5, 0));
    stop_event(sh, k);
    assert!(ops(&records(&ring)).is_empty());
    stop_event(sh, c);
    let got = ops(&records(&ring));
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0.timing,
        Timing::KernelCpu,
        "no pTimers: host KernelCh times"
    );
    assert_eq!(got[0].0.channels_done, 1);
}

#[test]
fn without_kernel_ch_in_the_mask_coll_stop_completes() {
    let (sh, ring) = fixture(small_cfg());
    sh.set_mask(EV_COLL as u32);
    let ctx = context(sh, 1, 0, 2);
    let c = start(sh, &ctx, &coll(7, c"Broadcast", 10, 4));
    stop_event(sh, c);
    let got = ops(&records(&ring));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.timing, Timing::Enqueue);
    assert!(got[0].0.end_ns >= got[0].0.enqueue_ns);
}

#[test]
fn doubled_and_forged_events_are_ignored_and_extra_channels_are_waited_for() {
    let (sh, ring) = fixture(small_cfg());
    let ctx = context(sh, 1, 0, 2);
    let c = start(sh, &ctx, &coll(0, c"AllReduce", 10, 1));
    let k0 = start(sh, &ctx, &kernel_ch(c, 0, 0));
    assert!(
        start(sh, &ctx, &kernel_ch(c, 0, 0)).is_null(),
        "second start of a channel"
    );
    let k1 = start(sh, &ctx, &kernel_ch(c, 1, 0));
    assert!(!k1.is_null(), "a channel beyond nChannels is still tracked");
    let forged = Handle::new(
        TAG_KERNEL_CH,
        9,
        Handle::from_ptr(c).unwrap().index,
        Handle::from_ptr(c).unwrap().gen,
    );
    stop_event(sh, forged.to_ptr());
    stop_event(sh, c);
    stop_event(sh, c);
    stop_event(sh, k0);
    stop_event(sh, k0);
    assert!(ops(&records(&ring)).is_empty(), "channel 1 still open");
    stop_event(sh, k1);
    let got = ops(&records(&ring));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.channels_done, 2);
    assert_eq!(sh.counters.events_ignored.load(Ordering::Relaxed), 4);
    assert_eq!(live(sh), 0);
}

#[test]
fn local_sn_counts_dropped_ops_and_drops_are_counted() {
    let mut cfg = small_cfg();
    cfg.max_inflight = 2;
    let (sh, ring) = fixture(cfg);
    sh.set_mask(EV_COLL as u32);
    let ctx = context(sh, 1, 0, 2);
    let a = start(sh, &ctx, &coll(0, c"AllReduce", 1, 1));
    let b = start(sh, &ctx, &coll(1, c"AllReduce", 1, 1));
    assert!(start(sh, &ctx, &coll(2, c"AllReduce", 1, 1)).is_null());
    assert_eq!(sh.counters.pool_drops.load(Ordering::Relaxed), 1);
    stop_event(sh, a);
    let d = start(sh, &ctx, &coll(3, c"AllReduce", 1, 1));
    stop_event(sh, b);
    stop_event(sh, d);
    let sns: Vec<u64> = ops(&records(&ring))
        .iter()
        .map(|o| o.0.coll_local_sn)
        .collect();
    assert_eq!(sns, vec![0, 1, 3]);
}

#[test]
fn p2p_ordinals_are_per_peer_and_func() {
    let (sh, ring) = fixture(small_cfg());
    sh.set_mask(EV_COLL as u32);
    let ctx = context(sh, 1, 0, 4);
    for (f, peer) in [
        (c"Send", 1),
        (c"Send", 1),
        (c"Recv", 1),
        (c"Send", 2),
        (c"Send", 1),
    ] {
        let h = start(sh, &ctx, &p2p(f, peer, 64, 1));
        stop_event(sh, h);
    }
    let got: Vec<(u64, i32, bool)> = ops(&records(&ring))
        .iter()
        .map(|(o, p2p, _)| (o.coll_sn, o.peer, *p2p))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 1, true),
            (1, 1, true),
            (0, 1, true),
            (0, 2, true),
            (2, 1, true)
        ]
    );
}

#[test]
fn finalize_retires_open_ops_as_incomplete() {
    let (sh, ring) = fixture(small_cfg());
    let ctx = context(sh, 5, 1, 2);
    let other = context(sh, 6, 1, 2);
    let _open = start(sh, &ctx, &coll(0, c"AllReduce", 1, 2));
    let keep = start(sh, &other, &coll(0, c"AllReduce", 1, 2));
    records(&ring);
    crate::core::end_context(sh, &ctx);
    let recs = records(&ring);
    let got = ops(&recs);
    assert_eq!(got.len(), 1);
    assert_ne!(got[0].2 & FLAG_INCOMPLETE, 0);
    assert_eq!(got[0].0.end_ns, 0);
    let fini = recs.iter().find_map(|r| match &r.body {
        Body::CommFini(f) => Some(f.clone()),
        _ => None,
    });
    let fini = fini.unwrap();
    assert_eq!((fini.comm_hash, fini.ops, fini.open_ops), (5, 0, 1));
    assert_eq!(live(sh), 1, "the other communicator's op stays");
    assert!(local_sn_of(sh, Handle::from_ptr(keep).unwrap()).is_some());
}

#[test]
fn a_gpu_timer_stepped_back_mid_op_leaves_the_gpu_pair_out_and_the_record_readable() {
    let (sh, ring) = fixture(small_cfg());
    let ctx = context(sh, 0xabc, 0, 8);
    records(&ring);
    let c = start(sh, &ctx, &coll(7, c"AllReduce", 1024, 1));
    stop_event(sh, c);
    // The channel starts at GPU time 10 s and stops at 1 µs: the timer was stepped back.
    let k = start(sh, &ctx, &kernel_ch(c, 0, 10_000_000_000));
    record(sh, k, ST_KERNEL_CH_STOP, 1_000);
    stop_event(sh, k);
    // `records` decodes with the bounds check: a reversed pair would fail it (op lost).
    let got = ops(&records(&ring));
    assert_eq!(got.len(), 1);
    let o = &got[0].0;
    assert_eq!((o.gpu_start_ns, o.gpu_end_ns), (0, 0));
    assert_eq!(o.timing, Timing::KernelCpu);
    assert!(o.enqueue_ns <= o.start_ns && o.start_ns <= o.end_ns);
}

/// Two host clock reads of one op that come out reversed (the TSC line switching under a
/// preempted reader, a thread moved between CPUs) never give a span that ends before it
/// starts: readers reject such a record as implausible and the op would be lost (seen in the
/// 30-minute soak, 3 ops in 720 M).
#[test]
fn an_op_whose_stop_reads_the_clock_behind_its_start_ends_at_its_start() {
    let (sh, ring) = fixture(small_cfg());
    let ctx = context(sh, 7, 0, 2);
    records(&ring);
    let c = start(sh, &ctx, &coll(3, c"AllReduce", 64, 1));
    stop_event(sh, c);
    let k = start(sh, &ctx, &kernel_ch(c, 0, 0));
    // The channel's start as a clock running 1 ms ahead read it.
    let h = crate::handle::Handle::from_ptr(c).expect("our handle");
    let slot = sh.ops.get(h.index).expect("the op's slot");
    let ahead = slot.first_start_ns.load(Ordering::Relaxed) + 1_000_000;
    slot.first_start_ns.store(ahead, Ordering::Relaxed);
    stop_event(sh, k);
    let got = ops(&records(&ring));
    assert_eq!(got.len(), 1);
    let o = &got[0].0;
    assert_eq!((o.start_ns, o.end_ns), (ahead, ahead), "{o:?}");
    let rec = Record::new(Body::Coll(o.clone()));
    assert!(
        Record::decode(&rec.encode()).is_ok(),
        "the record reads back"
    );
}

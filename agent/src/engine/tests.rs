//! The online engine against the offline rebuild, over a synthetic test-bed job: streams fed in
//! interleaved rounds, the template chosen once the roles settle, a checkpoint round trip in the
//! middle; plus the circuit breakers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, Record};
use comminsight_wire::segment::read_segment;

use super::{Builtins, Engine, Output};
use crate::offline::{steps, Input, Settings};
use crate::sinks::step_journal::{read_stream, stream_path, StepJournal};
use crate::steps::engine::{StepEngine, StepSettings};
use crate::steps::fsm::StepSummary;
use crate::steps::template::TemplateSet;
use crate::stream::StreamId;
use crate::util::testbed::synthetic;

/// The steps in `out`, each to its stream's list.
fn take_steps(out: &mut Vec<Output>, got: &mut BTreeMap<StreamId, Vec<StepSummary>>) {
    for o in out.drain(..) {
        if let Output::Step(d) = o {
            got.entry(d.id).or_default().push(d.summary);
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp(what: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!(
        "ci-engine-{what}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    TempDir(d)
}

/// Every stream's records, in order.
fn streams(root: &Path) -> BTreeMap<StreamId, Vec<comminsight_wire::RawRecord>> {
    let mut out: BTreeMap<StreamId, Vec<_>> = BTreeMap::new();
    let logs = root.join("inspector_logs");
    for job in std::fs::read_dir(&logs).unwrap().flatten() {
        for host in std::fs::read_dir(job.path()).unwrap().flatten() {
            for pid in std::fs::read_dir(host.path()).unwrap().flatten() {
                let id = StreamId::new(
                    &job.file_name().to_string_lossy(),
                    &host.file_name().to_string_lossy(),
                    &pid.file_name().to_string_lossy(),
                );
                let mut segs: Vec<PathBuf> = std::fs::read_dir(pid.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .collect();
                segs.sort();
                for s in segs {
                    let r = read_segment(&s).unwrap();
                    out.entry(id.clone()).or_default().extend(
                        r.records
                            .into_iter()
                            .filter(|x| {
                                !matches!(x.body, Body::Segment(_))
                                    && x.flags & comminsight_wire::record::FLAG_REPEAT == 0
                            })
                            .map(|x: Record| x.encode()),
                    );
                }
            }
        }
    }
    out
}

fn offline(root: &Path, out: &Path) -> BTreeMap<StreamId, Vec<StepSummary>> {
    steps::rebuild(root, &Settings::default(), out).unwrap();
    let mut m = BTreeMap::new();
    for id in streams(root).keys() {
        m.insert(id.clone(), read_stream(&stream_path(out, id)).unwrap());
    }
    m
}

#[test]
fn online_rounds_with_a_checkpoint_equal_the_offline_rebuild() {
    let dir = temp("online");
    let job = dir.0.join("job");
    synthetic(&job, "megatron.toml", 16, 60);
    let want = offline(&job, &dir.0.join("offline"));
    let input = streams(&job);
    let settings = StepSettings {
        settle_ops: 2000,
        ..StepSettings::default()
    };
    let mut p = Engine::new(Builtins::daemon(1000));
    p.enable_steps(TemplateSet::builtin(), settings.clone());
    let mut out = Vec::new();
    let mut got: BTreeMap<StreamId, Vec<StepSummary>> = BTreeMap::new();
    let mut pos: BTreeMap<&StreamId, usize> = input.keys().map(|k| (k, 0)).collect();
    let mut round = 0;
    loop {
        let mut any = false;
        for (id, recs) in &input {
            let at = pos[id];
            let end = (at + 97).min(recs.len());
            if at < end {
                any = true;
                p.apply(id, &recs[at..end], None, &mut [], &mut out);
                pos.insert(id, end);
            }
        }
        p.round(&mut out);
        take_steps(&mut out, &mut got);
        round += 1;
        if round == 40 {
            // The daemon's checkpoint: everything through serde and back.
            let text = serde_json::to_string(&p).unwrap();
            p = serde_json::from_str(&text).unwrap();
            p.enable_steps(TemplateSet::builtin(), settings.clone());
        }
        if !any {
            break;
        }
    }
    for id in input.keys() {
        p.end_stream(id, &mut [], &mut out);
    }
    p.round(&mut out);
    take_steps(&mut out, &mut got);
    assert_eq!(got.len(), 16);
    for (id, steps) in &want {
        assert_eq!(steps.len(), 60, "{id}");
        assert_eq!(got.get(id), Some(steps), "{id}");
    }
    assert_eq!(p.step_held_ops(), 0);
}

#[test]
fn a_job_no_template_matches_is_closed_and_its_memory_freed() {
    let dir = temp("none");
    let job = dir.0.join("job");
    synthetic(&job, "megatron.toml", 8, 20);
    let input = streams(&job);
    // Only a template that needs an EP all-to-all: the dense job matches nothing.
    let only_moe = TemplateSet::from_templates(
        TemplateSet::builtin()
            .templates
            .into_iter()
            .filter(|t| t.requires.iter().any(|r| r.starts_with("ep")))
            .collect(),
    )
    .unwrap();
    assert!(!only_moe.templates.is_empty());
    let mut e = StepEngine::new(
        only_moe,
        StepSettings {
            max_held_ops: 1000,
            ..StepSettings::default()
        },
    );
    let mut topo = crate::roles::TopologyCollector::default();
    for (id, recs) in &input {
        let mut clock = crate::clock::ProcessClock::default();
        for raw in recs {
            let rec = Record::decode(raw).unwrap();
            topo.observe(id, &rec);
            clock.observe(&rec);
            e.observe(id, &rec, crate::clock::align(&clock, None));
        }
        e.evaluate(&topo);
    }
    let jobs = e.jobs();
    assert_eq!(jobs.len(), 1);
    assert!(jobs[0].decided && jobs[0].template.is_none(), "{jobs:?}");
    assert!(jobs[0].features.iter().any(|f| f == "pp.Send"));
    // Held operations freed, later ones not kept, nothing emitted.
    assert_eq!(e.held_ops(), 0);
    assert!(e.take_output().is_empty());
}

#[test]
fn no_step_for_the_breaker_time_closes_the_session() {
    let dir = temp("breaker");
    let job = dir.0.join("job");
    synthetic(&job, "megatron.toml", 8, 20);
    // A breaker shorter than one step (16 ms): every rank's first open step trips it.
    let settings = StepSettings {
        breaker_us: 1000,
        ..StepSettings::default()
    };
    let out = dir.0.join("out");
    let mut journal = StepJournal::new(&out);
    let input = Input::open(&job).unwrap();
    let settings = Settings {
        steps: settings,
        ..Settings::default()
    };
    let jobs = steps::rebuild_into(
        &input,
        &settings,
        steps::decisions(&steps::topology(&input), &TemplateSet::builtin()),
        &mut steps::StepInputs::default(),
        &mut journal,
    )
    .unwrap();
    assert_eq!(jobs[0].tripped, (0..8).collect::<Vec<i64>>());
    assert!(jobs[0].open_ops.values().all(|n| *n == 0), "memory freed");
}

/// The hang snapshot joins each QP to the communicator the plugin's `net` records name and to
/// the peer rank whose QP points back at it, across two hosts' host streams.
#[test]
fn queue_pairs_join_their_communicator_and_peer_rank() {
    use comminsight_wire::host::{qp_event, qp_state, thread_state};
    use comminsight_wire::record::{HostQp, HostThread, NetRecord, ProcStart};
    let raw = |seq: u64, body: Body| {
        let mut r = Record::new(body).encode();
        r.set_seq(seq);
        r
    };
    let mut e = Engine::new(Builtins {
        topology: true,
        hang: true,
        host: true,
        ..Builtins::default()
    });
    let mut out = Vec::new();
    let ends = [
        ("h0", 100u32, 0i32, 0x10u32, 0x20u32),
        ("h1", 200, 1, 0x20, 0x10),
    ];
    for (host, pid, rank, qp, dest) in ends {
        let start = Body::ProcStart(ProcStart {
            pid,
            rank,
            world_size: 2,
            host: host.into(),
            job: "j".into(),
            ..ProcStart::default()
        });
        let rank_id = StreamId::new("j", host, &pid.to_string());
        e.apply(&rank_id, &[raw(0, start)], None, &mut [], &mut out);
        let thread = Body::Thread(HostThread {
            time_ns: 1_000_000_000,
            pid,
            tid: pid,
            state: thread_state::BLOCKED,
            ..HostThread::default()
        });
        let qp_rec = |seq, event, new_state| {
            raw(
                seq,
                Body::Qp(HostQp {
                    time_ns: 2_000_000_000 + seq,
                    pid,
                    qp_num: qp,
                    dest_qp_num: dest,
                    event,
                    new_state,
                    port: 1,
                    device: "mlx5_0".into(),
                    ..HostQp::default()
                }),
            )
        };
        let host_id = StreamId::new("j", host, "host-9");
        let batch = [
            raw(0, thread),
            qp_rec(1, qp_event::MODIFY, 3), // RTS
            qp_rec(2, qp_event::ERROR, qp_state::ERR),
        ];
        e.apply(&host_id, &batch, None, &mut [], &mut out);
        if pid == 100 {
            let net = Body::Net(NetRecord {
                comm_hash: 0xaa,
                qp_num: qp,
                rank,
                ..NetRecord::default()
            });
            e.apply(&rank_id, &[raw(1, net)], None, &mut [], &mut out);
        }
    }
    let snap = e.hang_snapshot("j", 10_000_000, 0);
    let qps = |rank: i64| {
        snap.ranks
            .iter()
            .find(|r| r.rank == rank)
            .and_then(|r| r.host_context.as_ref())
            .map(|h| h.qps.clone())
            .unwrap_or_default()
    };
    let (a, b) = (qps(0), qps(1));
    assert_eq!(a.len(), 1, "{snap:#?}");
    let peer = a[0].peer.clone().expect("rank 0's QP has its peer");
    assert_eq!(
        (peer.host.as_str(), peer.pid, peer.rank, peer.qp_num),
        ("h1", 200, 1, 0x20)
    );
    assert_eq!(a[0].comm, "0x00000000000000aa");
    assert_eq!(b[0].peer.as_ref().map(|p| p.rank), Some(0));
    assert_eq!(b[0].comm, "", "rank 1 had no net record");
    let line = crate::host::qps::errored_line(&a).unwrap();
    assert!(
        line.starts_with(
            "QP 0x10 on mlx5_0/1 to rank 1 (h1 pid 200 QP 0x20), comm 0x00000000000000aa: ERR at "
        ),
        "{line}"
    );
}

#[test]
fn a_ranks_gpu_evidence_comes_through_its_binding_in_any_stream_order() {
    use comminsight_wire::gpu::{gpu_valid, pci, throttle, CommDevice, GpuLink, GpuSample, GpuXid};
    use comminsight_wire::record::ProcStart;
    let raw = |seq: u64, body: Body| {
        let mut r = Record::new(body).encode();
        r.set_seq(seq);
        r
    };
    let g1 = pci::pack(0, 0x2a, 0, 0);
    let mut e = Engine::new(Builtins {
        topology: true,
        hang: true,
        host: true,
        ..Builtins::default()
    });
    let mut out = Vec::new();
    // The host stream first (an offline pass may read it before the ranks').
    let host_id = StreamId::new("j", "h0", "host-9");
    let s = 1_000_000_000u64;
    let mut batch = Vec::new();
    for k in 1..=10u64 {
        batch.push(raw(
            2 * k,
            Body::Gpu(GpuSample {
                time_ns: k * s,
                interval_ns: s,
                pci: g1,
                index: 1,
                sm_clock_mhz: if k > 5 { 1100 } else { 1980 },
                throttle_reasons: if k > 5 { throttle::HW_SLOWDOWN } else { 0 },
                hw_slowdown_share: if k > 5 { 10_000 } else { 0 },
                valid: gpu_valid::CLOCKS | gpu_valid::THROTTLE_REASONS,
                ..GpuSample::default()
            }),
        ));
        batch.push(raw(
            2 * k + 1,
            Body::GpuLink(GpuLink {
                time_ns: k * s,
                interval_ns: s,
                pci: g1,
                index: 1,
                link: 3,
                crc_flit: 7,
                ..GpuLink::default()
            }),
        ));
    }
    batch.push(raw(
        100,
        Body::Xid(GpuXid {
            time_ns: 9 * s,
            xid: 79,
            pci: g1,
            index: 1,
            ..GpuXid::default()
        }),
    ));
    e.apply(&host_id, &batch, None, &mut [], &mut out);
    let rank_id = StreamId::new("j", "h0", "100");
    let start = Body::ProcStart(ProcStart {
        pid: 100,
        rank: 1,
        world_size: 2,
        host: "h0".into(),
        job: "j".into(),
        ..ProcStart::default()
    });
    let dev = Body::CommDevice(CommDevice {
        comm_hash: 0xaa,
        pci: g1,
        rank: 1,
        device: 1,
        uuid: [9; 16],
        ..CommDevice::default()
    });
    e.apply(
        &rank_id,
        &[raw(0, start), raw(1, dev)],
        None,
        &mut [],
        &mut out,
    );
    let h = e.host_context().unwrap();
    assert_eq!(h.gpu().bound("h0")["j"], [g1].into());
    let w = h.gpu().window("j", "h0", 100, 0, 20_000_000).unwrap();
    assert_eq!((w.covered_ns, w.slowdown_ns), (10 * s, 5 * s));
    assert_eq!(w.min_sm_clock_mhz, 1100);
    assert_eq!(w.nvlink, vec![(g1, 3, 70)]);
    assert_eq!(w.xids, vec![(9_000_000, g1, 79)]);
    // Only the second half: all of it held down.
    let late = h
        .gpu()
        .window("j", "h0", 100, 6_000_000, 10_000_000)
        .unwrap();
    assert_eq!(late.slowdown_ns, late.covered_ns);
    let snap = e.hang_snapshot("j", 20_000_000, 0);
    let r = snap.ranks.iter().find(|r| r.rank == 1).unwrap();
    assert_eq!(r.gpus.len(), 1, "{snap:#?}");
    assert_eq!(r.gpus[0].pci, "0000:2a:00.0");
    assert_eq!(r.gpus[0].uuid, "GPU-09090909-0909-0909-0909-090909090909");
    assert_eq!(r.gpus[0].xids, vec![(9_000_000, 79)]);
    assert_eq!(r.gpus[0].nvlink_errors, 70);
    assert_eq!(r.gpus[0].reasons, vec!["hw_slowdown"]);
    // A checkpoint keeps all of it.
    let back: Engine = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(back.host_context().unwrap().gpu(), h.gpu());
}

//! Issue 16 acceptance: a corpus of crafted records (every numeric field of every body at its
//! extremes, huge `nranks`, `u64::MAX` sequence numbers, impossible times, unknown kinds) beside
//! a healthy job, through `dump`, every analysis command and the daemon. Nothing panics or
//! aborts, peak RSS stays under [`RSS_BOUND_KIB`], exit codes are the documented ones, the
//! healthy job is still analysed, and the records the wire bounds reject are reported.
//!
//! Layout of the corpus root: `megatron/` (a healthy synthetic job from the test bed),
//! `crafted-<kind>/h/<pid>/seg-*.cis` (one 2-rank job per record kind: rank 0's stream holds
//! one block of records per systematic mutation of its record of that kind, 64 blocks a segment
//! (the segment-header job: one, each header first in its file), rank 1's the same blocks
//! unchanged; so each command runs once over every case, in a few streams; the host-context
//! kinds (thread, qp, tcp, port, gpu, nvlink, xid), which only the agent's host stream carries: the two ranks
//! unchanged and the host stream `crafted-<kind>/h/host-<pid>/` holding one block of host
//! records per mutation), `deep-*/` (a copy
//! of the healthy job with one record of rank 0 replaced: the crafted value meets every
//! analysis with a real step structure around it).

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use comminsight_tests::*;
use comminsight_wire::bounds::{MAX_RANKS, MAX_SEQ, MAX_TIME_NS};
use comminsight_wire::gpu;
use comminsight_wire::host::{port_kind, qp_event, tcp_event, thread_source, thread_state};
use comminsight_wire::names::Func;
use comminsight_wire::record::{
    Body, CommDevice, CommFini, CommInit, EpStats, GpuLink, GpuSample, GpuXid, HostPort, HostQp,
    HostTcp, HostThread, Kind, NetRecord, OpRecord, Overdue, ProcStart, ProxyRecord, RawRecord,
    Record, SegmentHeader, Stats, Timing, FLAG_REPEAT, HEADER_SIZE,
};
use comminsight_wire::segment::{find_segments, read_segment};
use comminsight_wire::RECORD_SIZE;

/// Peak resident set of any command over the corpus (KiB): 512 MiB. A record that sized an
/// allocation (`nranks = 0xFFFFFFFF`: 34 GB) would blow through it.
const RSS_BOUND_KIB: i64 = 512 * 1024;

/// What a finished child did.
struct Measured {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
}

/// Run `comminsight-agent ARGS`, its peak RSS from `wait4`'s rusage.
fn measured(args: &[&str], dir: &Path) -> Measured {
    let (out_p, err_p) = (dir.join("cmd.stdout"), dir.join("cmd.stderr"));
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also gives its rusage (Child::wait does not)"
    )]
    let child = Command::new(bin_dir().join("comminsight-agent"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_p).unwrap())
        .stderr(std::fs::File::create(&err_p).unwrap())
        .spawn()
        .expect("start comminsight-agent");
    let (status, rss) = wait4(child.id() as libc::pid_t);
    Measured {
        code: status.code(),
        signal: status.signal(),
        stdout: std::fs::read_to_string(&out_p).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_p).unwrap_or_default(),
        max_rss_kib: rss,
    }
}

/// Reap `pid`: its exit status and peak RSS (KiB). Linux carries the peak over `execve`, so
/// this is the larger of the command's peak and this test's peak before the spawn: an upper bound.
fn wait4(pid: libc::pid_t) -> (std::process::ExitStatus, i64) {
    let mut status = 0;
    // SAFETY: rusage is plain data; zeroed is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our unreaped child; both pointers are to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    (
        std::process::ExitStatus::from_raw(status),
        ru.ru_maxrss as i64,
    )
}

// ---- the corpus -----------------------------------------------------------------------------

/// Records in one block of [`block`].
const BLOCK_LEN: u64 = 15;

/// Blocks per segment file (the segment-header job: one, so that each mutated header opens its
/// segment). The cursor lists a process directory at each segment it opens: a stream of
/// thousands of small segments costs more in `readdir` than in its records.
const BLOCKS_PER_SEGMENT: usize = 64;

/// The header of segment `index` of process `pid`, first in its file, `t0` its creation.
fn segment_header(pid: u32, index: u64, seq: u64, t0: u64) -> Record {
    Record {
        seq,
        flags: 0,
        body: Body::Segment(SegmentHeader {
            format: 1,
            record_size: RECORD_SIZE as u32,
            segment_index: index,
            pid,
            source: 0,
            created_real_ns: t0,
            created_mono_ns: 1_000 + (t0 - T0),
        }),
    }
}

/// The first block's start (real time, ns).
const T0: u64 = 1_764_425_999_000_000_000;

/// Block `k` of rank `rank` (0 or 1) of a small healthy 2-rank job: a record of every kind but
/// the segment header: proc_start, comm_init, coll and p2p operations, proxy, net, overdue,
/// stats, comm_fini. Block `k` is its own communicator, 60 s after block `k - 1`, and its seqs
/// continue the stream's: a process of many blocks is one stream.
fn block(job: &str, pid: u32, rank: i32, k: u64) -> Vec<Record> {
    let t0 = block_t0(k);
    let mono0 = 1_000 + k * 60_000_000_000;
    let comm = 0xabc0 + k;
    let peer = 1 - rank;
    let op = |i: u64| OpRecord {
        comm_hash: comm,
        coll_sn: i,
        coll_local_sn: i,
        count: 256,
        bytes: 1024,
        enqueue_ns: t0 + i * 1_000_000,
        start_ns: t0 + i * 1_000_000 + 10_000,
        end_ns: t0 + i * 1_000_000 + 500_000,
        gpu_start_ns: t0 + i * 1_000_000 + 20_000,
        gpu_end_ns: t0 + i * 1_000_000 + 400_000,
        api_ns: t0 + i * 1_000_000,
        rank,
        root: -1,
        peer: -1,
        func: Func::ALL_REDUCE,
        nchannels: 2,
        nwarps: 8,
        timing: Timing::KernelGpu,
        channels_done: 2,
        ..Default::default()
    };
    let mut bodies = vec![
        Body::ProcStart(ProcStart {
            pid,
            rank,
            local_rank: rank,
            world_size: 2,
            mono_ns: 1_000,
            real_ns: T0,
            abi_version: 5,
            host: "h".into(),
            job: job.into(),
        }),
        Body::CommInit(CommInit {
            comm_hash: comm,
            nranks: 2,
            rank,
            nnodes: 1,
            local_rank: rank,
            device: rank,
            abi_version: 5,
            time_ns: t0,
            comm_name: "dp:crafted".into(),
        }),
        Body::CommDevice(CommDevice {
            comm_hash: comm,
            time_ns: t0,
            pci: gpu::pci::pack(0, 0x10 + rank as u8, 0, 0),
            rank,
            device: rank,
            source: gpu::device_source::RUNTIME,
            uuid: [rank as u8 + 1; 16],
        }),
    ];
    bodies.extend((0..4).map(|i| Body::Coll(op(i))));
    bodies.push(Body::P2p(OpRecord {
        func: if rank == 0 { Func::SEND } else { Func::RECV },
        peer,
        coll_sn: 0,
        coll_local_sn: 4,
        ..op(4)
    }));
    let t = t0 + 5_000_000;
    bodies.extend([
        Body::Proxy(ProxyRecord {
            comm_hash: comm,
            parent_local_sn: 4,
            start_ns: t,
            end_ns: t + 1000,
            bytes: 1024,
            send_wait_ns: 10,
            recv_wait_ns: 10,
            pid,
            rank,
            peer,
            nsteps: 4,
            chunk_size: 256,
            steps_done: 4,
            channel: 0,
            is_send: u8::from(rank == 0),
        }),
        Body::Net(NetRecord {
            comm_hash: comm,
            parent_local_sn: 4,
            start_ns: t,
            end_ns: t + 900,
            length: 1024,
            net_type: 1,
            net_version: 1,
            fd: -1,
            ..Default::default()
        }),
        Body::Overdue(Overdue {
            comm_hash: comm,
            coll_sn: 4,
            coll_local_sn: 5,
            enqueue_ns: t,
            start_ns: t + 10,
            now_ns: t + 40_000_000_000,
            count: 256,
            bytes: 1024,
            age_ms: 40_000,
            threshold_ms: 30_000,
            peer: -1,
            func: Func::ALL_REDUCE,
            phase: 1,
            nchannels: 2,
            channels_started: 2,
            ..Default::default()
        }),
        Body::Coll(OpRecord {
            coll_local_sn: 5,
            ..op(4)
        }),
        // The rank's MoE EP wait counters for the block's window (an EP group of the 2 ranks).
        Body::EpStats(EpStats {
            ep_group_id: 0xe9,
            instance: [9; 16],
            window_seq: k,
            t_start_ns: t0,
            t_end_ns: t + 1_000_000,
            steps: 10,
            scale_bits: 0,
            ep_size: 2,
            rank: rank as u16,
            first: 0,
            count: 2,
            phase: comminsight_wire::moe::ep_phase::DISPATCH,
            source: comminsight_wire::moe::ep_source::DEEPEP_LL,
            ep_flags: 0,
            values: [1000, 2000, 0, 0, 0],
        }),
        Body::Stats(Stats {
            time_ns: t + 50_000_000_000,
            mono_ns: mono0 + 55_000_000_000,
            real_ns: t + 50_000_000_000,
            records_pushed: 14,
            event_mask: 0x747,
            ..Default::default()
        }),
        Body::CommFini(CommFini {
            comm_hash: comm,
            rank,
            time_ns: t + 51_000_000_000,
            ops: 6,
            open_ops: 0,
        }),
    ]);
    assert_eq!(bodies.len() as u64, BLOCK_LEN);
    // Block 0's proc_start has seq 0: the stream's epoch starts there.
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Record {
            seq: k * BLOCK_LEN + i as u64,
            flags: 0,
            body,
        })
        .collect()
}

/// Records in one block of [`host_block`].
const HOST_BLOCK_LEN: u64 = 8;

/// Whether records of `kind` come from the agent's host stream (not from a rank process).
fn is_host_kind(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Thread | Kind::Qp | Kind::Tcp | Kind::Port | Kind::Gpu | Kind::GpuLink | Kind::Xid
    )
}

/// Block `k` of the agent's host stream beside the 2-rank job of [`block`]: its proc_start
/// (rank -1, as the agent writes it) and a record of each host-context kind about rank 0
/// (process `rank0`), inside block `k`'s minute.
fn host_block(job: &str, agent: u32, rank0: u32, k: u64) -> Vec<Record> {
    let t = block_t0(k) + 2_000_000_000;
    let interval = 1_000_000_000;
    let bodies = [
        Body::ProcStart(ProcStart {
            pid: agent,
            rank: -1,
            local_rank: -1,
            world_size: -1,
            mono_ns: 1_000,
            real_ns: T0,
            abi_version: 0,
            host: "h".into(),
            job: job.into(),
        }),
        Body::Thread(HostThread {
            time_ns: t,
            interval_ns: interval,
            on_cpu_ns: 600_000_000,
            runnable_ns: 100_000_000,
            blocked_ns: 300_000_000,
            blocked_io_ns: 50_000_000,
            state_since_ns: t - 300_000_000,
            pid: rank0,
            tid: rank0,
            voluntary_switches: 40,
            involuntary_switches: 3,
            state: thread_state::BLOCKED,
            source: thread_source::EBPF,
            comm: "python".into(),
            syscall: "futex".into(),
        }),
        Body::Qp(HostQp {
            time_ns: t,
            created_ns: t - interval,
            pid: rank0,
            tid: rank0,
            qp_num: 0x11,
            dest_qp_num: 0x22,
            attr_mask: 0x1,
            dlid: 3,
            event: qp_event::MODIFY,
            qp_type: 2,
            old_state: 2,
            new_state: 3,
            port: 1,
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            device: "mlx5_0".into(),
        }),
        Body::Tcp(HostTcp {
            time_ns: t,
            interval_ns: interval,
            pid: rank0,
            retransmits: 2,
            state_changes: 0,
            sport: 40_000,
            dport: 29_500,
            event: tcp_event::RETRANSMIT,
            family: 2,
            old_state: 1,
            new_state: 1,
            saddr: [127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            daddr: [127, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        }),
        Body::Port(HostPort {
            time_ns: t,
            interval_ns: interval,
            rx_bytes: 1 << 30,
            tx_bytes: 1 << 30,
            rx_packets: 1 << 20,
            tx_packets: 1 << 20,
            errors: 1,
            link_downed: 0,
            port: 1,
            link_layer: port_kind::INFINIBAND,
            up: 1,
            port_flags: 0,
            device: "mlx5_0".into(),
        }),
        Body::Gpu(GpuSample {
            time_ns: t,
            interval_ns: interval,
            energy_mj: 300_000,
            memory_used_bytes: 40 << 30,
            throttle_reasons: gpu::throttle::HW_SLOWDOWN,
            pci: gpu::pci::pack(0, 0x10, 0, 0),
            power_mw: 300_000,
            valid: u32::MAX >> 18,
            sm_clock_mhz: 1980,
            memory_clock_mhz: 2619,
            hw_slowdown_share: 5000,
            sm_util: 90,
            memory_util: 40,
            temperature_c: 70,
            source: gpu::gpu_source::NVML,
            ..GpuSample::default()
        }),
        Body::GpuLink(GpuLink {
            time_ns: t,
            interval_ns: interval,
            tx_bytes: 1 << 30,
            rx_bytes: 1 << 30,
            pci: gpu::pci::pack(0, 0x10, 0, 0),
            crc_flit: 3,
            link: 2,
            up: 1,
            valid: 7,
            source: gpu::gpu_source::NVML,
            ..GpuLink::default()
        }),
        Body::Xid(GpuXid {
            time_ns: t,
            xid: 79,
            pci: gpu::pci::pack(0, 0x10, 0, 0),
            index: 0,
            source: gpu::gpu_source::NVML,
        }),
    ];
    assert_eq!(bodies.len() as u64, HOST_BLOCK_LEN);
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Record {
            seq: k * HOST_BLOCK_LEN + i as u64,
            flags: 0,
            body,
        })
        .collect()
}

/// When block `k` starts (real time, ns).
fn block_t0(k: u64) -> u64 {
    T0 + k * 60_000_000_000
}

/// Width and value patterns written over the body: every aligned u64 / u32 slot and every byte
/// gets the values at the edges of its type and of the wire bounds.
fn patterns() -> Vec<(usize, Vec<u64>)> {
    vec![
        (
            8,
            vec![
                0,
                u64::MAX,
                1 << 63,
                MAX_SEQ,
                MAX_SEQ - 1,
                MAX_TIME_NS,
                MAX_TIME_NS - 1,
            ],
        ),
        (
            4,
            vec![
                0,
                0xFFFF_FFFF,
                0x8000_0000,
                0x7FFF_FFFF,
                u64::from(MAX_RANKS),
                u64::from(MAX_RANKS) + 1,
                100_000_000,
            ],
        ),
        (1, vec![0xFF, 0x80]),
    ]
}

/// One systematic change of a record's raw bytes.
#[derive(Clone, Copy)]
enum Mutation {
    /// `width` little-endian bytes of `v` over the body at `off`.
    Body { off: usize, width: usize, v: u64 },
    /// The kind byte set to a value that is no kind.
    KindByte(u8),
    /// A header change (bad version, length, extreme seq, every flag).
    Header(fn(&mut RawRecord)),
}

impl Mutation {
    fn apply(self, raw: &mut RawRecord) {
        match self {
            Mutation::Body { off, width, v } => {
                let b = HEADER_SIZE + off;
                raw.0[b..b + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
            Mutation::KindByte(k) => raw.0[3] = k,
            Mutation::Header(f) => f(raw),
        }
    }
}

/// Every systematic mutation of a record of `kind`: (name, mutation).
fn systematic(kind: Kind) -> Vec<(String, Mutation)> {
    let mut out = Vec::new();
    let kinds: BTreeSet<u8> = Kind::ALL.iter().map(|k| *k as u8).collect();
    for (width, values) in patterns() {
        for off in (0..RECORD_SIZE - HEADER_SIZE).step_by(width) {
            for &v in &values {
                let name = format!("{}-{off}-w{width}-{v:x}", kind.name());
                out.push((name, Mutation::Body { off, width, v }));
            }
        }
    }
    // The header: every kind byte that is not a kind, a bad version and length, extreme seqs
    // and flags.
    for k in (0..=255u8).filter(|k| !kinds.contains(k)).step_by(17) {
        out.push((format!("{}-kind{k}", kind.name()), Mutation::KindByte(k)));
    }
    for (name, f) in [
        (
            "version",
            (|r: &mut RawRecord| r.0[2] = 9) as fn(&mut RawRecord),
        ),
        ("len", |r| r.0[4] = 64),
        ("seqmax", |r| r.set_seq(u64::MAX)),
        ("seqbound", |r| r.set_seq(MAX_SEQ)),
        ("flags", |r| r.0[6..8].copy_from_slice(&[0xFF, 0xFF])),
    ] {
        out.push((format!("{}-{name}", kind.name()), Mutation::Header(f)));
    }
    out
}

/// What the corpus holds.
#[derive(Default)]
struct Tally {
    /// Crafted cases (systematic and deep).
    cases: usize,
    /// Crafted records the wire bounds reject.
    rejected: u64,
    /// Records a reader delivers to the analyses unless rejected: all but segment headers and
    /// `FLAG_REPEAT` copies.
    deliverable: u64,
    /// The healthy job's `steps --json` and `straggler --json` over it alone.
    healthy_steps: serde_json::Value,
    healthy_straggler: serde_json::Value,
}

/// Write `recs` as segment `index` of process `pid` of `job` under `root`.
fn write_segment(
    t: &mut Tally,
    root: &Path,
    job: &str,
    pid: (&str, u32),
    index: u64,
    recs: &[RawRecord],
) {
    let dir = root.join(job).join(pid.0).join(pid.1.to_string());
    write_process_segment(t, &dir, index, recs);
}

/// Write `recs` as segment `index` of the process directory `dir`.
fn write_process_segment(t: &mut Tally, dir: &Path, index: u64, recs: &[RawRecord]) {
    std::fs::create_dir_all(dir).unwrap();
    let bytes: Vec<u8> = recs.iter().flat_map(|r| r.0).collect();
    std::fs::write(dir.join(format!("seg-{index:06}.cis")), bytes).unwrap();
    t.deliverable += recs.iter().filter(|r| deliverable(r)).count() as u64;
}

/// Not a segment header nor a `FLAG_REPEAT` copy: a reader hands it on (unless rejected).
fn deliverable(r: &RawRecord) -> bool {
    r.kind_byte() != Kind::Segment as u8 && u16::from_le_bytes([r.0[6], r.0[7]]) & FLAG_REPEAT == 0
}

/// The systematic cases of `kind` as job `crafted-<kind>`: rank 0's stream holds one block per
/// case, its record of `kind` mutated; rank 1's the same blocks unchanged.
fn write_kind_job(t: &mut Tally, root: &Path, kind: Kind, pid: u32) {
    let job = format!("crafted-{}", kind.name());
    let cases = systematic(kind);
    if is_host_kind(kind) {
        return write_host_kind_job(t, root, &job, kind, &cases, pid);
    }
    let at = block(&job, pid, 0, 0).iter().position(|r| r.kind() == kind);
    let per = if kind == Kind::Segment {
        1
    } else {
        BLOCKS_PER_SEGMENT
    };
    t.cases += cases.len();
    let ks: Vec<u64> = (0..cases.len() as u64).collect();
    for (index, chunk) in ks.chunks(per).enumerate() {
        let index = index as u64;
        for (rank, pid) in [(0, pid), (1, pid + 1)] {
            let first = chunk[0];
            let mut recs = vec![segment_header(
                pid,
                index,
                first * BLOCK_LEN,
                block_t0(first),
            )];
            recs.extend(chunk.iter().flat_map(|&k| block(&job, pid, rank, k)));
            let mut raws: Vec<RawRecord> = recs.iter().map(Record::encode).collect();
            if rank == 0 {
                for &k in chunk {
                    // The segment header, or the record of `kind` in block k.
                    let i = at.map_or(0, |at| 1 + (k - first) as usize * BLOCK_LEN as usize + at);
                    let (ok, raw) = mutated(raws[i], cases[k as usize].1, &job);
                    t.rejected += u64::from(!ok);
                    raws[i] = raw;
                }
            }
            write_segment(t, root, &job, ("h", pid), index, &raws);
        }
    }
}

/// The systematic cases of host-context `kind` as job `job`: its two ranks' streams unchanged
/// (as many blocks as cases) and the agent's host stream `host-<pid + 2>` beside them, one
/// [`host_block`] per case with its record of `kind` mutated.
fn write_host_kind_job(
    t: &mut Tally,
    root: &Path,
    job: &str,
    kind: Kind,
    cases: &[(String, Mutation)],
    pid: u32,
) {
    let agent = pid + 2;
    let proc_dir = format!("host-{agent}");
    let at = host_block(job, agent, pid, 0)
        .iter()
        .position(|r| r.kind() == kind)
        .expect("a host block holds every host kind");
    t.cases += cases.len();
    let ks: Vec<u64> = (0..cases.len() as u64).collect();
    for (index, chunk) in ks.chunks(BLOCKS_PER_SEGMENT).enumerate() {
        let (index, first) = (index as u64, chunk[0]);
        for (rank, pid) in [(0, pid), (1, pid + 1)] {
            let mut recs = vec![segment_header(
                pid,
                index,
                first * BLOCK_LEN,
                block_t0(first),
            )];
            recs.extend(chunk.iter().flat_map(|&k| block(job, pid, rank, k)));
            let raws: Vec<RawRecord> = recs.iter().map(Record::encode).collect();
            write_segment(t, root, job, ("h", pid), index, &raws);
        }
        let header = segment_header(agent, index, first * HOST_BLOCK_LEN, block_t0(first));
        let mut recs = vec![header];
        recs.extend(chunk.iter().flat_map(|&k| host_block(job, agent, pid, k)));
        let mut raws: Vec<RawRecord> = recs.iter().map(Record::encode).collect();
        for &k in chunk {
            let i = 1 + (k - first) as usize * HOST_BLOCK_LEN as usize + at;
            let (ok, raw) = mutated(raws[i], cases[k as usize].1, job);
            t.rejected += u64::from(!ok);
            raws[i] = raw;
        }
        write_process_segment(t, &root.join(job).join("h").join(&proc_dir), index, &raws);
    }
}

/// Communicators of the wide job ([`write_wide_job`]).
const WIDE_COMMS: u64 = 256;

/// Job `crafted-wide`: [`WIDE_COMMS`] blocks whose communicators all claim [`MAX_RANKS`]
/// members and bring two (communicator ranks at the top of that range). Every record is valid:
/// no bound rejects them, so nothing may size a table by `nranks` (a dense rank table is 8 MiB a
/// communicator, 2 GiB for these).
fn write_wide_job(t: &mut Tally, root: &Path, pid: u32) {
    let job = "crafted-wide";
    let ks: Vec<u64> = (0..WIDE_COMMS).collect();
    for (index, chunk) in ks.chunks(BLOCKS_PER_SEGMENT).enumerate() {
        for (rank, pid) in [(0, pid), (1, pid + 1)] {
            let first = chunk[0];
            let mut recs = vec![segment_header(
                pid,
                index as u64,
                first * BLOCK_LEN,
                block_t0(first),
            )];
            for &k in chunk {
                recs.extend(block(job, pid, rank, k).into_iter().map(|mut r| {
                    if let Body::CommInit(c) = &mut r.body {
                        c.nranks = MAX_RANKS;
                        c.rank = MAX_RANKS as i32 - 1 - rank;
                    }
                    r
                }));
            }
            let raws: Vec<RawRecord> = recs.iter().map(Record::encode).collect();
            assert!(raws.iter().all(|r| Record::decode(r).is_ok()));
            write_segment(t, root, job, ("h", pid), index as u64, &raws);
        }
    }
}

/// `raw` changed by `m`, and whether it still decodes. A proc_start that decodes keeps its job
/// name (the stream stays in `job`).
fn mutated(mut raw: RawRecord, m: Mutation, job: &str) -> (bool, RawRecord) {
    m.apply(&mut raw);
    match Record::decode(&raw) {
        Ok(mut r) => {
            if let Body::ProcStart(p) = &mut r.body {
                p.job = job.into();
            }
            (true, r.encode())
        }
        Err(_) => (false, raw),
    }
}

/// Deep cases: (name, mutation of one record of rank 0's stream of the healthy job). Each
/// returns whether it applied to the record it was given (first record of that kind after the
/// first `skip` of them).
type Deep = (&'static str, Kind, usize, fn(&mut Record));

fn deep_cases() -> Vec<Deep> {
    fn op(r: &mut Record) -> &mut OpRecord {
        match &mut r.body {
            Body::Coll(o) | Body::P2p(o) => o,
            _ => unreachable!(),
        }
    }
    fn init(r: &mut Record) -> &mut CommInit {
        match &mut r.body {
            Body::CommInit(c) => c,
            _ => unreachable!(),
        }
    }
    vec![
        ("nranks-max", Kind::CommInit, 0, |r| {
            init(r).nranks = u32::MAX
        }),
        ("nranks-1e8", Kind::CommInit, 0, |r| {
            init(r).nranks = 100_000_000
        }),
        ("nranks-bound", Kind::CommInit, 0, |r| {
            init(r).nranks = MAX_RANKS
        }),
        ("nranks-0", Kind::CommInit, 1, |r| init(r).nranks = 0),
        ("rank-ge-nranks", Kind::CommInit, 0, |r| {
            let c = init(r);
            c.rank = c.nranks as i32;
        }),
        ("collsn-max", Kind::Coll, 40, |r| op(r).coll_sn = u64::MAX),
        ("collsn-bound", Kind::Coll, 40, |r| {
            op(r).coll_sn = MAX_SEQ - 1
        }),
        ("collsn-0", Kind::Coll, 50, |r| op(r).coll_sn = 0),
        ("localsn-max", Kind::Coll, 30, |r| {
            op(r).coll_local_sn = u64::MAX
        }),
        ("localsn-bound", Kind::Coll, 30, |r| {
            op(r).coll_local_sn = MAX_SEQ - 1
        }),
        ("time-max", Kind::Coll, 20, |r| op(r).end_ns = u64::MAX),
        ("time-bound", Kind::Coll, 20, |r| {
            let o = op(r);
            o.end_ns = MAX_TIME_NS - 1;
            o.gpu_end_ns = MAX_TIME_NS - 1;
        }),
        ("time-zero", Kind::Coll, 25, |r| {
            let o = op(r);
            o.start_ns = 0;
            o.enqueue_ns = 0;
        }),
        ("end-before-start", Kind::Coll, 26, |r| {
            let o = op(r);
            o.end_ns = o.start_ns - 1;
        }),
        ("p2p-peer-max", Kind::P2p, 3, |r| op(r).peer = i32::MAX),
        ("seq-max", Kind::Coll, 33, |r| r.seq = u64::MAX),
        ("world-max", Kind::ProcStart, 0, |r| {
            if let Body::ProcStart(p) = &mut r.body {
                p.world_size = i32::MAX;
                p.rank = MAX_RANKS as i32 - 1;
            }
        }),
    ]
}

/// The healthy job's streams by process directory: (host, pid, records).
fn healthy_streams(job: &Path) -> Vec<(String, u32, Vec<RawRecord>)> {
    let mut out: Vec<(String, u32, Vec<RawRecord>)> = Vec::new();
    for f in find_segments(job).unwrap() {
        let pdir = f.parent().unwrap();
        let pid: u32 = pdir.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let host = pdir
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let seg = read_segment(&f).unwrap();
        assert!(seg.bad.is_empty());
        let recs: Vec<RawRecord> = seg.records.iter().map(Record::encode).collect();
        match out.iter_mut().find(|(h, p, _)| h == host && *p == pid) {
            Some((_, _, v)) => v.extend(recs),
            None => out.push((host.to_string(), pid, recs)),
        }
    }
    out.sort_by_key(|(h, p, _)| (h.clone(), *p));
    out
}

/// The healthy job copied as job `name` (its `proc_start`s renamed) with `deep` applied to
/// rank 0's stream.
fn write_deep(
    t: &mut Tally,
    root: &Path,
    streams: &[(String, u32, Vec<RawRecord>)],
    name: &str,
    deep: &Deep,
) {
    let (_, kind, skip, f) = deep;
    let mut rejected = false;
    for (i, (host, pid, recs)) in streams.iter().enumerate() {
        let mut seen = 0;
        let recs: Vec<RawRecord> = recs
            .iter()
            .map(|raw| {
                let mut r = Record::decode(raw).unwrap();
                if let Body::ProcStart(p) = &mut r.body {
                    p.job = name.into();
                }
                if i == 0 && r.kind() == *kind && r.flags == 0 {
                    if seen == *skip {
                        f(&mut r);
                        rejected = Record::decode(&r.encode()).is_err();
                    }
                    seen += 1;
                }
                r.encode()
            })
            .collect();
        write_segment(t, root, name, (host, *pid), 0, &recs);
    }
    t.cases += 1;
    t.rejected += u64::from(rejected);
}

/// Records the command said it skipped as corrupt: its "skipped N corrupt records" line, else
/// its per-record "is corrupt" warnings.
fn reported_corrupt(m: &Measured) -> u64 {
    let text = format!("{}\n{}", m.stdout, m.stderr);
    let from_line = text.lines().find_map(|l| {
        let at = l.find(" corrupt record")?;
        let head = &l[..at];
        let n = head.rsplit(|c: char| !c.is_ascii_digit()).next()?;
        head.contains("skipped")
            .then(|| n.parse::<u64>().ok())
            .flatten()
    });
    from_line.unwrap_or_else(|| text.lines().filter(|l| l.contains("is corrupt")).count() as u64)
}

fn check(what: &str, m: &Measured, codes: &[i32]) {
    assert!(
        m.signal.is_none() && !m.stderr.contains("panicked"),
        "{what}: died (signal {:?}):\n{}",
        m.signal,
        m.stderr
    );
    assert!(
        m.code.is_some_and(|c| codes.contains(&c)),
        "{what}: exit {:?} (expected one of {codes:?}):\nstdout:\n{}\nstderr:\n{}",
        m.code,
        &m.stdout[..m.stdout.len().min(4000)],
        m.stderr
    );
    assert!(
        m.max_rss_kib < RSS_BOUND_KIB,
        "{what}: peak RSS {} KiB over the bound {RSS_BOUND_KIB} KiB",
        m.max_rss_kib
    );
}

/// Build the corpus under `root`: the healthy job, one job per kind holding its systematic
/// cases, the deep cases. Returns the deep jobs and the tally.
fn corpus(root: &Path, healthy_out: &Path) -> (Vec<String>, Tally) {
    testbed(
        healthy_out,
        &[
            "--scenario",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/megatron.toml"),
            "--ranks",
            "4",
            "--hosts",
            "1",
            "--steps",
            "8",
            "--synthetic",
        ],
        &[],
    )
    .assert_ok();
    let logs = healthy_out.join("inspector_logs");
    let alone = |cmd: &str| -> serde_json::Value {
        let o = agent(&[cmd, logs.to_str().unwrap(), "--json"]);
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{cmd} over the healthy job: {e}: {o:?}"));
        // What a run skipped belongs to the run (one job: beside the job's fields), not to
        // the job.
        if let Some(m) = v.as_object_mut() {
            assert_eq!(
                m.remove("skipped").map(|s| s["corrupt_records"].clone()),
                Some(0.into()),
                "{cmd}"
            );
        }
        v
    };
    let mut t = Tally {
        // One job: the job itself (several: `{"jobs": [...]}`).
        healthy_steps: alone("steps"),
        healthy_straggler: alone("straggler"),
        ..Tally::default()
    };
    let streams = healthy_streams(&logs.join("megatron"));
    std::fs::rename(logs.join("megatron"), root.join("megatron")).unwrap();
    assert_eq!(t.healthy_steps["job"], "megatron");
    // The healthy job, moved as it is.
    t.deliverable += streams
        .iter()
        .flat_map(|(_, _, recs)| recs)
        .filter(|r| deliverable(r))
        .count() as u64;
    for (i, kind) in Kind::ALL.into_iter().enumerate() {
        write_kind_job(&mut t, root, kind, 1000 + 2 * i as u32);
    }
    write_wide_job(&mut t, root, 900);
    let mut deep = Vec::new();
    for d in deep_cases() {
        let job = format!("deep-{}", d.0);
        write_deep(&mut t, root, &streams, &job, &d);
        deep.push(job);
    }
    (deep, t)
}

#[test]
fn crafted_records_are_rejected_or_survived_by_every_command() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("crafted");
    let root = out.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let (deep, t) = corpus(&root, &out.path().join("healthy"));
    let (cases, rejected) = (t.cases, t.rejected);
    assert!(
        rejected > 100 && rejected < cases as u64,
        "the corpus has rejected and accepted records: {rejected} of {cases}"
    );
    let r = root.to_str().unwrap();
    let w = out.path();

    let dump = measured(&["dump", r], w);
    check("dump", &dump, &[0]);
    assert_eq!(
        reported_corrupt(&dump),
        rejected,
        "dump reports every rejected record"
    );
    let summary = measured(&["dump", r, "--summary", "--json"], w);
    check("dump --summary", &summary, &[0]);

    let roles = measured(&["roles", r, "--json"], w);
    check("roles", &roles, &[0]);
    let roles: serde_json::Value = serde_json::from_str(&roles.stdout).expect("roles JSON");
    let listed: BTreeSet<&str> = roles["jobs"]
        .as_array()
        .expect("roles jobs")
        .iter()
        .filter_map(|j| j["job"].as_str())
        .collect();
    // The healthy job, and every crafted job (its streams read through).
    for kind in Kind::ALL {
        let job = format!("crafted-{}", kind.name());
        assert!(
            listed.contains(job.as_str()),
            "roles: {job} missing: {listed:?}"
        );
    }
    assert!(listed.contains("megatron"), "roles: the healthy job");
    // The wide job's communicators: their two members, no table of 2^20 slots.
    let wide = roles["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "crafted-wide")
        .expect("roles: the wide job");
    let comms = wide["comms"].as_array().expect("wide comms");
    assert_eq!(comms.len() as u64, WIDE_COMMS, "{wide}");
    for c in comms {
        assert_eq!(c["nranks"], MAX_RANKS, "{c}");
        assert_eq!(c["ranks"], serde_json::json!([]), "{c}");
        assert_eq!(
            c["members"],
            serde_json::json!([[MAX_RANKS - 2, 1], [MAX_RANKS - 1, 0]]),
            "{c}"
        );
    }

    let steps = measured(&["steps", r, "--json"], w);
    check("steps", &steps, &[0]);
    let steps: serde_json::Value = serde_json::from_str(&steps.stdout).expect("steps JSON");
    let healthy = steps["jobs"]
        .as_array()
        .expect("steps jobs")
        .iter()
        .find(|j| j["job"] == "megatron")
        .expect("steps: the healthy job");
    // The crafted jobs beside it change nothing of the healthy job's steps.
    assert_eq!(
        healthy, &t.healthy_steps,
        "steps: the healthy job analysed alone"
    );
    assert!(
        healthy["steps"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["coverage_complete"] == true)),
        "steps: complete steps of the healthy job"
    );

    // hang / straggler: 1 is a finding (crafted overdue records may make one).
    let hang = measured(&["hang", r, "--json"], w);
    check("hang", &hang, &[0, 1]);
    let straggler = measured(&["straggler", r, "--json"], w);
    check("straggler", &straggler, &[0, 1]);
    let straggler: serde_json::Value =
        serde_json::from_str(&straggler.stdout).expect("straggler JSON");
    let healthy = straggler["jobs"]
        .as_array()
        .expect("straggler jobs")
        .iter()
        .find(|j| j["job"] == "megatron")
        .expect("straggler: the healthy job");
    assert_eq!(
        healthy, &t.healthy_straggler,
        "straggler: the healthy job analysed alone"
    );

    let html = w.join("report.html");
    let report = measured(&["report", r, "-o", html.to_str().unwrap()], w);
    check("report", &report, &[0]);
    // One page per job, named after it.
    let page = w.join("report-megatron.html");
    assert!(std::fs::read_to_string(&page).unwrap().contains("megatron"));

    let replay_out = w.join("replay");
    let replay = measured(
        &["replay", r, "--out", replay_out.to_str().unwrap(), "--json"],
        w,
    );
    check("replay", &replay, &[0]);
    let v: serde_json::Value = serde_json::from_str(replay.stdout.trim()).unwrap();
    // The engine's count: records whose header passed the cursor (those with a bad header or
    // seq are the cursor's corrupt count, not yet in replay's JSON).
    let corrupt = v["corrupt"].as_u64().unwrap_or(0);
    assert!(
        corrupt > 0 && corrupt <= rejected,
        "replay counts the rejected records: {corrupt} of {rejected}"
    );
    // Every other record reaches the analyses: the crafted streams are read to their end.
    let records = v["records"].as_u64().expect("replay records");
    assert!(
        records >= t.deliverable - rejected,
        "replay read {records} records of {} deliverable, {rejected} rejected",
        t.deliverable
    );

    let pf = w.join("t.pftrace");
    let pf = pf.to_str().unwrap();
    let trace = measured(
        &["trace", r, "--job", "megatron", "--steps", "1..3", "-o", pf],
        w,
    );
    check("trace", &trace, &[0]);
    for job in &deep {
        let t = measured(&["trace", r, "--job", job, "--steps", "0..7", "-o", pf], w);
        // 0: traced; 2: nothing to trace in that job (an input error, said in one line).
        check(&format!("trace {job}"), &t, &[0, 2]);
    }
    // The host-context kinds meet the trace's host drawer.
    for kind in Kind::ALL.into_iter().filter(|k| is_host_kind(*k)) {
        let job = format!("crafted-{}", kind.name());
        let t = measured(&["trace", r, "--job", &job, "-o", pf], w);
        check(&format!("trace {job}"), &t, &[0, 2]);
    }
    daemon_survives(out.path(), &root);
}

/// The daemon over the corpus root: it keeps running, the healthy job's steps appear, and it
/// runs again after a restart (the checkpoint holds the crafted streams' state).
fn daemon_survives(out: &Path, root: &Path) {
    let state = out.join("state");
    let conf = out.join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = {state:?}\npoll_interval_ms = 20\ncheckpoint_interval_ms = 200\n\
             [sources]\nshm_enabled = false\nsegment_dirs = [{root:?}]\nscan_interval_ms = 100\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = false\n[steps]\nstream_end_s = 1\n",
        ),
    )
    .unwrap();
    // The live daemon reads host streams only from its own `<state_dir>/host-streams` (a
    // `host-*` directory under a log root is refused as a forgery): the crafted host streams go
    // there too, as if the agent's own host stream held them.
    let host_streams = state.join("host-streams");
    for job in std::fs::read_dir(root).unwrap().flatten() {
        for host in std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for pid in std::fs::read_dir(host.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if !pid.file_name().to_string_lossy().starts_with("host-") {
                    continue;
                }
                let to = host_streams
                    .join(job.file_name())
                    .join(host.file_name())
                    .join(pid.file_name());
                std::fs::create_dir_all(&to).unwrap();
                for f in std::fs::read_dir(pid.path()).unwrap().flatten() {
                    std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
                }
            }
        }
    }
    let log = out.join("agent.log");
    let job_json: PathBuf = state.join("results/steps/megatron/job.json");
    let ckpt = state.join("checkpoint.json");
    let mtime = || std::fs::metadata(&ckpt).and_then(|m| m.modified()).ok();
    for round in 0..2 {
        let started = std::time::SystemTime::now();
        let mut a = start_agent(&conf, &log);
        // Round 0: the healthy job's steps; round 1 (a restart over the same checkpoint): a
        // fresh checkpoint written.
        let ok = wait_until(Duration::from_secs(120), || {
            (round == 1 || job_json.exists()) && mtime().is_some_and(|t| t > started)
        });
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            ok,
            "round {round}: no healthy steps / checkpoint from the daemon; log:\n{text}"
        );
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            a.0.try_wait().unwrap().is_none(),
            "round {round}: the daemon exited; log:\n{text}"
        );
        assert!(!text.contains("panicked"), "round {round}: {text}");
        // SAFETY: the daemon is our child, not yet reaped; SIGTERM asks it to stop.
        unsafe { libc::kill(a.pid() as libc::pid_t, libc::SIGTERM) };
        assert!(
            wait_until(Duration::from_secs(30), || a
                .0
                .try_wait()
                .unwrap()
                .is_some()),
            "round {round}: the daemon did not stop on SIGTERM"
        );
    }
}

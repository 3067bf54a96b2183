//! The record: 128 bytes, little-endian, a 16-byte header then a 112-byte kind-specific body.
//!
//! ```text
//! off size  header
//!   0   2   magic   = b"CI"
//!   2   1   version = RECORD_VERSION
//!   3   1   kind    (Kind)
//!   4   2   len     = RECORD_SIZE (room for larger records in a later version)
//!   6   2   flags   (FLAG_*)
//!   8   8   seq     per-process sequence, assigned by the ring (gaps = records lost)
//! ```
//! Host times (`*_ns`) are CLOCK_REALTIME nanoseconds obtained as CLOCK_MONOTONIC + a per-process
//! offset fixed at `proc_start` (so they never jump); `stats` records carry fresh calibration pairs
//! so a reader can correct drift. `gpu_*_ns` are the GPU timer (`%globaltimer`) as NCCL reports it.

pub use crate::body::{
    Body, CommFini, CommInit, NetRecord, OpRecord, Overdue, ProcStart, ProxyRecord, SegmentHeader,
    Stats, StrField, Timing,
};
pub use crate::gpu::{CommDevice, GpuLink, GpuSample, GpuXid};
pub use crate::host::{HostPort, HostQp, HostTcp, HostThread};
pub use crate::moe::EpStats;

/// Size of every record, in bytes.
pub const RECORD_SIZE: usize = 128;
/// Size of the header.
pub const HEADER_SIZE: usize = 16;
/// Size of the body.
pub const BODY_SIZE: usize = RECORD_SIZE - HEADER_SIZE;
/// `b"CI"` little-endian.
pub const MAGIC: u16 = u16::from_le_bytes(*b"CI");
/// Current record format version.
pub const RECORD_VERSION: u8 = 1;

/// This record repeats one written earlier (segment preamble: `proc_start`, live `comm_init`s).
pub const FLAG_REPEAT: u16 = 1 << 0;
/// A string field was truncated to fit.
pub const FLAG_TRUNCATED: u16 = 1 << 1;
/// The operation had not finished when the record was written (finalize, exit).
pub const FLAG_INCOMPLETE: u16 = 1 << 2;
/// Proxy operation created by another process (PXN).
pub const FLAG_PXN: u16 = 1 << 3;
/// Written by the synthetic test bed, not by the plugin.
pub const FLAG_SYNTHETIC: u16 = 1 << 4;
/// The communicator was aborted (`comm_fini`).
pub const FLAG_ABORTED: u16 = 1 << 5;
/// The record comes from an HCCL communicator (Ascend), recorded through the LD_PRELOAD shim's
/// HCCL interposition rather than NCCL's profiler ABI: set on `comm_init`, `comm_device`, `coll`,
/// `p2p`, `overdue` and `comm_fini` of such communicators (docs/contracts.md, "HCCL source").
/// Readers that do not know it see an NCCL-shaped record.
pub const FLAG_HCCL: u16 = 1 << 6;

/// A raw record as it sits in the ring and in segment files.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct RawRecord(pub [u8; RECORD_SIZE]);

impl RawRecord {
    pub const ZERO: RawRecord = RawRecord([0; RECORD_SIZE]);

    /// The per-process sequence number in the header.
    pub fn seq(&self) -> u64 {
        u64::from_le_bytes(self.0[8..16].try_into().expect("8 bytes"))
    }

    /// Overwrite the sequence number (the ring does this when it accepts a record).
    pub fn set_seq(&mut self, seq: u64) {
        self.0[8..16].copy_from_slice(&seq.to_le_bytes());
    }

    /// The kind byte, without validating anything else.
    pub fn kind_byte(&self) -> u8 {
        self.0[3]
    }
}

impl core::fmt::Debug for RawRecord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "RawRecord(kind={}, seq={})",
            self.kind_byte(),
            self.seq()
        )
    }
}

/// Record kinds (DESIGN.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Segment = 1,
    ProcStart = 2,
    CommInit = 3,
    CommFini = 4,
    Coll = 5,
    P2p = 6,
    Proxy = 7,
    Net = 8,
    Overdue = 9,
    Stats = 10,
    /// Host context, written by the agent (`crate::host`).
    Thread = 11,
    Qp = 12,
    Tcp = 13,
    Port = 14,
    /// The GPU of a communicator's rank, written by the plugin (`crate::gpu`).
    CommDevice = 15,
    /// GPU samples, written by the agent (`crate::gpu`).
    Gpu = 16,
    GpuLink = 17,
    Xid = 18,
    /// MoE EP wait counters, written by the producers in a rank's process (`crate::moe`).
    EpStats = 19,
}

impl Kind {
    pub const ALL: [Kind; 19] = [
        Kind::Segment,
        Kind::ProcStart,
        Kind::CommInit,
        Kind::CommFini,
        Kind::Coll,
        Kind::P2p,
        Kind::Proxy,
        Kind::Net,
        Kind::Overdue,
        Kind::Stats,
        Kind::Thread,
        Kind::Qp,
        Kind::Tcp,
        Kind::Port,
        Kind::CommDevice,
        Kind::Gpu,
        Kind::GpuLink,
        Kind::Xid,
        Kind::EpStats,
    ];

    pub fn from_u8(v: u8) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| *k as u8 == v)
    }

    /// The name used in JSON (`"kind"`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Segment => "segment",
            Kind::ProcStart => "proc_start",
            Kind::CommInit => "comm_init",
            Kind::CommFini => "comm_fini",
            Kind::Coll => "coll",
            Kind::P2p => "p2p",
            Kind::Proxy => "proxy",
            Kind::Net => "net",
            Kind::Overdue => "overdue",
            Kind::Stats => "stats",
            Kind::Thread => "thread",
            Kind::Qp => "qp",
            Kind::Tcp => "tcp",
            Kind::Port => "port",
            Kind::CommDevice => "comm_device",
            Kind::Gpu => "gpu",
            Kind::GpuLink => "nvlink",
            Kind::Xid => "xid",
            Kind::EpStats => "ep_stats",
        }
    }

    pub fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.name() == s)
    }
}

/// Why a byte block is not a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic(u16),
    UnsupportedVersion(u8),
    UnknownKind(u8),
    BadLength(u16),
    /// The header is fine but a value is impossible ([`crate::bounds`]): the phrase names it.
    Implausible(&'static str),
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DecodeError::BadMagic(m) => {
                write!(f, "bad record magic 0x{m:04x} (expected 0x{MAGIC:04x})")
            }
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported record version {v} (this build reads {RECORD_VERSION})"
                )
            }
            DecodeError::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            DecodeError::BadLength(l) => {
                write!(f, "bad record length {l} (expected {RECORD_SIZE})")
            }
            DecodeError::Implausible(what) => write!(f, "implausible record: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub flags: u16,
    pub body: Body,
}

impl Record {
    pub fn new(body: Body) -> Record {
        Record {
            seq: 0,
            flags: 0,
            body,
        }
    }

    pub fn kind(&self) -> Kind {
        self.body.kind()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::names::{Algo, DataType, Func, Proto};

    /// One record of every kind with every field non-default (shared with the JSON tests).
    pub(crate) fn samples() -> Vec<Record> {
        let op = OpRecord {
            comm_hash: 0xdead_beef_0123_4567,
            coll_sn: 41,
            coll_local_sn: 1234,
            count: 1 << 20,
            bytes: 4 << 20,
            enqueue_ns: 1_764_425_999_123_456_789,
            start_ns: 1_764_425_999_123_460_000,
            end_ns: 1_764_425_999_124_000_001,
            gpu_start_ns: 1_764_425_999_000_000_000,
            gpu_end_ns: 1_764_425_999_000_500_000,
            api_ns: 1_764_425_999_123_400_000,
            rank: 3,
            root: -1,
            peer: -1,
            func: Func::ALL_REDUCE,
            datatype: DataType::from_name("ncclFloat32"),
            algo: Algo::from_name("RING"),
            proto: Proto::from_name("SIMPLE"),
            nchannels: 4,
            nwarps: 16,
            timing: Timing::KernelGpu,
            channels_done: 4,
        };
        let bodies = vec![
            Body::Segment(SegmentHeader {
                format: 1,
                record_size: 128,
                segment_index: 7,
                pid: 4242,
                source: 2,
                created_real_ns: 99,
                created_mono_ns: 98,
            }),
            Body::ProcStart(ProcStart {
                pid: 4242,
                rank: 5,
                local_rank: 1,
                world_size: 8,
                mono_ns: 1000,
                real_ns: 2000,
                abi_version: 6,
                host: "node-017".into(),
                job: "job-xyz".into(),
            }),
            Body::CommInit(CommInit {
                comm_hash: 7,
                nranks: 8,
                rank: 5,
                nnodes: 2,
                local_rank: 1,
                device: 1,
                abi_version: 5,
                time_ns: 77,
                comm_name: "dp:pp_stage3".into(),
            }),
            Body::CommFini(CommFini {
                comm_hash: 7,
                rank: 5,
                time_ns: 88,
                ops: 100,
                open_ops: 1,
            }),
            Body::Coll(op.clone()),
            Body::P2p(OpRecord {
                func: Func::SEND,
                peer: 6,
                root: 0,
                ..op
            }),
            Body::Proxy(ProxyRecord {
                comm_hash: 7,
                parent_local_sn: 1234,
                start_ns: 1,
                end_ns: 2,
                bytes: 3,
                send_wait_ns: 4,
                recv_wait_ns: 5,
                pid: 6,
                rank: 7,
                peer: 8,
                nsteps: 9,
                chunk_size: 10,
                steps_done: 11,
                channel: 12,
                is_send: 1,
            }),
            Body::Net(NetRecord {
                comm_hash: 7,
                parent_local_sn: 8,
                start_ns: 9,
                end_ns: 10,
                wr_id: 11,
                length: 12,
                net_type: 1,
                net_version: 1,
                rank: 2,
                device: 3,
                qp_num: 4,
                opcode: 5,
                fd: -1,
                sock_op: 0,
            }),
            Body::Overdue(Overdue {
                comm_hash: 7,
                coll_sn: 3,
                coll_local_sn: 4,
                enqueue_ns: 5,
                start_ns: 6,
                now_ns: 7,
                count: 8,
                bytes: 9,
                age_ms: 31_000,
                repeat: 2,
                threshold_ms: 30_000,
                rank: 1,
                peer: -1,
                func: Func::ALL_REDUCE,
                phase: 1,
                channels_started: 2,
                channels_done: 1,
                is_p2p: 0,
                nchannels: 2,
            }),
            Body::Stats(Stats {
                time_ns: 1,
                mono_ns: 2,
                real_ns: 3,
                records_pushed: 4,
                ring_drops: 5,
                pool_drops: 6,
                bytes_written: 7,
                records_lost_io: 8,
                events_ignored: 9,
                overdue_emitted: 10,
                segments_sealed: 11,
                segments_deleted: 12,
                io_errors: 13,
                event_mask: 0x747,
                writer_failed: 1,
                ctl_refused: 14,
                mask_changes: 15,
            }),
            Body::Thread(HostThread {
                time_ns: 20,
                interval_ns: 10,
                on_cpu_ns: 4,
                runnable_ns: 3,
                blocked_ns: 2,
                blocked_io_ns: 1,
                state_since_ns: 15,
                pid: 41,
                tid: 42,
                voluntary_switches: 5,
                involuntary_switches: 6,
                state: crate::host::thread_state::BLOCKED,
                source: crate::host::thread_source::EBPF,
                comm: "pt_main_thread".into(),
                syscall: "futex".into(),
            }),
            Body::Qp(HostQp {
                time_ns: 21,
                created_ns: 19,
                pid: 41,
                tid: 43,
                qp_num: 0x1a2b,
                dest_qp_num: 0x3c4d,
                attr_mask: 0x1,
                dlid: 7,
                event: crate::host::qp_event::ERROR,
                qp_type: 2,
                old_state: 3,
                new_state: crate::host::qp_state::ERR,
                port: 1,
                dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                device: "mlx5_0".into(),
            }),
            Body::Tcp(HostTcp {
                time_ns: 22,
                interval_ns: 10,
                pid: 41,
                retransmits: 3,
                state_changes: 1,
                sport: 40000,
                dport: 29500,
                event: crate::host::tcp_event::RETRANSMIT,
                family: 4,
                old_state: 1,
                new_state: 1,
                saddr: std::net::Ipv4Addr::new(10, 0, 0, 1)
                    .to_ipv6_mapped()
                    .octets(),
                daddr: std::net::Ipv4Addr::new(10, 0, 0, 2)
                    .to_ipv6_mapped()
                    .octets(),
            }),
            Body::Port(HostPort {
                time_ns: 23,
                interval_ns: 10,
                rx_bytes: 1,
                tx_bytes: 2,
                rx_packets: 3,
                tx_packets: 4,
                errors: 5,
                link_downed: 1,
                port: 1,
                link_layer: crate::host::port_kind::INFINIBAND,
                up: 0,
                port_flags: crate::host::port_flags::LINK_DOWN,
                device: "mlx5_0".into(),
            }),
            Body::CommDevice(CommDevice {
                comm_hash: 0xabcdef,
                time_ns: 24,
                pci: crate::gpu::pci::pack(0, 0x3b, 0, 0),
                rank: 3,
                device: 1,
                source: crate::gpu::device_source::RUNTIME,
                uuid: [7; 16],
            }),
            Body::Gpu(GpuSample {
                time_ns: 25,
                interval_ns: 10,
                energy_mj: 1,
                memory_used_bytes: 2,
                throttle_reasons: crate::gpu::throttle::HW_SLOWDOWN,
                pci: 3,
                ecc_corrected: 4,
                ecc_uncorrected: 5,
                pcie_tx_kbps: 6,
                pcie_rx_kbps: 7,
                pcie_replays: 8,
                power_mw: 9,
                valid: 10,
                sm_clock_mhz: 11,
                memory_clock_mhz: 12,
                sw_power_share: 13,
                hw_slowdown_share: 14,
                hw_thermal_share: 15,
                hw_power_brake_share: 16,
                sw_thermal_share: 17,
                sm_active_share: 18,
                retired_pages: 19,
                remapped_rows: 20,
                sm_util: 21,
                memory_util: 22,
                temperature_c: 23,
                index: 24,
                source: crate::gpu::gpu_source::NVML,
                sample_flags: crate::gpu::gpu_flags::COUNTER_RESET,
            }),
            Body::GpuLink(GpuLink {
                time_ns: 26,
                interval_ns: 10,
                tx_bytes: 1,
                rx_bytes: 2,
                pci: 3,
                crc_flit: 4,
                crc_data: 5,
                replay: 6,
                recovery: 7,
                index: 8,
                link: 9,
                up: 1,
                valid: 7,
                sample_flags: 0,
                source: crate::gpu::gpu_source::DCGM,
            }),
            Body::Xid(GpuXid {
                time_ns: 27,
                xid: 79,
                pci: 3,
                index: 1,
                source: crate::gpu::gpu_source::NVML,
            }),
            Body::EpStats(EpStats {
                ep_group_id: 0xfeed,
                instance: [7; 16],
                window_seq: 3,
                t_start_ns: 28,
                t_end_ns: 29,
                steps: 580,
                scale_bits: 0.5f32.to_bits(),
                ep_size: 16,
                rank: 2,
                first: 10,
                count: 5,
                phase: crate::moe::ep_phase::COMBINE,
                source: crate::moe::ep_source::MC2,
                ep_flags: crate::moe::ep_flags::CUMULATIVE | crate::moe::ep_flags::HIERARCHICAL,
                values: [1, 2, 3, u64::from(u32::MAX), 5],
            }),
        ];
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Record {
                seq: 100 + i as u64,
                flags: FLAG_REPEAT,
                body,
            })
            .collect()
    }

    #[test]
    fn decode_into_reuses_any_slot_and_equals_decode() {
        let all = samples();
        // Every record decoded over every other (operation over operation: in place).
        for over in &all {
            for r in &all {
                let raw = r.encode();
                let mut slot = over.clone();
                Record::decode_into(&raw, &mut slot).unwrap();
                assert_eq!(
                    slot,
                    Record::decode(&raw).unwrap(),
                    "{:?} over {:?}",
                    r.kind(),
                    over.kind()
                );
            }
        }
        // A bad record leaves the slot as it was.
        let mut raw = all[0].encode();
        raw.0[0] ^= 0xff;
        let mut slot = all[1].clone();
        assert!(Record::decode_into(&raw, &mut slot).is_err());
        assert_eq!(slot, all[1]);
    }

    #[test]
    fn every_kind_round_trips_through_binary() {
        for rec in samples() {
            let raw = rec.encode();
            assert_eq!(raw.seq(), rec.seq);
            let back = Record::decode(&raw).unwrap();
            assert_eq!(back, rec, "{:?}", rec.kind());
            assert_eq!(back.encode(), raw);
        }
    }

    /// Plugins before issue 16 wrote `stats` with body bytes 97..112 zero: such a record decodes,
    /// its control-file counters 0 and every other field as written.
    #[test]
    fn stats_of_older_plugins_decode_with_zero_control_counters() {
        let rec = samples()
            .into_iter()
            .find(|r| r.kind() == Kind::Stats)
            .unwrap();
        let mut raw = rec.encode();
        let body = &raw.0[HEADER_SIZE..];
        assert_eq!(&body[97..100], &[0, 0, 0], "padding after writer_failed");
        assert_eq!(u32::from_le_bytes(body[100..104].try_into().unwrap()), 14);
        assert_eq!(u32::from_le_bytes(body[104..108].try_into().unwrap()), 15);
        assert!(body[108..].iter().all(|b| *b == 0), "4 spare bytes left");
        raw.0[HEADER_SIZE + 97..].fill(0); // what an older plugin wrote
        let old = Record::decode(&raw).unwrap();
        let (Body::Stats(new), Body::Stats(old)) = (&rec.body, &old.body) else {
            panic!("not stats")
        };
        assert_eq!((old.ctl_refused, old.mask_changes), (0, 0));
        let same = Stats {
            ctl_refused: 0,
            mask_changes: 0,
            ..new.clone()
        };
        assert_eq!(*old, same);
    }

    #[test]
    fn header_is_validated() {
        let mut raw = samples()[4].encode();
        raw.0[0] = 0;
        assert!(matches!(
            Record::decode(&raw),
            Err(DecodeError::BadMagic(_))
        ));
        let mut raw = samples()[4].encode();
        raw.0[2] = 9;
        assert_eq!(
            Record::decode(&raw),
            Err(DecodeError::UnsupportedVersion(9))
        );
        let mut raw = samples()[4].encode();
        raw.0[3] = 77;
        assert_eq!(Record::decode(&raw), Err(DecodeError::UnknownKind(77)));
    }

    #[test]
    fn long_names_are_cut_at_a_char_boundary_and_flagged() {
        let name = "é".repeat(60); // 120 bytes
        let rec = Record::new(Body::CommInit(CommInit {
            comm_name: name.as_str().into(),
            ..Default::default()
        }));
        let back = Record::decode(&rec.encode()).unwrap();
        assert_ne!(back.flags & FLAG_TRUNCATED, 0);
        let Body::CommInit(c) = back.body else {
            panic!()
        };
        assert_eq!(c.comm_name.0.len(), 70);
        assert!(std::str::from_utf8(&c.comm_name.0).is_ok());
    }
}

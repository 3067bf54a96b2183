//! Encoding and decoding of the GPU bodies (`crate::gpu`).

use super::{R, W};
use crate::body::Body;
use crate::gpu::*;

/// Each encoder returns whether a string field was truncated (none has one).
pub(super) fn encode_comm_device(c: &CommDevice, w: &mut W<'_>) -> bool {
    w.u64(c.comm_hash)
        .u64(c.time_ns)
        .u64(c.pci)
        .i32(c.rank)
        .i32(c.device)
        .u8(c.source)
        .bytes(&c.uuid);
    false
}

pub(super) fn encode_gpu(g: &GpuSample, w: &mut W<'_>) -> bool {
    w.u64(g.time_ns)
        .u64(g.interval_ns)
        .u64(g.energy_mj)
        .u64(g.memory_used_bytes)
        .u64(g.throttle_reasons)
        .u64(g.pci)
        .u32(g.ecc_corrected)
        .u32(g.ecc_uncorrected)
        .u32(g.pcie_tx_kbps)
        .u32(g.pcie_rx_kbps)
        .u32(g.pcie_replays)
        .u32(g.power_mw)
        .u32(g.valid)
        .u16(g.sm_clock_mhz)
        .u16(g.memory_clock_mhz)
        .u16(g.sw_power_share)
        .u16(g.hw_slowdown_share)
        .u16(g.hw_thermal_share)
        .u16(g.hw_power_brake_share)
        .u16(g.sw_thermal_share)
        .u16(g.sm_active_share)
        .u16(g.retired_pages)
        .u16(g.remapped_rows)
        .u8(g.sm_util)
        .u8(g.memory_util)
        .u8(g.temperature_c)
        .u8(g.index)
        .u8(g.source)
        .u8(g.sample_flags);
    false
}

pub(super) fn encode_link(l: &GpuLink, w: &mut W<'_>) -> bool {
    w.u64(l.time_ns)
        .u64(l.interval_ns)
        .u64(l.tx_bytes)
        .u64(l.rx_bytes)
        .u64(l.pci)
        .u32(l.crc_flit)
        .u32(l.crc_data)
        .u32(l.replay)
        .u32(l.recovery)
        .u8(l.index)
        .u8(l.link)
        .u8(l.up)
        .u8(l.valid)
        .u8(l.sample_flags)
        .u8(l.source);
    false
}

pub(super) fn encode_xid(x: &GpuXid, w: &mut W<'_>) -> bool {
    w.u64(x.time_ns)
        .u64(x.xid)
        .u64(x.pci)
        .u8(x.index)
        .u8(x.source);
    false
}

pub(super) fn decode_comm_device(r: &mut R<'_>) -> Body {
    Body::CommDevice(CommDevice {
        comm_hash: r.u64(),
        time_ns: r.u64(),
        pci: r.u64(),
        rank: r.i32(),
        device: r.i32(),
        source: r.u8(),
        uuid: r.take(),
    })
}

pub(super) fn decode_gpu(r: &mut R<'_>) -> Body {
    Body::Gpu(GpuSample {
        time_ns: r.u64(),
        interval_ns: r.u64(),
        energy_mj: r.u64(),
        memory_used_bytes: r.u64(),
        throttle_reasons: r.u64(),
        pci: r.u64(),
        ecc_corrected: r.u32(),
        ecc_uncorrected: r.u32(),
        pcie_tx_kbps: r.u32(),
        pcie_rx_kbps: r.u32(),
        pcie_replays: r.u32(),
        power_mw: r.u32(),
        valid: r.u32(),
        sm_clock_mhz: r.u16(),
        memory_clock_mhz: r.u16(),
        sw_power_share: r.u16(),
        hw_slowdown_share: r.u16(),
        hw_thermal_share: r.u16(),
        hw_power_brake_share: r.u16(),
        sw_thermal_share: r.u16(),
        sm_active_share: r.u16(),
        retired_pages: r.u16(),
        remapped_rows: r.u16(),
        sm_util: r.u8(),
        memory_util: r.u8(),
        temperature_c: r.u8(),
        index: r.u8(),
        source: r.u8(),
        sample_flags: r.u8(),
    })
}

pub(super) fn decode_link(r: &mut R<'_>) -> Body {
    Body::GpuLink(GpuLink {
        time_ns: r.u64(),
        interval_ns: r.u64(),
        tx_bytes: r.u64(),
        rx_bytes: r.u64(),
        pci: r.u64(),
        crc_flit: r.u32(),
        crc_data: r.u32(),
        replay: r.u32(),
        recovery: r.u32(),
        index: r.u8(),
        link: r.u8(),
        up: r.u8(),
        valid: r.u8(),
        sample_flags: r.u8(),
        source: r.u8(),
    })
}

pub(super) fn decode_xid(r: &mut R<'_>) -> Body {
    Body::Xid(GpuXid {
        time_ns: r.u64(),
        xid: r.u64(),
        pci: r.u64(),
        index: r.u8(),
        source: r.u8(),
    })
}

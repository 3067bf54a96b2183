//! The NVML source against the test bed's NVML stand-in (`tests/gpu-standin/nvml_standin.c`),
//! built here per test (its own copy: its own library instance) and loaded through the real
//! `nvml-wrapper` path by `[gpu] library`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use comminsight_wire::gpu::{gpu_flags, gpu_valid, link_valid, pci, throttle, SHARE_SCALE};

use super::nvml::NvmlSource;
use super::xid::XidWatcher;
use super::GpuConfig;

/// The stand-in reads its script from the environment at nvmlInit: one test at a time there.
pub(crate) static ENV: Mutex<()> = Mutex::new(());

/// Build the stand-in into `dir`, hiding the symbols `hide` (a version script), and a script.
pub(crate) fn standin(dir: &Path, hide: &[&str], script: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu-standin/nvml_standin.c");
    let so = dir.join("libnvidia-ml.so.1");
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-lpthread");
    if !hide.is_empty() {
        let map = dir.join("hide.map");
        std::fs::write(&map, format!("{{ local: {}; }};", hide.join("; "))).unwrap();
        cc.arg(format!("-Wl,--version-script={}", map.display()));
    }
    let out = cc.output().expect("run cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sc = dir.join("script");
    std::fs::write(&sc, script).unwrap();
    (so, sc)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ci-gpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Open the stand-in built in `dir` with `script` (devices: two).
fn open(name: &str, hide: &[&str], script: &str) -> NvmlSource {
    let dir = tmp(name);
    let (so, sc) = standin(&dir, hide, script);
    let _g = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("NVML_STANDIN_SCRIPT", &sc);
    std::env::set_var("GPU_STANDIN_DEVICES", "0000:18:00.0,0000:2a:00.0");
    let cfg = GpuConfig {
        library: so,
        ..GpuConfig::default()
    };
    let s = NvmlSource::open(&cfg).expect("open the stand-in");
    std::env::remove_var("NVML_STANDIN_SCRIPT");
    std::env::remove_var("GPU_STANDIN_DEVICES");
    s
}

fn mono() -> u64 {
    crate::probes::threads::monotonic_ns()
}

#[test]
fn the_standins_structures_have_nvmls_layout() {
    use nvml_wrapper_sys::bindings::*;
    let dir = tmp("layout");
    let (so, _) = standin(&dir, &[], "");
    let path = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading the stand-in runs no constructor; the name is NUL-terminated.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    // SAFETY: a NUL-terminated name on a valid handle.
    let f = unsafe { libc::dlsym(h, c"nvml_standin_layout".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: the stand-in defines `unsigned long nvml_standin_layout(int)`.
    let layout: extern "C" fn(i32) -> u64 = unsafe { std::mem::transmute(f) };
    let ours = [
        std::mem::size_of::<nvmlPciInfo_t>(),
        std::mem::size_of::<nvmlUtilization_t>(),
        std::mem::size_of::<nvmlMemory_v2_t>(),
        std::mem::size_of::<nvmlFieldValue_t>(),
        std::mem::size_of::<nvmlEventData_t>(),
        std::mem::offset_of!(nvmlFieldValue_t, value),
        std::mem::offset_of!(nvmlFieldValue_t, nvmlReturn),
        std::mem::offset_of!(nvmlPciInfo_t, busId),
        std::mem::offset_of!(nvmlEventData_t, eventData),
    ];
    for (i, want) in ours.into_iter().enumerate() {
        assert_eq!(layout(i as i32), want as u64, "layout item {i}");
    }
}

#[test]
fn a_throttled_gpu_and_a_link_with_rising_crc_errors_read_as_scripted() {
    let mut s = open(
        "values",
        &[],
        "links 4\nthrottle 1 0x48 0 -1\nnvlink_errors 1 2 1000 0\nunsupported nvmlDeviceGetPcieThroughput\n",
    );
    assert_eq!(s.devices().len(), 2);
    assert_eq!(s.devices()[1].pci, "0000:2a:00.0");
    assert_eq!(s.devices()[1].nvlinks, 4);
    assert!(
        s.devices()[1].uuid.starts_with("GPU-5c1ab1e0-"),
        "{:?}",
        s.devices()
    );
    let (g0, _) = s.sample(None, mono(), 1);
    assert!(g0.iter().all(|g| g.sample_flags & gpu_flags::FIRST != 0));
    std::thread::sleep(Duration::from_millis(300));
    let (g, l) = s.sample(None, mono(), 2);
    let (a, b) = (&g[0], &g[1]);
    assert_eq!(
        (a.pci, b.pci),
        (pci::pack(0, 0x18, 0, 0), pci::pack(0, 0x2a, 0, 0))
    );
    for x in [a, b] {
        for bit in [
            gpu_valid::UTIL,
            gpu_valid::CLOCKS,
            gpu_valid::THROTTLE_TIMES,
            gpu_valid::ENERGY,
            gpu_valid::MEMORY,
            gpu_valid::ECC,
        ] {
            assert_ne!(x.valid & bit, 0, "bit {bit:#x} of {x:?}");
        }
        assert_eq!(
            x.valid & gpu_valid::PCIE_THROUGHPUT,
            0,
            "PCIe throughput is off"
        );
        assert!(x.interval_ns >= 300_000_000);
        // 350 W over the interval.
        let want = 350 * x.interval_ns / 1_000_000;
        assert!(
            x.energy_mj.abs_diff(want) <= want / 20 + 5,
            "{} vs {want}",
            x.energy_mj
        );
    }
    assert_eq!(a.sm_clock_mhz, 1980);
    assert_eq!(a.hw_slowdown_share, 0);
    assert_eq!(a.throttle_reasons & throttle::SLOWDOWN, 0);
    assert_eq!(b.sm_clock_mhz, 1100);
    assert_eq!(b.throttle_reasons, 0x48);
    assert!(b.hw_thermal_share > SHARE_SCALE / 10 * 9, "{b:?}");
    assert_eq!(b.hw_slowdown_share, b.hw_thermal_share);
    assert_eq!(b.temperature_c, 91);
    assert_eq!(l.len(), 8, "4 links of each GPU");
    let crc = l.iter().find(|k| k.index == 1 && k.link == 2).unwrap();
    assert_eq!(
        crc.valid,
        link_valid::STATE | link_valid::THROUGHPUT | link_valid::ERRORS
    );
    assert!((250..=400).contains(&crc.crc_flit), "{crc:?}");
    assert!(l
        .iter()
        .filter(|k| (k.index, k.link) != (1, 2))
        .all(|k| k.errors() == 0));
    // 4 GiB/s TX per link.
    let tx_per_s = crc.tx_bytes as f64 / (crc.interval_ns as f64 / 1e9);
    assert!(
        (tx_per_s / (4u64 << 30) as f64 - 1.0).abs() < 0.1,
        "{tx_per_s}"
    );
    assert_eq!(
        s.off_lines,
        [
            "pcie_throughput on GPU 0 (0000:18:00.0): not supported",
            "pcie_throughput on GPU 1 (0000:2a:00.0): not supported"
        ]
    );
    // Only the wanted device.
    let want: BTreeSet<u64> = [pci::pack(0, 0x2a, 0, 0)].into();
    let (g, l) = s.sample(Some(&want), mono(), 3);
    assert_eq!((g.len(), l.len()), (1, 4));
}

#[test]
fn a_missing_symbol_turns_off_that_metric_alone_with_one_line() {
    let mut s = open("missing", &["nvmlDeviceGetPcieReplayCounter"], "links 2\n");
    for _ in 0..3 {
        let (g, _) = s.sample(None, mono(), 1);
        for x in &g {
            assert_eq!(x.valid & gpu_valid::PCIE_REPLAYS, 0);
            assert_ne!(x.valid & gpu_valid::PCIE_THROUGHPUT, 0);
            assert_ne!(x.valid & gpu_valid::CLOCKS, 0);
        }
    }
    assert_eq!(s.off_lines.len(), 1, "{:?}", s.off_lines);
    assert_eq!(
        s.off_lines[0],
        "pcie_replays: the NVML library has no nvmlDeviceGetPcieReplayCounter"
    );
}

#[test]
fn a_driver_reset_is_a_reset_not_a_negative_rate() {
    let mut s = open("reset", &[], "links 1\nreset * 250\n");
    s.sample(None, mono(), 1);
    std::thread::sleep(Duration::from_millis(200));
    let (g, _) = s.sample(None, mono(), 2);
    assert!(g[0].energy_mj > 0 && g[0].sample_flags == 0, "{:?}", g[0]);
    std::thread::sleep(Duration::from_millis(150));
    let (g, l) = s.sample(None, mono(), 3);
    assert_eq!(g[0].energy_mj, 0);
    assert_ne!(g[0].sample_flags & gpu_flags::COUNTER_RESET, 0);
    assert_ne!(l[0].sample_flags & gpu_flags::COUNTER_RESET, 0);
    assert_eq!(l[0].tx_bytes, 0);
}

#[test]
fn an_xid_event_arrives_with_its_gpu() {
    let s = open("xid", &[], "links 1\nxid 1 79 150\n");
    let w = XidWatcher::start(s.nvml(), Box::new(|| 42)).expect("events");
    let mut got = Vec::new();
    for _ in 0..40 {
        got.extend(w.take());
        if !got.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].xid, got[0].pci, got[0].index, got[0].time_ns),
        (79, pci::pack(0, 0x2a, 0, 0), 1, 42)
    );
}

#[test]
fn no_library_is_one_line_naming_it() {
    let cfg = GpuConfig {
        library: "/nonexistent/libnvidia-ml.so.1".into(),
        ..GpuConfig::default()
    };
    let e = NvmlSource::open(&cfg).err().expect("no library");
    assert!(
        e.starts_with("cannot load /nonexistent/libnvidia-ml.so.1"),
        "{e}"
    );
    assert!(!e.contains('\n'));
}

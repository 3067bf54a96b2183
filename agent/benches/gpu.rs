//! Cost of GPU sampling (issue 20): one NVML source period over 8 GPUs with 18 NVLinks each
//! (every metric, per-link state, throughput and DL error counters), against the test bed's NVML
//! stand-in built here (`tests/gpu-standin/nvml_standin.c`), through the real `nvml-wrapper`
//! path. What it measures is the agent's side — nvml-wrapper, our calls, the deltas, the records
//! — plus the stand-in's trivial answers: a real driver's ioctls come on top, so the bench also
//! counts the NVML calls per device per period (the stand-in counts them), to multiply by the
//! per-call cost the GPU check measures on real hardware. From the median of one period it
//! derives the CPU share per device at the 1 s and 100 ms periods.
//!
//! `cargo bench -p comminsight-agent --bench gpu`

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use comminsight_agent::host::gpu::nvml::NvmlSource;
use comminsight_agent::host::gpu::GpuConfig;
use criterion::Criterion;

const GPUS: u64 = 8;

fn main() {
    let dir = std::env::temp_dir().join(format!("ci-gpu-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let so = dir.join("libnvidia-ml.so.1");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu-standin/nvml_standin.c");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-lpthread")
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "cc {}", src.display());
    let script = dir.join("script");
    std::fs::write(
        &script,
        "links 18\nthrottle 1 0x48 0 -1\nnvlink_errors 2 3 100 0\n",
    )
    .unwrap();
    std::env::set_var("NVML_STANDIN_SCRIPT", &script);
    let cfg = GpuConfig {
        library: so.clone(),
        ..GpuConfig::default()
    };
    let mut n = NvmlSource::open(&cfg).expect("open the stand-in");
    assert_eq!(n.devices().len() as u64, GPUS);
    assert!(n.devices().iter().all(|d| d.nvlinks == 18));
    let calls = standin_calls(&so);
    let mut t = 1u64;
    let (g, l) = n.sample(None, t, t);
    assert_eq!((g.len(), l.len()), (8, 8 * 18));
    let before = calls();
    t += 1_000_000_000;
    n.sample(None, t, t);
    let per_device = (calls() - before) / GPUS;
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    c.bench_function("gpu_sample_8_gpus_18_nvlinks", |b| {
        b.iter(|| {
            t += 1_000_000_000;
            n.sample(None, t, t)
        })
    });
    c.final_summary();
    // The same, timed here: the median of 31 batches of 50 periods (criterion's report has
    // its own estimate beside it).
    let mut per: Vec<f64> = (0..31)
        .map(|_| {
            let s = std::time::Instant::now();
            for _ in 0..50 {
                t += 1_000_000_000;
                std::hint::black_box(n.sample(None, t, t));
            }
            s.elapsed().as_nanos() as f64 / 50.0
        })
        .collect();
    per.sort_by(f64::total_cmp);
    let median = per[per.len() / 2];
    let per_dev = median / GPUS as f64;
    println!(
        "gpu: one period of 8 GPUs x 18 NVLinks: median {:.1} us; {:.1} us per device; {per_device} NVML calls per device per period",
        median / 1e3,
        per_dev / 1e3
    );
    println!(
        "gpu: CPU per device: {:.4} % of a core at 1 s, {:.3} % at 100 ms (the agent's side; add {per_device} x the driver's per-call cost)",
        per_dev / 1e9 * 100.0,
        per_dev / 1e8 * 100.0
    );
    let _ = std::fs::remove_dir_all(&dir);
    dcgm(&mut c);
}

/// One dcgm-exporter scrape of 8 GPUs: the fields the agent keeps plus 12 it does not (as a
/// default dcgm-exporter counter file has them), parsed and converted to records.
fn dcgm(c: &mut Criterion) {
    use comminsight_agent::host::gpu::dcgm::convert::{DcgmConverter, FIELDS};
    use comminsight_agent::host::gpu::dcgm::exposition;
    let other = [
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_RETIRED_PENDING",
    ];
    let mut body = String::new();
    for f in FIELDS.iter().chain(other.iter()) {
        body.push_str(&format!("# HELP {f} The field.\n# TYPE {f} gauge\n"));
        for i in 0..GPUS {
            body.push_str(&format!(
                "{f}{{gpu=\"{i}\",UUID=\"GPU-5c1ab1e0-0000-{i:02x}00-0000-00000000000{i}\",\
                 pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",\
                 modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-17\",\
                 DCGM_FI_DRIVER_VERSION=\"570.133.20\"}} {}\n",
                0x18 + i * 0x10,
                1000 + i
            ));
        }
    }
    let mut conv = DcgmConverter::default();
    let uuids = std::collections::BTreeMap::new();
    let mut t = 1u64;
    let mut scrape = || {
        t += 1_000_000_000;
        let e = exposition::parse(&body, &FIELDS);
        conv.convert(&e.series, &uuids, t, t)
    };
    let (r, st) = scrape();
    assert_eq!((r.gpus.len(), st.gpus, st.unmapped), (8, 8, 0));
    c.bench_function("dcgm_scrape_8_gpus", |b| b.iter(&mut scrape));
    c.final_summary();
    let mut per: Vec<f64> = (0..31)
        .map(|_| {
            let s = std::time::Instant::now();
            for _ in 0..10 {
                std::hint::black_box(scrape());
            }
            s.elapsed().as_nanos() as f64 / 10.0
        })
        .collect();
    per.sort_by(f64::total_cmp);
    let median = per[per.len() / 2];
    println!(
        "dcgm: one scrape of 8 GPUs ({} bytes, {} lines, {} fields kept): parse + convert median {:.1} us; {:.4} % of a core at the 5 s default, {:.3} % at 100 ms",
        body.len(),
        body.lines().count(),
        FIELDS.len(),
        median / 1e3,
        median / 5e9 * 100.0,
        median / 1e8 * 100.0
    );
}

/// The stand-in's call counter.
fn standin_calls(so: &Path) -> impl Fn() -> u64 {
    let path = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: the library is loaded already (nvml-wrapper holds it); this adds a reference.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!h.is_null());
    // SAFETY: a NUL-terminated name on a valid handle.
    let f = unsafe { libc::dlsym(h, c"nvml_standin_calls".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: the stand-in defines `unsigned long nvml_standin_calls(void)`.
    let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(f) };
    move || f()
}

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

use std::collections::{BTreeMap, BTreeSet};

use comminsight_wire::record::{Body, Kind, Record};
use comminsight_wire::segment::{find_segments, read_segment};

use super::*;

struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("ci-recorder-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn records_under(root: &Path) -> Vec<Record> {
    let mut out = Vec::new();
    let mut segs = find_segments(root).unwrap_or_default();
    segs.sort();
    for p in segs {
        let r = read_segment(&p).unwrap();
        out.extend(r.records);
    }
    out
}

#[test]
fn schedstat_threads_of_followed_processes_go_into_one_host_stream_per_job() {
    let dir = Scratch::new("state");
    let sysfs = Scratch::new("sysfs");
    let probes = ProbesConfig {
        enabled: false,
        interval_ms: 100,
        ..ProbesConfig::default()
    };
    let ports = PortsConfig {
        sysfs_root: sysfs.path().to_path_buf(),
        interval_ms: 100,
        ..PortsConfig::default()
    };
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let gpu = GpuConfig {
        enabled: false,
        ..GpuConfig::default()
    };
    let mut r = HostRecorder::start(&probes, &ports, &gpu, dir.path(), "h1");
    assert_eq!(r.status().threads, "schedstat");
    let ranks: BTreeSet<(String, u32)> = [("job-a".to_string(), sleeper.id())].into();
    let t0 = Instant::now();
    r.tick(&ranks, &BoundGpus::default(), t0);
    std::thread::sleep(Duration::from_millis(150));
    r.tick(
        &ranks,
        &BoundGpus::default(),
        t0 + Duration::from_millis(150),
    );
    assert_eq!(r.status().tracked, 1);
    // The job's processes are gone: its stream is sealed.
    r.tick(
        &BTreeSet::new(),
        &BoundGpus::default(),
        t0 + Duration::from_millis(300),
    );
    sleeper.kill().unwrap();
    let _ = sleeper.wait();
    let stream = dir
        .path()
        .join(HOST_STREAMS_DIR)
        .join("job-a")
        .join("h1")
        .join(format!("host-{}", std::process::id()));
    let recs = records_under(&stream);
    assert_eq!(recs[0].kind(), Kind::Segment);
    let Body::ProcStart(ps) = &recs[1].body else {
        panic!("{:?}", recs[1])
    };
    assert_eq!((ps.rank, ps.job.as_str_lossy().as_ref()), (-1, "job-a"));
    let threads: Vec<&HostThread> = recs
        .iter()
        .filter_map(|r| match &r.body {
            Body::Thread(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert_eq!(threads[0].interval_ns, 0);
    let t = threads[1];
    assert_eq!(t.pid, sleeper.id());
    assert_eq!(t.state, thread_state::BLOCKED);
    assert_eq!(t.source, thread_source::SCHEDSTAT);
    assert!(t.interval_ns >= 100_000_000, "{t:?}");
    assert!(t.blocked_ns * 10 >= t.interval_ns * 9, "{t:?}");
    assert_eq!(t.syscall.as_str_lossy(), "clock_nanosleep");
    // Sequence numbers continue from the proc_start without gaps.
    let seqs: Vec<u64> = recs.iter().skip(1).map(|r| r.seq).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    assert!(std::fs::read_dir(&stream)
        .unwrap()
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().ends_with(".open")));
}

#[test]
fn each_job_gets_the_records_of_its_own_gpus_only() {
    let dir = Scratch::new("gpu");
    let lib = Scratch::new("gpu-lib");
    let (so, script) = crate::host::gpu::tests::standin(lib.path(), &[], "links 2\nxid 0 48 0\n");
    let probes = ProbesConfig {
        enabled: false,
        sched: false,
        ..ProbesConfig::default()
    };
    let ports = PortsConfig {
        enabled: false,
        ..PortsConfig::default()
    };
    let gpu = GpuConfig {
        library: so,
        interval_ms: 50,
        ..GpuConfig::default()
    };
    let mut r = {
        let _g = crate::host::gpu::tests::ENV
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        std::env::set_var("NVML_STANDIN_SCRIPT", &script);
        std::env::set_var("GPU_STANDIN_DEVICES", "0000:18:00.0,0000:2a:00.0");
        let r = HostRecorder::start(&probes, &ports, &gpu, dir.path(), "h1");
        std::env::remove_var("NVML_STANDIN_SCRIPT");
        std::env::remove_var("GPU_STANDIN_DEVICES");
        r
    };
    assert_eq!(r.status().gpu.nvml, "on (2 GPUs, driver 570.133.20)");
    let mut a = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let mut b = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let ranks: BTreeSet<(String, u32)> =
        [("job-a".to_string(), a.id()), ("job-b".to_string(), b.id())].into();
    let (ga, gb) = (
        comminsight_wire::gpu::pci::pack(0, 0x18, 0, 0),
        comminsight_wire::gpu::pci::pack(0, 0x2a, 0, 0),
    );
    let bound = BoundGpus {
        jobs: [
            ("job-a".to_string(), [ga].into()),
            ("job-b".to_string(), [gb].into()),
        ]
        .into(),
        uuids: BTreeMap::new(),
    };
    let t0 = Instant::now();
    for k in 0..4u64 {
        r.tick(&ranks, &bound, t0 + Duration::from_millis(60 * k));
        std::thread::sleep(Duration::from_millis(60));
    }
    r.finish();
    for p in [&mut a, &mut b] {
        p.kill().unwrap();
        let _ = p.wait();
    }
    let job = |j: &str| {
        records_under(
            &dir.path()
                .join(HOST_STREAMS_DIR)
                .join(j)
                .join("h1")
                .join(format!("host-{}", std::process::id())),
        )
    };
    for (j, mine) in [("job-a", ga), ("job-b", gb)] {
        let recs = job(j);
        let gpus: Vec<u64> = recs
            .iter()
            .filter_map(|r| match &r.body {
                Body::Gpu(g) => Some(g.pci),
                _ => None,
            })
            .collect();
        assert!(gpus.len() >= 3, "{j}: {gpus:?}");
        assert!(gpus.iter().all(|p| *p == mine), "{j}: {gpus:?}");
        let links = recs.iter().filter(|r| r.kind() == Kind::GpuLink).count();
        assert_eq!(links, 2 * gpus.len(), "{j}");
        let xids: Vec<u64> = recs
            .iter()
            .filter_map(|r| match &r.body {
                Body::Xid(x) => Some(x.pci),
                _ => None,
            })
            .collect();
        // The XID of GPU 0 (0000:18:00.0) is job-a's only.
        assert_eq!(xids, if j == "job-a" { vec![ga] } else { vec![] }, "{j}");
    }
    assert_eq!(r.status().gpu.xids, 1);
}

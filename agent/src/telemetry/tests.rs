use comminsight_wire::names::{Algo, DataType, Func, Proto};
use comminsight_wire::record::{Body, CommInit, OpRecord, Record, Timing};
use prost::Message;

use super::*;
use crate::metrics::MetricsAggregator;
use crate::StreamId;

/// An aggregator holding `durations_us` AllReduce operations on comm `tp` of job `j`.
fn snapshot(durations_us: &[u64]) -> MetricsSnapshot {
    let mut agg = MetricsAggregator::new(100);
    let s = StreamId::new("j", "h", "1");
    let init = Body::CommInit(CommInit {
        comm_hash: 7,
        nranks: 2,
        comm_name: "tp".into(),
        ..Default::default()
    });
    agg.observe(
        &s,
        &Record {
            seq: 0,
            flags: 0,
            body: init,
        },
    );
    let dt = DataType::from_name("ncclFloat32");
    for (i, us) in durations_us.iter().enumerate() {
        let op = OpRecord {
            comm_hash: 7,
            count: 1024,
            bytes: 1024 * dt.size(),
            start_ns: 1_000_000,
            end_ns: 1_000_000 + us * 1000,
            func: Func::ALL_REDUCE,
            datatype: dt,
            algo: Algo::from_name("RING"),
            proto: Proto::from_name("SIMPLE"),
            timing: Timing::KernelCpu,
            ..Default::default()
        };
        let seq = i as u64 + 1;
        agg.observe(
            &s,
            &Record {
                seq,
                flags: 0,
                body: Body::Coll(op),
            },
        );
    }
    agg.snapshot()
}

fn families(durations_us: &[u64]) -> Vec<Family> {
    let agent = SelfMetricsValues {
        records: 5,
        lag_ms: 1500,
        ..Default::default()
    };
    let mut straggler = StragglerValues::new();
    straggler.insert(("j".into(), 3), ("node-b".into(), (12.5, 40.0)));
    let mut host = HostValues::default();
    host.ranks.insert(("j".into(), 3), Default::default());
    host.ports.push(crate::host::context::PortView {
        device: "eth0".into(),
        port: 1,
        up: true,
        ..Default::default()
    });
    host.gpus.push(gpu_values());
    let mut moe = super::moe::MoeValues::default();
    let key = (
        "j".to_string(),
        "0x00000000000000e9".to_string(),
        "dispatch",
    );
    moe.groups.insert(
        key.clone(),
        super::moe::GroupValues {
            cols: vec![0.5, 2.5],
            rows: vec![1.0, 1.0],
            cells: vec![0.5, 1.5, 0.5, 1.5],
        },
    );
    moe.findings.insert((key, "sender_slow"), 2);
    collect(
        &snapshot(durations_us),
        &agent,
        &straggler,
        &host,
        &moe,
        "node-a",
    )
}

/// A GPU with every metric, one NVLink, a throttled period and an XID.
fn gpu_values() -> super::gpu::GpuValues {
    use crate::host::gpu::context::{GpuLatest, LinkView};
    super::gpu::GpuValues {
        job: "j".into(),
        rank: 3,
        pci: "0000:2a:00.0".into(),
        uuid: "GPU-5c1ab1e0-0000-2a00-0000-000000000001".into(),
        latest: GpuLatest {
            index: 1,
            valid: u32::MAX,
            sm_util: 85,
            memory_util: 40,
            sm_clock_mhz: 1100,
            memory_clock_mhz: 2619,
            temperature_c: 91,
            power_mw: 350_000,
            memory_used_bytes: 61 << 30,
            pcie_tx_kbps: 1_200_000,
            energy_mj: 3_500_000,
            ecc_corrected: 2,
            throttle_ns: [0, 4_000_000_000, 4_000_000_000, 0, 0],
            ..GpuLatest::default()
        },
        links: vec![LinkView {
            link: 3,
            tx_bytes: 1 << 30,
            crc_flit: 1204,
            up: 1,
            ..LinkView::default()
        }],
        xid: 79,
    }
}

#[test]
fn gpu_values_follow_the_hw_conventions_with_gpu_rank_and_host() {
    let f = families(&[5]);
    let one = |i: &Instrument| {
        let fam = family(&f, i);
        assert!(!fam.points.is_empty(), "{}", i.name);
        fam.points.clone()
    };
    let u = one(&catalogue::GPU_UTILIZATION);
    assert_eq!(u[0].value, Value::Real(0.85));
    let keys: Vec<&str> = u[0].attrs.iter().map(|a| a.0).collect();
    assert_eq!(
        keys,
        [
            "comminsight.job.id",
            "comminsight.rank",
            "host.name",
            "hw.id",
            "hw.type",
            "comminsight.gpu.pci"
        ]
    );
    assert_eq!(
        u[0].attrs[3].1,
        Attr::Str("GPU-5c1ab1e0-0000-2a00-0000-000000000001".into())
    );
    assert_eq!(u[0].attrs[4].1, Attr::Str("gpu".into()));
    assert_eq!(one(&catalogue::GPU_POWER)[0].value, Value::Real(350.0));
    assert_eq!(one(&catalogue::GPU_ENERGY)[0].value, Value::Real(3500.0));
    let t = one(&catalogue::GPU_THROTTLE_TIME);
    assert_eq!(t.len(), 5);
    assert_eq!(t[1].value, Value::Real(4.0), "hw_slowdown");
    let e = one(&catalogue::GPU_NVLINK_ERRORS);
    assert_eq!(e[0].value, Value::Count(1204), "crc_flit of link 3");
    assert_eq!(e[0].attrs[6], (catalogue::LINK, Attr::Int(3)));
    assert_eq!(one(&catalogue::GPU_XID)[0].value, Value::Real(79.0));
    let text = prometheus::render(f.clone());
    assert!(
        text.contains("comminsight_gpu_clock{comminsight_job_id=\"j\",comminsight_rank=\"3\",host_name=\"node-a\",hw_id=\"GPU-5c1ab1e0-0000-2a00-0000-000000000001\",hw_type=\"gpu\",comminsight_gpu_pci=\"0000:2a:00.0\",comminsight_gpu_clock_type=\"sm\"} 1100.0"),
        "{text}"
    );
    // A metric the device does not support has no point.
    let mut v = HostValues::default();
    let mut g = gpu_values();
    g.latest.valid = comminsight_wire::gpu::gpu_valid::UTIL;
    v.gpus.push(g);
    let f = collect(
        &snapshot(&[5]),
        &SelfMetricsValues::default(),
        &StragglerValues::new(),
        &v,
        &Default::default(),
        "h",
    );
    assert!(family(&f, &catalogue::GPU_POWER).points.is_empty());
    assert_eq!(family(&f, &catalogue::GPU_UTILIZATION).points.len(), 1);
}

fn family<'a>(f: &'a [Family], i: &Instrument) -> &'a Family {
    f.iter().find(|x| x.instrument.name == i.name).unwrap()
}

#[test]
fn the_histogram_is_native_in_seconds_with_host_on_every_point() {
    let f = families(&[5, 40, 40, 900]);
    assert_eq!(f.len(), catalogue::INSTRUMENTS.len());
    let d = family(&f, &catalogue::OP_DURATION);
    assert_eq!(d.points.len(), 1);
    let Value::Histogram { counts, sum, count } = &d.points[0].value else {
        panic!("not a histogram")
    };
    assert_eq!(*count, 4);
    assert!((sum - 985e-6).abs() < 1e-9, "{sum}");
    assert_eq!(counts.iter().sum::<u64>(), 4);
    let bounds = duration_bounds_s();
    assert_eq!(counts.len(), bounds.len() + 1);
    // Each operation lies in the first bucket whose bound holds it.
    for us in [5u64, 40, 900] {
        let b = bounds.iter().position(|&s| s >= us as f64 / 1e6).unwrap();
        assert!(counts[b] > 0, "{us} us not in bucket {b}: {counts:?}");
    }
    for fam in &f {
        for p in &fam.points {
            assert!(
                p.attrs.iter().any(|(k, _)| *k == catalogue::HOST),
                "{}",
                fam.instrument.name
            );
        }
    }
    let lag = family(&f, &catalogue::AGENT_LAG);
    assert_eq!(lag.points[0].value, Value::Real(1.5));
    let root = family(&f, &catalogue::STRAGGLER_ROOT_INDEX);
    assert_eq!(root.points[0].value, Value::Real(0.4));
    assert!(root.points[0]
        .attrs
        .contains(&(catalogue::HOST, Attr::Str("node-b".into()))));
}

#[test]
fn otlp_request_carries_the_resource_and_a_cumulative_histogram() {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let res = otlp::resource(&[("service.instance.id".into(), "node-a".into())]);
    let req = otlp::metrics_request(&res, &families(&[5, 40]), 10, 20);
    let bytes = req.encode_to_vec();
    let back =
        opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest::decode(
            bytes.as_slice(),
        )
        .unwrap();
    let rm = &back.resource_metrics[0];
    assert_eq!(
        rm.resource.as_ref().unwrap().attributes[0].key,
        "service.instance.id"
    );
    let metrics = &rm.scope_metrics[0].metrics;
    let h = metrics
        .iter()
        .find(|m| m.name == "comminsight.op.duration")
        .unwrap();
    assert_eq!(h.unit, "s");
    let Some(Data::Histogram(h)) = &h.data else {
        panic!("not a histogram")
    };
    assert_eq!(h.aggregation_temporality, 2, "cumulative");
    let p = &h.data_points[0];
    assert_eq!(
        (p.count, p.start_time_unix_nano, p.time_unix_nano),
        (2, 10, 20)
    );
    assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
    let c = metrics
        .iter()
        .find(|m| m.name == "comminsight.op.payload")
        .unwrap();
    let Some(Data::Sum(s)) = &c.data else {
        panic!("not a sum")
    };
    assert!(s.is_monotonic);
    // Families without points (incomplete ops exist, algbw too; overdue has a point per job)
    // are left out, never sent empty.
    assert!(metrics.iter().all(|m| match &m.data {
        Some(Data::Sum(s)) => !s.data_points.is_empty(),
        Some(Data::Gauge(g)) => !g.data_points.is_empty(),
        Some(Data::Histogram(h)) => !h.data_points.is_empty(),
        _ => false,
    }));
}

#[test]
fn prometheus_text_uses_the_catalogue_names_and_cumulative_buckets() {
    let text = prometheus::render(families(&[5, 40, 40, 900]));
    assert!(text.ends_with("# EOF\n"), "{text}");
    for i in catalogue::INSTRUMENTS {
        if i.name == catalogue::OP_INCOMPLETE.name {
            continue;
        }
        let name = i.prometheus_name();
        let family = name.strip_suffix("_total").unwrap_or(&name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    let inf = text
        .lines()
        .find(|l| {
            l.starts_with("comminsight_op_duration_seconds_bucket{") && l.contains("le=\"+Inf\"")
        })
        .unwrap();
    assert!(inf.ends_with(" 4"), "{inf}");
    assert!(inf.contains("host_name=\"node-a\""), "{inf}");
    assert!(inf.contains("comminsight_comm_name=\"tp\""), "{inf}");
    assert!(
        text.contains("comminsight_op_payload_bytes_total{"),
        "{text}"
    );
    assert!(text.contains("comminsight_straggler_root_index_ratio{comminsight_job_id=\"j\",comminsight_rank=\"3\",host_name=\"node-b\"} 0.4"), "{text}");
}

#[test]
fn docs_telemetry_md_matches_the_catalogue() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/telemetry.md");
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    let table = catalogue::markdown_table();
    let begin = "<!-- instruments: generated by `COMMINSIGHT_BLESS=1 cargo test -p comminsight-agent --lib telemetry` -->\n";
    let end = "<!-- end of instruments -->";
    if std::env::var_os("COMMINSIGHT_BLESS").is_some() {
        let (head, rest) = doc
            .split_once(begin)
            .expect("docs/telemetry.md has the begin marker");
        let (_, tail) = rest
            .split_once(end)
            .expect("docs/telemetry.md has the end marker");
        std::fs::write(path, format!("{head}{begin}{table}{end}{tail}")).unwrap();
        return;
    }
    assert!(
        doc.contains(&format!("{begin}{table}{end}")),
        "docs/telemetry.md's instrument table differs from the code: run COMMINSIGHT_BLESS=1 cargo test -p comminsight-agent --lib telemetry"
    );
}

/// A collection of only `v`'s host values.
fn host_families(v: &HostValues) -> Vec<Family> {
    collect(
        &snapshot(&[]),
        &SelfMetricsValues::default(),
        &StragglerValues::new(),
        v,
        &Default::default(),
        "node-a",
    )
}

#[test]
fn host_values_become_bounded_per_rank_and_per_port_series() {
    use crate::host::context::{CpuTimes, PortView, ProcTotals};
    let mut v = HostValues::default();
    v.ranks.insert(
        ("j".into(), 4),
        ProcTotals {
            main: CpuTimes {
                on_cpu_ns: 2_000_000_000,
                runnable_ns: 500_000_000,
                blocked_ns: 1_500_000_000,
                blocked_io_ns: 250_000_000,
            },
            retransmits: 17,
        },
    );
    v.ports.push(PortView {
        device: "mlx5_0".into(),
        port: 1,
        rx_bytes: 4096,
        tx_bytes: 8192,
        errors: 3,
        link_downed: 1,
        up: false,
        last_us: 0,
        last_ns: 0,
    });
    let f = host_families(&v);
    let t = family(&f, &catalogue::HOST_THREAD_TIME);
    let by_state: Vec<(String, Value)> = t
        .points
        .iter()
        .map(|p| {
            let Attr::Str(s) = &p.attrs[3].1 else {
                panic!()
            };
            (s.clone(), p.value.clone())
        })
        .collect();
    // The four states are disjoint: blocked is without its I/O part, so they add up.
    assert_eq!(
        by_state,
        vec![
            ("on_cpu".into(), Value::Real(2.0)),
            ("runnable".into(), Value::Real(0.5)),
            ("blocked".into(), Value::Real(1.25)),
            ("blocked_io".into(), Value::Real(0.25)),
        ]
    );
    assert!(t.points[0].attrs.contains(&(catalogue::RANK, Attr::Int(4))));
    let r = family(&f, &catalogue::HOST_TCP_RETRANSMITS);
    assert_eq!(r.points[0].value, Value::Count(17));
    // The straggler gauges share the rank attributes but not these values.
    assert!(family(&f, &catalogue::STRAGGLER_INDEX).points.is_empty());
    let up = family(&f, &catalogue::HOST_PORT_UP);
    assert_eq!(up.points[0].value, Value::Real(0.0));
    assert_eq!(
        family(&f, &catalogue::HOST_PORT_RECEIVED).points[0].value,
        Value::Count(4096)
    );
    let text = prometheus::render(f);
    for line in [
        "comminsight_host_thread_time_seconds_total{comminsight_job_id=\"j\",comminsight_rank=\"4\",host_name=\"node-a\",comminsight_thread_state=\"blocked_io\"} 0.25",
        "comminsight_host_port_errors_total{host_name=\"node-a\",comminsight_port_device=\"mlx5_0\",comminsight_port_number=\"1\"} 3",
        "comminsight_host_tcp_retransmits_total{comminsight_job_id=\"j\",comminsight_rank=\"4\",host_name=\"node-a\"} 17",
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
    // Bounded: no more than MAX_HOST_RANKS ranks, whatever the host context holds.
    for r in 0..(MAX_HOST_RANKS as i64 + 10) {
        v.ranks.insert(("k".into(), r), ProcTotals::default());
    }
    let f = host_families(&v);
    assert_eq!(
        family(&f, &catalogue::HOST_TCP_RETRANSMITS).points.len(),
        MAX_HOST_RANKS
    );
}

#[test]
fn moe_values_become_ratio_cell_and_finding_points() {
    let f = families(&[5]);
    let one = |i: &catalogue::Instrument| family(&f, i).points.clone();
    let ratio = one(&catalogue::MOE_WAIT_RATIO);
    // Two ranks, two axes.
    assert_eq!(ratio.len(), 4);
    let col1 = ratio
        .iter()
        .find(|p| {
            p.attrs
                .contains(&(catalogue::EP_AXIS, Attr::Str("col".into())))
                && p.attrs.contains(&(catalogue::RANK, Attr::Int(1)))
        })
        .unwrap();
    assert_eq!(col1.value, Value::Real(2.5));
    let cells = one(&catalogue::MOE_CELL_RATIO);
    assert_eq!(cells.len(), 4);
    assert!(cells[1]
        .attrs
        .contains(&(catalogue::EP_WAITER, Attr::Int(0))));
    assert!(cells[1].attrs.contains(&(catalogue::EP_PEER, Attr::Int(1))));
    let findings = one(&catalogue::MOE_FINDINGS);
    assert_eq!(findings[0].value, Value::Count(2));
    let text = prometheus::render(f);
    assert!(
        text.contains("comminsight_moe_ep_findings_total{comminsight_job_id=\"j\",comminsight_moe_ep_group=\"0x00000000000000e9\",comminsight_moe_phase=\"dispatch\",comminsight_moe_finding=\"sender_slow\",host_name=\"node-a\"} 2"),
        "{text}"
    );
}

//! Fixture-tree tests of the sampler.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

const SEC: u64 = 1_000_000_000;

/// A fixture sysfs tree under the temp dir, removed on drop.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("comminsight-ports-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("fixture root");
        Self { root }
    }

    fn port_dir(&self) -> PathBuf {
        self.root.join("class/infiniband/mlx5_0/ports/1")
    }

    fn write(&self, rel: impl AsRef<Path>, content: &str) {
        let path = self.root.join(rel);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(&path, content).expect("write");
    }

    fn ib(&self, file: &str, content: &str) {
        let path = self.port_dir().join(file);
        self.write(path.strip_prefix(&self.root).expect("under root"), content);
    }

    fn ib_port(&self) {
        self.ib("state", "4: ACTIVE\n");
        self.ib("phys_state", "5: LinkUp\n");
        self.ib("link_layer", "InfiniBand\n");
        self.ib("rate", "200 Gb/sec (4X HDR)\n");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn port<'a>(s: &'a PortSample, kind: PortKind, device: &str) -> &'a PortReading {
    s.ports
        .iter()
        .find(|p| p.kind == kind && p.device == device)
        .unwrap_or_else(|| panic!("no {kind:?} {device} in {s:#?}"))
}

fn counter<'a>(p: &'a PortReading, name: &str) -> &'a CounterReading {
    p.counters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no counter {name} in {p:#?}"))
}

#[test]
fn config_defaults_and_strictness() {
    let c: PortsConfig = toml::from_str("").expect("empty");
    assert_eq!(c, PortsConfig::default());
    assert_eq!(c.sysfs_root, PathBuf::from("/sys"));
    assert_eq!(c.interval_ms, 1000);
    let c: PortsConfig = toml::from_str("interval_ms = 250").expect("partial");
    assert_eq!(
        (c.interval_ms, c.sysfs_root.as_path()),
        (250, Path::new("/sys"))
    );
    assert!(toml::from_str::<PortsConfig>("intervall_ms = 1").is_err());
    assert_eq!(PortSampler::from_config(&c).root(), Path::new("/sys"));
}

#[test]
fn devices_narrow_the_ports_sampled() {
    let f = Fixture::new();
    f.ib_port();
    f.ib("counters/port_xmit_data", "1000\n");
    f.write("class/net/eth0/statistics/tx_bytes", "5\n");
    f.write("class/net/eth1/statistics/tx_bytes", "7\n");
    let c: PortsConfig = toml::from_str(&format!(
        "sysfs_root = {:?}\ndevices = [\"eth1\", \"mlx5_0\"]",
        f.root
    ))
    .expect("devices");
    let mut s = PortSampler::from_config(&c);
    let sample = s.sample(SEC);
    let names: Vec<&str> = sample.ports.iter().map(|p| p.device.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "eth1"]);
    let all = PortSampler::new(f.root.clone()).sample(SEC);
    assert_eq!(all.ports.len(), 3);
}

#[test]
fn rates_scale_data_by_four_and_sort_names() {
    let f = Fixture::new();
    f.ib_port();
    f.ib("counters/port_xmit_data", "1000\n");
    f.ib("counters/port_xmit_packets", "10\n");
    f.ib("hw_counters/out_of_buffer", "7\n");
    f.ib("hw_counters/lifespan", "12\n");
    let mut s = PortSampler::new(&f.root);
    let first = s.sample(SEC);
    let p = port(&first, PortKind::Ib, "mlx5_0");
    assert_eq!(p.port, Some(1));
    assert_eq!(p.state.as_deref(), Some("4: ACTIVE"));
    assert_eq!(p.phys_state.as_deref(), Some("5: LinkUp"));
    assert_eq!(p.link_layer.as_deref(), Some("InfiniBand"));
    assert_eq!(p.rate.as_deref(), Some("200 Gb/sec (4X HDR)"));
    let names: Vec<_> = p.counters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["port_xmit_data", "port_xmit_packets", "out_of_buffer"]
    );
    assert_eq!(counter(p, "port_xmit_data").value, 4000);
    assert!(p
        .counters
        .iter()
        .all(|c| c.delta.is_none() && c.rate_per_s.is_none()));

    f.ib("counters/port_xmit_data", "3000\n");
    f.ib("counters/port_xmit_packets", "30\n");
    f.ib("hw_counters/out_of_buffer", "8\n");
    let second = s.sample(3 * SEC);
    assert!(
        second.events.is_empty() && second.read_errors.is_empty(),
        "{second:#?}"
    );
    let p = port(&second, PortKind::Ib, "mlx5_0");
    let data = counter(p, "port_xmit_data");
    assert_eq!(
        (data.value, data.delta, data.rate_per_s),
        (12000, Some(8000), Some(4000.0))
    );
    let pk = counter(p, "port_xmit_packets");
    assert_eq!((pk.delta, pk.rate_per_s), (Some(20), Some(10.0)));
    assert_eq!(counter(p, "out_of_buffer").delta, Some(1));
    serde_json::to_string(&second).expect("serializes");
}

#[test]
fn saturated_32bit_counter_has_no_delta() {
    let f = Fixture::new();
    f.ib_port();
    f.ib("counters/port_rcv_packets", "4294967000\n");
    f.ib("counters/symbol_error", "65535\n");
    let mut s = PortSampler::new(&f.root);
    let first = s.sample(SEC);
    let p = port(&first, PortKind::Ib, "mlx5_0");
    assert!(counter(p, "symbol_error").saturated);
    assert!(!counter(p, "port_rcv_packets").saturated);
    f.ib("counters/port_rcv_packets", "4294967295\n");
    let second = s.sample(2 * SEC);
    let p = port(&second, PortKind::Ib, "mlx5_0");
    let c = counter(p, "port_rcv_packets");
    assert!(c.saturated);
    assert_eq!((c.delta, c.rate_per_s), (None, None));
    let e = counter(p, "symbol_error");
    assert!(e.saturated && e.delta.is_none());
    assert!(
        second.events.is_empty(),
        "saturation is no reset: {:?}",
        second.events
    );
}

#[test]
fn counter_going_backwards_is_a_reset_and_new_baseline() {
    let f = Fixture::new();
    f.ib_port();
    f.ib("counters/port_rcv_data", "5000\n");
    let mut s = PortSampler::new(&f.root);
    s.sample(SEC);
    f.ib("counters/port_rcv_data", "100\n");
    let second = s.sample(2 * SEC);
    let c = counter(port(&second, PortKind::Ib, "mlx5_0"), "port_rcv_data");
    assert_eq!((c.value, c.delta), (400, None));
    assert_eq!(
        second.events,
        [PortEvent::CounterReset {
            kind: PortKind::Ib,
            device: "mlx5_0".into(),
            port: Some(1),
            counter: "port_rcv_data".into(),
            previous: 20000,
            value: 400,
        }]
    );
    f.ib("counters/port_rcv_data", "150\n");
    let third = s.sample(3 * SEC);
    let c = counter(port(&third, PortKind::Ib, "mlx5_0"), "port_rcv_data");
    assert_eq!((c.delta, c.rate_per_s), (Some(200), Some(200.0)));
    assert!(third.events.is_empty());
}

#[test]
fn unreadable_files_are_errors_not_panics() {
    let f = Fixture::new();
    f.ib_port();
    f.ib("counters/port_xmit_packets", "1\n");
    f.ib("counters/port_rcv_errors", "lots\n");
    fs::create_dir_all(f.port_dir().join("counters/port_xmit_wait")).expect("dir");
    f.write("class/net/eth0/statistics/rx_bytes", "5\n");
    let path = f.root.join("class/net/eth0/statistics/tx_bytes");
    fs::write(&path, [0xff, 0xfe, b'1']).expect("invalid utf-8");
    let mut s = PortSampler::new(&f.root);
    s.sample(SEC);
    f.ib("counters/port_xmit_packets", "3\n");
    let sample = s.sample(2 * SEC);
    let mut bad: Vec<_> = sample
        .read_errors
        .iter()
        .map(|e| Path::new(&e.path).file_name().expect("name").to_owned())
        .collect();
    bad.sort();
    assert_eq!(
        bad,
        ["port_rcv_errors", "port_xmit_wait", "tx_bytes"],
        "{sample:#?}"
    );
    let ib = port(&sample, PortKind::Ib, "mlx5_0");
    assert_eq!(ib.counters.len(), 1);
    assert_eq!(counter(ib, "port_xmit_packets").delta, Some(2));
    let net = port(&sample, PortKind::Net, "eth0");
    assert_eq!(counter(net, "rx_bytes").delta, Some(0));
}

#[test]
fn link_down_and_up_events() {
    let f = Fixture::new();
    f.ib_port();
    f.ib("counters/link_downed", "0\n");
    let mut s = PortSampler::new(&f.root);
    assert!(s.sample(SEC).events.is_empty());
    f.ib("state", "1: DOWN\n");
    f.ib("counters/link_downed", "1\n");
    let down = s.sample(2 * SEC);
    assert_eq!(
        down.events,
        [PortEvent::LinkDown {
            device: "mlx5_0".into(),
            port: Some(1),
            previous_state: Some("4: ACTIVE".into()),
            state: Some("1: DOWN".into()),
            link_downed_increase: Some(1),
        }]
    );
    assert!(
        s.sample(3 * SEC).events.is_empty(),
        "still down: no new event"
    );
    f.ib("state", "4: ACTIVE\n");
    let up = s.sample(4 * SEC);
    assert!(
        matches!(&up.events[..], [PortEvent::LinkUp { port: Some(1), .. }]),
        "{up:?}"
    );
    // A flap between two samples shows only in link_downed.
    f.ib("counters/link_downed", "2\n");
    let flap = s.sample(5 * SEC);
    assert!(
        matches!(
            &flap.events[..],
            [PortEvent::LinkDown {
                link_downed_increase: Some(1),
                ..
            }]
        ),
        "{flap:?}"
    );
    let json = serde_json::to_value(&flap.events[0]).expect("json");
    assert_eq!(json["event"], "link_down");
}

#[test]
fn ethernet_statistics_and_devices_coming_and_going() {
    let f = Fixture::new();
    f.write("class/net/eth0/operstate", "up\n");
    f.write(
        "class/net/eth0/statistics/tx_bytes",
        "18446744073709551000\n",
    );
    f.write("class/net/eth0/statistics/rx_packets", "10\n");
    f.write("class/net/bonding_masters", "\n");
    let mut s = PortSampler::new(&f.root);
    let first = s.sample(SEC);
    assert!(first.read_errors.is_empty(), "{first:#?}");
    assert_eq!(first.ports.len(), 1);
    f.write(
        "class/net/eth0/statistics/tx_bytes",
        "18446744073709551500\n",
    );
    f.write("class/net/eth0/statistics/rx_packets", "20\n");
    f.ib_port();
    let second = s.sample(SEC + SEC / 2);
    let eth = port(&second, PortKind::Net, "eth0");
    assert_eq!((eth.port, eth.state.as_deref()), (None, Some("up")));
    let tx = counter(eth, "tx_bytes");
    assert_eq!((tx.delta, tx.rate_per_s), (Some(500), Some(1000.0)));
    assert_eq!(counter(eth, "rx_packets").rate_per_s, Some(20.0));
    assert_eq!(second.ports[0].kind, PortKind::Ib, "IB first, then net");
    f.write("class/net/eth0/statistics/tx_bytes", "7\n");
    let third = s.sample(2 * SEC);
    assert!(matches!(
        &third.events[..],
        [PortEvent::CounterReset {
            kind: PortKind::Net,
            ..
        }]
    ));
    fs::remove_dir_all(f.root.join("class/net/eth0")).expect("unplug");
    let fourth = s.sample(3 * SEC);
    assert!(fourth.ports.iter().all(|p| p.kind == PortKind::Ib));
    assert!(fourth.read_errors.is_empty() && fourth.events.is_empty());
}

#[test]
fn missing_root_is_empty() {
    let mut s = PortSampler::new("/nonexistent/comminsight-sysfs");
    let sample = s.sample(1);
    assert!(sample.ports.is_empty() && sample.read_errors.is_empty());
}

//! A real-kernel check: a veth pair into a network namespace, 100 UDP datagrams, `/sys` deltas.

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

use super::*;

/// Runs `ip` with `args`; an error text when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Deletes the veth pair and the namespace, whatever happened.
struct Teardown {
    netns: String,
    veth: String,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

/// Why the test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Some(format!("needs root (euid {euid})"));
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("`ip -V` failed: {}", out.status)),
        Err(e) => Some(format!("`ip` not available: {e}")),
    }
}

fn stat(sample: &PortSample, veth: &str, name: &str) -> u64 {
    let p = sample
        .ports
        .iter()
        .find(|p| p.kind == PortKind::Net && p.device == veth)
        .unwrap_or_else(|| panic!("{veth} not in /sys/class/net"));
    p.counters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{veth} has no {name}"))
        .value
}

#[test]
fn veth_counts_bytes_sent() {
    if let Some(reason) = skip_reason() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("veth_counts_bytes_sent cannot run under CI=true: {reason}");
        }
        eprintln!("skipping veth_counts_bytes_sent: {reason}");
        return;
    }
    let pid = std::process::id();
    let (netns, veth, peer) = (
        format!("cix{pid}"),
        format!("cix{pid}a"),
        format!("cix{pid}b"),
    );
    let (o3, o4) = (pid % 256, (pid / 256 % 64) * 4);
    let local = format!("10.213.{o3}.{}", o4 + 1);
    let remote = format!("10.213.{o3}.{}", o4 + 2);
    let _teardown = Teardown {
        netns: netns.clone(),
        veth: veth.clone(),
    };
    let setup: [&[&str]; 7] = [
        &["netns", "add", &netns],
        &["link", "add", &veth, "type", "veth", "peer", "name", &peer],
        &["link", "set", &peer, "netns", &netns],
        &["addr", "add", &format!("{local}/30"), "dev", &veth],
        &["link", "set", &veth, "up"],
        &[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{remote}/30"),
            "dev",
            &peer,
        ],
        &["-n", &netns, "link", "set", &peer, "up"],
    ];
    for args in setup {
        ip(args).unwrap_or_else(|e| panic!("veth setup: {e}"));
    }
    let socket = UdpSocket::bind(format!("{local}:0")).expect("bind UDP");
    let dest = format!("{remote}:9");
    let payload = [0u8; 1000];
    // Resolve ARP before the baseline so no datagram waits in (or drops from) the ARP queue.
    socket.send_to(&payload[..1], &dest).expect("prime ARP");
    std::thread::sleep(Duration::from_millis(300));

    let mut sampler = PortSampler::new("/sys");
    let t0 = std::time::Instant::now();
    let before = sampler.sample(1);
    for _ in 0..100 {
        socket.send_to(&payload, &dest).expect("send UDP");
    }
    std::thread::sleep(Duration::from_millis(50));
    let after = sampler.sample(1 + t0.elapsed().as_nanos() as u64);

    let packets = stat(&after, &veth, "tx_packets") - stat(&before, &veth, "tx_packets");
    let bytes = stat(&after, &veth, "tx_bytes") - stat(&before, &veth, "tx_bytes");
    let p = after
        .ports
        .iter()
        .find(|p| p.device == veth)
        .expect("veth in sample");
    let tx = p
        .counters
        .iter()
        .find(|c| c.name == "tx_bytes")
        .expect("tx_bytes");
    assert_eq!(tx.delta, Some(bytes), "sampler delta matches the values");
    assert!(tx.rate_per_s.is_some_and(|r| r > 0.0));
    assert!(packets >= 100, "tx_packets +{packets}");
    assert!(
        (100 * 1042..100 * 1042 + 2000).contains(&bytes),
        "tx_bytes +{bytes} (100 frames of 1042 B)"
    );
}

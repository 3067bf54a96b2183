//! The TCP probes against a real lossy link (root, tracefs, network namespaces):
//! `comminsight-agent probe` attributes each retransmit to the process that owns the socket by
//! its 4-tuple, whatever task the kernel ran it in.
//!
//! A fresh network namespace is joined to the host by a veth pair (names unique to the run,
//! removed on drop, panics included). Packets host -> namespace lose 20 %: `tc netem loss 20%` on
//! the host end where the kernel has netem, else an nftables rule inside the namespace (so
//! nothing is ever added to the host's firewall). A sender on the host pushes 4 MiB to a
//! receiver in the namespace; a control sender pushes 4 MiB over loopback in the same run. The
//! probe tracks the lossy sender and the loopback receiver (listening before the probe starts),
//! not the control sender, and must report retransmits > 0 for the lossy sender's connection to
//! the namespace address, next to none on the control connection, no connection of the
//! receivers as the sender's, and the host veth's `tx_bytes` must have grown by at least the
//! bytes sent and by less than a sane overhead. The receiver's accepted connection moves to
//! SYN_RECV and ESTABLISHED in softirq context while the untracked sender is the current task
//! (and the lossy connection to FIN_WAIT2 and CLOSE likewise): they must still be reported, as
//! the receiver's — the kernel follows tracked sockets by address and listening port, not by
//! the task a change runs in.
//!
//! Without root, the BPF object, `ip` or a loss mechanism the test says why and passes; under
//! `CI=true` that is a failure.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use comminsight_tests::{bin_dir, wait_until, Child, OutDir};
use serde_json::Value;

/// Bytes each sender sends.
const BYTES: u64 = 4 << 20;
/// Receiver port inside the namespace (only the namespace listens on it).
const NS_PORT: u16 = 5201;

/// Run a command; its stderr when it fails.
fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace joined to the host by a veth pair; both are deleted on drop.
struct NetNs {
    name: String,
    host_if: String,
    host_ip: String,
    ns_ip: String,
    /// How the loss is made (`netem` or `nftables`).
    loss: &'static str,
}

impl NetNs {
    /// Namespace, veth pair, addresses, and 20 % loss host -> namespace.
    fn create() -> Result<NetNs, String> {
        static RUN: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = RUN.fetch_add(1, Ordering::Relaxed);
        // Interface names are at most 15 bytes; the subnet is unique per pid and call.
        let tag = format!("{:x}{n}", pid & 0xfffff);
        let (a, b) = (200 + (pid >> 8) % 50, pid.wrapping_add(n * 97) & 0xff);
        let mut ns = NetNs {
            name: format!("comminsight-tcp-{pid}-{n}"),
            host_if: format!("cit{tag}h"),
            host_ip: format!("10.{a}.{b}.1"),
            ns_ip: format!("10.{a}.{b}.2"),
            loss: "",
        };
        let ns_if = format!("cit{tag}n");
        sh(&["ip", "netns", "add", &ns.name])?;
        let net = format!("{}/30", ns.host_ip);
        let ns_net = format!("{}/30", ns.ns_ip);
        let steps: [&[&str]; 7] = [
            &[
                "ip",
                "link",
                "add",
                &ns.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &ns_if,
            ],
            &["ip", "link", "set", &ns_if, "netns", &ns.name],
            &["ip", "addr", "add", &net, "dev", &ns.host_if],
            &["ip", "link", "set", &ns.host_if, "up"],
            &["ip", "-n", &ns.name, "addr", "add", &ns_net, "dev", &ns_if],
            &["ip", "-n", &ns.name, "link", "set", &ns_if, "up"],
            &["ip", "-n", &ns.name, "link", "set", "lo", "up"],
        ];
        for s in steps {
            sh(s)?;
        }
        let netem = sh(&[
            "tc",
            "qdisc",
            "add",
            "dev",
            &ns.host_if,
            "root",
            "netem",
            "loss",
            "20%",
        ]);
        ns.loss = match netem {
            Ok(()) => "netem",
            Err(netem) => {
                ns.nft_loss().map_err(|nft| {
                    format!("no way to lose packets: {netem}; and nftables: {nft} (apt-get install nftables, or a kernel with sch_netem)")
                })?;
                "nftables"
            }
        };
        Ok(ns)
    }

    /// Drop 20 % of the TCP segments to [`NS_PORT`] as they enter the namespace.
    fn nft_loss(&self) -> Result<(), String> {
        let rules = format!(
            "table inet comminsight_loss {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    tcp dport {NS_PORT} numgen random mod 100 < 20 drop\n  }}\n}}\n"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("ip netns exec nft: {e}"))?;
        nft.stdin
            .take()
            .ok_or("no stdin")?
            .write_all(rules.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = nft.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    fn tx_bytes(&self) -> u64 {
        let p = format!("/sys/class/net/{}/statistics/tx_bytes", self.host_if);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .trim()
            .parse()
            .expect("tx_bytes is a number")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth end and with it the pair; the explicit link
        // delete covers a pair whose peer never moved.
        let _ = sh(&["ip", "netns", "del", &self.name]);
        let _ = sh(&["ip", "link", "del", &self.host_if]);
    }
}

/// Why the test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("the eBPF probes and network namespaces need root: run as root".into());
    }
    for tool in ["ip", "tc", "python3"] {
        if Command::new(tool).arg("-V").output().is_err()
            && Command::new(tool).arg("--version").output().is_err()
        {
            return Some(format!("{tool} is missing (cargo xtask deps)"));
        }
    }
    let me = std::process::id().to_string();
    let out = Command::new(bin_dir().join("comminsight-agent"))
        .args(["probe", "--pid", &me, "--duration-s", "0"])
        .args(["--out", "/dev/null"])
        .output()
        .expect("start comminsight-agent");
    if !out.status.success() {
        return Some(format!(
            "comminsight-agent probe cannot run: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    None
}

/// The namespace, or `None` when the test may not go on (says why, or panics under CI=true).
fn prerequisites() -> Option<NetNs> {
    let why = match missing_prerequisite() {
        None => match NetNs::create() {
            Ok(ns) => return Some(ns),
            Err(e) => format!("cannot build the lossy test network: {e}"),
        },
        Some(why) => why,
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true and a prerequisite of the TCP probe test is missing: {why}");
    }
    eprintln!("skipping: {why}");
    None
}

/// Receiver: accept one connection on (addr, port; 0 = any), count its bytes to EOF, answer the
/// count. Writes its port to argv[3] once listening.
const RECV: &str = r#"
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen(1)
with open(sys.argv[3] + ".tmp", "w") as f:
    f.write(str(l.getsockname()[1]))
import os
os.rename(sys.argv[3] + ".tmp", sys.argv[3])
c, _ = l.accept()
n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    n += len(b)
c.sendall(str(n).encode())
c.close()
"#;

/// Sender: once argv[4] exists, send argv[3] bytes to (argv[1], argv[2]), half-close, wait for
/// the receiver's count; prints `local remote sent received kernel_total_retrans` (TCP_INFO).
const SEND: &str = r#"
import os, socket, struct, sys, time
while not os.path.exists(sys.argv[4]):
    time.sleep(0.01)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
l, r = s.getsockname(), s.getpeername()
n = int(sys.argv[3])
buf = b"x" * 65536
sent = 0
while sent < n:
    sent += s.send(buf[: min(len(buf), n - sent)])
s.shutdown(socket.SHUT_WR)
got = int(s.recv(64) or b"0")
info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
print("%s:%d %s:%d %d %d %d" % (l[0], l[1], r[0], r[1], sent, got, struct.unpack_from("I", info, 100)[0]))
s.close()
"#;

/// What one sender printed.
struct Sent {
    local: String,
    remote: String,
    sent: u64,
    received: u64,
    kernel_retrans: u64,
}

fn spawn(cmd: &mut Command) -> Child {
    Child(cmd.stdout(Stdio::piped()).spawn().expect("spawn"))
}

fn read_port(f: &Path) -> u16 {
    assert!(
        wait_until(Duration::from_secs(20), || f.exists()),
        "receiver did not listen ({})",
        f.display()
    );
    std::fs::read_to_string(f).unwrap().trim().parse().unwrap()
}

/// Wait for a sender (at most 120 s) and parse its line.
fn finish_sender(mut c: Child) -> Sent {
    let mut status = None;
    let done = wait_until(Duration::from_secs(120), || {
        status = c.0.try_wait().ok().flatten();
        status.is_some()
    });
    assert!(done, "a sender did not finish within 120 s");
    assert!(
        status.is_some_and(|s| s.success()),
        "sender failed: {status:?}"
    );
    let mut text = String::new();
    c.0.stdout
        .take()
        .expect("sender stdout")
        .read_to_string(&mut text)
        .expect("read sender stdout");
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.len(), 5, "sender printed {text:?}");
    Sent {
        local: f[0].into(),
        remote: f[1].into(),
        sent: f[2].parse().unwrap(),
        received: f[3].parse().unwrap(),
        kernel_retrans: f[4].parse().unwrap(),
    }
}

fn peers_of(r: &Value, pid: u32) -> Vec<&Value> {
    r["tcp_peers"]
        .as_array()
        .expect("tcp_peers in the report")
        .iter()
        .filter(|p| p["pid"] == pid)
        .collect()
}

#[test]
fn retransmits_on_a_lossy_veth_go_to_the_sender_and_a_clean_loopback_control_has_none() {
    let Some(ns) = prerequisites() else {
        return;
    };
    let dir = OutDir::new("host-tcp");
    std::fs::create_dir_all(dir.path()).unwrap();
    let path = |n: &str| -> PathBuf { dir.path().join(n) };
    std::fs::write(path("recv.py"), RECV).unwrap();
    std::fs::write(path("send.py"), SEND).unwrap();
    let go = path("probe.ready");
    let py = |args: &[&str]| {
        let mut c = Command::new("python3");
        c.arg(path(args[0])).args(&args[1..]);
        c
    };
    // Receivers: in the namespace on its address, and on host loopback (the control).
    let ns_recv = spawn(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3"])
            .arg(path("recv.py"))
            .args([&ns.ns_ip, &NS_PORT.to_string()])
            .arg(path("ns.port")),
    );
    let lo_recv = spawn(py(&["recv.py", "127.0.0.1", "0"]).arg(path("lo.port")));
    assert_eq!(read_port(&path("ns.port")), NS_PORT);
    let lo_port = read_port(&path("lo.port"));
    let bytes = BYTES.to_string();
    let lossy = spawn(py(&["send.py", &ns.ns_ip, &NS_PORT.to_string(), &bytes]).arg(&go));
    let control = spawn(py(&["send.py", "127.0.0.1", &lo_port.to_string(), &bytes]).arg(&go));
    let (lossy_pid, recv_pid) = (lossy.pid(), lo_recv.pid());
    let tx_before = ns.tx_bytes();
    let out = path("probe.json");
    let probe = spawn(
        Command::new(bin_dir().join("comminsight-agent"))
            .args(["probe", "--pid", &format!("{lossy_pid},{recv_pid}")])
            .args(["--duration-s", "150", "--ready-file"])
            .arg(&go)
            .arg("--out")
            .arg(&out),
    );
    assert!(
        wait_until(Duration::from_secs(30), || go.exists()),
        "comminsight-agent probe did not attach within 30 s"
    );
    let l = finish_sender(lossy);
    let c = finish_sender(control);
    let tx_after = ns.tx_bytes();
    drop((ns_recv, lo_recv));
    let mut probe = probe;
    assert!(
        wait_until(Duration::from_secs(30), || matches!(
            probe.0.try_wait(),
            Ok(Some(_))
        )),
        "the probe did not stop once its processes exited"
    );
    assert!(
        probe.0.wait().unwrap().success(),
        "comminsight-agent probe failed"
    );
    let r: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("probe report")).expect("probe JSON");

    assert_eq!((l.sent, l.received), (BYTES, BYTES), "the lossy transfer");
    assert_eq!((c.sent, c.received), (BYTES, BYTES), "the control transfer");
    assert_eq!(l.remote, format!("{}:{NS_PORT}", ns.ns_ip));
    let lossy_peer = peers_of(&r, lossy_pid)
        .into_iter()
        .find(|p| p["remote"] == l.remote.as_str() && p["local"] == l.local.as_str())
        .unwrap_or_else(|| panic!("no tcp_peers entry for {} -> {}: {r:#}", l.local, l.remote))
        .clone();
    let retransmits = lossy_peer["retransmits"].as_u64().unwrap();
    let tx = tx_after - tx_before;
    eprintln!(
        "host_tcp: loss by {}; lossy sender {} -> {}: {retransmits} retransmits seen by the probe, \
         {} segments retransmitted per TCP_INFO; {} bytes sent, veth tx_bytes +{tx} ({:.3}x); \
         control {} -> {}: {} retransmits per TCP_INFO; {} TCP events of other sockets dropped",
        ns.loss,
        l.local,
        l.remote,
        l.kernel_retrans,
        l.sent,
        tx as f64 / l.sent as f64,
        c.local,
        c.remote,
        c.kernel_retrans,
        r["tcp_unowned"],
    );
    assert!(retransmits > 0, "no retransmit attributed: {lossy_peer:#}");
    assert!(l.kernel_retrans > 0, "the kernel retransmitted nothing");
    assert!(lossy_peer["rto_ms"].as_u64().is_some(), "{lossy_peer:#}");
    // Every retransmit record of the lossy connection is the sender's.
    for t in r["tcp"].as_array().unwrap() {
        if t["remote"] == l.remote.as_str() {
            assert_eq!(t["pid"], lossy_pid, "{t}");
        }
    }
    // Its state changes: SYN_SENT (the sender's own task, before the port is bound), then
    // ESTABLISHED from softirq on the SYN-ACK, and the close.
    let states: Vec<u64> = r["tcp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["what"] == "state" && t["remote"] == l.remote.as_str())
        .filter_map(|t| t["new_state"].as_u64())
        .collect();
    eprintln!("host_tcp: the lossy connection's states {states:?}");
    assert!(
        states.contains(&1),
        "no ESTABLISHED (softirq) state change of {} -> {}: {states:?}",
        l.local,
        l.remote
    );
    // The control: a clean loopback connection, no retransmits. The receiver's side of it is
    // the receiver's, ESTABLISHED included (softirq, the untracked sender current); nothing of
    // the receivers' sockets (local port = a receiver's) is called the sender's.
    // (A loaded machine sees a few tail-loss probes even on loopback: far fewer than the lossy
    // link's.)
    assert!(
        c.kernel_retrans * 10 <= l.kernel_retrans,
        "the loopback control retransmitted {} segments, the lossy link {}",
        c.kernel_retrans,
        l.kernel_retrans
    );
    let accepted = peers_of(&r, recv_pid)
        .into_iter()
        .find(|p| p["remote"] == c.local.as_str())
        .unwrap_or_else(|| panic!("no tcp_peers entry of the receiver for {}: {r:#}", c.local))
        .clone();
    assert!(
        accepted["retransmits"].as_u64().unwrap_or(u64::MAX) * 10 <= retransmits,
        "control: {accepted:#}"
    );
    assert_eq!(accepted["local"], c.remote.as_str(), "{accepted:#}");
    let recv_states: Vec<u64> = r["tcp"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["what"] == "state" && t["remote"] == c.local.as_str())
        .inspect(|t| assert_eq!(t["pid"], recv_pid, "{t}"))
        .filter_map(|t| t["new_state"].as_u64())
        .collect();
    eprintln!("host_tcp: the receiver's accepted connection's states {recv_states:?}");
    assert!(
        recv_states.contains(&1),
        "no ESTABLISHED of the accepted connection {} <- {}: {recv_states:?}",
        c.remote,
        c.local
    );
    for p in peers_of(&r, lossy_pid) {
        let local = p["local"].as_str().unwrap();
        assert!(
            !local.ends_with(&format!(":{lo_port}")) && !local.ends_with(&format!(":{NS_PORT}")),
            "a receiver's socket attributed to sender {lossy_pid}: {p:#}"
        );
    }
    // The veth carried every byte at least once, plus headers and retransmissions (20 % loss:
    // about 1.2-1.5x with offloads; 2.5x is far past sane).
    assert!(tx >= l.sent, "veth tx_bytes +{tx} < {} bytes sent", l.sent);
    assert!(
        tx <= l.sent * 5 / 2,
        "veth tx_bytes +{tx} is more than 2.5x the {} bytes sent",
        l.sent
    );
}

//! Simulated hosts as network namespaces, so `tc tbf` can make a real slow link and an
//! nftables rule a real lossy one.
//!
//! Per run: a hub namespace `cit-<pid>-hub` with a bridge `br0`, and one namespace per host
//! `cit-<pid>-h<h>` whose `eth0` (a veth pair, peer `p<h>` on the bridge) has `10.231.0.<h+1>/24`.
//! All addresses live only inside these namespaces. [`Netns`] deletes every namespace it made
//! when dropped (and [`Netns::teardown`] does it explicitly), even after a failed setup.

use std::process::Command;

/// The private /24 used inside the run's namespaces.
pub const SUBNET: &str = "10.231.0";
/// Rate of the htb classes themselves (the tbf leaf does the shaping).
const UNSHAPED: &str = "10gbit";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("cannot run `{cmd}`: {source} (network namespaces need iproute2 and root)")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("at most 253 hosts fit in {SUBNET}.0/24, asked for {hosts}")]
    TooManyHosts { hosts: usize },
}

/// The namespaces of one run.
#[derive(Debug)]
pub struct Netns {
    prefix: String,
    hosts: usize,
    created: Vec<String>,
    /// Hosts whose eth0 already has the htb root.
    shaped: Vec<usize>,
}

fn run(args: &[&str]) -> Result<(), NetnsError> {
    let cmd = args.join(" ");
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|source| NetnsError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// `cit-<pid>` of a test-bed namespace name (`cit-<pid>-hub`, `cit-<pid>-h<n>`), else None.
fn runner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("cit-")?;
    let (pid, tail) = rest.split_once('-')?;
    let ok_tail = tail == "hub"
        || tail
            .strip_prefix('h')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !ok_tail {
        return None;
    }
    pid.parse().ok()
}

/// Delete test-bed namespaces left by runners that no longer exist (killed with SIGKILL).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if let Some(pid) = runner_pid(name) {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = run(&["ip", "netns", "del", name]);
            }
        }
    }
}

impl Netns {
    /// Create the hub and `hosts` host namespaces, wired to one bridge.
    pub fn create(hosts: usize) -> Result<Netns, NetnsError> {
        if hosts > 253 {
            return Err(NetnsError::TooManyHosts { hosts });
        }
        let mut n = Netns {
            prefix: format!("cit-{}", std::process::id()),
            hosts,
            created: Vec::new(),
            shaped: Vec::new(),
        };
        remove_stale();
        let hub = n.hub();
        n.add_ns(&hub)?;
        run(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &hub, "link", "set", "br0", "up"])?;
        for h in 0..hosts {
            let ns = n.host_ns(h);
            n.add_ns(&ns)?;
            let peer = format!("p{h}");
            run(&[
                "ip", "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &peer,
                "netns", &hub,
            ])?;
            let addr = format!("{}/24", n.addr(h));
            run(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &hub, "link", "set", &peer, "master", "br0"])?;
            run(&["ip", "-n", &hub, "link", "set", &peer, "up"])?;
        }
        Ok(n)
    }

    fn add_ns(&mut self, name: &str) -> Result<(), NetnsError> {
        run(&["ip", "netns", "add", name])?;
        self.created.push(name.to_string());
        run(&["ip", "-n", name, "link", "set", "lo", "up"])
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// Namespace of host `h`.
    pub fn host_ns(&self, h: usize) -> String {
        format!("{}-h{h}", self.prefix)
    }

    /// Address of host `h` inside its namespace.
    pub fn addr(&self, h: usize) -> String {
        format!("{SUBNET}.{}", h + 1)
    }

    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Shape traffic from host `from` to host `to` (only that direction and pair) to `rate`:
    /// an htb root on `from`'s `eth0` (unclassified traffic unshaped), one class per shaped
    /// destination with a `tbf rate <rate>` leaf, and a u32 filter on the destination address.
    pub fn shape(
        &mut self,
        from: usize,
        to: usize,
        rate: &str,
        rate_bps: u64,
    ) -> Result<(), NetnsError> {
        let ns = self.host_ns(from);
        let tc = |args: &[&str]| {
            let mut v = vec!["tc", "-n", ns.as_str()];
            v.extend_from_slice(args);
            run(&v)
        };
        if !self.shaped.contains(&from) {
            tc(&[
                "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1",
            ])?;
            tc(&[
                "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate",
                UNSHAPED, "quantum", "60000",
            ])?;
            self.shaped.push(from);
        }
        let class = format!("1:{}", 100 + to);
        let handle = format!("{}:", 100 + to);
        tc(&[
            "class", "add", "dev", "eth0", "parent", "1:", "classid", &class, "htb", "rate",
            UNSHAPED, "quantum", "60000",
        ])?;
        let burst = (rate_bps / 8 / 100).max(16_000).to_string();
        tc(&[
            "qdisc", "add", "dev", "eth0", "parent", &class, "handle", &handle, "tbf", "rate",
            rate, "burst", &burst, "latency", "400ms",
        ])?;
        let dst = format!("{}/32", self.addr(to));
        tc(&[
            "filter", "add", "dev", "eth0", "protocol", "ip", "parent", "1:0", "prio", "1", "u32",
            "match", "ip", "dst", &dst, "flowid", &class,
        ])
    }

    /// Lose `pct` % of the packets from host `from` to host `to` (only that direction and
    /// pair): an nftables table in `to`'s namespace drops them at random as they arrive, before
    /// any socket sees them, as a lossy cable would (the senders retransmit). Nothing is added
    /// outside the run's namespaces; the table goes with them.
    pub fn drop_packets(&mut self, from: usize, to: usize, pct: f64) -> Result<(), NetnsError> {
        // numgen draws 0..9999: basis points keep fractional percents.
        let bp = (pct * 100.0).round().clamp(1.0, 9999.0) as u32;
        let rules = format!(
            "table ip cit_droplink_{from} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ip saddr {src} numgen random mod 10000 < {bp} drop\n  }}\n}}\n",
            src = self.addr(from),
        );
        let ns = self.host_ns(to);
        let cmd = format!("ip netns exec {ns} nft -f -");
        let spawn = |source| NetnsError::Spawn {
            cmd: cmd.clone(),
            source,
        };
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(spawn)?;
        {
            use std::io::Write;
            let mut stdin = nft.stdin.take().expect("piped stdin");
            stdin.write_all(rules.as_bytes()).map_err(spawn)?;
        }
        let out = nft.wait_with_output().map_err(spawn)?;
        if !out.status.success() {
            return Err(NetnsError::Command {
                cmd,
                stderr: format!(
                    "{} (droplink needs nftables: apt-get install nftables)",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    /// Delete every namespace made (idempotent).
    pub fn teardown(&mut self) {
        for ns in self.created.drain(..).rev() {
            let _ = run(&["ip", "netns", "del", &ns]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have_netns() -> bool {
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .is_ok_and(|o| o.status.success())
            && is_root()
    }

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
            })
            .unwrap_or(false)
    }

    fn namespaces() -> String {
        String::from_utf8_lossy(
            &Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned()
    }

    #[test]
    fn only_test_bed_namespace_names_are_recognised() {
        assert_eq!(runner_pid("cit-123-hub"), Some(123));
        assert_eq!(runner_pid("cit-123-h7"), Some(123));
        assert_eq!(runner_pid("cit-123-h"), None);
        assert_eq!(runner_pid("cit-123-eth"), None);
        assert_eq!(runner_pid("cit-x-hub"), None);
        assert_eq!(runner_pid("prod-net"), None);
    }

    const SERVER: &str =
        "import socket,sys\ns=socket.socket();s.bind((sys.argv[1],0));s.listen(1)\n\
print(s.getsockname()[1],flush=True)\nc,_=s.accept()\nwhile c.recv(65536):pass\nc.sendall(b'k')";
    const CLIENT: &str = "import socket,sys,time\nt=time.time();c=socket.create_connection((sys.argv[1],int(sys.argv[2])),5)\n\
c.sendall(b'x'*500000);c.shutdown(socket.SHUT_WR);c.recv(1);print(time.time()-t)";

    /// Seconds to push 500 kB from host `from` to host `to` over TCP (inside the namespaces).
    fn transfer_secs(n: &Netns, from: usize, to: usize) -> f64 {
        use std::io::BufRead;
        let mut server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &n.host_ns(to),
                "python3",
                "-c",
                SERVER,
                &n.addr(to),
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut port = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &n.host_ns(from),
                "python3",
                "-c",
                CLIENT,
                &n.addr(to),
                port.trim(),
            ])
            .output()
            .unwrap();
        let _ = server.kill();
        let _ = server.wait();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    #[test]
    fn only_the_shaped_direction_is_slow_and_everything_is_torn_down() {
        assert!(
            have_netns(),
            "network namespaces need root and iproute2 (the test machines run as root, DESIGN.md §6)"
        );
        let mut n = Netns::create(3).unwrap();
        let prefix = n.prefix.clone();
        assert!(namespaces().contains(&n.host_ns(2)));
        n.shape(0, 1, "8mbit", 8_000_000).unwrap();
        let slow = transfer_secs(&n, 0, 1); // 4 Mbit at 8 Mbit/s: about 0.5 s
        let back = transfer_secs(&n, 1, 0);
        let other = transfer_secs(&n, 0, 2);
        assert!(slow > 0.3, "shaped 0->1 took {slow} s");
        assert!(
            back < slow / 3.0 && other < slow / 3.0,
            "0->1 {slow} s, 1->0 {back} s, 0->2 {other} s"
        );
        n.teardown();
        drop(n);
        assert!(!namespaces().contains(&prefix));
    }
}

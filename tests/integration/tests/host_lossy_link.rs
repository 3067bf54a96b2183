//! Issue 19: a lossy link under a real job. The test bed runs 6 rank processes on 3 hosts, each
//! host a network namespace; 5 % of the packets from host0 to host1 are dropped as they arrive
//! (`droplink`: an nftables rule inside host1's namespace). One daemon per host, with the eBPF
//! probes, follows that host's ranks and writes its host stream. Then, offline over the job's
//! segments and the host streams:
//!
//! * the straggler report's evidence (`host_tcp`) of every rank names its own connections, and
//!   counts TCP retransmits for the ranks whose sockets use the lossy link: at least 10 times
//!   as many there as on every other connection together (clean links and loopback see a few
//!   on a loaded machine: tail-loss probes, spurious timeouts);
//! * the Perfetto trace has a "TCP retransmits" counter track with values for those ranks.
//!
//! Without root, the BPF object, `ip` or `nft` the test says why and passes; under `CI=true`
//! that is a failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use comminsight_tests::*;
use serde_json::Value;

const HOSTS: usize = 3;
const RANKS: usize = 6;
/// The test bed's per-run subnet (`10.231.0.<host + 1>` inside the namespaces).
const SUBNET: &str = "10.231.0";

/// Why this machine cannot run the test, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, eBPF)".into());
    }
    let bpf = std::env::var_os("COMMINSIGHT_BPF_OBJECT").map(PathBuf::from);
    if !bpf.is_some_and(|p| p.exists()) {
        return Some(
            "needs the BPF object (cargo xtask build-ebpf; COMMINSIGHT_BPF_OBJECT)".into(),
        );
    }
    for tool in ["ip", "nft"] {
        let ok = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !ok {
            return Some(format!(
                "needs `{tool}` (apt-get install iproute2 nftables)"
            ));
        }
    }
    None
}

/// Host `h`'s address inside its namespace.
fn addr(h: usize) -> String {
    format!("{SUBNET}.{}", h + 1)
}

/// The host of `ip:port` (`None`: not a test-bed host address).
fn host_of_addr(a: &str) -> Option<usize> {
    let ip = a.rsplit_once(':')?.0;
    (0..HOSTS).find(|h| addr(*h) == ip)
}

/// A daemon config for test-bed host `h`: it follows that host's ranks (shared memory and
/// segments) and writes its host stream with the probes on.
fn agent_conf(out: &Path, h: usize, shm: &Path, logs: &Path) -> PathBuf {
    let dir = out.join(format!("agent{h}"));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let conf = dir.join("agent.toml");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = {state:?}\nhost_name = \"host{h}\"\npoll_interval_ms = 20\n\
             [sources]\nshm_dir = {shm:?}\nsegment_dirs = [{logs:?}]\nhosts = [\"host{h}\"]\nscan_interval_ms = 50\n\
             [master]\nlisten = \"\"\n[archive]\nenabled = false\n\
             [probes]\ninterval_ms = 200\nverbs = false\n[ports]\nenabled = false\n"
        ),
    )
    .unwrap();
    conf
}

/// Counter tracks of the trace at `pf` named `name` with a value above 0: their ranks.
fn counter_ranks(pf: &Path, name: &str) -> BTreeSet<i64> {
    comminsight_tests::backends::trace_counters(pf)
        .iter()
        .filter(|c| c["name"] == name && c["max"].as_f64().unwrap_or(0.0) > 0.0)
        .filter_map(|c| c["rank"].as_i64())
        .collect()
}

#[test]
fn retransmits_on_a_lossy_link_are_the_evidence_of_the_ranks_that_use_it() {
    let _g = one_job_at_a_time();
    if let Some(why) = missing() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: {why}"
        );
        eprintln!("skipping: {why}");
        return;
    }
    let out = OutDir::new("host-lossy-link");
    let shm = out.path().join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let run = out.path().join("run");
    let logs = run.join("inspector_logs");
    std::fs::create_dir_all(&logs).unwrap();
    // The daemons first, so they follow the ranks from their first operation.
    let daemons: Vec<Child> = (0..HOSTS)
        .map(|h| {
            let conf = agent_conf(out.path(), h, &shm, &logs);
            start_agent(&conf, &out.path().join(format!("agent{h}/agent.log")))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let mut tb = Child(
        Command::new(bin_dir().join("comminsight-testbed"))
            .arg("run")
            .arg("--out")
            .arg(&run)
            .args([
                "--scenario",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/ddp.toml"),
                "--ranks",
                &RANKS.to_string(),
                "--hosts",
                &HOSTS.to_string(),
                "--steps",
                "60",
                "--timeout",
                "120",
                "--fault",
                "droplink:a=0,b=2,pct=5",
            ])
            .env("COMMINSIGHT_LIB_DIR", lib_dir())
            .env("COMMINSIGHT_SHM_DIR", &shm)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(out.path().join("testbed.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let done = wait_until(Duration::from_secs(150), || {
        matches!(tb.0.try_wait(), Ok(Some(_)))
    });
    let tb_log = std::fs::read_to_string(out.path().join("testbed.log")).unwrap_or_default();
    assert!(done, "the test bed did not finish: {tb_log}");
    assert_eq!(tb.0.wait().unwrap().code(), Some(0), "test bed: {tb_log}");
    // Let the recorders write the last intervals and seal their host streams.
    std::thread::sleep(Duration::from_secs(2));
    drop(daemons);
    for h in 0..HOSTS {
        let log = std::fs::read_to_string(out.path().join(format!("agent{h}/agent.log")))
            .unwrap_or_default();
        assert!(
            !log.contains("eBPF host probes off") && !log.contains("panicked"),
            "agent{h}: {log}"
        );
    }

    let o = agent(&["straggler", out.path().to_str().unwrap(), "--json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "straggler --json: {e}: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let ranks = report["ranks"].as_array().expect("ranks");
    let host_of_rank = |r: i64| r as usize * HOSTS / RANKS;
    for r in ranks {
        eprintln!(
            "rank {}: class {} tcp {}",
            r["rank"], r["class"], r["host_tcp"]
        );
    }
    // Per rank: retransmits on connections between host0 and host1 (the lossy link, either
    // direction: lost data, or lost ACKs), and on every other connection. Loaded machines see a
    // few elsewhere too (tail-loss probes, spurious timeouts on loopback): the lossy link must
    // dominate, not be alone.
    let (mut on_link, mut elsewhere) = (0u64, 0u64);
    let mut lossy = BTreeSet::new();
    for r in ranks {
        let rank = r["rank"].as_i64().unwrap();
        let tcp = &r["host_tcp"];
        assert!(tcp.is_object(), "rank {rank}: no host_tcp evidence: {r:#}");
        let mut link = 0;
        for c in tcp["connections"].as_array().unwrap() {
            let (local, remote) = (c["local"].as_str().unwrap(), c["remote"].as_str().unwrap());
            assert_eq!(
                host_of_addr(local),
                Some(host_of_rank(rank)),
                "rank {rank}: a connection of another host: {c}"
            );
            let ends: BTreeSet<Option<usize>> = [host_of_addr(local), host_of_addr(remote)].into();
            if ends == BTreeSet::from([Some(0), Some(1)]) {
                link += c["retransmits"].as_u64().unwrap();
            }
        }
        let total = tcp["retransmits"].as_u64().unwrap();
        on_link += link;
        elsewhere += total - link;
        if link >= 10 {
            lossy.insert(rank);
        }
    }
    assert!(
        on_link >= 50 && on_link >= 10 * elsewhere,
        "retransmits on the lossy link {on_link}, elsewhere {elsewhere}: {report:#}"
    );
    assert!(
        !lossy.is_empty() && lossy.iter().all(|r| host_of_rank(*r) <= 1),
        "the ranks with retransmits on the lossy link: {lossy:?}"
    );

    let pf = out.path().join("t.pftrace");
    let o = agent(&[
        "trace",
        out.path().to_str().unwrap(),
        "--job",
        "ddp",
        "--steps",
        "0..59",
        "-o",
        pf.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "trace: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let traced = counter_ranks(&pf, "TCP retransmits");
    assert!(
        traced.is_superset(&lossy),
        "the trace's retransmit tracks {traced:?}, the lossy link's ranks {lossy:?}: {stdout}"
    );
}

//! `comminsight-agent probe`: attach the eBPF host probes to running processes for a while and
//! write what they saw (ibverbs calls, the QP map, thread scheduler shares, TCP events and
//! per-connection TCP counters) as JSON.
//! The daemon runs the same probes for the ranks the plugin registers; this command is how an
//! operator (and the tests) look at one process by hand.

use std::path::PathBuf;

#[cfg(comminsight_bpf)]
use super::exit;
#[cfg(comminsight_bpf)]
use crate::probes::ProbeReport;
use crate::probes::ProbesConfig;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Processes to track (comma-separated pids).
    #[arg(long, value_delimiter = ',', required = true)]
    pub pid: Vec<u32>,
    /// Stop after this many seconds (default: when every tracked process has exited).
    #[arg(long, value_name = "S")]
    pub duration_s: Option<f64>,
    /// Write the report here (JSON) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Once attached, create this file (so a script knows when to start the traced work).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Attach the uprobes by plain symbol name, as a name-based tracer would (hooks the
    /// first, possibly compat, version of a versioned symbol): for comparison only.
    #[arg(long)]
    pub attach_by_name: bool,
    /// The libibverbs to probe (default: libibverbs.so.1 in the library directories).
    #[arg(long, value_name = "FILE")]
    pub libibverbs: Option<PathBuf>,
}

#[cfg(not(comminsight_bpf))]
pub fn run(_a: &ProbeArgs) -> anyhow::Result<u8> {
    let _ = ProbesConfig::default();
    Err(crate::probes::ProbeError::NotBuiltIn.into())
}

#[cfg(comminsight_bpf)]
pub fn run(a: &ProbeArgs) -> anyhow::Result<u8> {
    use anyhow::Context;
    let cfg = ProbesConfig {
        libibverbs: a.libibverbs.clone().unwrap_or_default(),
        ..ProbesConfig::default()
    };
    let mut probes = crate::probes::HostProbes::start(&cfg, a.attach_by_name)?;
    for s in probes.statuses() {
        if !s.ok {
            eprintln!("comminsight-agent: probe {}: {}", s.name, s.detail);
        }
    }
    for &pid in &a.pid {
        probes.track(pid)?;
    }
    if let Some(f) = &a.ready_file {
        std::fs::write(f, b"attached\n")
            .with_context(|| format!("writing --ready-file {}", f.display()))?;
    }
    let deadline = a
        .duration_s
        .map(|s| std::time::Instant::now() + std::time::Duration::from_secs_f64(s));
    let mut report = ProbeReport {
        pids: a.pid.clone(),
        ..ProbeReport::default()
    };
    loop {
        let (verbs, tcp) = probes.poll();
        report.verbs.extend(verbs);
        report.tcp.extend(tcp);
        let alive = a
            .pid
            .iter()
            .any(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        let samples = probes.threads();
        if !samples.is_empty() {
            report.threads = samples;
        }
        if !alive || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (verbs, tcp) = probes.poll();
    report.verbs.extend(verbs);
    report.tcp.extend(tcp);
    report.tcp.extend(probes.flush_tcp());
    report.tcp_peers = probes.tcp_peers();
    report.tcp_unowned = probes.tcp_unowned();
    report.statuses = probes.statuses().to_vec();
    report.qps = probes.qps().all();
    report.counts = probes.counts();
    let text = serde_json::to_string_pretty(&report)?;
    match &a.out {
        Some(f) => {
            std::fs::write(f, text).with_context(|| format!("writing --out {}", f.display()))?
        }
        None => println!("{text}"),
    }
    Ok(exit::OK)
}

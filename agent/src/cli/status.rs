//! `comminsight-agent status`: the running daemon's state in one screen (like `vector top`),
//! read from its `/status` endpoint, else from the `<state_dir>/status.json` it rewrites.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{exit, load_config};
use crate::host::recorder::RecorderStatus;
use crate::pipeline::status::{lag, round2, status_path, DaemonStatus, Finding, FILE_EVERY};

/// Streams listed on the screen (`--json` has them all).
const SHOWN_STREAMS: usize = 18;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The daemon's configuration file (its `[http] listen` and `[agent] state_dir`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the daemon's state as one JSON object (what `/status` serves).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &StatusArgs) -> anyhow::Result<u8> {
    let cfg = load_config(a.config.as_deref())?;
    let st = fetch(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string(&st)?);
    } else {
        print!("{}", render(&st));
    }
    Ok(exit::OK)
}

/// The daemon's state: `/status` when the endpoint serves, else `status.json` when fresh.
fn fetch(cfg: &crate::AgentConfig) -> anyhow::Result<DaemonStatus> {
    let dir = &cfg.agent.state_dir;
    if lock_is_free(dir) {
        anyhow::bail!(
            "no comminsight-agent runs on {} (its agent.lock is free); start it (systemctl start comminsight-agent, or comminsight-agent run) or pass the daemon's --config",
            dir.display()
        );
    }
    let file = read_file(dir);
    if cfg.http.enabled() {
        // Port 0: the daemon wrote the port it got into its status file.
        let addr = match (&file, cfg.http.listen.ends_with(":0")) {
            (Ok(f), true) => f.http.clone(),
            (_, true) => None,
            (_, false) => Some(cfg.http.listen.clone()),
        };
        if let Some(addr) = addr {
            match from_http(&addr) {
                Ok(s) => return Ok(s),
                Err(e) if file.is_err() => {
                    return Err(e.context(format!(
                    "cannot read the daemon's state; is it running with this [http] listen ({})?",
                    cfg.http.listen
                )))
                }
                Err(_) => {}
            }
        }
    }
    let st = file?;
    let age_ms = crate::util::time::unix_ms().saturating_sub(st.taken_unix_ms);
    if age_ms > 10 * FILE_EVERY.as_millis() as u64 {
        anyhow::bail!(
            "{}: {} s old: the daemon (pid {}) stopped updating it; check it with systemctl status comminsight-agent",
            status_path(dir).display(),
            age_ms / 1000,
            st.pid
        );
    }
    Ok(st)
}

fn from_http(addr: &str) -> anyhow::Result<DaemonStatus> {
    let r = crate::http::client::get(addr, "/status")?;
    if r.code != 200 {
        anyhow::bail!("http://{addr}/status: HTTP {}", r.code);
    }
    serde_json::from_slice(&r.body)
        .with_context(|| format!("http://{addr}/status: not the daemon's status"))
}

fn read_file(dir: &Path) -> anyhow::Result<DaemonStatus> {
    let p = status_path(dir);
    let bytes = std::fs::read(&p).with_context(|| {
        format!(
            "{}: cannot read the daemon's status; run this as the daemon's user, or enable [http] listen",
            p.display()
        )
    })?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not a daemon status file", p.display()))
}

/// True when nobody holds `<dir>/agent.lock` (no daemon); false when one does, or when this
/// user cannot tell.
fn lock_is_free(dir: &Path) -> bool {
    let path = dir.join(crate::pipeline::state::LOCK_FILE);
    match std::fs::File::open(&path) {
        Ok(f) => f.try_lock_shared().is_ok(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

fn since(ms: u64, now: u64) -> String {
    format!("{} ago", lag(now.saturating_sub(ms)))
}

fn finding(f: &Option<Finding>, now: u64) -> String {
    f.as_ref().map_or_else(
        || "none".into(),
        |f| format!("{} ({}, job {})", f.line, since(f.at_unix_ms, now), f.job),
    )
}

fn uptime(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One screen: the daemon, its sinks, the last verdicts, then its streams.
pub fn render(s: &DaemonStatus) -> String {
    use std::fmt::Write as _;
    let now = s.taken_unix_ms;
    let state = match (s.ready, s.stopping) {
        (_, true) => "stopping",
        (true, false) => "ready",
        (false, false) => "starting",
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        "comminsight-agent {} on {} (pid {}): {state}, up {}{}",
        s.agent_version,
        s.host,
        s.pid,
        uptime(s.uptime_s),
        s.http
            .as_ref()
            .map(|a| format!(", http://{a}/"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        o,
        "records  {} ({}/s), lag {}, {} dropped, rss {} MiB",
        s.records,
        round2(s.records_per_s),
        lag(s.lag_ms),
        s.drops,
        s.rss_bytes >> 20
    );
    let on = |b: bool| if b { "on" } else { "off" };
    let _ = writeln!(
        o,
        "sinks    otlp {} (logs dropped {}), archive {} (backlog {} segments), {} sink errors",
        on(s.sinks.otlp_enabled),
        s.sinks.logs_dropped,
        on(s.sinks.archive_enabled),
        s.sinks.archive_backlog,
        s.sinks.errors
    );
    let _ = writeln!(o, "hang     {}", finding(&s.last_hang, now));
    let _ = writeln!(o, "straggler {}", finding(&s.last_straggler, now));
    let _ = writeln!(o, "moe      {}", finding(&s.last_moe, now));
    let _ = writeln!(o, "host     {}", host_context(s.host_context.as_ref()));
    let _ = writeln!(o, "gpu      {}", gpu_line(s.host_context.as_ref()));
    let live = s.streams.iter().filter(|x| !x.finished).count();
    let _ = writeln!(o, "\nstreams: {} ({live} live)", s.streams.len());
    if s.streams.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "{:<20} {:>6} {:<16} {:>8} {:>12} {:>8} {:>7}  STATE",
        "JOB", "RANK", "HOST", "PID", "RECORDS", "LAG", "DROPS"
    );
    let mut rows: Vec<_> = s.streams.iter().collect();
    rows.sort_by(|a, b| (&a.job, a.rank, &a.host, &a.pid).cmp(&(&b.job, b.rank, &b.host, &b.pid)));
    for x in rows.iter().take(SHOWN_STREAMS) {
        let _ = writeln!(
            o,
            "{:<20} {:>6} {:<16} {:>8} {:>12} {:>8} {:>7}  {}",
            x.job,
            x.rank.map_or_else(|| "-".into(), |r| r.to_string()),
            x.host,
            x.pid,
            x.records,
            if x.finished {
                "-".into()
            } else {
                lag(x.lag_ms)
            },
            x.drops,
            if x.finished { "ended" } else { "live" }
        );
    }
    if rows.len() > SHOWN_STREAMS {
        let _ = writeln!(
            o,
            "... {} more streams (--json lists them all)",
            rows.len() - SHOWN_STREAMS
        );
    }
    o
}

/// The host recorder in one line: where thread times come from, the probes attached (and
/// the first that failed), ports, ranks followed, records written and lost.
fn host_context(h: Option<&RecorderStatus>) -> String {
    let Some(h) = h else {
        return "off ([probes] and [ports] disabled)".into();
    };
    let attached = h.probes.iter().filter(|p| p.ok).count();
    let failed = h
        .probes
        .iter()
        .find(|p| !p.ok)
        .map(|p| format!(" ({} failed: {})", p.name, p.detail))
        .unwrap_or_default();
    format!(
        "ebpf {}, threads from {}, {attached}/{} probes attached{failed}, ports {}, {} ranks followed, {} records ({} lost)",
        h.ebpf,
        h.threads,
        h.probes.len(),
        if h.ports { "on" } else { "off" },
        h.tracked,
        h.records,
        h.lost
    )
}

/// The GPU sources in one line: NVML on (GPUs, driver) or why not, GPUs sampled, the metrics
/// switched off (the first named), XIDs seen.
fn gpu_line(h: Option<&RecorderStatus>) -> String {
    let Some(g) = h.map(|h| &h.gpu).filter(|g| !g.nvml.is_empty()) else {
        return "off (no host recorder)".into();
    };
    let off = match g.metrics_off.first() {
        None => "no metric off".to_string(),
        Some(f) => format!("{} metrics off ({f})", g.metrics_off.len()),
    };
    let dcgm = match g.dcgm.as_str() {
        "" | "off" => String::new(),
        d if g.dcgm_unmapped > 0 => format!(
            ", dcgm {d} ({} failed scrapes, {} series of unknown GPUs)",
            g.dcgm_failed, g.dcgm_unmapped
        ),
        d => format!(", dcgm {d} ({} failed scrapes)", g.dcgm_failed),
    };
    format!(
        "nvml {}, {} GPUs sampled, {off}, {} XIDs{dcgm}",
        g.nvml, g.sampled, g.xids
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::gpu::GpuStatus;
    use crate::pipeline::status::StreamStatus;
    use crate::probes::ProbeStatus;

    #[test]
    fn one_screen_names_the_daemon_sinks_verdicts_and_streams() {
        let s = DaemonStatus {
            agent_version: "0.1.0".into(),
            host: "h0".into(),
            pid: 42,
            http: Some("127.0.0.1:9464".into()),
            uptime_s: 3725,
            taken_unix_ms: 100_000,
            ready: true,
            records: 1234,
            records_per_s: 56.0,
            streams: (0..25)
                .map(|i| StreamStatus {
                    job: "job7".into(),
                    host: "h0".into(),
                    pid: (1000 + i).to_string(),
                    rank: Some(24 - i),
                    records: 10,
                    ..Default::default()
                })
                .collect(),
            last_hang: Some(Finding {
                at_unix_ms: 40_000,
                job: "job7".into(),
                line: "hang: rank 3 stopped".into(),
            }),
            host_context: Some(RecorderStatus {
                ebpf: "on".into(),
                threads: "ebpf".into(),
                ports: true,
                probes: vec![
                    ProbeStatus {
                        name: "sched:sched_switch".into(),
                        ok: true,
                        detail: "attached".into(),
                    },
                    ProbeStatus {
                        name: "verbs:ibv_reg_mr".into(),
                        ok: false,
                        detail: "libibverbs.so.1 not found".into(),
                    },
                ],
                tracked: 8,
                records: 99,
                lost: 0,
                gpu: GpuStatus {
                    nvml: "on (8 GPUs, driver 570.133.20)".into(),
                    metrics_off: vec!["pcie_replays: the NVML library has no X".into()],
                    sampled: 8,
                    errors: 0,
                    xids: 1,
                    dcgm: "on (http://127.0.0.1:9400/metrics): 8 GPUs".into(),
                    dcgm_failed: 2,
                    dcgm_unmapped: 0,
                },
            }),
            ..Default::default()
        };
        let text = render(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "comminsight-agent 0.1.0 on h0 (pid 42): ready, up 1h 02m, http://127.0.0.1:9464/"
        );
        assert_eq!(
            lines[3],
            "hang     hang: rank 3 stopped (60 s ago, job job7)"
        );
        assert_eq!(lines[4], "straggler none");
        assert_eq!(lines[5], "moe      none");
        assert_eq!(
            lines[6],
            "host     ebpf on, threads from ebpf, 1/2 probes attached (verbs:ibv_reg_mr failed: \
             libibverbs.so.1 not found), ports on, 8 ranks followed, 99 records (0 lost)"
        );
        assert_eq!(
            lines[7],
            "gpu      nvml on (8 GPUs, driver 570.133.20), 8 GPUs sampled, 1 metrics off \
             (pcie_replays: the NVML library has no X), 1 XIDs, dcgm on \
             (http://127.0.0.1:9400/metrics): 8 GPUs (2 failed scrapes)"
        );
        // Sorted by rank; one screen, with the rest counted.
        assert!(
            lines[11].starts_with("job7") && lines[11].contains(" 0 "),
            "{}",
            lines[11]
        );
        assert_eq!(
            *lines.last().unwrap(),
            "... 7 more streams (--json lists them all)"
        );
        assert!(lines.len() <= 30, "{text}");
    }
}

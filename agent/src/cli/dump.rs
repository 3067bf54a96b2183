//! `comminsight-agent dump`: records as text or JSON lines, or a summary.

use std::io::{BufWriter, Write};

use anyhow::{bail, Context};
use comminsight_wire::json::JsonRenderer;
use comminsight_wire::record::{Body, Kind, Record};

use super::{exit, DumpArgs};
use crate::dump::{self, Summary};

pub fn run(a: &DumpArgs) -> anyhow::Result<u8> {
    let mut kinds = Vec::new();
    for k in &a.kind {
        match Kind::from_name(k) {
            Some(kind) => kinds.push(kind),
            None => bail!(
                "--kind {k}: unknown kind; use one of {}",
                Kind::ALL.map(Kind::name).join(", ")
            ),
        }
    }
    let loaded = dump::load(&a.path)?;
    for p in &loaded.problems {
        eprintln!("warning: {p}");
    }
    if loaded.more_problems > 0 {
        eprintln!("warning: ... and {} more problems", loaded.more_problems);
    }
    let skipped = loaded.skips.summary();
    let res = write(a, &kinds, &loaded);
    super::offline::report_skipped(&skipped);
    res
}

fn write(a: &DumpArgs, kinds: &[Kind], loaded: &dump::Loaded) -> anyhow::Result<u8> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if a.summary {
        let s = dump::summarize(loaded);
        if a.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&s)?)?;
        } else {
            write_summary(&mut out, &s)?;
        }
        out.flush()?;
        return Ok(exit::OK);
    }
    let mut json = JsonRenderer::new();
    let mut human = JsonRenderer::new();
    for sr in &loaded.records {
        let rec = &sr.record;
        let wanted = kinds.is_empty() || kinds.contains(&rec.kind());
        if a.json {
            // Render every record so derived fields (comm_name) see the comm_init records.
            let line = json.render_line(rec);
            if wanted {
                writeln!(out, "{line}")?;
            }
        } else {
            let m = human.render_value(rec);
            if wanted {
                writeln!(out, "{}", human_line(rec, &m))?;
            }
        }
    }
    out.flush().context("writing to standard output")?;
    Ok(exit::OK)
}

fn field(m: &serde_json::Map<String, serde_json::Value>, k: &str) -> String {
    match m.get(k) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "-".into(),
    }
}

/// One compact line per record: the fields an engineer looks at first.
fn human_line(rec: &Record, m: &serde_json::Map<String, serde_json::Value>) -> String {
    let f = |k: &str| field(m, k);
    let head = format!("{:>8} {:<10}", rec.seq, rec.kind().name());
    match &rec.body {
        Body::Coll(o) | Body::P2p(o) => {
            let dur = if o.end_ns > 0 { format!("{:.1}", (o.end_ns - o.start_ns.min(o.end_ns)) as f64 / 1e3) } else { "open".into() };
            format!(
                "{head} comm={} ({}) rank={} {} sn={} local_sn={} count={} {} bytes={} peer={} start_us={} dur_us={dur} ch={} {}",
                f("comm_hash"), m.get("comm_name").and_then(|v| v.as_str()).unwrap_or("unnamed"), o.rank, o.func,
                o.coll_sn, o.coll_local_sn, o.count, o.datatype, o.bytes, o.peer, o.start_ns / 1000,
                o.nchannels, o.timing.name()
            )
        }
        Body::Overdue(o) => format!(
            "{head} comm={} ({}) rank={} {} sn={} local_sn={} age_ms={} repeat={} phase={} channels={}/{}",
            f("comm_hash"), m.get("comm_name").and_then(|v| v.as_str()).unwrap_or("unnamed"), o.rank, o.func,
            o.coll_sn, o.coll_local_sn, o.age_ms, o.repeat, o.phase, o.channels_done, o.channels_started
        ),
        _ => {
            let rest: Vec<String> = m
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "kind" | "seq" | "flags"))
                .map(|(k, v)| format!("{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_string)))
                .collect();
            format!("{head} {}", rest.join(" "))
        }
    }
}

fn write_summary(out: &mut impl Write, s: &Summary) -> std::io::Result<()> {
    writeln!(out, "{} records in {} segment files", s.records, s.files)?;
    let kinds: Vec<String> = s.kinds.iter().map(|(k, n)| format!("{k}={n}")).collect();
    writeln!(out, "kinds: {}", kinds.join(" "))?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>5} {:<10} {:>8} {:>7} {:>6} {:>10} {:>8} {:>11} {:>6} {:>7} {:>6}",
        "rank",
        "host",
        "pid",
        "colls",
        "p2ps",
        "open",
        "overdue",
        "mean_op_us",
        "drops",
        "corrupt",
        "gaps"
    )?;
    for p in &s.processes {
        writeln!(
            out,
            "{:>5} {:<10} {:>8} {:>7} {:>6} {:>10} {:>8} {:>11.1} {:>6} {:>7} {:>6}",
            p.rank,
            p.host,
            p.pid,
            p.colls,
            p.p2ps,
            p.incomplete,
            p.overdue,
            p.mean_op_us,
            p.plugin_drops(),
            p.corrupt,
            p.seq_gaps
        )?;
    }
    for p in s
        .processes
        .iter()
        .filter(|p| p.ctl_refused + p.mask_changes > 0)
    {
        writeln!(
            out,
            "control: rank {} pid {} on {}: event mask changed {} times, {} control files refused (foreign owner, writable by others or not a regular file)",
            p.rank, p.pid, p.host, p.mask_changes, p.ctl_refused
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<18} {:<24} {:>6} {:>6} {:>8} {:>8}  comm ranks seen",
        "comm", "name", "nranks", "nodes", "ops", "overdue"
    )?;
    for c in &s.comms {
        writeln!(
            out,
            "{:<18} {:<24} {:>6} {:>6} {:>8} {:>8}  {:?}",
            c.comm_hash,
            if c.name.is_empty() {
                "unnamed"
            } else {
                &c.name
            },
            c.nranks,
            c.nnodes,
            c.ops,
            c.overdue,
            c.ranks_seen
        )?;
    }
    for h in &s.hints {
        writeln!(out, "hint: {h}")?;
    }
    for p in &s.problems {
        writeln!(out, "problem: {p}")?;
    }
    if let Some(d) = s.skipped.describe() {
        writeln!(out, "skipped: {d}")?;
    }
    writeln!(
        out,
        "drops: what the plugin reports it dropped (ring, pool, I/O); corrupt: records on disk that do not decode; gaps: other missing seqs"
    )?;
    Ok(())
}

//! `comminsight-agent hang DIR [--json]`: hang and failure verdicts from segments and archived
//! evidence. Exit code 1 when a verdict exists.

use serde_json::Value;

use crate::hang::model::{HangReport, Verdict, VerdictKind};
use crate::offline::hang::report;

use super::{exit, HangArgs};

pub fn run(a: &HangArgs) -> anyhow::Result<u8> {
    let all = super::offline::settings(&a.config, None)?;
    let mut settings = all.hang;
    if let Some(s) = a.min_wait_s {
        if !(s >= 0.0 && s.is_finite()) {
            anyhow::bail!("--min-wait-s {s}: give a number of seconds >= 0");
        }
        settings.min_wait_us = (s * 1e6) as u64;
    }
    if let Some(f) = a.gap_factor {
        if !(f >= 0.0 && f.is_finite()) {
            anyhow::bail!("--gap-factor {f}: give a factor >= 0 (e.g. 2)");
        }
        settings.gap_factor = f;
    }
    let (mut r, skipped) = report(&a.dir, &settings, &all.moe)?;
    if let Some(job) = &a.job {
        r.verdicts.retain(|v| &v.job == job);
        r.resolved.retain(|v| &v.job == job);
        r.ep_incomplete.retain(|v| &v.job == job);
    }
    if a.json {
        let v = super::offline::with_skipped(serde_json::to_value(&r)?, &skipped);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render_human(&r));
    }
    super::offline::report_skipped(&skipped);
    Ok(if r.verdicts.is_empty() {
        exit::OK
    } else {
        exit::FINDING
    })
}

fn secs(us: u64) -> String {
    format!("{:.1} s", us as f64 / 1e6)
}

fn ranks(v: &[i64]) -> String {
    const SHOW: usize = 16;
    let mut s: Vec<String> = v.iter().take(SHOW).map(i64::to_string).collect();
    if v.len() > SHOW {
        s.push(format!("... ({} in all)", v.len()));
    }
    s.join(",")
}

/// The human report: one block per verdict, then the stalls the jobs survived.
pub fn render_human(r: &HangReport) -> String {
    let mut out = String::new();
    if r.verdicts.is_empty() {
        out.push_str("no hang: no rank waits on another beyond the threshold\n");
    }
    for v in &r.verdicts {
        render_verdict(&mut out, v);
    }
    for s in &r.resolved {
        out.push_str(&format!(
            "stall (resolved) in job {}: {} {} seq {} on {} comm 0x{:016x}: ranks {} waited up to {} (hang threshold then {})\n",
            s.job,
            s.func,
            "op",
            s.seq,
            if s.comm.role.is_empty() { "?" } else { &s.comm.role },
            s.comm.hash,
            ranks(&s.ranks),
            secs(s.wait_us),
            secs(s.threshold_us),
        ));
    }
    render_ep(&mut out, &r.ep_incomplete);
    out
}

/// The MoE EP windows missing ranks, one line per group, phase and set of missing ranks.
fn render_ep(out: &mut String, ep: &[crate::hang::model::EpMissing]) {
    type Key<'a> = (&'a str, &'a str, &'a str, &'a [u32], &'a [i64]);
    let mut runs: std::collections::BTreeMap<Key<'_>, (u64, u64, usize)> = Default::default();
    for m in ep {
        let key = (
            m.job.as_str(),
            m.ep_group.as_str(),
            m.phase.as_str(),
            m.missing_ep_ranks.as_slice(),
            m.missing_ranks.as_slice(),
        );
        let e = runs.entry(key).or_insert((m.window_seq, m.window_seq, 0));
        e.0 = e.0.min(m.window_seq);
        e.1 = e.1.max(m.window_seq);
        e.2 += 1;
    }
    for ((job, group, phase, ep_ranks, global), (first, last, n)) in runs {
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        out.push_str(&format!(
            "MoE EP evidence in job {job}: {n} {phase} window(s) {first}..{last} of EP group {group} never got a row from EP rank(s) {} (global rank(s) {})\n",
            list(ep_ranks),
            ranks(global)
        ));
    }
}

/// One verdict's block: the header, its sources, the first non-progressing instance, the
/// wait-for chain and the sources' innermost frames.
fn render_verdict(out: &mut String, v: &Verdict) {
    let kind = match v.kind {
        VerdictKind::Hang => "HANG",
        VerdictKind::Failure => "FAILURE",
        VerdictKind::Mismatch => "MISMATCH",
    };
    out.push_str(&format!(
        "{kind} in job {}: source rank(s) {}\n",
        v.job,
        ranks(&v.source_ranks)
    ));
    if let Some(f) = &v.gpu_fault {
        out.push_str(&format!("  GPU FAULT: {f}\n"));
    }
    let sources = v.evidence.get("sources").and_then(|s| s.as_array());
    if let Some(sources) = sources {
        for s in sources {
            render_source(out, s);
        }
    }
    render_instance(out, v);
    render_chain(out, v);
    // Innermost frames of the sources' stacks.
    if let Some(sources) = sources {
        for s in sources {
            render_stacks(out, s);
        }
    }
}

/// One source's line: state, host, pid, silence and process state.
fn render_source(out: &mut String, s: &Value) {
    out.push_str(&format!(
        "  rank {}: {} on {} pid {}, {}{}\n",
        s["rank"],
        s["state"].as_str().unwrap_or("?"),
        s["host"].as_str().unwrap_or("?"),
        s["pid"],
        s["silent_us"].as_u64().map_or_else(
            || "no operation of it recorded".to_string(),
            |us| format!("silent {}", secs(us))
        ),
        s.get("proc_state")
            .and_then(|p| p.get("status"))
            .and_then(|p| p.as_str())
            .map(|p| format!(", process {p}"))
            .unwrap_or_default(),
    ));
}

/// The first non-progressing instance, and who entered it and who is absent.
fn render_instance(out: &mut String, v: &Verdict) {
    let role = if v.comm.role.is_empty() {
        "?"
    } else {
        &v.comm.role
    };
    out.push_str(&format!(
        "  first non-progressing: {} seq {} on {role} comm 0x{:016x} {}\n",
        v.func,
        v.seq,
        v.comm.hash,
        if v.comm.name.is_empty() {
            String::new()
        } else {
            format!("({})", v.comm.name)
        }
    ));
    out.push_str(&format!(
        "  entered: {}; absent: {}\n",
        ranks(&v.entered_ranks),
        ranks(&v.absent_ranks)
    ));
}

/// The first 12 wait-for links, and how many more there are.
fn render_chain(out: &mut String, v: &Verdict) {
    for l in v.chain.iter().take(12) {
        out.push_str(&format!(
            "  rank {} waits in {} seq {} (comm 0x{:016x}) for {}\n",
            l.rank,
            l.func,
            l.seq,
            l.comm,
            ranks(&l.waits_for)
        ));
    }
    if v.chain.len() > 12 {
        out.push_str(&format!(
            "  ... {} more wait-for links\n",
            v.chain.len() - 12
        ));
    }
}

/// A source's innermost frames (4 threads, 4 frames each), or why its stacks are missing.
fn render_stacks(out: &mut String, s: &Value) {
    let Some(threads) = s
        .get("stacks")
        .and_then(|st| st.get("threads"))
        .and_then(|t| t.as_array())
    else {
        if let Some(err) = s
            .get("stacks")
            .and_then(|st| st.get("error"))
            .and_then(|e| e.as_str())
        {
            out.push_str(&format!("  rank {} stacks: {err}\n", s["rank"]));
        }
        return;
    };
    for t in threads.iter().take(4) {
        let frames: Vec<String> = t["frames"]
            .as_array()
            .map(|f| {
                f.iter()
                    .take(4)
                    .map(|f| {
                        format!(
                            "{} ({}:{})",
                            f["name"].as_str().unwrap_or("?"),
                            f["file"].as_str().unwrap_or(""),
                            f["line"]
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "  rank {} thread {}{}: {}\n",
            s["rank"],
            t["name"].as_str().unwrap_or("?"),
            if t["owns_gil"].as_bool() == Some(true) {
                " [GIL]"
            } else {
                ""
            },
            frames.join(" <- ")
        ));
    }
}

//! `comminsight-agent replay DIR --out DIR`: the pipeline offline, same code as online.

use crate::offline::replay::replay;

use super::offline::{settings, ConfigArg};
use super::{exit, ReplayArgs};

pub fn run(a: &ReplayArgs) -> anyhow::Result<u8> {
    let config = ConfigArg {
        config: a.config.clone(),
    };
    let settings = settings(&config, None)?;
    let input = super::offline::open_input(&a.dir, "replay")?;
    let s = replay(&input, &a.out, &settings)?;
    let skipped = input.skipped();
    if a.json {
        let v = serde_json::json!({
            "skipped": skipped,
            "streams": s.streams,
            "records": s.records,
            "corrupt": s.corrupt,
            "seconds": s.seconds,
            "records_per_s": s.records_per_s,
            "outputs": s.outputs,
        });
        println!("{v}");
    } else {
        println!(
            "replayed {} records from {} streams in {:.2} s ({:.0} records/s)",
            s.records, s.streams, s.seconds, s.records_per_s
        );
        if s.corrupt > 0 {
            println!("{} corrupt records skipped", s.corrupt);
        }
        print!("{}", render_table(&s.metrics, 12));
        for o in &s.outputs {
            println!("wrote {}", o.display());
        }
    }
    super::offline::report_skipped(&skipped);
    Ok(exit::OK)
}

/// The busiest series per job (by total execution time), one line each.
pub fn render_table(m: &crate::metrics::MetricsSnapshot, top: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (job, j) in &m.jobs {
        let _ = writeln!(
            out,
            "\njob {job}: {} series, {} overdue ops, {} plugin drops, {} records lost",
            j.series.len(),
            j.overdue_ops,
            j.plugin_drops,
            j.records_lost
        );
        let _ = writeln!(
            out,
            "  {:<18} {:<14} {:<10} {:>8} {:>10} {:>9} {:>9}",
            "comm", "func", "size", "ops", "mean us", "algbw", "busbw"
        );
        let mut series: Vec<_> = j.series.iter().collect();
        series.sort_by_key(|s| std::cmp::Reverse(s.values.exec_ns_sum));
        for s in series.iter().take(top) {
            let v = &s.values;
            let mean_us = if v.ops > 0 {
                v.exec_ns_sum as f64 / v.ops as f64 / 1e3
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "  {:<18} {:<14} {:<10} {:>8} {:>10.1} {:>7.2}GB {:>7.2}GB",
                s.labels.comm,
                s.labels.func,
                s.labels.size,
                v.ops,
                mean_us,
                s.algbw_gbs,
                s.busbw_gbs
            );
        }
        if series.len() > top {
            let _ = writeln!(
                out,
                "  ... {} more series in metrics.json",
                series.len() - top
            );
        }
    }
    out
}

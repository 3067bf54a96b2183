//! `comminsight-agent trace DIR (--steps a..b | --time t0..t1) [--ranks ..] [--job J]
//! [--templates DIR] [--config FILE] -o FILE.pftrace`: a Perfetto timeline of the chosen steps and ranks.

use std::path::PathBuf;

use crate::trace::{write_trace, TraceOptions, Window};

use super::exit;
use super::offline::{parse_steps, ranks_arg, settings, ConfigArg};

/// `trace` options.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("window").required(true).args(["steps", "time"])))]
pub struct TraceArgs {
    /// Segments: a segment root, a test-bed output directory, a job directory or an agent archive.
    pub dir: PathBuf,
    /// These steps (a..b, both included, or one step), numbered as `steps` shows them.
    #[arg(long)]
    pub steps: Option<String>,
    /// A time window t0..t1 in µs on the aligned job timeline (realtime µs since the Unix epoch,
    /// as `steps --json` prints `start_us`): the steps and operations that overlap it.
    #[arg(long, value_name = "T0..T1")]
    pub time: Option<String>,
    /// Only these ranks (e.g. 0,3,8-11).
    #[arg(long)]
    pub ranks: Option<String>,
    /// Only this job (required when the input holds several).
    #[arg(long)]
    pub job: Option<String>,
    /// Step templates from this directory (every *.toml) instead of the built-in ones.
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Output file (Perfetto protobuf trace; open it in ui.perfetto.dev).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
}

/// `"t0..t1"` (µs, t0 <= t1) -> the window.
pub fn parse_time(s: &str) -> Result<(u64, u64), String> {
    let err = || format!("--time {s:?}: use t0..t1 in µs on the aligned timeline (t0 <= t1)");
    let (a, b) = s.split_once("..").ok_or_else(err)?;
    match (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => Ok((a, b)),
        _ => Err(err()),
    }
}

/// Run `trace`.
pub fn run(a: &TraceArgs) -> anyhow::Result<u8> {
    let window = match (&a.steps, &a.time) {
        (Some(s), _) => Window::Steps(parse_steps(s).map_err(anyhow::Error::msg)?),
        (None, Some(t)) => {
            let (t0, t1) = parse_time(t).map_err(anyhow::Error::msg)?;
            Window::Time(t0, t1)
        }
        (None, None) => anyhow::bail!("give --steps a..b or --time t0..t1"),
    };
    let settings = settings(&a.config, a.templates.as_deref())?;
    let opts = TraceOptions {
        window,
        ranks: ranks_arg(a.ranks.as_deref())?,
        job: a.job.clone(),
    };
    let input = super::offline::open_input(&a.dir, "trace")?;
    // Written next to the target and renamed at the end: a failed run leaves no half trace.
    let mut tmp = a.out.as_os_str().to_owned();
    tmp.push(".part");
    let tmp = PathBuf::from(tmp);
    let file = std::fs::File::create(&tmp)
        .map_err(|e| anyhow::anyhow!("{}: cannot create the trace: {e}", tmp.display()))?;
    let res = write_trace(&input, &opts, &settings, std::io::BufWriter::new(file));
    let s = match res {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    };
    std::fs::rename(&tmp, &a.out)
        .map_err(|e| anyhow::anyhow!("{}: cannot write the trace: {e}", a.out.display()))?;
    println!(
        "wrote {}: {} packets, {} op slices, {} bytes ({:.1} bytes/op)",
        a.out.display(),
        s.packets,
        s.op_slices,
        s.bytes,
        s.bytes_per_op()
    );
    println!(
        "job {}: {} hosts, {} ranks, {} steps, {} phases, {} ops ({} on async tracks), {} flows, {} NIC counter values, {}..{} µs; {} of {} segments read (time index: {} streams cached, {} indexed{})",
        s.job,
        s.hosts,
        s.ranks,
        s.step_slices,
        s.phase_slices,
        s.op_slices,
        s.async_op_slices,
        s.flows,
        s.counter_values,
        s.from_us,
        s.to_us,
        s.segments_read,
        s.segments_total,
        s.index.cached,
        s.index.rebuilt,
        if s.index.saved { ", saved" } else { "" }
    );
    let h = &s.host;
    println!(
        "host context: {} main-thread CPU slices, {} TCP retransmit values, {} QP events, {} port counter values, {} GPU values",
        h.cpu_slices, h.tcp_values, h.qp_events, h.port_values, h.gpu_values
    );
    if s.ep_instants > 0 {
        println!("MoE EP: {} finding instants", s.ep_instants);
    }
    super::offline::report_skipped(&input.skipped());
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_windows() {
        assert_eq!(parse_time("10..20"), Ok((10, 20)));
        assert_eq!(parse_time(" 5 .. 5"), Ok((5, 5)));
        assert!(parse_time("20..10").is_err());
        assert!(parse_time("10").is_err());
        assert!(parse_time("a..b").is_err());
    }
}

//! `comminsight-agent replay DIR --out DIR`: the pipeline offline, same code as online.

use crate::replay::{replay, ReplayOptions};

use super::{exit, load_config, ReplayArgs};

pub fn run(a: &ReplayArgs) -> anyhow::Result<u8> {
    let cfg = load_config(a.config.as_deref())?;
    let opts = ReplayOptions {
        progress: !a.json,
        max_series: cfg.otlp.max_series,
    };
    let s = replay(&a.dir, &a.out, &opts)?;
    if a.json {
        let v = serde_json::json!({
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
        for o in &s.outputs {
            println!("wrote {}", o.display());
        }
    }
    Ok(exit::OK)
}

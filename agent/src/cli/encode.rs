//! `comminsight-agent encode`: JSON lines back to binary records (the inverse of `dump --json`).

use std::io::{BufRead, BufReader, Read, Write};

use anyhow::Context;
use comminsight_wire::json::from_line;

use super::{exit, EncodeArgs};

pub fn run(a: &EncodeArgs) -> anyhow::Result<u8> {
    let input: Box<dyn Read> =
        if a.input.as_os_str() == "-" {
            Box::new(std::io::stdin())
        } else {
            Box::new(std::fs::File::open(&a.input).with_context(|| {
                format!("{}: cannot open the JSON-lines input", a.input.display())
            })?)
        };
    let mut bytes = Vec::new();
    let mut records = 0u64;
    for (i, line) in BufReader::new(input).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}: read error at line {}", a.input.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec = from_line(&line).with_context(|| {
            format!(
                "{} line {}: not a record ({}); fix or remove that line",
                a.input.display(),
                i + 1,
                line.chars().take(60).collect::<String>()
            )
        })?;
        bytes.extend_from_slice(&rec.encode().0);
        records += 1;
    }
    let mut f = std::fs::File::create(&a.out)
        .with_context(|| format!("{}: cannot create the output file", a.out.display()))?;
    f.write_all(&bytes)
        .with_context(|| format!("{}: write failed", a.out.display()))?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "records": records, "out": a.out, "bytes": bytes.len() })
        );
    }
    Ok(exit::OK)
}

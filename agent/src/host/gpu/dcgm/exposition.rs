//! A dcgm-exporter `/metrics` body as [`Series`]. The Prometheus text format is line-oriented
//! (a label value's newline is escaped), so each sample line of a wanted field is parsed on its
//! own ([`super::promtext`]), with its family's `# TYPE`: a malformed line costs that line alone,
//! counted, and a family's samples may carry different label sets (dcgm-exporter adds
//! `GPU_I_PROFILE` / `GPU_I_ID` to MIG instances only).
//! DCGM's blank values (no data, not supported, no permission: `DCGM_INT64_BLANK` and up,
//! `DCGM_INT32_BLANK` and up, `DCGM_FP64_BLANK` and up) come out as [`Series::value`] `None`.

use std::collections::{BTreeMap, HashMap};

use super::promtext::{self, Number};

/// Sample lines read from one body at most (more are counted as skipped).
pub const MAX_LINES: usize = 100_000;

/// One sample of the body.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// `DCGM_FI_DEV_SM_CLOCK`, ...
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `None`: one of DCGM's blank values.
    pub value: Option<f64>,
}

/// What a body gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exposition {
    pub series: Vec<Series>,
    /// Sample lines of wanted fields that did not parse (or past [`MAX_LINES`]).
    pub skipped: u64,
    /// The first of them, for the log (cut to 200 bytes).
    pub first_skipped: String,
}

/// `DCGM_INT64_BLANK` (`0x7ffffffffffffff0`) and the blanks above it.
const INT64_BLANK: i64 = 0x7fff_ffff_ffff_fff0;
/// `DCGM_INT32_BLANK` (`0x7ffffff0`) .. `+3`.
const INT32_BLANK: i64 = 0x7fff_fff0;
/// `DCGM_FP64_BLANK` (`140737488355328.0`, 2^47) .. `+3`.
const FP64_BLANK: f64 = 140_737_488_355_328.0;

/// The value of `n`, `None` for a DCGM blank (or NaN).
fn value_of(n: Number) -> Option<f64> {
    match n {
        Number::Int(i) if i >= INT64_BLANK || (INT32_BLANK..INT32_BLANK + 4).contains(&i) => None,
        Number::Int(i) => Some(i as f64),
        Number::Float(f)
            if f.is_nan()
                || f >= INT64_BLANK as f64
                || (FP64_BLANK..FP64_BLANK + 4.0).contains(&f)
                || (INT32_BLANK as f64..INT32_BLANK as f64 + 4.0).contains(&f) =>
        {
            None
        }
        Number::Float(f) => Some(f),
    }
}

/// The metric name a sample line starts with.
fn name_of(line: &str) -> &str {
    let end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    &line[..end]
}

/// One sample line (with its family's `# TYPE`, if any): a gauge, a counter or untyped.
fn parse_line(name: &str, kind: Option<&str>, line: &str) -> Result<Series, String> {
    if let Some(k) = kind.filter(|k| !matches!(*k, "gauge" | "counter" | "untyped" | "unknown")) {
        return Err(format!("a {k}, not a gauge or counter"));
    }
    let s = promtext::sample(line)?;
    Ok(Series {
        name: name.to_string(),
        labels: s.labels,
        value: value_of(s.value),
    })
}

/// The samples of `body` whose metric is one of `wanted` (other lines are not parsed at all).
pub fn parse(body: &str, wanted: &[&str]) -> Exposition {
    let mut out = Exposition::default();
    let mut types: HashMap<&str, &str> = HashMap::new();
    let mut read = 0usize;
    for line in body.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix('#') {
            let mut w = rest.split_ascii_whitespace();
            if let (Some("TYPE"), Some(n), Some(k)) = (w.next(), w.next(), w.next()) {
                types.insert(n, k);
            }
            continue;
        }
        let name = name_of(line);
        if !wanted.contains(&name) {
            continue;
        }
        read += 1;
        let parsed = if read > MAX_LINES {
            Err(format!("over {MAX_LINES} lines"))
        } else {
            parse_line(name, types.get(name).copied(), line)
        };
        match parsed {
            Ok(s) => out.series.push(s),
            Err(e) => {
                out.skipped += 1;
                if out.first_skipped.is_empty() {
                    let mut l = format!("{line:?}: {e}");
                    let mut cut = l.len().min(200);
                    while !l.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    l.truncate(cut);
                    out.first_skipped = l;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_parse_in_order_blanks_are_none_and_a_bad_line_costs_itself() {
        let body = "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n\
            # TYPE DCGM_FI_DEV_SM_CLOCK gauge\n\
            DCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-a\",pci_bus_id=\"00000000:1B:00.0\",modelName=\"NVIDIA H100 80GB HBM3, rev=1\"} 1980\n\
            DCGM_FI_DEV_SM_CLOCK{gpu=\"1\",UUID=\"GPU-b\",pci_bus_id=\"00000000:43:00.0\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"3\"} 1410\n\
            DCGM_FI_DEV_SM_CLOCK{gpu=\"2\", UUID=\"GPU-c\"} 9223372036854775794\n\
            # TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n\
            DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu=\"0\",UUID=\"GPU-a\"} 123456789012\n\
            DCGM_FI_DEV_POWER_USAGE{gpu=\"0\"} 140737488355328.000\n\
            DCGM_FI_DEV_POWER_USAGE{gpu=\"1\"} 300.5\n\
            DCGM_FI_DEV_POWER_USAGE{gpu=\"2\"} 301\n\
            DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 2147483634\n\
            DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",broken 5\n\
            DCGM_FI_DEV_ENC_UTIL{gpu=\"1\",broken too, but not wanted 5\n\
            go_goroutines 12\n";
        let e = parse(
            body,
            &[
                "DCGM_FI_DEV_SM_CLOCK",
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "DCGM_FI_DEV_POWER_USAGE",
                "DCGM_FI_DEV_GPU_TEMP",
            ],
        );
        assert_eq!(e.skipped, 1, "{e:?}");
        assert!(e.first_skipped.contains("broken"), "{}", e.first_skipped);
        let v: Vec<(&str, Option<f64>)> = e
            .series
            .iter()
            .map(|s| (s.name.as_str(), s.value))
            .collect();
        assert_eq!(
            v,
            [
                ("DCGM_FI_DEV_SM_CLOCK", Some(1980.0)),
                ("DCGM_FI_DEV_SM_CLOCK", Some(1410.0)),
                ("DCGM_FI_DEV_SM_CLOCK", None),
                ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Some(123456789012.0)),
                ("DCGM_FI_DEV_POWER_USAGE", None),
                ("DCGM_FI_DEV_POWER_USAGE", Some(300.5)),
                ("DCGM_FI_DEV_POWER_USAGE", Some(301.0)),
                ("DCGM_FI_DEV_GPU_TEMP", None),
            ]
        );
        let l = &e.series[0].labels;
        assert_eq!(l["modelName"], "NVIDIA H100 80GB HBM3, rev=1");
        assert_eq!(l["pci_bus_id"], "00000000:1B:00.0");
        assert_eq!(e.series[1].labels["GPU_I_ID"], "3");
        assert_eq!(
            e.series[2].labels["UUID"], "GPU-c",
            "a space after the comma"
        );
    }
}

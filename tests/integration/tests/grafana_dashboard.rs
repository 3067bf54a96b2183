//! `packaging/grafana/comminsight.json` queries only metrics the agent exports: every PromQL
//! expression (panel targets and template variables) is tokenized, its metric names extracted and
//! each checked against the "Prometheus name" column of `docs/telemetry.md` (generated from the
//! code; a histogram family also answers to `_bucket`, `_sum` and `_count`). The dashboard also
//! keeps its datasource variable, its job and host variables and a panel for each subject (ops,
//! bus bandwidth, p99 op time, overdue ops, drops, straggler root index, agent health).
//!
//! `COMMINSIGHT_TELEMETRY_MD=FILE` checks against another table (a draft) instead.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dashboard() -> Value {
    let p = repo().join("packaging/grafana/comminsight.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", p.display()))
}

/// PromQL functions (a name followed by `(`), Prometheus 2.x and 3.x.
const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "cos",
    "cosh",
    "count_over_time",
    "days_in_month",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "deg",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log10",
    "log2",
    "mad_over_time",
    "max_over_time",
    "min_over_time",
    "minute",
    "month",
    "pi",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rad",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sin",
    "sinh",
    "sort",
    "sort_desc",
    "sort_by_label",
    "sort_by_label_desc",
    "sqrt",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
    "tan",
    "tanh",
    "time",
    "timestamp",
    "vector",
    "year",
    // Aggregation operators.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    // Grafana's template queries.
    "label_values",
    "label_names",
    "metrics",
    "query_result",
];
/// Keywords that are never metric names.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
    "start",
    "end",
];
/// Words that open a parenthesised label list, not an argument list.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names an expression selects. Panics on a function it does not know (a typo).
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let (mut i, mut out) = (0, Vec::new());
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(b, i);
        } else if c == b'{' || c == b'[' {
            i = skip_group(b, i);
        } else if c == b'$' {
            // A Grafana variable: $x, ${x}, $__rate_interval.
            i += 1;
            if b.get(i) == Some(&b'{') {
                i = skip_group(b, i);
            }
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == b'.' {
            // A number or a duration (5m, 1e3, 0x1f).
            while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let mut j = i;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            // `sum by (..) (..)`: an aggregation whose modifier comes before its argument.
            let modifier = ["by", "without"].iter().any(|m| {
                expr[j..].strip_prefix(m).is_some_and(|r| {
                    !r.starts_with(|ch: char| ch.is_ascii_alphanumeric() || ch == '_')
                })
            });
            let call = b.get(j) == Some(&b'(') || (modifier && FUNCTIONS.contains(&word));
            if LABEL_LISTS.contains(&word) {
                if call {
                    i = skip_group(b, j);
                }
            } else if word == "label_values" && call {
                // label_values([selector, ] label): the last argument is a label name.
                let end = skip_group(b, j);
                let args = &expr[j + 1..end - 1];
                if let Some(comma) = last_top_level_comma(args.as_bytes()) {
                    out.extend(metric_names(&args[..comma]));
                }
                i = end;
            } else if call {
                assert!(
                    FUNCTIONS.contains(&word),
                    "`{word}(` in `{expr}` is no PromQL function: a typo, or add it to FUNCTIONS"
                );
            } else if !KEYWORDS.contains(&word) {
                out.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

fn skip_string(b: &[u8], start: usize) -> usize {
    let q = b[start];
    let mut i = start + 1;
    while i < b.len() && b[i] != q {
        i += if b[i] == b'\\' && q != b'`' { 2 } else { 1 };
    }
    i + 1
}

/// The byte offset of the last comma outside brackets and strings.
fn last_top_level_comma(b: &[u8]) -> Option<usize> {
    let (mut i, mut depth, mut last) = (0, 0usize, None);
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => {
                i = skip_string(b, i);
                continue;
            }
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => last = Some(i),
            _ => {}
        }
        i += 1;
    }
    last
}

/// Past the bracket group opened at `start` (`{..}`, `[..]`, `(..)`), strings inside skipped.
fn skip_group(b: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => {
                i = skip_string(b, i);
                continue;
            }
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unbalanced brackets in `{}`", String::from_utf8_lossy(b));
}

/// Every PromQL expression of the dashboard: panel targets and query variables.
fn expressions(d: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = d["panels"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("a target without expr: {t}"));
            out.push(e.to_string());
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" {
            let q = v["query"]["query"].as_str().or(v["query"].as_str());
            out.push(
                q.unwrap_or_else(|| panic!("variable {} has no query", v["name"]))
                    .to_string(),
            );
        }
    }
    out
}

/// The "Prometheus name" column of every table in `docs/telemetry.md`: (name, kind).
fn exported() -> Vec<(String, String)> {
    let p = std::env::var_os("COMMINSIGHT_TELEMETRY_MD")
        .map_or_else(|| repo().join("docs/telemetry.md"), PathBuf::from);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "read {}: {e}; it lists the exported metrics (the agent's telemetry catalogue)",
            p.display()
        )
    });
    let cells = |l: &str| -> Vec<String> {
        let l = l.trim().trim_start_matches('|').trim_end_matches('|');
        l.split('|')
            .map(|c| c.trim().trim_matches('`').trim().to_string())
            .collect()
    };
    let mut out: Vec<(String, String)> = Vec::new();
    // The columns of the table being read: "Prometheus name" and "kind" (when it has one).
    let mut cols: Option<(usize, Option<usize>)> = None;
    for line in text.lines() {
        if !line.trim_start().starts_with('|') {
            cols = None;
            continue;
        }
        let c = cells(line);
        if let Some(name) = c
            .iter()
            .position(|h| h.eq_ignore_ascii_case("Prometheus name"))
        {
            cols = Some((name, c.iter().position(|h| h.eq_ignore_ascii_case("kind"))));
        } else if let Some((name, kind)) = cols {
            if c.iter().all(|x| x.chars().all(|ch| ch == '-' || ch == ':')) {
                continue;
            }
            let kind = kind.and_then(|k| c.get(k)).cloned().unwrap_or_default();
            out.push((c.get(name).cloned().unwrap_or_default(), kind));
        }
    }
    assert!(
        !out.is_empty(),
        "{}: no table with a \"Prometheus name\" column",
        p.display()
    );
    out
}

fn is_exported(m: &str, table: &[(String, String)]) -> bool {
    table.iter().any(|(n, kind)| {
        n == m
            || (kind == "histogram"
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| m.strip_suffix(s) == Some(n.as_str())))
    })
}

#[test]
fn every_query_names_an_exported_metric() {
    let table = exported();
    let d = dashboard();
    let mut used = BTreeSet::new();
    for e in expressions(&d) {
        let names = metric_names(&e);
        assert!(!names.is_empty(), "`{e}` selects no metric");
        for m in names {
            assert!(
                is_exported(&m, &table),
                "`{m}` (in `{e}`) is not in docs/telemetry.md's Prometheus name column: rename it to an exported metric"
            );
            used.insert(m);
        }
    }
    // A panel for each subject of the dashboard.
    for m in [
        "comminsight_op_duration_seconds_count",
        "comminsight_op_duration_seconds_bucket",
        "comminsight_op_bus_traffic_bytes_total",
        "comminsight_op_overdue_total",
        "comminsight_plugin_dropped_total",
        "comminsight_stream_lost_total",
        "comminsight_straggler_root_index_ratio",
        "comminsight_agent_lag_seconds",
        "comminsight_agent_memory_rss_bytes",
        "comminsight_agent_sink_errors_total",
        "comminsight_agent_logs_dropped_total",
        "comminsight_agent_archive_backlog",
    ] {
        assert!(used.contains(m), "no panel queries {m}");
    }
    let p99 = expressions(&d).into_iter().any(|e| {
        e.contains("histogram_quantile(0.99")
            && e.contains("comminsight_op_duration_seconds_bucket")
            && e.contains("le")
    });
    assert!(p99, "no p99 panel: histogram_quantile(0.99, ... by (le, ...) comminsight_op_duration_seconds_bucket)");
    println!(
        "dashboard queries {} metrics, all exported: {used:?}",
        used.len()
    );
}

#[test]
fn dashboard_uses_the_datasource_job_and_host_variables() {
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(
        ds["query"], "prometheus",
        "the datasource variable picks Prometheus datasources"
    );
    let ds_ref = format!("${{{}}}", ds["name"].as_str().unwrap());
    for name in ["job", "host"] {
        assert!(
            vars.iter().any(|v| v["name"] == name),
            "no ${name} variable"
        );
    }
    let mut stack: Vec<&Value> = d["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner);
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"],
            ds_ref.as_str(),
            "panel {} uses a fixed datasource",
            p["title"]
        );
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap_or_default();
            assert!(
                e.contains("$host"),
                "panel {}: `{e}` ignores $host",
                p["title"]
            );
        }
    }
}

#[test]
fn extractor_finds_metrics_and_skips_labels_functions_and_variables() {
    let e = r#"histogram_quantile(0.99, sum by (le, comminsight_comm_name) (rate(comminsight_op_duration_seconds_bucket{host_name=~"$host", x="a}b"}[$__rate_interval])))"#;
    assert_eq!(metric_names(e), ["comminsight_op_duration_seconds_bucket"]);
    let e = "a_total / on (host_name) group_left(job) b offset 5m > bool 0 or sum(c)";
    assert_eq!(metric_names(e), ["a_total", "b", "c"]);
    assert_eq!(
        metric_names("label_values(m{j=~\"$job\", k=\"a,b\"}, host_name)"),
        ["m"]
    );
    assert!(metric_names("label_values(host_name)").is_empty());
    let table = vec![
        ("h_seconds".to_string(), "histogram".to_string()),
        ("c_total".to_string(), "counter".to_string()),
    ];
    assert!(is_exported("h_seconds_bucket", &table) && is_exported("c_total", &table));
    assert!(!is_exported("c_total_count", &table) && !is_exported("h_seconds_total", &table));
}

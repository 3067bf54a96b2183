//! A dump's JSON form (the pickle's, converted by [`crate::pickle::Value::to_json`], or the
//! file's own) typed into an [`FrDump`].

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::{rank_from_name, FrDump, FrEntry, FrFrame, PgConfig, PgStatus};
use crate::{ImportError, Skips};

/// Versions read: 2.x.
const SUPPORTED: &str = "2.x";

/// The typed dump, and what was skipped.
pub(super) fn dump(doc: &Value, path: &Path) -> Result<(FrDump, Skips), ImportError> {
    let top = doc.as_object().ok_or_else(|| {
        ImportError::format(
            path,
            "not a Flight Recorder dump: the top level is not a dict",
        )
    })?;
    let entries = top
        .get("entries")
        .ok_or_else(|| ImportError::format(path, "not a Flight Recorder dump: no \"entries\""))?
        .as_array()
        .ok_or_else(|| {
            ImportError::format(
                path,
                "not a Flight Recorder dump: \"entries\" is not a list",
            )
        })?;
    let version = match top.get("version") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "(none)".into(),
    };
    if !version_ok(&version) {
        return Err(ImportError::Version {
            path: path.to_path_buf(),
            what: "Flight Recorder dump",
            version,
            supported: SUPPORTED,
        });
    }
    let rank = match top.get("rank") {
        Some(r) => r.as_i64(),
        None => rank_from_name(path),
    }
    .filter(|r| (0..i64::from(i32::MAX)).contains(r))
    .ok_or_else(|| {
        ImportError::format(
            path,
            "cannot tell the rank of this dump: no usable \"rank\" key (an integer below 2^31) and the file name does not end in the rank (torch names dumps <prefix><rank>)",
        )
    })?;
    let mut skips = Skips::default();
    let pg_config = pg_config(top.get("pg_config"), &mut skips);
    let pg_status = pg_status(top.get("pg_status"), &mut skips);
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        match entry(e) {
            Ok(e) => out.push(e),
            Err(why) => skips.add(why, 1),
        }
    }
    let nccl_version = match top.get("nccl_version") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    let dump = FrDump {
        path: path.to_path_buf(),
        rank,
        version,
        nccl_version,
        pg_config,
        pg_status,
        entries: out,
    };
    Ok((dump, skips))
}

/// `2.<anything>`.
fn version_ok(v: &str) -> bool {
    v.strip_prefix("2.").is_some_and(|minor| {
        !minor.is_empty() && minor.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
    })
}

fn pg_config(v: Option<&Value>, skips: &mut Skips) -> BTreeMap<String, PgConfig> {
    let mut out = BTreeMap::new();
    let Some(Value::Object(m)) = v else {
        return out;
    };
    for (key, g) in m {
        let Some(g) = g.as_object() else {
            skips.add("pg_config group that is not a dict", 1);
            continue;
        };
        let Some(ranks) = g.get("ranks").and_then(ranks) else {
            skips.add("pg_config group with unreadable ranks", 1);
            continue;
        };
        let name = match g.get("name") {
            Some(Value::String(s)) => s.clone(),
            _ => key.clone(),
        };
        let desc = str_of(g, "desc").unwrap_or_default();
        out.insert(key.clone(), PgConfig { name, desc, ranks });
    }
    out
}

/// `"[0, 1, 2]"` or `[0, 1, 2]`.
fn ranks(v: &Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(a) => a.iter().map(Value::as_i64).collect(),
        Value::String(s) => {
            let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
            if inner.is_empty() {
                return Some(Vec::new());
            }
            inner.split(',').map(|x| x.trim().parse().ok()).collect()
        }
        _ => None,
    }
}

fn pg_status(v: Option<&Value>, skips: &mut Skips) -> BTreeMap<i64, PgStatus> {
    let mut out = BTreeMap::new();
    let Some(Value::Object(m)) = v else {
        return out;
    };
    for (key, s) in m {
        let (Ok(id), Some(s)) = (key.trim().parse::<i64>(), s.as_object()) else {
            skips.add("pg_status entry unreadable", 1);
            continue;
        };
        let n = |k: &str| s.get(k).and_then(Value::as_i64).unwrap_or(-1);
        out.insert(
            id,
            PgStatus {
                last_enqueued: n("last_enqueued_collective"),
                last_started: n("last_started_collective"),
                last_completed: n("last_completed_collective"),
            },
        );
    }
    out
}

fn str_of(m: &Map<String, Value>, k: &str) -> Option<String> {
    m.get(k).and_then(Value::as_str).map(str::to_string)
}

fn shapes(v: Option<&Value>) -> Option<Vec<Vec<i64>>> {
    match v {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_array()?.iter().map(Value::as_i64).collect())
            .collect(),
        _ => None,
    }
}

fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    match v {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(|s| s.as_str().map(str::to_string)).collect(),
        _ => None,
    }
}

/// A time: absent or null is `None`; anything but a non-negative integer is an error.
fn time(v: Option<&Value>) -> Result<Option<u64>, ()> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(t) => t.as_u64().map(Some).ok_or(()),
    }
}

fn frames(v: Option<&Value>) -> Vec<FrFrame> {
    let Some(Value::Array(a)) = v else {
        return Vec::new();
    };
    a.iter()
        .filter_map(Value::as_object)
        .map(|f| FrFrame {
            name: str_of(f, "name").unwrap_or_default(),
            filename: str_of(f, "filename").unwrap_or_default(),
            line: f.get("line").and_then(Value::as_i64).unwrap_or(-1),
        })
        .collect()
}

/// One entry, or the short reason it is skipped.
fn entry(v: &Value) -> Result<FrEntry, &'static str> {
    let m = v.as_object().ok_or("entry that is not a dict")?;
    let int = |k: &str| m.get(k).and_then(Value::as_i64);
    let (pg_name, pg_desc) = match m.get("process_group").and_then(Value::as_array) {
        Some(pg) => (
            pg.first()
                .and_then(Value::as_str)
                .ok_or("entry without a process group name")?,
            pg.get(1).and_then(Value::as_str).unwrap_or(""),
        ),
        None => return Err("entry without process_group"),
    };
    Ok(FrEntry {
        record_id: int("record_id").unwrap_or(-1),
        pg_id: int("pg_id").unwrap_or(-1),
        pg_name: pg_name.to_string(),
        pg_desc: pg_desc.to_string(),
        thread_name: str_of(m, "thread_name").unwrap_or_default(),
        // A string in the dumps (`"23456244340032"`), a number in hand-made ones.
        thread_id: m
            .get("thread_id")
            .and_then(|t| t.as_u64().or_else(|| t.as_str()?.parse().ok()))
            .unwrap_or(0),
        collective_seq_id: int("collective_seq_id").ok_or("entry without collective_seq_id")?,
        p2p_seq_id: int("p2p_seq_id").unwrap_or(-1),
        op_id: int("op_id").unwrap_or(-1),
        profiling_name: str_of(m, "profiling_name").ok_or("entry without profiling_name")?,
        time_created_ns: m
            .get("time_created_ns")
            .and_then(Value::as_u64)
            .ok_or("entry without time_created_ns")?,
        input_sizes: shapes(m.get("input_sizes")).ok_or("entry with unreadable input_sizes")?,
        input_dtypes: strings(m.get("input_dtypes")).ok_or("entry with unreadable input_dtypes")?,
        output_sizes: shapes(m.get("output_sizes")).ok_or("entry with unreadable output_sizes")?,
        output_dtypes: strings(m.get("output_dtypes"))
            .ok_or("entry with unreadable output_dtypes")?,
        state: str_of(m, "state").ok_or("entry without state")?,
        time_started_ns: time(m.get("time_discovered_started_ns"))
            .map_err(|()| "entry with an unreadable start time")?,
        time_completed_ns: time(m.get("time_discovered_completed_ns"))
            .map_err(|()| "entry with an unreadable completion time")?,
        timeout_ms: m.get("timeout_ms").and_then(Value::as_u64).unwrap_or(0),
        is_p2p: m.get("is_p2p").and_then(Value::as_bool).unwrap_or(false),
        retired: m.get("retired").and_then(Value::as_bool).unwrap_or(false),
        frames: frames(m.get("frames")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_ranks() {
        assert!(version_ok("2.9") && version_ok("2.10") && version_ok("2.1.3"));
        assert!(!version_ok("1.5") && !version_ok("3.0") && !version_ok("2.") && !version_ok("20"));
        assert_eq!(ranks(&Value::from("[0, 1, 2]")), Some(vec![0, 1, 2]));
        assert_eq!(ranks(&Value::from("[]")), Some(vec![]));
        assert_eq!(ranks(&serde_json::json!([3, 4])), Some(vec![3, 4]));
        assert_eq!(ranks(&Value::from("all")), None);
    }
}

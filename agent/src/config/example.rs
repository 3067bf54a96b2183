//! `agent/config.example.toml`, generated from `AgentConfig::default()` and the key table.

use toml::Value;

use super::keys::{self, KEYS};
use super::AgentConfig;

/// The default configuration as a TOML tree.
pub fn defaults_value() -> toml::Table {
    match Value::try_from(AgentConfig::default()) {
        Ok(Value::Table(t)) => t,
        // AgentConfig is a struct of plain fields: it always serializes to a table.
        other => panic!("AgentConfig::default() did not serialize to a TOML table: {other:?}"),
    }
}

/// The value at a dotted path of a tree.
pub fn lookup<'a>(t: &'a toml::Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = t.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

/// Every leaf key (dotted) of a tree.
pub fn leaf_paths(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in t {
        let full = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(inner) => leaf_paths(inner, &full, out),
            _ => out.push(full),
        }
    }
}

/// The text of `agent/config.example.toml`: every key with its documentation, its environment
/// variable and its default value (uncommented, so the file parses back to the defaults).
pub fn example_toml() -> String {
    let defaults = defaults_value();
    let mut out = String::new();
    out.push_str(
        "# CommInsight agent configuration: every key with its default.\n\
         # GENERATED from AgentConfig::default(); do not edit. Regenerate with\n\
         #   cargo run -p comminsight-agent -- config example > agent/config.example.toml\n\
         # or COMMINSIGHT_BLESS=1 cargo test -p comminsight-agent --test config_example\n\
         #\n\
         # Install as /etc/comminsight/agent.toml (the default path; absent = all defaults; --config FILE\n\
         # or COMMINSIGHT_CONFIG=FILE name another) and keep only the keys you change. Drop-ins\n\
         # <dir of that file>/conf.d/*.toml (/etc/comminsight/conf.d/) are merged over it in lexical\n\
         # order, table by table (a list is replaced whole). Each key can be overridden by the\n\
         # environment variable named above it (lists: comma-separated), which wins over every file.\n\
         # Unknown keys and bad values stop the agent with a message naming the file, the key and the\n\
         # fix; `comminsight-agent config check FILE` checks a file with its drop-ins.\n",
    );
    let mut table = "";
    for k in KEYS {
        if k.table() != table {
            table = k.table();
            out.push_str(&format!("\n[{table}]\n"));
        }
        let value = lookup(&defaults, k.path).map_or_else(|| "?".into(), render);
        out.push_str(&format!("# {}\n# env: {}\n", k.doc, k.env_name()));
        out.push_str(&format!("{} = {value}\n", k.name()));
    }
    out
}

fn render(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("[{}]", a.iter().map(render).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// Keys of the defaults that have no line in the key table, and table keys absent from the
/// defaults (both empty when the table is complete).
pub fn undocumented_keys() -> (Vec<String>, Vec<&'static str>) {
    let defaults = defaults_value();
    let mut leaves = Vec::new();
    leaf_paths(&defaults, "", &mut leaves);
    let missing_doc = leaves
        .iter()
        .filter(|l| keys::find(l).is_none())
        .cloned()
        .collect();
    let extra = KEYS
        .iter()
        .filter(|k| !leaves.iter().any(|l| l == k.path))
        .map(|k| k.path)
        .collect();
    (missing_doc, extra)
}

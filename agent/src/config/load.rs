//! Loading: the TOML file, then `COMMINSIGHT_*` environment overrides, then validation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Value;

use super::error::{ConfigError, Origin, Origins, SEE};
use super::files;
use super::keys::{self, KeyDoc, ValueKind, ENV_PREFIX};
use super::AgentConfig;

/// The configuration and the warnings found while loading it.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The validated configuration.
    pub config: AgentConfig,
    /// `COMMINSIGHT_*` variables that are neither agent keys nor plugin variables (ignored).
    pub warnings: Vec<String>,
    /// The file that was read; `None` when the default file is absent.
    pub file: Option<PathBuf>,
    /// The drop-ins merged over it (`<its dir>/conf.d/*.toml`), in order.
    pub drop_ins: Vec<PathBuf>,
}

impl AgentConfig {
    /// Load the configuration: the TOML file at `path` (else `$COMMINSIGHT_CONFIG` in `env`, else
    /// [`super::DEFAULT_PATH`], where a missing file means all defaults; a missing named file is an
    /// error), then its drop-ins `<dir>/conf.d/*.toml` merged in lexical order, then the
    /// `COMMINSIGHT_*` overrides in `env`, then validation. Warnings (unknown `COMMINSIGHT_*` variables) are logged; use
    /// [`load_with_warnings`] to get them.
    pub fn load(path: Option<&Path>, env: &[(String, String)]) -> Result<AgentConfig, ConfigError> {
        let loaded = load_with_warnings(path, env)?;
        for w in &loaded.warnings {
            tracing::warn!("{w}");
        }
        Ok(loaded.config)
    }
}

/// Check one file on its own (no environment overrides): what `comminsight-agent config check FILE` reports.
pub fn check(path: &Path) -> Result<AgentConfig, ConfigError> {
    load_with_warnings(Some(path), &[]).map(|l| l.config)
}

/// The process environment's `COMMINSIGHT_*` variables (others are irrelevant to the agent).
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect()
}

/// [`AgentConfig::load`], returning the warnings too.
pub fn load_with_warnings(
    path: Option<&Path>,
    env: &[(String, String)],
) -> Result<Loaded, ConfigError> {
    let (main, named) = files::main_file(path, env);
    let mut parsed = Vec::new();
    let file = match read_file(&main, named)? {
        Some(t) => {
            parsed.push((main.clone(), t));
            Some(main.clone())
        }
        None => None,
    };
    let drop_ins = files::drop_ins(&main)?;
    for d in &drop_ins {
        let t = read_file(d, true)?.unwrap_or_default();
        parsed.push((d.clone(), t));
    }
    let mut loaded = load_tree(parsed, file, env)?;
    loaded.drop_ins = drop_ins;
    Ok(loaded)
}

/// The defaults plus the `COMMINSIGHT_*` overrides in `env`, no file (an offline command run by a
/// user who cannot read the site's file).
pub fn load_env_only(env: &[(String, String)]) -> Result<Loaded, ConfigError> {
    load_tree(Vec::new(), None, env)
}

/// `parsed`: each file's table, in merge order (each checked on its own, so an error names its
/// file); `file`: the main file, if one was read.
fn load_tree(
    parsed: Vec<(PathBuf, toml::Table)>,
    file: Option<PathBuf>,
    env: &[(String, String)],
) -> Result<Loaded, ConfigError> {
    let mut origins = Origins {
        map: HashMap::new(),
        file: file.clone(),
    };
    let mut tree = toml::Table::new();
    for (path, t) in parsed {
        check_table(&t, "", &path, &mut origins)?;
        files::merge(&mut tree, t);
    }
    let warnings = apply_env(&mut tree, env, &mut origins)?;
    let config =
        AgentConfig::deserialize(Value::Table(tree)).map_err(|e| ConfigError::BadValue {
            origin: file
                .as_deref()
                .map_or_else(|| "environment".into(), |f| f.display().to_string()),
            key: String::new(),
            message: format!("{}; {SEE}", one_line(e.message())),
        })?;
    super::validate::validate(&config, &origins)?;
    Ok(Loaded {
        config,
        warnings,
        file,
        drop_ins: Vec::new(),
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One file's table; `Ok(None)` when a file not `named` is absent.
fn read_file(p: &Path, named: bool) -> Result<Option<toml::Table>, ConfigError> {
    let text = match files::read_checked(p) {
        Ok(t) => t,
        Err(ConfigError::Read { source, .. })
            if !named && source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let p = p.to_path_buf();
    match text.parse::<toml::Table>() {
        Ok(t) => Ok(Some(t)),
        Err(e) => {
            let offset = e.span().map_or(0, |s| s.start).min(text.len());
            let before = &text[..offset];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Err(ConfigError::Syntax {
                path: p,
                line,
                column,
                message: one_line(e.message()),
            })
        }
    }
}

/// Check every key of a file table against the key table (names and types).
fn check_table(
    t: &toml::Table,
    prefix: &str,
    file: &Path,
    origins: &mut Origins,
) -> Result<(), ConfigError> {
    for (k, v) in t {
        let full = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(doc) = keys::find(&full) {
            check_file_value(doc, v, file)?;
            origins
                .map
                .insert(doc.path, Origin::File(file.to_path_buf()));
        } else if keys::is_table(&full) {
            match v {
                Value::Table(inner) => check_table(inner, &full, file, origins)?,
                other => {
                    return Err(ConfigError::BadValue {
                        origin: format!("{}: `{full}` = {other}", file.display()),
                        key: full.clone(),
                        message: format!(
                            "`{full}` is a table: write its keys under a [{full}] header; {SEE}"
                        ),
                    })
                }
            }
        } else {
            let hint = keys::closest(&full, keys::all_paths())
                .map(|c| format!(" (did you mean `{c}`?)"))
                .unwrap_or_default();
            return Err(ConfigError::UnknownKey {
                origin: file.display().to_string(),
                key: full,
                hint,
            });
        }
    }
    Ok(())
}

fn check_file_value(doc: &KeyDoc, v: &Value, file: &Path) -> Result<(), ConfigError> {
    let ok = match (doc.kind, v) {
        (ValueKind::Bool, Value::Boolean(_)) => true,
        (ValueKind::Int { min, max }, Value::Integer(i)) => (min..=max).contains(i),
        (ValueKind::Float { min, max }, Value::Integer(i)) => (min..=max).contains(&(*i as f64)),
        (ValueKind::Float { min, max }, Value::Float(f)) => (min..=max).contains(f),
        (ValueKind::Str | ValueKind::Path, Value::String(_)) => true,
        (ValueKind::OneOf(names), Value::String(s)) => names.contains(&s.as_str()),
        (ValueKind::PathList | ValueKind::StrList, Value::Array(a)) => a.iter().all(Value::is_str),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(ConfigError::BadValue {
        origin: format!("{}: `{}` = {v}", file.display(), doc.path),
        key: doc.path.into(),
        message: format!("{}; {SEE}", doc.expected()),
    })
}

/// Parse one environment value into the key's TOML type.
fn parse_env(doc: &KeyDoc, var: &str, raw: &str) -> Result<Value, ConfigError> {
    let bad = || ConfigError::BadValue {
        origin: format!("{var}={raw}"),
        key: doc.path.into(),
        message: format!("{} (`{}`)", doc.expected(), doc.path),
    };
    let t = raw.trim();
    Ok(match doc.kind {
        ValueKind::Bool => match t.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Value::Boolean(true),
            "false" | "0" | "no" | "off" => Value::Boolean(false),
            _ => return Err(bad()),
        },
        ValueKind::Int { min, max } => match t.parse::<i64>() {
            Ok(i) if (min..=max).contains(&i) => Value::Integer(i),
            _ => return Err(bad()),
        },
        ValueKind::Float { min, max } => match t.parse::<f64>() {
            Ok(f) if (min..=max).contains(&f) => Value::Float(f),
            _ => return Err(bad()),
        },
        ValueKind::Str | ValueKind::Path => Value::String(raw.to_string()),
        ValueKind::OneOf(names) => match names.iter().find(|n| **n == t) {
            Some(n) => Value::String((*n).to_string()),
            None => return Err(bad()),
        },
        ValueKind::PathList | ValueKind::StrList => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.into()))
                .collect(),
        ),
    })
}

/// Overlay the environment; return warnings for unknown `COMMINSIGHT_*` variables.
fn apply_env(
    tree: &mut toml::Table,
    env: &[(String, String)],
    origins: &mut Origins,
) -> Result<Vec<String>, ConfigError> {
    let names: Vec<(String, &'static KeyDoc)> =
        keys::KEYS.iter().map(|k| (k.env_name(), k)).collect();
    let mut warnings = Vec::new();
    for (var, raw) in env {
        if !var.starts_with(ENV_PREFIX) || var == files::CONFIG_ENV {
            continue;
        }
        let Some((_, doc)) = names.iter().find(|(n, _)| n == var) else {
            if !keys::is_foreign_var(var) {
                let hint = keys::closest(var, names.iter().map(|(n, _)| n.as_str()))
                    .map(|c| format!(" (did you mean {c}?)"))
                    .unwrap_or_default();
                warnings.push(format!(
                    "{var}: not an agent setting nor a plugin variable, ignored{hint}; the agent's variables are COMMINSIGHT_<SECTION>_<KEY> (see agent/config.example.toml)"
                ));
            }
            continue;
        };
        let value = parse_env(doc, var, raw)?;
        set_path(tree, doc.path, value);
        origins.map.insert(
            doc.path,
            Origin::Env {
                var: var.clone(),
                raw: raw.clone(),
            },
        );
    }
    Ok(warnings)
}

fn set_path(tree: &mut toml::Table, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or(path);
    let mut t = tree;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(toml::Table::new());
        }
        let Value::Table(inner) = entry else {
            unreachable!("just made a table")
        };
        t = inner;
    }
    t.insert(last.to_string(), value);
}

//! What the offline subcommands share: `--config` (the site's analysis settings), template
//! loading, `--ranks` / `--steps` parsing.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use crate::config::DEFAULT_PATH;
use crate::offline::{Settings, Skipped};
use crate::steps::template::TemplateSet;

/// `--config FILE` of an offline command.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArg {
    /// Configuration file whose [steps], [hang] and [straggler] settings the analysis uses, as
    /// the daemon does (default: /etc/comminsight/agent.toml when this user can read it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The analyses' settings: `config` (else the site's file when readable, else the defaults),
/// the `COMMINSIGHT_*` environment, and `templates` instead of `[steps] templates_dir` when given.
pub fn settings(config: &ConfigArg, templates: Option<&Path>) -> anyhow::Result<Settings> {
    let env = crate::config::process_env();
    let loaded = match config.config.as_deref() {
        Some(p) => crate::config::load_with_warnings(Some(p), &env)?,
        None if std::fs::File::open(DEFAULT_PATH).is_ok() => {
            crate::config::load_with_warnings(Some(Path::new(DEFAULT_PATH)), &env)?
        }
        None => crate::config::load_env_only(&env)?,
    };
    for w in &loaded.warnings {
        eprintln!("comminsight-agent: warning: {w}");
    }
    let mut s = Settings::from_config(&loaded.config).map_err(|e| {
        anyhow::anyhow!(
            "{e}; fix it or leave [steps] templates_dir empty for the built-in templates"
        )
    })?;
    if let Some(dir) = templates {
        s.templates = TemplateSet::load_dir(dir)?;
    }
    Ok(s)
}

/// `"0,3,8-11"` -> the ranks.
pub fn parse_ranks(s: &str) -> Result<Vec<RangeInclusive<i64>>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let p = p.trim();
            let (a, b) = p.split_once('-').unwrap_or((p, p));
            match (a.trim().parse::<i64>(), b.trim().parse::<i64>()) {
                (Ok(a), Ok(b)) if a <= b => Ok(a..=b),
                _ => Err(format!(
                    "--ranks {s:?}: {p:?} is not a rank or a range like 8-11"
                )),
            }
        })
        .collect()
}

/// `"a..b"` (both included) or `"a"` -> the steps.
pub fn parse_steps(s: &str) -> Result<RangeInclusive<u64>, String> {
    let (a, b) = s.split_once("..").unwrap_or((s, s));
    match (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => Ok(a..=b),
        _ => Err(format!(
            "--steps {s:?}: use a..b (both included) or one step number"
        )),
    }
}

/// `--ranks` as a list of ranges (`None` when absent).
pub fn ranks_arg(s: Option<&str>) -> anyhow::Result<Option<Vec<RangeInclusive<i64>>>> {
    s.map(parse_ranks).transpose().map_err(anyhow::Error::msg)
}

/// `--steps` as `(first, last)` (`None` when absent).
pub fn steps_arg(s: Option<&str>) -> anyhow::Result<Option<(u64, u64)>> {
    Ok(s.map(parse_steps)
        .transpose()
        .map_err(anyhow::Error::msg)?
        .map(|r| (*r.start(), *r.end())))
}

/// The input of an offline command, with a progress bar named after the command (drawn only
/// when standard error is a terminal).
pub fn open_input(dir: &Path, command: &'static str) -> anyhow::Result<crate::offline::Input> {
    let mut input = crate::offline::Input::open(dir)?;
    input.show_progress(command);
    Ok(input)
}

/// The line an offline command ends with on standard error when input was skipped.
pub fn report_skipped(s: &Skipped) {
    if let Some(line) = s.line() {
        eprintln!("comminsight-agent: {line}");
    }
}

/// `v` (a JSON object) with the `skipped` counts added.
pub fn with_skipped(mut v: serde_json::Value, s: &Skipped) -> serde_json::Value {
    if let Some(m) = v.as_object_mut() {
        m.insert(
            "skipped".into(),
            serde_json::to_value(s).unwrap_or_default(),
        );
    }
    v
}

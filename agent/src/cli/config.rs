//! `comminsight-agent config example | check FILE`.

use super::{exit, ConfigArgs, ConfigCommand};
use crate::config::{example_toml, load_with_warnings, process_env};

pub fn run(a: &ConfigArgs) -> anyhow::Result<u8> {
    match &a.command {
        ConfigCommand::Example { json } => {
            if *json {
                println!(
                    "{}",
                    serde_json::to_string(&crate::config::AgentConfig::default())?
                );
            } else {
                print!("{}", example_toml());
            }
            Ok(exit::OK)
        }
        ConfigCommand::Check { file, json } => {
            let env = process_env();
            let loaded = load_with_warnings(Some(file), &env)?;
            // The same checks `run` makes before it serves or joins the link.
            crate::master::preflight(&loaded.config.master, &loaded.config.agent.state_dir)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            if *json {
                println!("{}", serde_json::to_string(&loaded.config)?);
            } else {
                let names: Vec<String> = loaded
                    .drop_ins
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect();
                if names.is_empty() {
                    println!("{}: ok", file.display());
                } else {
                    println!("{}: ok (with {})", file.display(), names.join(", "));
                }
            }
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            Ok(exit::OK)
        }
    }
}

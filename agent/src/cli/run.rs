//! `comminsight-agent run`: the host daemon.

use anyhow::Context;

use super::{exit, load_config, RunArgs};

pub fn run(a: &RunArgs) -> anyhow::Result<u8> {
    let cfg = load_config(a.config.as_deref())?;
    crate::cli::init_tracing(
        &cfg.log.level,
        if a.json { "json" } else { &cfg.log.format },
    )?;
    crate::pipeline::run(cfg, None).context("the agent stopped with an error")?;
    Ok(exit::OK)
}

//! `comminsight-agent generate man --out DIR | completions SHELL` (hidden): the man pages and the
//! shell completions, generated from this very CLI definition so they never drift from `--help`.
//! `cargo xtask dist` runs it on the binary it packages.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{CommandFactory, Subcommand};

use super::{exit, Cli};

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(subcommand)]
    pub what: Generate,
}

#[derive(Debug, Subcommand)]
pub enum Generate {
    /// Man pages: comminsight-agent.1 and comminsight-agent-<command>.1 for each command.
    Man {
        /// Directory the pages are written to (created when missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// The completion script for SHELL on standard output.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<u8> {
    match &a.what {
        Generate::Man { out } => man_pages(out)?,
        Generate::Completions { shell } => {
            let mut cmd = Cli::command();
            let mut buf = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "comminsight-agent", &mut buf);
            std::io::stdout().lock().write_all(&buf)?;
        }
    }
    Ok(exit::OK)
}

/// One page per visible command, dated with the build date (reproducible with SOURCE_DATE_EPOCH).
fn man_pages(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("--out {}: cannot create the directory", out.display()))?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut todo = vec![cmd];
    while let Some(c) = todo.pop() {
        todo.extend(c.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        let page = clap_mangen::Man::new(c)
            .date(&env!("COMMINSIGHT_BUILD_DATE")[..10])
            .manual("CommInsight");
        let path = out.join(page.get_filename());
        let mut text = Vec::new();
        page.render(&mut text)?;
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write {}; check --out", path.display()))?;
    }
    Ok(())
}

//! The command line: `Cli`, the subcommands, and the exit-code mapping. Each subcommand is one
//! library call plus rendering.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod dump;
mod encode;

/// CommInsight: communication-centric observability and diagnosis for GPU/NPU training jobs.
#[derive(Debug, Parser)]
#[command(name = "comminsight-agent", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the records of a segment file or of every segment under a directory.
    Dump(DumpArgs),
    /// Turn JSON lines (as printed by `dump --json`) back into a binary segment file.
    Encode(EncodeArgs),
}

#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// A segment file (seg-*.cis), a process directory, or any directory above segments
    /// (e.g. a job's inspector_logs or a test-bed output directory).
    pub path: PathBuf,
    /// One JSON object per line (field names as in DESIGN.md §4).
    #[arg(long)]
    pub json: bool,
    /// Print a per-process / per-communicator summary instead of the records.
    #[arg(long)]
    pub summary: bool,
    /// Only these kinds (comma-separated: coll,p2p,overdue,comm_init,...).
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct EncodeArgs {
    /// JSON-lines input ("-" for standard input).
    pub input: PathBuf,
    /// Binary output file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Exit codes shared by every subcommand.
pub mod exit {
    pub const OK: u8 = 0;
    pub const FINDING: u8 = 1;
    pub const INPUT: u8 = 2;
}

/// Run one command and map its outcome to the exit code.
pub fn dispatch(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Dump(a) => dump::run(&a),
        Command::Encode(a) => encode::run(&a),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("comminsight-agent: {e:#}");
            ExitCode::from(exit::INPUT)
        }
    }
}

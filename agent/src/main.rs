//! `comminsight-agent`: parse, dispatch, exit 0 (ok) / 1 (finding) / 2 (usage or input error).

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = comminsight_agent::cli::Cli::parse();
    comminsight_agent::cli::pipe::run_quiet_on_broken_pipe(|| comminsight_agent::cli::dispatch(cli))
}

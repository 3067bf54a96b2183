//! `comminsight-testbed`: parse, run, render, exit 0 (as expected) / 1 (run failed) / 2 (usage).

use std::process::ExitCode;

use clap::Parser;
use comminsight_testbed::cli::{self, Cli, Command, InputError};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Run(args) = cli.command;
    match cli::run(&args) {
        Ok(summary) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&summary).expect("summary json")
                );
            } else {
                print!("{}", summary.render());
            }
            if summary.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("comminsight-testbed: {e:#}");
            if e.downcast_ref::<InputError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

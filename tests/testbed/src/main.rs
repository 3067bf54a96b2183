//! `comminsight-testbed`: parse, run, render, exit 0 (as expected) / 1 (run failed) / 2 (usage).
//! `eval hang` / `eval straggler` exit 0 when their targets are met, 1 when one is missed, 2 when it cannot run.

use std::process::ExitCode;

use clap::Parser;
use comminsight_testbed::cli::{self, Cli, Command, InputError, RunArgs};
use comminsight_testbed::eval::{self, CaseKind, EvalCommand, EvalHangArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(&args),
        Command::Eval(EvalCommand::Hang(args)) => eval_hang(&args),
        Command::Eval(EvalCommand::Straggler(args)) => eval_straggler(&args),
    }
}

fn run(args: &RunArgs) -> ExitCode {
    match cli::run(args) {
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

fn eval_hang(args: &EvalHangArgs) -> ExitCode {
    let progress = |done: usize, total: usize, r: &eval::CaseResult| {
        let c = &r.case;
        let what = match (&r.error, c.kind) {
            (Some(e), _) => format!("ERROR {e}"),
            (None, CaseKind::Healthy) if r.score.false_alarm => "FALSE ALARM".into(),
            (None, CaseKind::Healthy) => format!("quiet ({} resolved)", r.score.transient_alarms),
            (None, _) if r.score.hit => "hit".into(),
            (None, _) => format!(
                "MISS (top-1 {:?}, truth {:?})",
                r.score.top1, r.truth_culprits
            ),
        };
        eprintln!(
            "[{done}/{total}] #{} {} {} {} ranks {} ({:.1} s): {what}",
            c.index,
            c.kind.name(),
            c.scenario,
            c.ranks,
            c.faults.join(" "),
            r.wall_s
        );
    };
    match eval::run_hang(args, &progress) {
        Ok(report) => {
            print!("{}", report.render(&args.out));
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("comminsight-testbed: {e}");
            ExitCode::from(2)
        }
    }
}

fn eval_straggler(args: &eval::straggler::EvalStragglerArgs) -> ExitCode {
    let progress = |done: usize, total: usize, r: &eval::straggler::StragglerResult| {
        eprintln!("[{done}/{total}] {}", r.line());
    };
    match eval::straggler::run(args, &progress) {
        Ok(report) => {
            print!("{}", report.render(&args.out));
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("comminsight-testbed: {e}");
            ExitCode::from(2)
        }
    }
}

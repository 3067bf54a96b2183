//! Steps rebuilt offline (`steps`, `replay`, and the first half of `straggler`, `report`,
//! `trace`): pass 1 gathers every communicator's membership and traffic, each job's template is
//! chosen from the whole input's roles ([`decisions`]), then pass 2 streams each process's
//! records through the daemon's step engine with those choices, one process at a time (memory:
//! one reorder window and one open step at a time).

use std::collections::BTreeMap;
use std::path::Path;

use super::{Input, OfflineError, Settings};
use crate::engine::{Builtins, Engine, Output};
use crate::roles::TopologyCollector;
use crate::sinks::step_journal::StepJournal;
use crate::steps::engine::{Decision, JobInfo};
use crate::steps::template::TemplateSet;

/// Each job's template choice from the whole input's roles.
pub fn decisions(
    topology: &TopologyCollector,
    templates: &TemplateSet,
) -> BTreeMap<String, Decision> {
    topology
        .jobs()
        .iter()
        .map(|(job, obs)| {
            let roles = crate::roles::infer(job, obs);
            (job.clone(), Decision::of_job(&roles, obs, templates))
        })
        .collect()
}

/// Pass 1: membership and traffic of every communicator (nothing else is kept).
pub fn topology(input: &Input) -> TopologyCollector {
    let mut engine = Engine::new(Builtins {
        topology: true,
        ..Builtins::default()
    });
    input.run(&mut engine, &mut [], &mut |_| {});
    engine.take_topology()
}

/// The engine of pass 2: the step engine with `settings` and each job's template decided
/// (`decisions`), and the straggler arrivals when `arrivals`.
pub fn step_engine(
    settings: &Settings,
    decisions: BTreeMap<String, Decision>,
    arrivals: bool,
) -> Engine {
    let mut engine = Engine::new(Builtins {
        arrivals,
        ..Builtins::default()
    });
    engine.enable_steps(settings.templates.clone(), settings.steps.clone());
    engine.decide(decisions);
    engine
}

/// Pass 2 into a journal: every step summary to its stream's file, then each job's header;
/// returns the headers.
pub fn rebuild_into(
    input: &Input,
    settings: &Settings,
    decisions: BTreeMap<String, Decision>,
    journal: &mut StepJournal,
) -> Result<Vec<JobInfo>, OfflineError> {
    let mut engine = step_engine(settings, decisions, false);
    let mut err: Option<std::io::Error> = None;
    input.run(&mut engine, &mut [], &mut |o| {
        if let Output::Step(done) = o {
            if let Err(e) = journal.write(&done.id, &done.summary) {
                err.get_or_insert(e);
            }
        }
    });
    let jobs = engine.step_jobs();
    let root = journal.root().to_path_buf();
    let fail = |source| OfflineError::WriteSteps {
        path: root.clone(),
        source,
    };
    if let Some(e) = err {
        return Err(fail(e));
    }
    journal.close_all().map_err(fail)?;
    journal.write_jobs(&jobs).map_err(fail)?;
    Ok(jobs)
}

/// Rebuild the steps of every job under `dir` into `out` (`<out>/<job>/<host>/<pid>.jsonl` and
/// `<out>/<job>/job.json`); returns each job's header.
pub fn rebuild(dir: &Path, settings: &Settings, out: &Path) -> Result<Vec<JobInfo>, OfflineError> {
    let input = Input::open(dir)?;
    let d = decisions(&topology(&input), &settings.templates);
    rebuild_into(&input, settings, d, &mut StepJournal::new(out))
}

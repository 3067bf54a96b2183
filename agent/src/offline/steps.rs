//! Steps rebuilt offline (`steps`, `replay`, and the first half of `straggler`, `report`,
//! `trace`): pass 1 gathers every communicator's membership and traffic, each job's template is
//! chosen from the whole input's roles ([`decisions`]), then pass 2 streams each process's
//! records through the daemon's step engine with those choices, one process at a time (memory:
//! one reorder window and one open step at a time).
//!
//! Decoded once: while pass 1 decodes the records it also keeps each stream's step-engine input
//! ([`StepInputs`], the ops exactly as the step built-in derives them), up to [`CACHED_OPS`]
//! operations in all; pass 2 feeds those streams from it and reads only the others again.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Input, OfflineError, Settings};
use crate::engine::{step_input, Analysis, Builtins, Cx, Decoded, Engine, Output};
use crate::roles::TopologyCollector;
use crate::sinks::step_journal::StepJournal;
use crate::steps::engine::{Decision, JobInfo};
use crate::steps::template::TemplateSet;
use crate::steps::StepOp;
use crate::stream::StreamId;

/// Operations pass 1 keeps for pass 2 at most (~64 MiB): inputs up to this size are decoded once.
pub const CACHED_OPS: usize = 1 << 20;

/// One batch of a stream's step-engine input: its rank (from a `proc_start`) and its ops.
type StepBatch = (Option<i64>, Vec<(StepOp, u64)>);

/// Each stream's step-engine input, batch by batch, kept by pass 1 while the total stays within
/// a budget (a stream that would pass it is not kept, nor any after it). See the module docs.
#[derive(Debug, Default)]
pub struct StepInputs {
    budget: usize,
    held: usize,
    full: bool,
    streams: BTreeMap<StreamId, Vec<StepBatch>>,
}

impl StepInputs {
    /// Keep up to `budget_ops` operations.
    pub fn new(budget_ops: usize) -> StepInputs {
        StepInputs {
            budget: budget_ops,
            ..StepInputs::default()
        }
    }

    /// The kept input of `id`, if the whole stream was kept.
    fn take(&mut self, id: &StreamId) -> Option<Vec<StepBatch>> {
        self.streams.remove(id)
    }
}

impl Analysis for StepInputs {
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], _out: &mut Vec<Output>) {
        if self.full {
            return;
        }
        let (rank, ops) = step_input(recs);
        let ops: Vec<(StepOp, u64)> = ops.collect();
        self.held += ops.len();
        if self.held > self.budget {
            // This stream is not whole: it and the rest are read again.
            self.full = true;
            self.streams.remove(cx.id);
            return;
        }
        self.streams
            .entry(cx.id.clone())
            .or_default()
            .push((rank, ops));
    }
}

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
    first_pass(input, &mut StepInputs::default())
}

/// Pass 1 of the step rebuild: the topology, and the step-engine input that fits into `keep`.
pub fn first_pass(input: &Input, keep: &mut StepInputs) -> TopologyCollector {
    let mut engine = Engine::new(Builtins {
        topology: true,
        ..Builtins::default()
    });
    input.run(&mut engine, &mut [keep], &mut |_| {});
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
/// returns the headers. The streams `kept` by pass 1 are fed from it, the others read again.
pub fn rebuild_into(
    input: &Input,
    settings: &Settings,
    decisions: BTreeMap<String, Decision>,
    kept: &mut StepInputs,
    journal: &mut StepJournal,
) -> Result<Vec<JobInfo>, OfflineError> {
    let mut engine = step_engine(settings, decisions, false);
    let mut err: Option<std::io::Error> = None;
    let mut route = |o| {
        if let Output::Step(done) = o {
            if let Err(e) = journal.write(&done.id, &done.summary) {
                err.get_or_insert(e);
            }
        }
    };
    // Streams are independent here (the templates are chosen): the kept ones first.
    let mut again = Vec::new();
    let mut out = Vec::new();
    for id in input.streams() {
        let Some(batches) = kept.take(id) else {
            again.push(id.clone());
            continue;
        };
        for (rank, ops) in batches {
            engine.apply_step_input(id, rank, ops, &mut out);
            out.drain(..).for_each(&mut route);
        }
        engine.end_stream(id, &mut [], &mut out);
        engine.release_stream(id);
        out.drain(..).for_each(&mut route);
    }
    input.run_streams(&mut again.iter(), &mut engine, &mut [], &mut route);
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
    let mut kept = StepInputs::new(CACHED_OPS);
    let d = decisions(&first_pass(&input, &mut kept), &settings.templates);
    rebuild_into(&input, settings, d, &mut kept, &mut StepJournal::new(out))
}

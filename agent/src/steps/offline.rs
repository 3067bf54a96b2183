//! Steps rebuilt offline from segments or an archive (`comminsight-agent steps`, `replay`):
//! a first pass gathers the communicators' membership and traffic (role inference), each job's
//! template is chosen from the whole input's roles, then a second pass streams each process's
//! records through the same [`StepEngine`] the daemon runs, one process at a time, into a
//! [`StepJournal`] (memory: one reorder window and one open step at a time).

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_wire::record::{Body, Record};

use super::engine::{Decision, JobInfo, StepEngine, StepSettings};
use super::journal::StepJournal;
use super::template::TemplateSet;
use crate::clock::{align, ProcessClock};
use crate::replay::{read_streams, ReplayError};
use crate::roles::TopologyCollector;
use crate::stream::StreamId;

pub use super::engine::TemplateRef;

/// Default reorder window: operations may arrive this late (µs) without changing the result.
pub use super::config::DEFAULT_SAFE_WINDOW_US as SAFE_WINDOW_US;

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

/// The first pass: membership and traffic of every communicator (nothing else is kept).
pub fn topology(input: &Path, scratch: &Path) -> Result<TopologyCollector, ReplayError> {
    let mut topo = TopologyCollector::default();
    read_streams(input, scratch, &mut |id, batch| {
        for raw in batch {
            if let Ok(rec) = Record::decode(raw) {
                topo.observe(id, &rec);
            }
        }
    })?;
    Ok(topo)
}

/// The second pass: every stream through the engine with the given choices; the summaries go to
/// `journal`, each job's header too. Returns the headers.
pub fn steps_pass(
    input: &Path,
    scratch: &Path,
    decisions: BTreeMap<String, Decision>,
    templates: &TemplateSet,
    settings: &StepSettings,
    journal: &mut StepJournal,
) -> Result<Vec<JobInfo>, ReplayError> {
    let mut engine = StepEngine::new(templates.clone(), settings.clone());
    for (job, d) in decisions {
        engine.decide(&job, d);
    }
    let mut current: Option<StreamId> = None;
    let mut clock = ProcessClock::default();
    let mut io_err: Option<std::io::Error> = None;
    let mut flush = |engine: &mut StepEngine, journal: &mut StepJournal| {
        for (id, s) in engine.take_output() {
            if let Err(e) = journal.write(&id, &s) {
                io_err.get_or_insert(e);
            }
        }
    };
    read_streams(input, scratch, &mut |id, batch| {
        if current.as_ref() != Some(id) {
            if let Some(prev) = current.take() {
                engine.end_stream(&prev);
                flush(&mut engine, journal);
                let _ = journal.close(&prev);
            }
            current = Some(id.clone());
            clock = ProcessClock::default();
        }
        // The same clock updates as the daemon's processor, record by record.
        let (mut rank, mut ops) = (None, Vec::with_capacity(batch.len()));
        for raw in batch {
            let Ok(rec) = Record::decode(raw) else {
                continue;
            };
            match &rec.body {
                Body::ProcStart(p) => {
                    rank = Some(i64::from(p.rank));
                    clock.observe(&rec);
                }
                Body::Stats(_) | Body::Coll(_) | Body::P2p(_) => clock.observe(&rec),
                _ => {}
            }
            ops.extend(StepEngine::op_of(&rec, align(&clock, None)));
        }
        engine.feed(id, rank, ops);
        flush(&mut engine, journal);
    })?;
    if let Some(prev) = current.take() {
        engine.end_stream(&prev);
        flush(&mut engine, journal);
    }
    let jobs = engine.jobs();
    let root = journal.root().to_path_buf();
    let io = |e: std::io::Error| ReplayError::Io {
        path: root.clone(),
        message: format!("cannot write the steps: {e}"),
    };
    if let Some(e) = io_err {
        return Err(io(e));
    }
    journal.close_all().map_err(io)?;
    journal.write_jobs(&jobs).map_err(io)?;
    Ok(jobs)
}

/// Rebuild the steps of every job under `input` into `out` (`<out>/<job>/<host>/<pid>.jsonl`
/// and `<out>/<job>/job.json`); returns each job's header.
pub fn rebuild(
    input: &Path,
    templates: &TemplateSet,
    settings: &StepSettings,
    out: &Path,
) -> Result<Vec<JobInfo>, ReplayError> {
    let scratch = crate::replay::scratch_dir("steps");
    let res = (|| {
        let topo = topology(input, &scratch)?;
        let d = decisions(&topo, templates);
        let mut journal = StepJournal::new(out);
        steps_pass(input, &scratch, d, templates, settings, &mut journal)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    res
}

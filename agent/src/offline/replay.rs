//! `comminsight-agent replay DIR --out OUT`: the daemon's stages run offline over segments, with
//! the same engine and the same cursors, so the results are byte-identical to what the daemon
//! wrote for the same input: `OUT/metrics.json`, `OUT/roles.json`, `OUT/streams.json` and (with
//! `[steps] enabled`) `OUT/steps/` as the daemon's `results/steps/`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{steps, Input, OfflineError, Settings};
use crate::engine::{Builtins, Engine};
use crate::sinks::step_journal::StepJournal;
use crate::sources::CursorStats;
use crate::stream::StreamId;
use crate::util::fs::write_atomic;

/// Per-stream accounting of a replay.
#[derive(Clone, Debug, Serialize)]
pub struct StreamSummary {
    pub stream: StreamId,
    pub stats: CursorStats,
}

/// What a replay read and wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ReplaySummary {
    pub streams: usize,
    pub records: u64,
    pub corrupt: u64,
    pub seconds: f64,
    pub records_per_s: f64,
    pub outputs: Vec<PathBuf>,
    pub per_stream: Vec<StreamSummary>,
    /// The metrics results (also in `OUT/metrics.json`).
    #[serde(skip)]
    pub metrics: crate::metrics::MetricsSnapshot,
    /// Communicator roles per job (also in `OUT/roles.json`).
    #[serde(skip)]
    pub roles: Vec<crate::roles::JobRoles>,
}

/// The metrics results as written online and by `replay` (byte-identical for the same input).
pub fn render_metrics(s: &crate::metrics::MetricsSnapshot) -> String {
    let mut text = serde_json::to_string_pretty(s).expect("snapshot serialises");
    text.push('\n');
    text
}

/// Replay `input` into `out`: pass 1 metrics, roles and clocks; pass 2 (with `[steps]
/// enabled`) the steps, their templates chosen from pass 1's roles.
pub fn replay(
    input: &Input,
    out: &Path,
    settings: &Settings,
) -> Result<ReplaySummary, OfflineError> {
    let write = |path: &Path, what: &'static str, bytes: &[u8]| {
        write_atomic(path, bytes).map_err(|source| OfflineError::Write {
            path: path.to_path_buf(),
            what,
            source,
        })
    };
    std::fs::create_dir_all(out).map_err(|source| OfflineError::Write {
        path: out.to_path_buf(),
        what: "the replay's results",
        source,
    })?;
    let mut engine = Engine::new(Builtins {
        metrics: Some(settings.max_series),
        topology: true,
        ..Builtins::default()
    });
    let mut kept = steps::StepInputs::new(if settings.steps_enabled {
        steps::CACHED_OPS
    } else {
        0
    });
    let pass = input.run(&mut engine, &mut [&mut kept], &mut |_| {});
    let snapshot = engine.snapshot();
    let metrics = out.join("metrics.json");
    write(
        &metrics,
        "the metrics",
        render_metrics(&snapshot).as_bytes(),
    )?;
    let roles = engine.roles();
    let roles_path = out.join("roles.json");
    write(
        &roles_path,
        "the roles",
        crate::roles::render(&roles).as_bytes(),
    )?;
    let per_stream: Vec<StreamSummary> = pass
        .per_stream
        .iter()
        .map(|(id, stats)| StreamSummary {
            stream: id.clone(),
            stats: *stats,
        })
        .collect();
    let streams_path = out.join("streams.json");
    let mut text = serde_json::to_string_pretty(&per_stream).expect("serialisable");
    text.push('\n');
    write(&streams_path, "the stream summary", text.as_bytes())?;
    let mut outputs = vec![metrics, roles_path, streams_path];
    if settings.steps_enabled {
        let dir = out.join("steps");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| OfflineError::Write {
                path: dir.clone(),
                what: "the steps",
                source,
            })?;
        }
        let decisions = steps::decisions(engine.topology(), &settings.templates);
        steps::rebuild_into(
            input,
            settings,
            decisions,
            &mut kept,
            &mut StepJournal::new(&dir),
        )?;
        outputs.push(dir);
    }
    Ok(ReplaySummary {
        streams: per_stream.len(),
        records: pass.records,
        corrupt: pass.corrupt,
        seconds: pass.seconds,
        records_per_s: if pass.seconds > 0.0 {
            pass.records as f64 / pass.seconds
        } else {
            0.0
        },
        outputs,
        per_stream,
        metrics: snapshot,
        roles,
    })
}

/// The communicator roles of every job under `input` (one topology pass).
pub fn roles(input: &Input) -> Vec<crate::roles::JobRoles> {
    crate::roles::job_roles(&steps::topology(input))
}

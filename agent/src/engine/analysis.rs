//! What an analysis sees and what it produces: [`Analysis`] (one small trait for the built-in
//! analyses and for an offline command's extras), the decoded batch it reads ([`Decoded`],
//! [`Cx`]) and the [`Output`]s it hands back, which the daemon and the offline commands route
//! to their sinks in one place each.

use comminsight_wire::record::Record;

use crate::clock::ProcessClock;
use crate::hang::Verdict;
use crate::host::windows::HostSample;
use crate::steps::fsm::StepSummary;
use crate::straggler::RankStep;
use crate::stream::{Alignment, StreamId};

/// One record of a stream, decoded, with the stream's mapping onto the job timeline right after
/// it (the process clock only; the host's offset to the master is not applied).
#[derive(Clone, Debug)]
pub struct Decoded {
    pub rec: Record,
    pub align: Alignment,
}

/// The stream a batch belongs to.
#[derive(Clone, Copy, Debug)]
pub struct Cx<'a> {
    pub id: &'a StreamId,
    /// The stream's clock after the batch.
    pub clock: &'a ProcessClock,
    /// The segment the whole batch came from, when the reader knows it (offline passes: every
    /// batch ends at a segment's end).
    pub segment: Option<u64>,
}

/// A completed step: its summary, and its arrivals for the straggler index when the arrivals
/// analysis runs (raw step number, process clock only: the host's offset and error are the
/// consumer's to add).
#[derive(Clone, Debug)]
pub struct StepDone {
    pub id: StreamId,
    pub summary: StepSummary,
    pub arrivals: Option<RankStep>,
}

/// What the engine and the daemon's live analyses hand to the sinks.
#[derive(Clone, Debug)]
pub enum Output {
    /// The first report (`repeat == 0`) of an overdue operation, with its communicator's name
    /// when the metrics know it.
    Overdue {
        id: StreamId,
        record: Record,
        comm_name: Option<String>,
    },
    /// A step was completed.
    Step(Box<StepDone>),
    /// This host's hang evidence changed (daemon): the job's snapshot (JSON) at an event, and
    /// this host's verdicts (JSON) when its view already names a source.
    HangEvidence {
        job: String,
        event: u64,
        snapshot: Vec<u8>,
        verdicts: Option<Vec<u8>>,
    },
    /// A verdict of this host's view whose source ranks are new (daemon).
    HangVerdict(Box<Verdict>),
    /// A sample of a rank process' host context (a main-thread interval, retransmits; process
    /// clock), `id` the rank's own stream: the daemon pushes it beside the step lines, so the
    /// master's straggler classes read the same windows as offline.
    HostSample { id: StreamId, sample: HostSample },
    /// One rank's row of MoE EP wait times for one window, decoded from its `ep_stats`
    /// records: the windows are assembled across the EP group from these.
    EpRow {
        id: StreamId,
        row: Box<crate::moe::EpRow>,
    },
}

/// One analysis over the record streams (see the module docs). Every call carries a stream's
/// records in that stream's order; streams interleave (online) or come one after another
/// (offline), and the same records give the same state either way.
pub trait Analysis {
    /// The stream's next records.
    fn batch(&mut self, cx: &Cx<'_>, recs: &[Decoded], out: &mut Vec<Output>);

    /// The stream ended: its process is gone, or the offline input has no more of it. More
    /// records of it may still come (a late segment); they continue it.
    fn stream_end(&mut self, _id: &StreamId, _out: &mut Vec<Output>) {}

    /// Forget the stream: gone for good (the daemon pruned it, or an offline pass is past it and
    /// keeps nothing of it).
    fn forget(&mut self, _id: &StreamId) {}
}

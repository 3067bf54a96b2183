//! The aggregator's serialized form (checkpoints): plain vectors, ids resolved by `names`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{CommInfo, JobState, Key, MetricsAggregator, SeriesValues, StreamState};
use crate::stream::StreamId;

/// One stream's state as checkpointed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StreamCheckpoint {
    id: StreamId,
    job: u32,
    comms: Vec<(u64, CommInfo)>,
    last_seq: Option<u64>,
    lost: u64,
    drops: u64,
}

/// [`MetricsAggregator`] as checkpointed (`serde(into, from)`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct AggregatorState {
    max_series: usize,
    names: Vec<String>,
    streams: Vec<StreamCheckpoint>,
    series: Vec<(Key, SeriesValues)>,
    jobs: Vec<(u32, JobState)>,
}

impl From<MetricsAggregator> for AggregatorState {
    fn from(a: MetricsAggregator) -> Self {
        let streams = a
            .streams
            .into_iter()
            .map(|(id, st)| {
                let mut comms: Vec<(u64, CommInfo)> = st.comms.into_iter().collect();
                comms.sort_by_key(|c| c.0);
                StreamCheckpoint {
                    id,
                    job: st.job,
                    comms,
                    last_seq: st.last_seq,
                    lost: st.lost,
                    drops: st.drops,
                }
            })
            .collect();
        let mut jobs: Vec<(u32, JobState)> = a.jobs.into_iter().collect();
        jobs.sort_by_key(|j| j.0);
        AggregatorState {
            max_series: a.max_series,
            names: a.names,
            streams,
            series: a.series,
            jobs,
        }
    }
}

impl From<AggregatorState> for MetricsAggregator {
    fn from(s: AggregatorState) -> Self {
        let name_ids: HashMap<String, u32> = s
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        let mut stream_ids = HashMap::new();
        let streams = s
            .streams
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                stream_ids.insert(c.id.clone(), i as u32);
                let st = StreamState {
                    job: c.job,
                    comms: c.comms.into_iter().collect(),
                    last_seq: c.last_seq,
                    lost: c.lost,
                    drops: c.drops,
                };
                (c.id, st)
            })
            .collect();
        let series_index = s
            .series
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (*k, i as u32))
            .collect();
        MetricsAggregator {
            max_series: s.max_series,
            names: s.names,
            name_ids,
            streams,
            stream_ids,
            last_stream: None,
            series_index,
            series: s.series,
            jobs: s.jobs.into_iter().collect(),
        }
    }
}

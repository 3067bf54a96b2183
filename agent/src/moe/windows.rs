//! [`MoeWindows`]: rows of every rank of an EP group assembled into windows
//! (`comminsight_ascend::window`), each whole window (summed over `[moe] aggregate_windows`)
//! analysed with the detector configured by `[moe]`, its findings kept `persistence_m` of
//! `persistence_n` windows when E2 is on; a window a rank never reported is `incomplete`. The
//! same code runs offline (`comminsight-agent moe`, times from the records) and on the job
//! master.

use std::collections::BTreeMap;

use comminsight_ascend::decode::Source;
use comminsight_ascend::detect::{detect, DetectConfig, Detection, TopologyMask};
use comminsight_ascend::persist::Persistence;
use comminsight_ascend::report::{deepxtrace_lines, EpEvent};
use comminsight_ascend::window::{Aggregator, Assembled, WindowAssembler, WindowKey};
use comminsight_ascend::WaitMatrix;
use serde::Serialize;

use super::{EpRow, MoeConfig};

/// Cycles per ms a DeepEP row is taken to count at for E1 (a 2 GHz SM clock).
const CYCLES_PER_MS: f64 = 2e6;

/// One analysed window: the event, and the matrix it was computed on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpWindow {
    pub job: String,
    pub event: EpEvent,
    /// The (aggregated) matrix and what the detector said of it; `None` for an incomplete
    /// window.
    pub matrix: Option<WaitMatrix>,
    #[serde(skip)]
    pub detection: Option<Detection>,
    pub source: Source,
}

impl EpWindow {
    /// A finding, or a window missing a rank.
    pub fn is_finding(&self) -> bool {
        !self.event.findings.is_empty() || self.event.incomplete_window.is_some()
    }

    /// DeepXTrace's log lines of this window (none for an incomplete one), with the matrix
    /// rows when `details` (its `DEEPEP_DIAGNOSE_LOG_DETAILS=1`).
    pub fn deepxtrace_lines(&self, details: bool) -> Vec<String> {
        let (Some(m), Some(d)) = (&self.matrix, &self.detection) else {
            return Vec::new();
        };
        let (y, mo, day, h, mi, se, ms) = crate::util::time::utc_parts(self.event.ts_ns);
        let time = format!("[{y:04}-{mo:02}-{day:02}T{h:02}:{mi:02}:{se:02}.{ms:03}]");
        deepxtrace_lines(
            &time,
            &self.event.instance_id,
            self.event.phase,
            d,
            m.n(),
            details.then_some(m),
        )
    }

    /// Every rank's column and row ratio to the window's mean cell (DeepXTrace's `z^col`,
    /// `z^row`: what the thresholds compare), `(columns, rows)`; `None` when incomplete.
    pub fn ratios(&self) -> Option<(Vec<f64>, Vec<f64>)> {
        let m = self.matrix.as_ref()?;
        let n = m.n();
        if n == 0 {
            return None;
        }
        let nf = n as f64;
        let mu = m.cells().iter().sum::<f64>() / (nf * nf);
        let z = |sum: f64| (sum / nf) / (mu + 1e-8);
        let cols = (0..n)
            .map(|j| z((0..n).map(|i| m.get(i, j)).sum()))
            .collect();
        let rows = (0..n).map(|i| z(m.row(i).iter().sum())).collect();
        Some((cols, rows))
    }
}

/// What a window's rows said about the group besides the matrix.
#[derive(Clone, Debug)]
struct GroupInfo {
    job: String,
    source: Source,
    hierarchical: bool,
}

/// The windows of every job. See the module docs.
pub struct MoeWindows {
    cfg: MoeConfig,
    assembler: WindowAssembler,
    aggregator: Aggregator,
    persistence: Option<Persistence>,
    groups: BTreeMap<WindowKey, GroupInfo>,
}

impl MoeWindows {
    pub fn new(cfg: &MoeConfig) -> MoeWindows {
        MoeWindows {
            assembler: WindowAssembler::new(cfg.assemble_timeout_s.saturating_mul(1_000_000_000)),
            aggregator: Aggregator::new(cfg.aggregate_windows),
            persistence: (cfg.persistence_m > 0)
                .then(|| Persistence::new(cfg.persistence_m, cfg.persistence_n)),
            groups: BTreeMap::new(),
            cfg: cfg.clone(),
        }
    }

    /// A row, seen at `now_ns` (offline: the row's window end); the windows it completed (and
    /// those the bound gave up).
    pub fn row(&mut self, r: EpRow, now_ns: u64) -> Vec<EpWindow> {
        if self.groups.len() >= WindowAssembler::MAX_PENDING * 2 {
            self.groups.pop_first();
        }
        self.groups.entry(r.key.clone()).or_insert(GroupInfo {
            job: r.job.clone(),
            source: r.source,
            hierarchical: r.hierarchical,
        });
        let done = self.assembler.insert(r.key, r.n, r.row, now_ns);
        self.finish(done)
    }

    /// The windows still missing rows at `now_ns` past the timeout, as incomplete.
    pub fn expire(&mut self, now_ns: u64) -> Vec<EpWindow> {
        let done = self.assembler.expire(now_ns);
        self.finish(done)
    }

    /// Every window still waiting, as incomplete (the end of an offline input).
    pub fn flush(&mut self) -> Vec<EpWindow> {
        self.expire(u64::MAX)
    }

    /// Rows refused (a finished window's, sizes that disagree).
    pub fn refused(&self) -> u64 {
        self.assembler.refused
    }

    fn finish(&mut self, done: Vec<Assembled>) -> Vec<EpWindow> {
        let mut out = Vec::new();
        for a in done {
            match a {
                Assembled::Complete {
                    key,
                    matrix,
                    steps,
                    t_end_ns,
                    ..
                } => {
                    let Some(g) = self.groups.remove(&key) else {
                        continue;
                    };
                    out.push(self.analyse(&key, &g, &matrix, steps, t_end_ns));
                }
                Assembled::Incomplete {
                    key,
                    n,
                    missing_rows,
                    t_end_ns,
                    ..
                } => {
                    let Some(g) = self.groups.remove(&key) else {
                        continue;
                    };
                    out.push(EpWindow {
                        job: g.job,
                        event: EpEvent::incomplete(&key, t_end_ns, n as usize, missing_rows),
                        matrix: None,
                        detection: None,
                        source: g.source,
                    });
                }
            }
        }
        out
    }

    fn analyse(
        &mut self,
        key: &WindowKey,
        g: &GroupInfo,
        m: &WaitMatrix,
        steps: u64,
        t_end_ns: u64,
    ) -> EpWindow {
        let (sum, steps) = self.aggregator.push(key, m, steps);
        let cfg = self.detect_config(g);
        let mut d = detect(&sum, &cfg, steps);
        if let Some(p) = self.persistence.as_mut() {
            p.filter(
                (key.ep_group_id, key.instance_id.clone(), key.phase),
                &mut d,
            );
        }
        EpWindow {
            job: g.job.clone(),
            event: EpEvent::of(key, t_end_ns, sum.n(), &d),
            matrix: Some(sum),
            detection: Some(d),
            source: g.source,
        }
    }

    /// The detector for a group: `[moe]`'s thresholds and extensions, zero exclusion as
    /// configured (`auto`: MC2's hierarchical layout).
    fn detect_config(&self, g: &GroupInfo) -> DetectConfig {
        let c = &self.cfg;
        let hierarchical = g.source == Source::Mc2 && g.hierarchical;
        DetectConfig {
            threshold_col: c.threshold_col,
            threshold_row: c.threshold_row,
            threshold_point: c.threshold_point,
            exclude_zeros: match c.exclude_zeros.as_str() {
                "on" => true,
                "off" => false,
                _ => hierarchical,
            },
            min_excess: (c.min_excess_ms > 0.0).then_some(match g.source {
                Source::Mc2 => c.min_excess_ms * 1000.0,
                Source::DeepepLl => c.min_excess_ms * CYCLES_PER_MS,
            }),
            path_reclassify: c.path_reclassify,
            robust_baseline: c.robust_baseline,
            topology_mask: (c.topology_mask && hierarchical)
                .then_some(TopologyMask::Hierarchical { per_server: 8 }),
        }
    }
}

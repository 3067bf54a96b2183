//! The MoE expert-parallel instruments (issue 21, spec §5.5): per EP group and phase, each
//! rank's column and row ratio of the latest analysed window (what DeepXTrace's thresholds
//! compare: a column above 3 is a slow sender, a row a slow receiver), the findings counted by
//! kind, and the matrix itself as ratios to its mean cell for groups of at most
//! [`MAX_MATRIX_N`] ranks (label cardinality). The job master (or a standalone agent) sets the
//! values; [`moe_points`] turns them into points (the instruments are in the catalogue).

use std::collections::BTreeMap;

use super::catalogue::{
    Instrument, EP_AXIS, EP_GROUP, EP_KIND, EP_PEER, EP_PHASE, EP_WAITER, HOST, JOB,
    MOE_CELL_RATIO, MOE_WAIT_RATIO, RANK,
};
use super::{Attr, Point, Value};

/// Groups whose matrix is exported cell by cell.
pub const MAX_MATRIX_N: usize = 64;
/// Groups (with their phases) exported per collection.
pub const MAX_GROUPS: usize = 256;

/// The latest window of one group and phase.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupValues {
    /// Column and row ratio per rank.
    pub cols: Vec<f64>,
    pub rows: Vec<f64>,
    /// Cell / mean cell, row-major, for N <= [`MAX_MATRIX_N`] (else empty).
    pub cells: Vec<f64>,
}

/// `(job, ep group (hex), phase)`.
pub type GroupKey = (String, String, &'static str);

/// Everything the MoE instruments export.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeValues {
    pub groups: BTreeMap<GroupKey, GroupValues>,
    /// `(group key, finding kind) -> count`.
    pub findings: BTreeMap<(GroupKey, &'static str), u64>,
}

/// The points of a MoE instrument (`None`: another instrument).
pub fn moe_points(i: &Instrument, v: &MoeValues, host: &str) -> Option<Vec<Point>> {
    if !i.name.starts_with("comminsight.moe.") {
        return None;
    }
    let base = |(job, group, phase): &GroupKey| {
        vec![
            (JOB, Attr::Str(job.clone())),
            (EP_GROUP, Attr::Str(group.clone())),
            (EP_PHASE, Attr::Str((*phase).to_owned())),
        ]
    };
    let mut out = Vec::new();
    let groups = v.groups.iter().take(MAX_GROUPS);
    match i.name {
        n if n == MOE_WAIT_RATIO.name => {
            for (k, g) in groups {
                for (axis, vals) in [("col", &g.cols), ("row", &g.rows)] {
                    for (r, x) in vals.iter().enumerate() {
                        let mut attrs = base(k);
                        attrs.push((EP_AXIS, Attr::Str(axis.into())));
                        attrs.push((RANK, Attr::Int(r as i64)));
                        attrs.push((HOST, Attr::Str(host.to_owned())));
                        out.push(Point {
                            attrs,
                            value: Value::Real(*x),
                        });
                    }
                }
            }
        }
        n if n == MOE_CELL_RATIO.name => {
            for (k, g) in groups {
                let n = g.cols.len();
                for (c, x) in g.cells.iter().enumerate().take(n * n) {
                    let mut attrs = base(k);
                    attrs.push((EP_WAITER, Attr::Int((c / n) as i64)));
                    attrs.push((EP_PEER, Attr::Int((c % n) as i64)));
                    attrs.push((HOST, Attr::Str(host.to_owned())));
                    out.push(Point {
                        attrs,
                        value: Value::Real(*x),
                    });
                }
            }
        }
        _ => {
            for ((k, kind), count) in v.findings.iter().take(MAX_GROUPS * 4) {
                let mut attrs = base(k);
                attrs.push((EP_KIND, Attr::Str((*kind).to_owned())));
                attrs.push((HOST, Attr::Str(host.to_owned())));
                out.push(Point {
                    attrs,
                    value: Value::Count(*count),
                });
            }
        }
    }
    Some(out)
}

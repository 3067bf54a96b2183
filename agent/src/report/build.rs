//! The pure part: the analyses' results -> [`ReportModel`] (no I/O; unit-tested with
//! hand-made inputs).

use std::collections::{BTreeMap, BTreeSet};

use super::labels::{class_str, host_cpu_text, host_gpu_text, host_links_text, host_tcp_text};
use super::layout;
use super::model::{
    tenths, HangView, RankDetail, RankOps, RankStacks, ReportModel, StepStat, Summary, Tenths,
    TopStraggler, TraceLink, VerdictView, MODEL_VERSION,
};
use crate::hang::model::{HangReport, Verdict};
use crate::roles::JobRoles;
use crate::stacks::{ProcState, ProcessStacks};
use crate::straggler::{RankSummary, StragglerReport};

/// Ranks, chain links and stacks listed at most per verdict.
pub const MAX_LISTED: usize = 64;
/// Processes whose stacks a verdict shows at most.
const MAX_STACKS: usize = 16;
/// Ranks named in a trace command's `--ranks` at most.
const MAX_TRACE_RANKS: usize = 16;
/// Up to this world size the trace commands keep every rank.
const ALL_RANKS_UP_TO: u32 = 64;

/// Everything [`build`] needs about one job.
#[derive(Debug)]
pub struct Inputs {
    /// The input directory as the user gave it.
    pub source: String,
    pub straggler: StragglerReport,
    pub roles: Option<JobRoles>,
    /// Host of each global rank.
    pub hosts: BTreeMap<i64, String>,
    /// `(rank, step, duration_us)` of every step summary.
    pub durations: Vec<(i64, u64, u64)>,
    pub template: Option<String>,
    pub calibrated: bool,
    /// Verdicts and stalls of this job only.
    pub hang: Option<HangReport>,
    pub ops: Vec<RankOps>,
    pub ops_note: String,
    /// Function names the op rows index.
    pub funcs: Vec<String>,
    pub notes: Vec<String>,
    /// The job's MoE EP windows (`comminsight-agent moe`'s).
    pub ep_windows: Vec<crate::moe::windows::EpWindow>,
}

impl Inputs {
    /// The inputs of a job with only its straggler report (the rest empty).
    pub fn new(source: String, straggler: StragglerReport) -> Inputs {
        Inputs {
            source,
            straggler,
            roles: None,
            hosts: BTreeMap::new(),
            durations: Vec::new(),
            template: None,
            calibrated: false,
            hang: None,
            ops: Vec::new(),
            ops_note: String::new(),
            funcs: Vec::new(),
            notes: Vec::new(),
            ep_windows: Vec::new(),
        }
    }
}

fn top_of(r: &RankSummary) -> TopStraggler {
    TopStraggler {
        rank: r.rank,
        host: r.host.clone(),
        index: r.index,
        root_index: r.root_index,
        saves_pct: r.saves_pct,
        chain: r.chain.clone(),
        class: class_str(r.class).into(),
        reason: r.class_reason.clone(),
    }
}

/// `q`-quantile (0..=1) of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `[0, 1, 2, 5, 7, 8]` -> `"0-2,5,7-8"`.
pub fn rank_list(ranks: &[i64]) -> String {
    let mut v: Vec<i64> = ranks.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// `s` quoted for a POSIX shell when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The `trace` command for steps `first..=last` and `ranks` (`None`: all).
pub fn trace_command(
    source: &str,
    job: &str,
    first: u64,
    last: u64,
    ranks: Option<&str>,
) -> String {
    let name: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut cmd = format!(
        "comminsight-agent trace {} --job {} --steps {first}..{last}",
        shell_quote(source),
        shell_quote(job)
    );
    if let Some(r) = ranks {
        cmd.push_str(&format!(" --ranks {r}"));
    }
    cmd.push_str(&format!(" -o {name}-steps-{first}-{last}.pftrace"));
    cmd
}

fn verdict_view(v: &Verdict) -> VerdictView {
    let sources: BTreeSet<i64> = v.source_ranks.iter().copied().collect();
    let mut stacks = Vec::new();
    let ev = &v.evidence;
    let state_of = |rank: i64| -> Option<ProcState> {
        ev.get("procs")
            .and_then(|p| p.get(rank.to_string()))
            .and_then(|p| serde_json::from_value(p.clone()).ok())
    };
    if let Some(src) = ev.get("sources").and_then(|s| s.as_array()) {
        for s in src {
            let rank = s
                .get("rank")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(-1);
            let st: Option<ProcessStacks> = s
                .get("stacks")
                .and_then(|x| serde_json::from_value(x.clone()).ok());
            if let Some(st) = st {
                let proc_state = s
                    .get("proc_state")
                    .and_then(|x| serde_json::from_value(x.clone()).ok());
                stacks.push(RankStacks {
                    rank,
                    source: true,
                    proc_state,
                    stacks: st,
                });
            }
        }
    }
    if let Some(map) = ev.get("stacks").and_then(|s| s.as_object()) {
        for (rank, st) in map {
            let Ok(rank) = rank.parse::<i64>() else {
                continue;
            };
            if stacks.iter().any(|s| s.rank == rank) {
                continue;
            }
            if let Ok(st) = serde_json::from_value::<ProcessStacks>(st.clone()) {
                stacks.push(RankStacks {
                    rank,
                    source: sources.contains(&rank),
                    proc_state: state_of(rank),
                    stacks: st,
                });
            }
        }
    }
    stacks.truncate(MAX_STACKS);
    VerdictView {
        kind: v.kind,
        source_ranks: v.source_ranks.iter().take(MAX_LISTED).copied().collect(),
        comm: v.comm.clone(),
        func: v.func.clone(),
        seq: v.seq,
        entered: v.entered_ranks.len(),
        absent: v.absent_ranks.len(),
        absent_ranks: v.absent_ranks.iter().take(MAX_LISTED).copied().collect(),
        chain: v.chain.iter().take(MAX_LISTED).cloned().collect(),
        chain_dropped: v.chain.len().saturating_sub(MAX_LISTED),
        since_us: v.since_us,
        stacks,
    }
}

fn peer_rows(p: &[crate::straggler::PeerWait]) -> Vec<[i64; 3]> {
    p.iter()
        .map(|w| [w.rank, w.wait_us as i64, w.steps as i64])
        .collect()
}

/// Every rank any input knows of, ascending.
fn all_ranks(inp: &Inputs) -> Vec<i64> {
    let mut rank_set: BTreeSet<i64> = inp.straggler.ranks.iter().map(|r| r.rank).collect();
    rank_set.extend(inp.hosts.keys().copied());
    rank_set.extend(inp.durations.iter().map(|d| d.0));
    if let Some(j) = &inp.roles {
        for c in &j.comms {
            rank_set.extend(c.members.iter().map(|m| m.1).filter(|r| *r >= 0));
        }
    }
    rank_set.into_iter().collect()
}

/// The hosts in order of first use, and the host index of each of `ranks` (`?` when unknown).
fn host_table(inp: &Inputs, ranks: &[i64]) -> (Vec<String>, Vec<u32>) {
    let mut hosts: Vec<String> = Vec::new();
    let mut host_ix: BTreeMap<String, u32> = BTreeMap::new();
    let summary_host: BTreeMap<i64, &str> = inp
        .straggler
        .ranks
        .iter()
        .map(|r| (r.rank, r.host.as_str()))
        .collect();
    let rank_host: Vec<u32> = ranks
        .iter()
        .map(|r| {
            let h = inp
                .hosts
                .get(r)
                .map(String::as_str)
                .or_else(|| summary_host.get(r).copied())
                .unwrap_or("?");
            *host_ix.entry(h.to_string()).or_insert_with(|| {
                hosts.push(h.to_string());
                (hosts.len() - 1) as u32
            })
        })
        .collect();
    (hosts, rank_host)
}

/// Per step either input knows: its duration statistics, and each rank's index in it (tenths,
/// -1 where none; `pos`: rank -> column).
fn step_tables(inp: &Inputs, pos: &BTreeMap<i64, usize>) -> (Vec<StepStat>, [Vec<Vec<Tenths>>; 2]) {
    let st = &inp.straggler;
    let mut by_step: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(_, s, d) in &inp.durations {
        by_step.entry(s).or_default().push(d);
    }
    for s in &st.steps {
        by_step.entry(s.step).or_default();
    }
    let step_of: BTreeMap<u64, &crate::straggler::StepIndex> =
        st.steps.iter().map(|s| (s.step, s)).collect();
    let mut step_stats = Vec::with_capacity(by_step.len());
    let mut step_index = Vec::with_capacity(by_step.len());
    let mut step_root = Vec::with_capacity(by_step.len());
    for (step, d) in &by_step {
        let si = step_of.get(step);
        let (min, max, mean) = if d.is_empty() {
            let m = si.map_or(0.0, |s| s.avg_step_us);
            (m as u64, m as u64, m)
        } else {
            let sum: u64 = d.iter().sum();
            (
                *d.iter().min().expect("not empty"),
                *d.iter().max().expect("not empty"),
                sum as f64 / d.len() as f64,
            )
        };
        let mut row = vec![-1; pos.len()];
        let mut root_row = vec![-1; pos.len()];
        let mut top_rank = -1;
        if let Some(si) = si {
            for ri in &si.ranks {
                if let Some(&p) = pos.get(&ri.rank) {
                    row[p] = tenths(ri.index);
                    root_row[p] = tenths(ri.root_index);
                }
            }
            // The step's ranks come highest root index first, then highest index.
            top_rank = si
                .ranks
                .first()
                .filter(|r| r.root_index > 0.0 || r.index > 0.0)
                .map_or(-1, |r| r.rank);
        }
        step_stats.push(StepStat {
            step: *step,
            min_us: min,
            mean_us: mean,
            max_us: max,
            ranks: if d.is_empty() {
                si.map_or(0, |s| s.ranks.len() as u32)
            } else {
                d.len() as u32
            },
            top_rank,
        });
        step_index.push(row);
        step_root.push(root_row);
    }
    (step_stats, [step_index, step_root])
}

/// Each rank's job index (tenths, -1 where none), and the details of the ranks with an index
/// or peers (`pos`: rank -> column).
fn rank_tables(
    st: &StragglerReport,
    pos: &BTreeMap<i64, usize>,
) -> ([Vec<Tenths>; 2], Vec<RankDetail>) {
    let mut index = vec![-1; pos.len()];
    let mut root = vec![-1; pos.len()];
    let mut details = Vec::new();
    for r in &st.ranks {
        let Some(&p) = pos.get(&r.rank) else { continue };
        index[p] = tenths(r.index);
        root[p] = tenths(r.root_index);
        if r.index > 0.0
            || r.root_index > 0.0
            || !r.top_causes.is_empty()
            || !r.top_victims.is_empty()
            || r.host_shares.is_some()
            || r.host_tcp.is_some()
            || r.host_links.is_some()
            || r.host_gpu.is_some()
        {
            details.push(RankDetail {
                pos: p as u32,
                index: r.index,
                max_index: r.max_index,
                complete_steps: r.complete_steps,
                steps_over: r.steps_over_threshold,
                root_index: r.root_index,
                root_delay: r.root_delay,
                saves_pct: r.saves_pct,
                root_steps_over: r.root_steps_over,
                chain: r.chain.clone(),
                causes: peer_rows(&r.top_causes),
                victims: peer_rows(&r.top_victims),
                class: class_str(r.class).into(),
                reason: r.class_reason.clone(),
                host_cpu: r
                    .host_shares
                    .as_ref()
                    .map(host_cpu_text)
                    .unwrap_or_default(),
                host_tcp: r.host_tcp.as_ref().map(host_tcp_text).unwrap_or_default(),
                host_links: r
                    .host_links
                    .as_ref()
                    .map(host_links_text)
                    .unwrap_or_default(),
                host_gpu: r.host_gpu.as_ref().map(host_gpu_text).unwrap_or_default(),
            });
        }
    }
    ([index, root], details)
}

/// The page's headline: step time quantiles, the top stragglers, the hang verdicts' count.
fn summary_of(st: &StragglerReport, step_stats: &[StepStat], hang: Option<&HangView>) -> Summary {
    let mut avg: Vec<f64> = step_stats.iter().map(|s| s.mean_us).collect();
    avg.sort_by(f64::total_cmp);
    Summary {
        median_step_us: quantile(&avg, 0.5),
        p95_step_us: quantile(&avg, 0.95),
        top: st
            .ranks
            .iter()
            .filter(|r| st.is_straggler(r))
            .take(5)
            .map(top_of)
            .collect(),
        // Ranks come highest root index first, then highest index.
        highest: st
            .ranks
            .first()
            .filter(|r| r.root_index > 0.0 || r.index > 0.0)
            .map(top_of),
        hang_verdicts: hang.map_or(0, |h| h.verdicts.len()),
    }
}

/// Assemble the page's model of one job.
pub fn build(inp: Inputs) -> ReportModel {
    let st = &inp.straggler;
    let ranks = all_ranks(&inp);
    let pos: BTreeMap<i64, usize> = ranks.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    let (hosts, rank_host) = host_table(&inp, &ranks);
    let grid = layout::grid_of(inp.roles.as_ref());
    let (coords, coords_guessed) = layout::coords(&ranks, inp.roles.as_ref(), grid);
    let (step_stats, [step_index, step_root_index]) = step_tables(&inp, &pos);
    let ([index, root_index], details) = rank_tables(st, &pos);
    let comms = layout::comm_infos(inp.roles.as_ref());
    let hang = inp.hang.as_ref().map(|h| HangView {
        verdicts: h.verdicts.iter().map(verdict_view).collect(),
        resolved: h.resolved.len(),
    });
    let summary = summary_of(st, &step_stats, hang.as_ref());
    let world = inp
        .roles
        .as_ref()
        .map_or(0, |j| j.world)
        .max(ranks.len() as u32);
    let traces = trace_links(&inp, &step_stats, &summary, hang.as_ref(), world);
    ReportModel {
        version: MODEL_VERSION,
        job: st.job.clone(),
        source: inp.source.clone(),
        generator: format!("comminsight-agent {}", env!("CARGO_PKG_VERSION")),
        world,
        grid,
        grid_confidence: inp.roles.as_ref().map_or(0.0, |j| j.grid_confidence),
        template: inp.template.clone(),
        calibrated: inp.calibrated,
        threshold: st.threshold,
        root_threshold: st.root_threshold,
        root_min_delay: st.root_min_delay,
        summary,
        step_stats,
        ranks,
        hosts,
        rank_host,
        coords,
        coords_guessed,
        index,
        step_index,
        root_index,
        step_root_index,
        details,
        comms,
        funcs: inp.funcs,
        ops: inp.ops,
        ops_note: inp.ops_note,
        hang,
        ep: super::ep::view(&inp.ep_windows),
        traces,
        notes: inp.notes,
    }
}

/// The trace links of a report as they are found, each step range and rank set once.
struct Links<'a> {
    inp: &'a Inputs,
    world: u32,
    out: Vec<TraceLink>,
}

impl Links<'_> {
    /// `ranks` as a `--ranks` list: `None` (all) up to [`ALL_RANKS_UP_TO`] ranks or when
    /// empty, else the first [`MAX_TRACE_RANKS`].
    fn limit(&self, mut v: Vec<i64>) -> Option<String> {
        if self.world <= ALL_RANKS_UP_TO || v.is_empty() {
            return None;
        }
        v.truncate(MAX_TRACE_RANKS);
        Some(rank_list(&v))
    }

    /// Adds a link for steps `first..=last` and `ranks` unless one with the same range and
    /// ranks exists.
    fn push(&mut self, label: String, first: u64, last: u64, ranks: Vec<i64>) {
        let ranks = self.limit(ranks);
        if self
            .out
            .iter()
            .any(|t| t.first == first && t.last == last && t.ranks == ranks)
        {
            return;
        }
        let command = trace_command(
            &self.inp.source,
            &self.inp.straggler.job,
            first,
            last,
            ranks.as_deref(),
        );
        self.out.push(TraceLink {
            label,
            first,
            last,
            ranks,
            command,
        });
    }
}

/// The step where `rank` had its highest index (the earliest on a tie), and that index.
fn peak_step(st: &StragglerReport, rank: i64) -> Option<(u64, f64)> {
    st.steps
        .iter()
        .filter_map(|s| {
            s.ranks
                .iter()
                .find(|x| x.rank == rank)
                .map(|x| (s.step, x.index))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
}

/// The interesting step ranges: the slowest steps, where the top straggler peaked, the last
/// steps before a hang.
fn trace_links(
    inp: &Inputs,
    stats: &[StepStat],
    summary: &Summary,
    hang: Option<&HangView>,
    world: u32,
) -> Vec<TraceLink> {
    let mut links = Links {
        inp,
        world,
        out: Vec::new(),
    };
    let mut slow: Vec<&StepStat> = stats.iter().collect();
    slow.sort_by(|a, b| b.max_us.cmp(&a.max_us).then(a.step.cmp(&b.step)));
    for s in slow.iter().take(2) {
        let mut rs = Vec::new();
        if s.top_rank >= 0 {
            rs.push(s.top_rank);
            if let Some(r) = inp.straggler.ranks.iter().find(|r| r.rank == s.top_rank) {
                rs.extend(r.top_victims.iter().map(|w| w.rank));
            }
        }
        links.push(
            format!(
                "slowest step {} (max {:.1} ms)",
                s.step,
                s.max_us as f64 / 1e3
            ),
            s.step,
            s.step,
            rs,
        );
    }
    if let Some(top) = summary.top.first().or(summary.highest.as_ref()) {
        if let Some(p) = inp.straggler.ranks.iter().find(|r| r.rank == top.rank) {
            if let Some((step, ix)) = peak_step(&inp.straggler, top.rank) {
                let mut rs = vec![top.rank];
                rs.extend(p.top_victims.iter().map(|w| w.rank));
                links.push(
                    format!("rank {} peaked at index {ix:.1} in step {step}", top.rank),
                    step.saturating_sub(1)
                        .max(stats.first().map_or(0, |s| s.step)),
                    step,
                    rs,
                );
            }
        }
    }
    if let (Some(h), Some(last)) = (hang, stats.last()) {
        if let Some(v) = h.verdicts.first() {
            let mut rs = v.source_ranks.clone();
            for l in &v.chain {
                rs.push(l.rank);
            }
            let first = stats.iter().rev().nth(1).map_or(last.step, |s| s.step);
            links.push(
                format!("last steps before the {:?} verdict", v.kind).to_lowercase(),
                first,
                last.step,
                rs,
            );
        }
    }
    links.out
}

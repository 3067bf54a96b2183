//! Mismatches: members of one collective instance with different counts or sizes, or members
//! of one comm all blocked in it but in different functions. They are named apart from the
//! wait-for graph's verdict.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::context::{comm_of, open_json, Ctx, MAX_EVIDENCE_OPS};
use super::model::{OpenOp, Verdict, VerdictKind};

/// Mismatches: members of one collective instance with different counts or sizes, or members
/// of one comm all blocked in it but in different functions.
pub(super) fn find_mismatches(ctx: &Ctx<'_>, blocked_in: &BTreeMap<i64, &OpenOp>) -> Vec<Verdict> {
    let mut out = count_mismatches(ctx);
    out.extend(dtype_mismatches(ctx));
    out.extend(func_mismatches(ctx, blocked_in));
    out
}

/// Functions whose members legitimately move different sizes (uneven splits: an MoE
/// all-to-all's tokens per rank, all-gather-v): never a size mismatch.
const UNEVEN_SIZES: [&str; 2] = ["AlltoAll", "AllGatherV"];

/// Open collective ops of the members that entered one instance `(comm, func, seq)`.
type Entered<'o> = Vec<(i64, &'o OpenOp)>;

/// The open collective ops of every instance `(comm, func, seq)`, by instance.
fn entered_instances<'c>(ctx: &'c Ctx<'_>) -> BTreeMap<(u64, String, u64), Entered<'c>> {
    let mut by_inst: BTreeMap<(u64, String, u64), Entered<'_>> = BTreeMap::new();
    for v in ctx.views.values() {
        for o in v.open.iter().filter(|o| o.peer < 0) {
            by_inst
                .entry((o.comm, o.func.clone(), o.seq))
                .or_default()
                .push((v.rank, o));
        }
    }
    by_inst
}

/// (a) Same instance, different count / bytes.
fn count_mismatches(ctx: &Ctx<'_>) -> Vec<Verdict> {
    let mut out = Vec::new();
    for ((comm, func, seq), ops) in &entered_instances(ctx) {
        if UNEVEN_SIZES.contains(&func.as_str()) {
            continue;
        }
        let mut groups: BTreeMap<(u64, u64), Vec<i64>> = BTreeMap::new();
        for (r, o) in ops {
            groups.entry((o.count, o.bytes)).or_default().push(*r);
        }
        if groups.len() < 2 {
            continue;
        }
        let usual = usual_count(ctx, *comm, func, ops);
        let odd = minority(&groups, |k| Some(k.0) == usual);
        let evidence_ops: Vec<Value> = ops
            .iter()
            .take(MAX_EVIDENCE_OPS)
            .map(|(r, o)| open_json(*r, o))
            .collect();
        out.push(instance_verdict(
            ctx,
            (*comm, func, *seq),
            ops,
            odd,
            json!({"reason": "count", "overdue": evidence_ops}),
        ));
    }
    out
}

/// (c) Same instance, different data types (only sources that name the type: imported Flight
/// Recorder entries).
fn dtype_mismatches(ctx: &Ctx<'_>) -> Vec<Verdict> {
    let mut out = Vec::new();
    for ((comm, func, seq), ops) in &entered_instances(ctx) {
        let mut types: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (r, o) in ops.iter().filter(|(_, o)| !o.dtype.is_empty()) {
            types.entry(o.dtype.clone()).or_default().push(*r);
        }
        if types.len() < 2 {
            continue;
        }
        let groups: BTreeMap<(u64, u64), Vec<i64>> = types
            .values()
            .enumerate()
            .map(|(i, rs)| ((i as u64, 0), rs.clone()))
            .collect();
        let odd = minority(&groups, |_| false);
        out.push(instance_verdict(
            ctx,
            (*comm, func, *seq),
            ops,
            odd,
            json!({"reason": "dtype", "dtypes": types}),
        ));
    }
    out
}

/// A mismatch verdict on the instance `(comm, func, seq)` its members `ops` entered, naming
/// `odd` (every member entered, nobody is absent).
fn instance_verdict(
    ctx: &Ctx<'_>,
    (comm, func, seq): (u64, &str, u64),
    ops: &Entered<'_>,
    odd: Vec<i64>,
    evidence: Value,
) -> Verdict {
    mismatch_verdict(
        ctx,
        comm,
        func.to_string(),
        seq,
        odd,
        ops.iter().map(|(r, _)| *r).collect(),
        vec![],
        ops.iter().map(|(_, o)| o.enqueue_us).min().unwrap_or(0),
        evidence,
    )
}

/// The usual size of `func` on `comm`: the count its members in `ops` finished last most
/// often (the larger on a tie), if any finished one.
fn usual_count(ctx: &Ctx<'_>, comm: u64, func: &str, ops: &Entered<'_>) -> Option<u64> {
    let mut usual: BTreeMap<u64, usize> = BTreeMap::new();
    for (r, _) in ops {
        if let Some(c) = ctx.views[r]
            .colls
            .iter()
            .find(|c| c.comm == comm && c.func == func)
        {
            *usual.entry(c.last_count).or_default() += 1;
        }
    }
    usual
        .into_iter()
        .max_by_key(|(c, n)| (*n, *c))
        .map(|(c, _)| c)
}

/// (b) Members of one comm blocked in it, in different functions.
fn func_mismatches(ctx: &Ctx<'_>, blocked_in: &BTreeMap<i64, &OpenOp>) -> Vec<Verdict> {
    let mut out = Vec::new();
    let mut by_comm: BTreeMap<u64, BTreeMap<String, Vec<i64>>> = BTreeMap::new();
    for (r, o) in blocked_in {
        by_comm
            .entry(o.comm)
            .or_default()
            .entry(o.func.clone())
            .or_default()
            .push(*r);
    }
    for (comm, funcs) in &by_comm {
        let coll_funcs = funcs
            .keys()
            .filter(|f| *f != "Send" && *f != "Recv")
            .count();
        let Some(c) = ctx.comms.get(comm) else {
            continue;
        };
        let total: usize = funcs.values().map(Vec::len).sum();
        if coll_funcs < 2 || total < c.members.len() {
            continue;
        }
        let groups: BTreeMap<(u64, u64), Vec<i64>> = funcs
            .iter()
            .enumerate()
            .map(|(i, (_, rs))| ((i as u64, 0), rs.clone()))
            .collect();
        let odd = minority(&groups, |_| false);
        let majority_func = funcs
            .iter()
            .max_by_key(|(f, rs)| (rs.len(), std::cmp::Reverse((*f).clone())))
            .map(|(f, _)| f.clone())
            .unwrap_or_default();
        let op = blocked_in[&funcs[&majority_func][0]];
        out.push(mismatch_verdict(
            ctx,
            *comm,
            majority_func.clone(),
            op.seq,
            odd.clone(),
            funcs[&majority_func].clone(),
            odd,
            op.enqueue_us,
            json!({"reason": "func", "funcs": funcs}),
        ));
    }
    out
}

/// The ranks of the smallest group; among several of that size, those `usual` does not accept
/// (all of them when that leaves none or all).
fn minority(
    groups: &BTreeMap<(u64, u64), Vec<i64>>,
    usual: impl Fn(&(u64, u64)) -> bool,
) -> Vec<i64> {
    let min = groups.values().map(Vec::len).min().unwrap_or(0);
    let small: Vec<(&(u64, u64), &Vec<i64>)> =
        groups.iter().filter(|(_, v)| v.len() == min).collect();
    let unusual: Vec<&Vec<i64>> = small
        .iter()
        .filter(|(k, _)| !usual(k))
        .map(|(_, v)| *v)
        .collect();
    let pick: Vec<&Vec<i64>> =
        if small.len() > 1 && !unusual.is_empty() && unusual.len() < small.len() {
            unusual
        } else {
            small.iter().map(|(_, v)| *v).collect()
        };
    let mut odd: Vec<i64> = pick.into_iter().flatten().copied().collect();
    odd.sort_unstable();
    odd
}

#[allow(
    clippy::too_many_arguments,
    reason = "one private constructor, named fields at its two call sites"
)]
/// A mismatch verdict on `comm` naming `sources`, with the comm's membership and the
/// sources' stacks added to `evidence`.
fn mismatch_verdict(
    ctx: &Ctx<'_>,
    comm: u64,
    func: String,
    seq: u64,
    sources: Vec<i64>,
    entered: Vec<i64>,
    absent: Vec<i64>,
    since: u64,
    mut evidence: Value,
) -> Verdict {
    if let Value::Object(m) = &mut evidence {
        m.insert("membership".into(), json!(ctx.comms.get(&comm)));
        let stacks: BTreeMap<String, Value> = sources
            .iter()
            .filter_map(|r| ctx.views.get(r))
            .filter_map(|v| v.stacks.as_ref().map(|s| (v.rank.to_string(), json!(s))))
            .collect();
        m.insert("stacks".into(), json!(stacks));
    }
    let category = match evidence.get("reason").and_then(Value::as_str) {
        Some("count") => "size",
        Some("dtype") => "type",
        _ => "collective",
    };
    Verdict {
        job: String::new(),
        kind: VerdictKind::Mismatch,
        category: Some(category.to_string()),
        source_ranks: sources,
        comm: comm_of(ctx, comm),
        func,
        seq,
        entered_ranks: entered,
        absent_ranks: absent,
        chain: vec![],
        since_us: since,
        gpu_fault: None,
        evidence,
    }
}

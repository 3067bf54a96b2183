//! Terminal strongly connected components of the wait-for graph: the sets of ranks that wait
//! on nobody outside themselves (a single rank waiting on nobody, or a cycle).

use std::collections::{BTreeMap, BTreeSet};

/// Every terminal component reachable in `edges` (a node without an entry has no out-edges),
/// each sorted, in order of their smallest member.
pub fn terminal_components(edges: &BTreeMap<i64, BTreeSet<i64>>) -> Vec<Vec<i64>> {
    // Nodes: every waiter and every rank waited on.
    let mut nodes: BTreeSet<i64> = edges.keys().copied().collect();
    nodes.extend(edges.values().flatten().copied());
    let idx: BTreeMap<i64, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let names: Vec<i64> = nodes.iter().copied().collect();
    let adj: Vec<Vec<usize>> = names
        .iter()
        .map(|n| {
            edges
                .get(n)
                .map(|s| s.iter().map(|t| idx[t]).collect())
                .unwrap_or_default()
        })
        .collect();
    let comp = tarjan(&adj);
    let ncomp = comp.iter().copied().max().map_or(0, |m| m + 1);
    let mut has_out = vec![false; ncomp];
    for (u, outs) in adj.iter().enumerate() {
        for &v in outs {
            if comp[u] != comp[v] {
                has_out[comp[u]] = true;
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    for (u, c) in comp.iter().enumerate() {
        if !has_out[*c] {
            groups.entry(*c).or_default().push(names[u]);
        }
    }
    let mut out: Vec<Vec<i64>> = groups.into_values().collect();
    for g in &mut out {
        g.sort_unstable();
    }
    out.sort();
    out
}

/// Component id of every node (iterative Tarjan, no recursion: graphs of thousands of ranks).
fn tarjan(adj: &[Vec<usize>]) -> Vec<usize> {
    let n = adj.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let mut comp = vec![usize::MAX; n];
    let (mut next, mut ncomp) = (0usize, 0usize);
    let mut stack: Vec<usize> = Vec::new();
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, next child position)
        let mut work: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (u, ref mut pos)) = work.last_mut() {
            if *pos < adj[u].len() {
                let v = adj[u][*pos];
                *pos += 1;
                if index[v] == usize::MAX {
                    index[v] = next;
                    low[v] = next;
                    next += 1;
                    stack.push(v);
                    on_stack[v] = true;
                    work.push((v, 0));
                } else if on_stack[v] {
                    low[u] = low[u].min(index[v]);
                }
            } else {
                work.pop();
                if let Some(&(p, _)) = work.last() {
                    low[p] = low[p].min(low[u]);
                }
                if low[u] == index[u] {
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        comp[w] = ncomp;
                        if w == u {
                            break;
                        }
                    }
                    ncomp += 1;
                }
            }
        }
    }
    comp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(e: &[(i64, &[i64])]) -> BTreeMap<i64, BTreeSet<i64>> {
        e.iter()
            .map(|(a, b)| (*a, b.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn pp_chain_ends_in_the_stuck_stage() {
        // DESIGN.md §5: 3 -> 2, 1 -> 2, 0 -> 1, DP peers 4,5,7 -> {0,1,3}.
        let e = g(&[
            (3, &[2]),
            (1, &[2]),
            (0, &[1]),
            (4, &[0]),
            (5, &[1]),
            (7, &[3]),
        ]);
        assert_eq!(terminal_components(&e), vec![vec![2]]);
    }

    #[test]
    fn a_cycle_is_one_terminal_component() {
        let e = g(&[(0, &[1]), (1, &[0]), (2, &[0]), (3, &[4])]);
        assert_eq!(terminal_components(&e), vec![vec![0, 1], vec![4]]);
    }

    #[test]
    fn a_cycle_with_a_way_out_is_not_terminal() {
        let e = g(&[(0, &[1]), (1, &[0, 2])]);
        assert_eq!(terminal_components(&e), vec![vec![2]]);
    }

    #[test]
    fn long_chains_do_not_recurse() {
        let e: BTreeMap<i64, BTreeSet<i64>> = (0..100_000)
            .map(|i| (i, [i + 1].into_iter().collect()))
            .collect();
        assert_eq!(terminal_components(&e), vec![vec![100_000]]);
    }
}

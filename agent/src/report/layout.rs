//! Each rank's place on the parallel grid (`[tp, cp, pp, dp, ep]`): its position in its TP, CP,
//! PP, DP and EP communicators when the roles name them; otherwise derived from the rank number
//! in Megatron's order (tp fastest, then cp, dp, pp). When that still puts two ranks on one cell
//! the layout falls back to one row of ranks per "replica" of the world (`dp = rank`).

use std::collections::{BTreeMap, BTreeSet};

use comminsight_wire::roles::Role;

use super::model::{CommInfo, Coord, GridView};
use crate::roles::JobRoles;

/// Dimension order of a [`Coord`].
const DIMS: [Role; 5] = [Role::Tp, Role::Cp, Role::Pp, Role::Dp, Role::Ep];

/// The grid of a job (each size at least 1).
pub fn grid_of(roles: Option<&JobRoles>) -> GridView {
    let g = roles.map(|r| r.grid).unwrap_or_default();
    GridView {
        tp: g.tp.max(1),
        cp: g.cp.max(1),
        pp: g.pp.max(1),
        dp: g.dp.max(1),
        ep: g.ep.max(1),
    }
}

/// Coordinates of `ranks` (ascending global ranks) and whether any had to be guessed.
pub fn coords(ranks: &[i64], roles: Option<&JobRoles>, grid: GridView) -> (Vec<Coord>, bool) {
    let mut known: BTreeMap<i64, [Option<u32>; 5]> = BTreeMap::new();
    if let Some(j) = roles {
        for c in &j.comms {
            let Some(dim) = c.role.and_then(|r| DIMS.iter().position(|d| *d == r)) else {
                continue;
            };
            for (pos, r) in &c.members {
                if *r >= 0 {
                    known.entry(*r).or_default()[dim] = Some(*pos);
                }
            }
        }
    }
    let sizes = [grid.tp, grid.cp, grid.pp, grid.dp, grid.ep];
    let mut guessed = false;
    let out: Vec<Coord> = ranks
        .iter()
        .map(|&r| {
            let k = known.get(&r).copied().unwrap_or_default();
            let derived = derive(r, sizes);
            let mut c = [0u32; 5];
            for d in 0..5 {
                c[d] = match k[d] {
                    Some(v) => v,
                    None => {
                        // A dimension of size 1 has nothing to guess.
                        guessed |= sizes[d] > 1;
                        derived[d]
                    }
                };
            }
            c
        })
        .collect();
    // Expert parallelism reuses the DP (and CP) ranks: it never separates two cells.
    let distinct: BTreeSet<[u32; 4]> = out.iter().map(|c| [c[0], c[1], c[2], c[3]]).collect();
    if distinct.len() == out.len() {
        return (out, guessed);
    }
    let flat = ranks
        .iter()
        .enumerate()
        .map(|(i, _)| [0, 0, 0, i as u32, 0])
        .collect();
    (flat, true)
}

/// Megatron's default order: rank = tp + TP·(cp + CP·(dp + DP·pp)); ep = dp mod EP.
fn derive(rank: i64, sizes: [u32; 5]) -> [u32; 5] {
    let r = rank.max(0) as u64;
    let [tp, cp, _pp, dp, ep] = sizes.map(u64::from);
    let t = r % tp;
    let c = (r / tp) % cp;
    let d = (r / (tp * cp)) % dp;
    let p = r / (tp * cp * dp);
    [t as u32, c as u32, p as u32, d as u32, (d % ep) as u32]
}

/// The communicators of the inferred roles (none without roles).
pub fn comm_infos(roles: Option<&JobRoles>) -> Vec<CommInfo> {
    roles
        .map(|j| {
            j.comms
                .iter()
                .map(|c| CommInfo {
                    hash: format!("0x{:016x}", c.hash),
                    name: c.name.clone(),
                    role: c.role.map_or("unknown", Role::as_str).into(),
                    ranks: c.ranks.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order_without_roles() {
        let g = GridView {
            tp: 2,
            cp: 1,
            pp: 2,
            dp: 4,
            ep: 1,
        };
        let ranks: Vec<i64> = (0..16).collect();
        let (c, guessed) = coords(&ranks, None, g);
        assert!(guessed);
        assert_eq!(c[0], [0, 0, 0, 0, 0]);
        assert_eq!(c[5], [1, 0, 0, 2, 0]);
        assert_eq!(c[9], [1, 0, 1, 0, 0]);
    }

    #[test]
    fn positions_in_named_communicators_win() {
        use crate::roles::{CommRole, Grid};
        let comm = |role, ranks: Vec<i64>| CommRole::dense(1, "", Some(role), ranks);
        let roles = JobRoles {
            job: "j".into(),
            world: 4,
            comms: vec![
                comm(Role::Tp, vec![1, 0]),
                comm(Role::Tp, vec![3, 2]),
                comm(Role::Dp, vec![0, 2]),
                comm(Role::Dp, vec![1, 3]),
            ],
            grid: Grid {
                tp: 2,
                cp: 1,
                pp: 1,
                dp: 2,
                ep: 1,
            },
            grid_confidence: 1.0,
        };
        let g = grid_of(Some(&roles));
        let (c, guessed) = coords(&[0, 1, 2, 3], Some(&roles), g);
        assert!(!guessed);
        assert_eq!(
            c,
            vec![
                [1, 0, 0, 0, 0],
                [0, 0, 0, 0, 0],
                [1, 0, 0, 1, 0],
                [0, 0, 0, 1, 0]
            ]
        );
    }
}

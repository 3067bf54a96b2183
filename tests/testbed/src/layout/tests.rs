use super::*;

const MEGATRON: Layout = Layout::new(2, 1, 2, 2, 1);
const MOE: Layout = Layout::new(2, 1, 4, 2, 2);

#[test]
fn tp_is_fastest_then_cp_dp_pp() {
    let l = Layout::new(2, 2, 2, 2, 1);
    let c = l.coords(13); // 13 = 1 + 2*(0 + 2*(1 + 2*1))
    assert_eq!((c.tp, c.cp, c.dp, c.pp), (1, 0, 1, 1));
    for r in 0..l.world() {
        let c = l.coords(r);
        assert_eq!(l.rank_of(c.tp, c.cp, c.dp, c.pp), r);
    }
}

#[test]
fn megatron_groups_partition_the_world() {
    let l = MEGATRON;
    assert_eq!(l.world(), 8);
    assert_eq!(l.group_of(5, Role::Tp).ranks, vec![4, 5]);
    assert_eq!(l.group_of(5, Role::Tp).name, "tp:pp1_dp0");
    assert_eq!(l.group_of(5, Role::Dp).ranks, vec![5, 7]);
    assert_eq!(l.group_of(5, Role::Pp).ranks, vec![1, 5]);
    assert_eq!(l.group_of(5, Role::Pp).comm_rank(5), Some(1));
    assert_eq!(
        l.active_roles(),
        vec![Role::Tp, Role::Dp, Role::Pp, Role::Global]
    );
    let groups = l.all_groups();
    for role in [Role::Tp, Role::Dp, Role::Pp] {
        let mut members: Vec<usize> = groups
            .iter()
            .filter(|g| g.role == role)
            .flat_map(|g| g.ranks.clone())
            .collect();
        members.sort();
        assert_eq!(members, (0..8).collect::<Vec<_>>(), "{role}");
    }
    // Every rank sees the same group (same name) from each of its members.
    for g in &groups {
        for r in &g.ranks {
            assert_eq!(&l.group_of(*r, g.role), g);
        }
    }
}

#[test]
fn moe_ep_groups_sit_inside_dp() {
    let l = MOE;
    assert_eq!(l.world(), 16);
    // rank 2: tp0 dp1 pp0 -> ep group 0 = dp {0,1} with tp0 pp0 = ranks {0, 2}
    assert_eq!(l.group_of(2, Role::Ep).ranks, vec![0, 2]);
    assert_eq!(l.group_of(6, Role::Ep).ranks, vec![4, 6]);
    assert_eq!(l.group_of(6, Role::Ep).name, "ep:pp0_tp0_g1");
    let dp = l.group_of(6, Role::Dp).ranks;
    assert!(l.group_of(6, Role::Ep).ranks.iter().all(|r| dp.contains(r)));
    assert_eq!(
        l.all_groups().iter().filter(|g| g.role == Role::Ep).count(),
        8
    );
}

#[test]
fn rescaling_scales_dp_or_explains_why_not() {
    assert_eq!(MEGATRON.rescaled(16).unwrap().dp, 4);
    assert_eq!(MEGATRON.rescaled(4).unwrap().dp, 1);
    let e = MEGATRON.rescaled(6).unwrap_err().to_string();
    assert!(e.contains("multiple of tp*cp*pp = 4"), "{e}");
    assert!(MOE.rescaled(12).is_err()); // dp = 3, ep = 2
    assert_eq!(MOE.rescaled(32).unwrap().dp, 8);
    assert!(check_hosts(8, 3).is_err());
    assert_eq!(host_of(5, 8, 2), 1);
    assert_eq!(host_of(3, 8, 2), 0);
}

fn order(s: &str) -> Order {
    s.parse().unwrap()
}

/// Groups of every role partition the world, every member sees the same group, members are
/// in communicator-rank order (the varying coordinate), and EP groups sit inside DP groups.
fn check_partition(l: &Layout) {
    let world = l.world();
    for r in 0..world {
        let c = l.coords(r);
        assert_eq!(l.rank_of(c.tp, c.cp, c.dp, c.pp), r, "{}", l.order);
    }
    let groups = l.all_groups();
    for role in l.active_roles() {
        let mut members: Vec<usize> = groups
            .iter()
            .filter(|g| g.role == role)
            .flat_map(|g| g.ranks.clone())
            .collect();
        members.sort();
        assert_eq!(
            members,
            (0..world).collect::<Vec<_>>(),
            "{role} {}",
            l.order
        );
    }
    for g in &groups {
        assert_eq!(g.ranks.len(), l.size(g.role));
        for (i, r) in g.ranks.iter().enumerate() {
            assert_eq!(&l.group_of(*r, g.role), g, "{} {}", g.name, l.order);
            let c = l.coords(*r);
            let idx = match g.role {
                Role::Tp => c.tp,
                Role::Cp => c.cp,
                Role::Dp => c.dp,
                Role::Pp => c.pp,
                Role::Ep => c.ep,
                Role::Global => *r,
            };
            assert_eq!(idx, i, "{} member {r} {}", g.name, l.order);
        }
        if g.role == Role::Ep {
            let dp = l.group_of(g.ranks[0], Role::Dp).ranks;
            assert!(g.ranks.iter().all(|r| dp.contains(r)), "{}", g.name);
            let c0 = l.coords(g.ranks[0]);
            for r in &g.ranks {
                let c = l.coords(*r);
                assert_eq!(
                    (c.tp, c.cp, c.pp, c.ep_group),
                    (c0.tp, c0.cp, c0.pp, c0.ep_group)
                );
            }
        }
    }
}

#[test]
fn orders_parse_print_and_reject_with_reasons() {
    assert_eq!(Order::default().to_string(), MEGATRON_ORDER);
    assert_eq!(order("tp-cp-ep-pp-dp").to_string(), "tp-cp-ep-pp-dp");
    assert_eq!(order("PP-dp-tp-cp").to_string(), "pp-dp-tp-cp");
    assert_eq!(
        order("tp-cp-ep-pp-dp").dims,
        [Dim::Tp, Dim::Cp, Dim::Pp, Dim::Dp]
    );
    for bad in [
        "",
        "tp-cp-dp",
        "tp-cp-dp-pp-tp",
        "tp-cp-ep-ep-dp-pp",
        "tp-cp-xp-dp-pp",
    ] {
        let e = bad.parse::<Order>().unwrap_err();
        assert!(e.contains("permutation of tp, cp, dp, pp"), "{e}");
    }
    let l = Layout::new(2, 1, 4, 2, 2).with_order(order("tp-cp-ep-pp-dp"));
    let v = serde_json::to_value(l).unwrap();
    assert_eq!(v["order"], "tp-cp-ep-pp-dp");
    assert_eq!(serde_json::from_value::<Layout>(v).unwrap(), l);
    let old = serde_json::json!({"tp": 2, "cp": 1, "dp": 2, "pp": 2, "ep": 1});
    assert_eq!(serde_json::from_value::<Layout>(old).unwrap(), MEGATRON);
}

#[test]
fn tp_pp_dp_mapping_puts_pp_before_dp() {
    // Megatron's --use-tp-pp-dp-mapping: tp fastest, then pp, then dp.
    let l = Layout::new(2, 1, 4, 2, 2).with_order(order("tp-cp-ep-pp-dp"));
    assert_eq!(l.group_of(0, Role::Tp).ranks, vec![0, 1]);
    assert_eq!(l.group_of(0, Role::Pp).ranks, vec![0, 2]);
    assert_eq!(l.group_of(0, Role::Dp).ranks, vec![0, 4, 8, 12]);
    assert_eq!(l.group_of(0, Role::Ep).ranks, vec![0, 4]);
    assert_eq!(l.group_of(9, Role::Ep).ranks, vec![9, 13]);
    let c = l.coords(6); // tp0, pp1, dp1
    assert_eq!((c.tp, c.pp, c.dp), (0, 1, 1));
    assert_eq!(l.group_of(6, Role::Tp).name, "tp:pp1_dp1");
    // The default order numbers the same sizes differently.
    assert_eq!(
        l.with_order(Order::MEGATRON).group_of(0, Role::Dp).ranks,
        vec![0, 2, 4, 6]
    );
}

#[test]
fn groups_partition_the_world_in_every_order() {
    let dims = ["tp", "cp", "dp", "pp"];
    let mut orders = Vec::new();
    for a in 0..4 {
        for b in 0..4 {
            for c in 0..4 {
                for d in 0..4 {
                    let idx = [a, b, c, d];
                    let mut u = idx.to_vec();
                    u.sort();
                    u.dedup();
                    if u.len() == 4 {
                        orders.push(idx.map(|i| dims[i]).join("-"));
                    }
                }
            }
        }
    }
    assert_eq!(orders.len(), 24);
    for o in &orders {
        for l in [
            Layout::new(2, 1, 4, 2, 2),
            Layout::new(2, 2, 2, 3, 2),
            Layout::new(1, 1, 8, 1, 4),
        ] {
            check_partition(&l.with_order(order(o)));
        }
    }
    check_partition(&Layout::new(2, 1, 4, 2, 4).with_order(order("tp-cp-ep-pp-dp")));
    check_partition(&MOE);
    check_partition(&MEGATRON);
}

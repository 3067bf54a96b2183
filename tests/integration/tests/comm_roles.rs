//! Issue 4 acceptance: communicator roles.
//!
//! * With the preload shim + Python inject and a script that never names its groups (the test
//!   bed's torch frontend over a fake `torch.distributed`), every `comm_init` carries its role.
//! * With both off (unnamed communicators), `comminsight-agent roles` infers the same roles and
//!   grid for >= 95% of the communicators over the test-bed layouts below.

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_tests::*;
use comminsight_wire::record::Body;
use comminsight_wire::roles::{parse_comm_name, Role};

/// One test-bed layout: (label, tp, cp, pp, dp, ep, rank order).
type Layout = (&'static str, u32, u32, u32, u32, u32, &'static str);

/// The layouts inference is scored on (16 ranks each, real rank processes).
const LAYOUTS: &[Layout] = &[
    ("dense, Megatron order", 2, 1, 2, 4, 1, "tp-cp-ep-dp-pp"),
    ("MoE, Megatron order", 2, 1, 2, 4, 4, "tp-cp-ep-dp-pp"),
    ("CP, Megatron order", 2, 2, 2, 2, 1, "tp-cp-ep-dp-pp"),
    ("dense, tp-pp-dp order", 2, 1, 2, 4, 1, "tp-cp-ep-pp-dp"),
    ("MoE, tp-pp-dp order", 2, 1, 2, 4, 4, "tp-cp-ep-pp-dp"),
    ("CP+MoE, tp-pp-dp order", 2, 2, 2, 2, 2, "tp-cp-ep-pp-dp"),
    ("dense, dp-tp-pp order", 2, 1, 2, 4, 1, "dp-tp-cp-pp"),
    (
        "deep pipeline, Megatron order",
        1,
        1,
        4,
        4,
        1,
        "tp-cp-ep-dp-pp",
    ),
    ("wide TP, tp-pp-dp order", 4, 1, 2, 2, 2, "tp-cp-ep-pp-dp"),
    // NCCL 2.27 has no ncclAlltoAll: EP traffic is grouped send/recv to every peer.
    ("MoE on NCCL 2.27", 2, 1, 2, 4, 4, "tp-cp-ep-dp-pp"),
];

/// A scenario file for `layout`: 16 ranks on 2 hosts, a few steps, small messages.
fn scenario(dir: &Path, l: &Layout, extra_workload: &str) -> String {
    let (label, tp, cp, pp, dp, ep, order) = *l;
    let moe = if ep > 1 {
        "moe_layers = 1\ndp_sync = \"reduce_scatter_all_gather\"\n"
    } else {
        "dp_sync = \"all_reduce\"\n"
    };
    let text = format!(
        "name = \"roles\"\ndescription = \"{label}\"\n\n[layout]\ntp = {tp}\ncp = {cp}\npp = {pp}\n\
         dp = {dp}\nep = {ep}\nhosts = 2\norder = \"{order}\"\n\n[workload]\nsteps = 3\n\
         microbatches = 2\nlayers = 2\nnamed_comms = false\n{moe}{extra_workload}\n\
         [messages]\ntp = 4096\ncp = 2048\npp = 4096\nep = 8192\ndp = 262144\nglobal = 8\n\n\
         [compute]\nforward_ms = 0.2\nbackward_ms = 0.4\nexpert_ms = 0.1\noptimizer_ms = 0.2\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{}.toml", label.replace([' ', ',', '+'], "_")));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// truth.json's communicators: hash -> role.
fn truth_roles(out: &Path) -> BTreeMap<String, String> {
    truth(out)["comms"]
        .as_array()
        .expect("truth comms")
        .iter()
        .map(|c| {
            (
                c["hash"].as_str().unwrap().to_string(),
                c["role"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `comminsight-agent roles OUT --json` scored against truth.json: (communicators with the truth's
/// role, communicators in the truth, the grid [tp, cp, pp, dp, ep]). Every role must be inferred
/// (the jobs are unnamed).
fn score_inference(out: &Path, label: &str) -> (usize, usize, [u64; 5]) {
    let o = agent(&["roles", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("roles --json");
    let inferred: BTreeMap<String, String> = v["comms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["source"], "inferred", "{label}: {c}");
            (
                c["hash"].as_str().unwrap().to_string(),
                c["role"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = truth_roles(out);
    let ok = want
        .iter()
        .filter(|(h, role)| inferred.get(*h) == Some(*role))
        .count();
    let g = &v["grid"];
    (
        ok,
        want.len(),
        ["tp", "cp", "pp", "dp", "ep"].map(|k| g[k].as_u64().unwrap()),
    )
}

#[test]
fn inference_recovers_roles_of_unnamed_communicators_over_testbed_layouts() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("roles-layouts");
    let (mut total, mut right) = (0usize, 0usize);
    let mut report = String::new();
    let mut grids_ok = 0;
    // The same Python-driven torch jobs as the preload test, with neither preload nor inject.
    let torch: &[(Layout, &str)] = &[
        (
            ("torch job, Megatron order", 2, 1, 2, 4, 1, "tp-cp-ep-dp-pp"),
            "frontend = \"torch\"\ntorch_groups = \"megatron\"\ncomm_init = \"config\"\n",
        ),
        (
            (
                "torch MoE job, tp-pp-dp order",
                2,
                1,
                2,
                4,
                4,
                "tp-cp-ep-pp-dp",
            ),
            "frontend = \"torch\"\ntorch_groups = \"megatron\"\ncomm_init = \"split\"\n",
        ),
    ];
    let all: Vec<(&Layout, &str)> = LAYOUTS
        .iter()
        .map(|l| (l, ""))
        .chain(torch.iter().map(|(l, w)| (l, *w)))
        .collect();
    for (l, workload) in &all {
        let out = dir.path().join(l.0.replace([' ', ',', '+'], "_"));
        let sc = scenario(dir.path(), l, workload);
        let env: &[(&str, &str)] = if l.0.contains("2.27") {
            &[("COMMINSIGHT_TESTBED_NCCL_VERSION", "2.27")]
        } else {
            &[]
        };
        testbed(&out, &["--scenario", &sc], env).assert_ok();
        // Unnamed, as upstream PyTorch leaves them.
        for r in records(&out.join("inspector_logs")) {
            if let Body::CommInit(c) = &r.body {
                assert!(
                    c.comm_name.is_empty(),
                    "{}: named comm {:?}",
                    l.0,
                    c.comm_name
                );
            }
        }
        let (ok, n, grid) = score_inference(&out, l.0);
        total += n;
        right += ok;
        let grid_ok = grid == [l.1, l.2, l.3, l.4, l.5].map(u64::from);
        grids_ok += usize::from(grid_ok);
        report.push_str(&format!(
            "{:<26} {:>2}/{:<2} comms  grid tp={} cp={} pp={} dp={} ep={} {}\n",
            l.0,
            ok,
            n,
            grid[0],
            grid[1],
            grid[2],
            grid[3],
            grid[4],
            if grid_ok { "ok" } else { "WRONG" }
        ));
    }
    eprintln!("role inference over the test-bed layouts:\n{report}");
    let acc = right as f64 / total as f64;
    eprintln!(
        "overall: {right}/{total} communicators = {:.1}%",
        acc * 100.0
    );
    assert!(acc >= 0.95, "accuracy {acc:.3} < 0.95:\n{report}");
    assert!(
        grids_ok as f64 / all.len() as f64 >= 0.95,
        "grids:\n{report}"
    );
}

/// Larger layouts through the test bed's `--synthetic` mode (the same plans, simulated): (layout,
/// hosts).
const SYNTHETIC: &[(Layout, u32)] = &[
    (
        ("256 ranks, Megatron order", 8, 1, 4, 8, 4, "tp-cp-ep-dp-pp"),
        32,
    ),
    (
        (
            "512 ranks, tp-pp-dp order",
            4,
            2,
            4,
            16,
            8,
            "tp-cp-ep-pp-dp",
        ),
        64,
    ),
    (
        ("1024 ranks, dp-tp-pp order", 8, 1, 8, 16, 1, "dp-tp-cp-pp"),
        128,
    ),
];

#[test]
fn inference_holds_at_scale_on_synthetic_jobs() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("roles-synthetic");
    let mut report = String::new();
    let (mut total, mut right) = (0usize, 0usize);
    for (l, hosts) in SYNTHETIC {
        let out = dir.path().join(l.0.replace([' ', ',', '+'], "_"));
        let sc = scenario(dir.path(), l, "");
        let hosts = hosts.to_string();
        testbed(
            &out,
            &["--scenario", &sc, "--synthetic", "--hosts", &hosts],
            &[],
        )
        .assert_ok();
        let (ok, n, grid) = score_inference(&out, l.0);
        total += n;
        right += ok;
        assert_eq!(
            grid,
            [l.1, l.2, l.3, l.4, l.5].map(u64::from),
            "{}: grid",
            l.0
        );
        report.push_str(&format!("{:<28} {ok}/{n} comms\n", l.0));
    }
    eprintln!("synthetic:\n{report}");
    assert!(
        right as f64 / total as f64 >= 0.95,
        "{right}/{total}:\n{report}"
    );
}

/// The staged preload shim (`cargo xtask build`).
fn preload() -> String {
    let p = lib_dir().join("libcomminsight-preload.so");
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask build`",
        p.display()
    );
    p.to_str().unwrap().to_string()
}

#[test]
fn preload_and_inject_name_every_communicator_of_an_unnamed_torch_job() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("roles-preload");
    let cases: &[(Layout, &str)] = &[
        (
            ("torch megatron lazy", 2, 1, 2, 4, 1, "tp-cp-ep-dp-pp"),
            "frontend = \"torch\"\ntorch_groups = \"megatron\"\ncomm_init = \"config\"\n",
        ),
        (
            ("torch megatron moe eager", 2, 1, 2, 4, 4, "tp-cp-ep-dp-pp"),
            "frontend = \"torch\"\ntorch_groups = \"megatron\"\ncomm_init = \"split\"\n",
        ),
        (
            ("torch mesh", 2, 1, 2, 4, 1, "tp-cp-ep-dp-pp"),
            "frontend = \"torch\"\ntorch_groups = \"mesh\"\ncomm_init = \"config\"\n",
        ),
    ];
    for (l, workload) in cases {
        let out = dir.path().join(l.0.replace(' ', "_"));
        let sc = scenario(dir.path(), l, workload);
        testbed(&out, &["--scenario", &sc], &[("LD_PRELOAD", &preload())]).assert_ok();
        let want = truth_roles(&out);
        let mut named: BTreeMap<String, (String, usize)> = BTreeMap::new();
        for r in records(&out.join("inspector_logs")) {
            if let Body::CommInit(c) = &r.body {
                let name = c.comm_name.as_str_lossy().into_owned();
                let role = parse_comm_name(&name).map_or("none".to_string(), |r| r.to_string());
                let e = named
                    .entry(format!("0x{:016x}", c.comm_hash))
                    .or_insert((role.clone(), 0));
                assert_eq!(e.0, role, "{}: members disagree on {name}", l.0);
                e.1 += 1;
                // The role is CommInsight's prefix: "<role>:<group_desc>:<group_name>".
                assert!(
                    name.split(':').next().unwrap().parse::<Role>().is_ok(),
                    "{}: {name:?} has no role prefix",
                    l.0
                );
            }
        }
        for (hash, role) in &want {
            let got = named.get(hash).map(|(r, _)| r.as_str());
            assert_eq!(got, Some(role.as_str()), "{}: comm {hash}", l.0);
        }
        // With names, `roles` reports them as named.
        let o = agent(&["roles", out.to_str().unwrap(), "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for c in v["comms"].as_array().unwrap() {
            let h = c["hash"].as_str().unwrap();
            if let Some(role) = want.get(h) {
                assert_eq!(c["source"], "named", "{}: {c}", l.0);
                assert_eq!(c["role"].as_str(), Some(role.as_str()), "{}: {c}", l.0);
            }
        }
    }
}

//! The torch frontend end to end: 16 rank processes run the plans through the fake
//! `torch.distributed` (which never names communicators), against the libnccl stand-in and the
//! plugin; with the LD_PRELOAD shim and the Python inject, every communicator is named by role.
//! Fails, not skips, when the staged libraries are missing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use comminsight_wire::record::Body;
use comminsight_wire::roles::parse_comm_name;
use support::*;

/// A shipped scenario with some `key = value` lines replaced (the key must be there already,
/// or is added to `[workload]`), written into `out`.
fn variant(out: &Path, name: &str, set: &[(&str, &str)]) -> String {
    let text = std::fs::read_to_string(scenario(name)).expect("scenario");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for (k, v) in set {
        let prefix = format!("{k} =");
        match lines.iter_mut().find(|l| l.starts_with(&prefix)) {
            Some(l) => *l = format!("{k} = {v}"),
            None => {
                let at = lines
                    .iter()
                    .position(|l| l == "[workload]")
                    .expect("[workload]")
                    + 1;
                lines.insert(at, format!("{k} = {v}"));
            }
        }
    }
    std::fs::create_dir_all(out).expect("out dir");
    let p = out.join(format!("{name}-variant.toml"));
    std::fs::write(&p, lines.join("\n") + "\n").expect("write scenario");
    p.to_string_lossy().into_owned()
}

/// (name, role, ranks) of every truth comm.
type CommSet = BTreeSet<(String, String, Vec<u64>)>;
/// hash -> (role, nranks).
type ByHash = BTreeMap<String, (String, usize)>;

/// The truth comms, as a set and by hash.
fn truth_comms(truth: &serde_json::Value) -> (CommSet, ByHash) {
    let mut set = BTreeSet::new();
    let mut by_hash = BTreeMap::new();
    for c in truth["comms"].as_array().expect("comms") {
        let ranks: Vec<u64> = c["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap())
            .collect();
        let role = c["role"].as_str().unwrap().to_string();
        by_hash.insert(
            c["hash"].as_str().unwrap().to_string(),
            (role.clone(), ranks.len()),
        );
        set.insert((c["name"].as_str().unwrap().to_string(), role, ranks));
    }
    (set, by_hash)
}

/// Every rank finished `steps` steps; returns each comm_init as (rank, hash, nranks, name).
fn check_run(out: &Out, steps: usize) -> Vec<(i32, String, u32, String)> {
    let truth = out.truth();
    assert_eq!(truth["ranks"], 16);
    let recs = records_by_rank(out.path());
    assert_eq!(recs.len(), 16, "one process directory per rank");
    let mut inits = Vec::new();
    for (rank, rs) in &recs {
        assert_eq!(
            truth["steps"][rank.to_string()].as_array().unwrap().len(),
            steps,
            "rank {rank}"
        );
        assert_steps_tile_records(&truth, &recs, *rank);
        for r in rs {
            if let Body::CommInit(c) = &r.body {
                inits.push((
                    *rank,
                    format!("0x{:016x}", c.comm_hash),
                    c.nranks,
                    c.comm_name.as_str_lossy().to_string(),
                ));
            }
        }
    }
    inits
}

#[test]
fn torch_runs_verify_and_list_the_same_comms_as_the_nccl_frontend() {
    let _g = one_job_at_a_time();
    for (name, order, init, roles) in [
        ("torch_megatron", "tp-cp-ep-dp-pp", "config", 4),
        ("torch_moe", "tp-cp-ep-pp-dp", "split", 5),
    ] {
        let torch_out = Out::new(&format!("{name}-torch"));
        let nccl_out = Out::new(&format!("{name}-nccl"));
        let order = format!("\"{order}\"");
        let init = format!("\"{init}\"");
        let t = variant(
            torch_out.path(),
            name,
            &[("order", &order), ("comm_init", &init)],
        );
        let n = variant(
            nccl_out.path(),
            name,
            &[
                ("order", &order),
                ("comm_init", &init),
                ("frontend", "\"nccl\""),
                ("named_comms", "false"),
            ],
        );
        let env = [("PYTHONPATH", ""), ("LD_PRELOAD", "")];
        let (o, _) = testbed(torch_out.path(), &["--scenario", &t], &env);
        assert_ok(&o);
        let (o, _) = testbed(nccl_out.path(), &["--scenario", &n], &env);
        assert_ok(&o);
        let (torch_set, by_hash) = truth_comms(&torch_out.truth());
        let (nccl_set, _) = truth_comms(&nccl_out.truth());
        assert_eq!(torch_set, nccl_set, "{name}: truth comms of both frontends");
        let kinds: BTreeSet<&str> = torch_set.iter().map(|(_, r, _)| r.as_str()).collect();
        assert_eq!(kinds.len(), roles, "{name}: {kinds:?}");
        assert!(torch_out.truth().get("warnings").is_none(), "{name}");
        let inits = check_run(&torch_out, 3);
        for (rank, hash, nranks, cname) in &inits {
            let (_, size) = by_hash
                .get(hash)
                .unwrap_or_else(|| panic!("{name}: rank {rank}: {hash} not in truth"));
            assert_eq!(*size as u32, *nranks);
            assert_eq!(cname, "", "{name}: upstream-torch style: no names");
        }
        assert_eq!(
            inits.len(),
            16 * roles,
            "{name}: every rank is in one comm of each role"
        );
        let ranks_log = std::fs::read_to_string(torch_out.path().join("ranks/rank-0.log")).unwrap();
        assert!(!ranks_log.contains("Traceback"), "{ranks_log}");
    }
}

/// The staged preload library; its constructor puts the staged inject (`lib/python/`) on
/// PYTHONPATH, so LD_PRELOAD alone enables both.
fn preload() -> PathBuf {
    let lib = lib_dir();
    for f in ["libcomminsight-preload.so", "python/sitecustomize.py"] {
        assert!(
            lib.join(f).exists(),
            "{} lacks {f}: run `cargo xtask build`",
            lib.display()
        );
    }
    lib.join("libcomminsight-preload.so")
}

#[test]
fn preload_and_inject_name_every_communicator_by_its_role() {
    let _g = one_job_at_a_time();
    let so = preload().to_string_lossy().into_owned();
    for (name, order, init, groups) in [
        ("torch_megatron", "tp-cp-ep-dp-pp", "config", "megatron"),
        ("torch_moe", "tp-cp-ep-pp-dp", "split", "megatron"),
        ("torch_megatron", "pp-dp-tp-cp", "split", "mesh"),
    ] {
        let what = format!("{name} {order} {init} {groups}");
        let out = Out::new(&format!("{name}-{init}-{groups}-named"));
        let s = variant(
            out.path(),
            name,
            &[
                ("order", &format!("\"{order}\"")),
                ("comm_init", &format!("\"{init}\"")),
                ("torch_groups", &format!("\"{groups}\"")),
            ],
        );
        let (o, _) = testbed(
            out.path(),
            &["--scenario", &s],
            &[("LD_PRELOAD", &so), ("PYTHONPATH", "")],
        );
        assert_ok(&o);
        let (_, by_hash) = truth_comms(&out.truth());
        let inits = check_run(&out, 3);
        assert!(inits.len() >= 16 * 4, "{what}");
        for (rank, hash, _, cname) in &inits {
            let (role, _) = &by_hash[hash];
            let got = parse_comm_name(cname).map(|r| r.as_str());
            assert_eq!(got, Some(role.as_str()), "{what}: rank {rank}: {cname:?}");
            let desc = cname.split(':').nth(1).unwrap_or("");
            let want_desc = match (role.as_str(), groups) {
                ("global", _) => "default_pg".to_string(),
                (r, "mesh") => format!("mesh_{r}"),
                ("tp", _) => "TENSOR_MODEL_PARALLEL_GROUP".into(),
                ("dp", _) => "DATA_PARALLEL_GROUP".into(),
                ("pp", _) => "PIPELINE_MODEL_PARALLEL_GROUP".into(),
                ("ep", _) => "EXPERT_MODEL_PARALLEL_GROUP".into(),
                (r, _) => panic!("unexpected role {r}"),
            };
            assert_eq!(desc, want_desc, "{what}: {cname}");
        }
    }
}

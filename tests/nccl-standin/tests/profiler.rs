//! Profiler plugin tests: loading rules per emulated NCCL release (by name via LD_LIBRARY_PATH, by
//! path, STATIC_PLUGIN, none, v3-only), init-error semantics, dlclose/reload, event hierarchy per ABI
//! version (v4 parent = Group; v5/v6 parent = CollApi/P2pApi; KernelCh state 22 before stop; ProxyOp
//! only for remote-host peers), activation-mask implications, loss injection. Uses the recording
//! plugins built by build.rs (`csrc/rec_plugin.c`), which log every call to a file per rank.

mod common;

use common::*;
use nccl::ffi::{
    ncclGroupEnd, ncclGroupStart, ncclTestbedCommHash, ncclTestbedProfiledOps,
    ncclTestbedProfilerAbi,
};
use std::collections::HashMap;
use std::time::Duration;

type Env = Vec<(&'static str, String)>;

const PLUGDIR: &str = env!("NCCL_STANDIN_TEST_PLUGIN_DIR");

#[test]
fn child_entry() {
    let Ok(s) = std::env::var("NCCL_STANDIN_CHILD") else {
        return;
    };
    let code = match s.as_str() {
        "prof" => prof(),
        "loss" => loss(),
        "reload" => reload(),
        "funcs" => funcs(),
        "splitprof" => splitprof(),
        _ => 99,
    };
    std::process::exit(code);
}

fn report(c: CommT) {
    // SAFETY: plain getters.
    unsafe {
        println!("\nABI {}", ncclTestbedProfilerAbi());
        println!("OPS {}", ncclTestbedProfiledOps());
        println!("HASH {:x}", ncclTestbedCommHash(c));
    }
}

fn prof() -> i32 {
    let m = me();
    let (r, n) = (m.rank, m.nranks);
    let mut cfg = nccl::types::Config::initializer();
    cfg.commName = c"tp0".as_ptr();
    let (rc, c) = init_config(m.ids[0], n, r, &mut cfg);
    check(rc, "init");
    let s = vec![1f32; 200_000];
    let mut d = vec![0f32; 200_000];
    allreduce(c, &s[..0], &mut d[..0], FLOAT32, SUM); // empty: discarded, no events, no seqNumber
    allreduce(c, &s, &mut d, FLOAT32, SUM);
    let ps = vec![r; 1000];
    let mut pd = vec![0i32; 1000];
    check(ncclGroupStart(), "gs");
    send(c, &ps, INT32, (r + 1) % n);
    recv(c, &mut pd, INT32, (r + n - 1) % n);
    check(ncclGroupEnd(), "ge");
    let mut d2 = vec![0f32; 10];
    allreduce(c, &s[..10], &mut d2, FLOAT32, SUM);
    sync(c);
    assert!(d.iter().all(|v| *v == n as f32));
    assert!(pd.iter().all(|v| *v == (r + n - 1) % n));
    report(c);
    destroy(c);
    0
}

fn loss() -> i32 {
    let m = me();
    let c = init(m.ids[0], m.nranks, m.rank);
    let s = vec![1f32; 64];
    let mut d = vec![0f32; 64];
    for _ in 0..40 {
        allreduce(c, &s, &mut d, FLOAT32, SUM);
    }
    sync(c);
    report(c);
    destroy(c);
    0
}

fn reload() -> i32 {
    let m = me();
    for id in &m.ids {
        let c = init(*id, m.nranks, m.rank);
        let s = vec![1f32; 8];
        let mut d = vec![0f32; 8];
        allreduce(c, &s, &mut d, FLOAT32, SUM);
        sync(c);
        report(c);
        destroy(c);
    }
    0
}

fn funcs() -> i32 {
    let m = me();
    let (r, n) = (m.rank as usize, m.nranks as usize);
    let c = init(m.ids[0], n as i32, r as i32);
    let nul = std::ptr::null_mut();
    let b: Vec<f32> = (0..1000)
        .map(|i| if r == 0 { i as f32 } else { -1.0 })
        .collect();
    let mut bd = vec![0f32; 1000];
    let ag: Vec<f32> = vec![r as f32; 100];
    let mut agd = vec![0f32; 100 * n];
    let a2a: Vec<i32> = (0..10 * n).map(|j| (r * 100 + j / 10) as i32).collect();
    let mut a2ad = vec![0i32; 10 * n];
    // SAFETY: buffers live until the sync below.
    unsafe {
        check(
            nccl::ffi::ncclBroadcast(
                b.as_ptr().cast(),
                bd.as_mut_ptr().cast(),
                1000,
                FLOAT32,
                0,
                c,
                nul,
            ),
            "bcast",
        );
        check(
            nccl::ffi::ncclAllGather(
                ag.as_ptr().cast(),
                agd.as_mut_ptr().cast(),
                100,
                FLOAT32,
                c,
                nul,
            ),
            "ag",
        );
        check(
            nccl::ffi::ncclAlltoAll(
                a2a.as_ptr().cast(),
                a2ad.as_mut_ptr().cast(),
                10,
                INT32,
                c,
                nul,
            ),
            "a2a",
        );
    }
    sync(c);
    assert!(bd.iter().enumerate().all(|(i, v)| *v == i as f32));
    assert!(agd.iter().enumerate().all(|(j, v)| *v == (j / 100) as f32));
    assert!(
        a2ad.iter()
            .enumerate()
            .all(|(j, v)| *v == ((j / 10) * 100 + r) as i32),
        "{a2ad:?}"
    );
    report(c);
    destroy(c);
    0
}

fn splitprof() -> i32 {
    let m = me();
    let c = init(m.ids[0], m.nranks, m.rank);
    let mut cfg = nccl::types::Config::initializer();
    cfg.commName = c"half".as_ptr();
    let mut child: CommT = std::ptr::null();
    // SAFETY: valid comm, out-pointer and config.
    check(
        unsafe { nccl::ffi::ncclCommSplit(c, m.rank % 2, m.rank, &mut child, &mut cfg) },
        "split",
    );
    let s = vec![1f32; 8];
    let mut d = vec![0f32; 8];
    allreduce(child, &s, &mut d, FLOAT32, SUM);
    sync(child);
    assert!(d.iter().all(|v| *v == (m.nranks / 2) as f32));
    // SAFETY: valid comm.
    println!("\nCHILD {:x}", unsafe { ncclTestbedCommHash(child) });
    destroy(child);
    report(c);
    destroy(c);
    0
}

/// One recorded plugin call.
#[derive(Debug, Clone)]
struct Rec {
    what: String,
    kv: HashMap<String, String>,
}

impl Rec {
    fn get(&self, k: &str) -> &str {
        self.kv.get(k).map(String::as_str).unwrap_or("")
    }
    fn ty(&self) -> u32 {
        self.get("type").parse().unwrap_or(0)
    }
}

fn parse(path: &std::path::Path) -> Vec<Rec> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut it = l.split_whitespace();
            let what = it.next().unwrap_or("").to_string();
            let kv = it
                .filter_map(|t| t.split_once('='))
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            Rec { what, kv }
        })
        .collect()
}

struct Run {
    ranks: Ranks,
}

impl Run {
    fn rec(&self, r: usize) -> Vec<Rec> {
        parse(&self.ranks.dir.join(format!("rec-{r}.log")))
    }
    fn val(&self, r: usize, key: &str) -> String {
        let out = self.ranks.out(r);
        out.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key} ")))
            .next_back()
            .unwrap_or_else(|| panic!("rank {r} printed no {key}:\n{out}\n{}", self.ranks.err(r)))
            .to_string()
    }
    fn abi(&self, r: usize) -> u32 {
        self.val(r, "ABI").parse().unwrap()
    }
}

fn run(
    name: &str,
    scenario: &str,
    n: usize,
    nids: usize,
    env: &[(&str, String)],
    two_hosts: bool,
) -> Run {
    let dir = scratch(name);
    let ids: Vec<String> = (0..nids).map(|_| new_id_hex()).collect();
    let d = dir.clone();
    let per_rank = move |r: usize| {
        let mut v = vec![(
            "NCCL_STANDIN_REC_FILE".to_string(),
            d.join(format!("rec-{r}.log")).display().to_string(),
        )];
        if two_hosts {
            v.push(("COMMINSIGHT_TESTBED_HOST".into(), format!("host{}", r / 2)));
        }
        v
    };
    let mut env: Vec<(&str, String)> = env.to_vec();
    env.push(("LD_LIBRARY_PATH", PLUGDIR.to_string()));
    env.push(("NCCL_DEBUG", "INFO".to_string()));
    env.push(("NCCL_DEBUG_SUBSYS", "INIT,ENV,PROFILE".to_string()));
    let mut ranks = Ranks::spawn(scenario, n, &ids, &dir, &env, &per_rank);
    ranks.expect_success(Duration::from_secs(120));
    Run { ranks }
}

fn env(version: &str, plugin: &str) -> Vec<(&'static str, String)> {
    vec![
        ("COMMINSIGHT_TESTBED_NCCL_VERSION", version.to_string()),
        ("NCCL_PROFILER_PLUGIN", plugin.to_string()),
    ]
}

fn handles(recs: &[Rec], ty: u32) -> HashMap<String, Rec> {
    recs.iter()
        .filter(|e| e.what == "start" && e.ty() == ty)
        .map(|e| (e.get("h").to_string(), e.clone()))
        .collect()
}

/// Checks the v5/v6 hierarchy of one rank's log; returns (#ProxyOp, #KernelCh).
fn check_v5_hierarchy(recs: &[Rec], r: usize, hosts: &dyn Fn(usize) -> usize) -> (usize, usize) {
    let gapi = handles(recs, 256);
    let capi = handles(recs, 512);
    let papi = handles(recs, 1024);
    let groups = handles(recs, 1);
    let colls = handles(recs, 2);
    let p2ps = handles(recs, 4);
    let pops = handles(recs, 8);
    let steps = handles(recs, 16);
    assert!(!gapi.is_empty() && !capi.is_empty() && !papi.is_empty() && !groups.is_empty());
    for e in capi.values().chain(papi.values()) {
        assert!(
            gapi.contains_key(e.get("parent")),
            "API event parent must be the GroupApi: {e:?}"
        );
    }
    for e in recs.iter().filter(|e| e.what == "start" && e.ty() == 2048) {
        assert!(
            gapi.contains_key(e.get("parent")),
            "KernelLaunch parent = GroupApi"
        );
    }
    let seqs: Vec<&str> = colls.values().map(|c| c.get("seq")).collect();
    assert_eq!(colls.len(), 2);
    assert!(
        seqs.contains(&"0") && seqs.contains(&"1"),
        "per-func seqNumber 0,1: {seqs:?}"
    );
    for c in colls.values() {
        assert!(
            capi.contains_key(c.get("parent")),
            "v5+ Coll parent = CollApi: {c:?}"
        );
        assert!(groups.contains_key(c.get("pgroup")), "parentGroup = Group");
        assert_eq!(
            (c.get("func"), c.get("dt"), c.get("algo"), c.get("proto")),
            ("AllReduce", "ncclFloat32", "RING", "SIMPLE")
        );
        assert_eq!(c.get("rank"), r.to_string());
    }
    for p in p2ps.values() {
        assert!(
            papi.contains_key(p.get("parent")),
            "v5+ P2p parent = P2pApi: {p:?}"
        );
        assert!(groups.contains_key(p.get("pgroup")));
    }
    // GroupApi: 23 then 24 (NULL args), then stop.
    for h in gapi.keys() {
        let st: Vec<&Rec> = recs
            .iter()
            .filter(|e| e.get("h") == h && e.what != "start")
            .collect();
        let seq: Vec<String> = st
            .iter()
            .map(|e| format!("{}{}", e.what, e.get("s")))
            .collect();
        assert_eq!(seq, ["state23", "state24", "stop"], "GroupApi {h}");
        assert!(st[..2].iter().all(|e| e.get("null") == "1"));
    }
    // KernelCh: parent Coll/P2p; state 22 then stop.
    let kch = handles(recs, 64);
    for (h, k) in &kch {
        assert!(
            colls.contains_key(k.get("parent")) || p2ps.contains_key(k.get("parent")),
            "KernelCh parent {k:?}"
        );
        let seq: Vec<String> = recs
            .iter()
            .filter(|e| e.get("h") == h && e.what != "start")
            .map(|e| format!("{}{}", e.what, e.get("s")))
            .collect();
        assert_eq!(seq, ["state22", "stop"], "KernelCh {h}");
    }
    for p in pops.values() {
        assert!(colls.contains_key(p.get("parent")) || p2ps.contains_key(p.get("parent")));
        let peer: usize = p.get("peer").parse().unwrap();
        assert_ne!(
            hosts(peer),
            hosts(r),
            "ProxyOp only for peers on other hosts: {p:?}"
        );
        assert_eq!(
            p.get("pid"),
            recs.iter().find(|e| e.what == "init").unwrap().get("pid")
        );
    }
    for s in steps.values() {
        assert!(
            pops.contains_key(s.get("parent")),
            "ProxyStep parent = ProxyOp"
        );
    }
    for nt in handles(recs, 128).values() {
        assert!(
            steps.contains_key(nt.get("parent")),
            "NetPlugin parent = ProxyStep"
        );
        assert_eq!(
            (nt.get("id"), nt.get("stype")),
            ("20001", "1"),
            "SOCK descriptor"
        );
    }
    (pops.len(), kch.len())
}

#[test]
fn v6_on_2_30_emits_nccl_hierarchy_with_proxy_events_for_remote_hosts_only() {
    let r = run("v6", "prof", 4, 1, &env("2.30", "rec6"), true);
    let mut total_pops = 0;
    for q in 0..4 {
        assert_eq!(r.abi(q), 6);
        let recs = r.rec(q);
        let init = recs.iter().find(|e| e.what == "init").expect("init");
        assert_eq!(
            (
                init.get("v"),
                init.get("name"),
                init.get("nranks"),
                init.get("nnodes")
            ),
            ("6", "tp0", "4", "2")
        );
        assert_eq!(init.get("rank"), q.to_string());
        assert_eq!(init.get("hash"), r.val(q, "HASH"));
        let (pops, kch) = check_v5_hierarchy(&recs, q, &|x| x / 2);
        assert!(kch > 0);
        total_pops += pops;
        assert!(
            recs.iter()
                .any(|e| e.what == "start" && e.ty() == 32 && e.get("parent") == "0"),
            "ProxyCtrl"
        );
        let ops = recs
            .iter()
            .filter(|e| e.what == "start" && (e.ty() == 2 || e.ty() == 4))
            .count();
        assert_eq!(
            r.val(q, "OPS"),
            ops.to_string(),
            "ncclTestbedProfiledOps = delivered Coll+P2p starts"
        );
        let fin = recs
            .iter()
            .position(|e| e.what == "finalize")
            .expect("finalize");
        let unl = recs
            .iter()
            .position(|e| e.what == "unload")
            .expect("dlclose after the last comm");
        assert!(fin < unl);
        assert!(
            r.ranks
                .err(q)
                .contains("PROFILER/Plugin: Loaded Rec-v6 (v6)"),
            "{}",
            r.ranks.err(q)
        );
    }
    assert!(
        total_pops > 0,
        "ring links between host0 and host1 carry ProxyOps"
    );
}

#[test]
fn same_host_ranks_get_no_proxy_events() {
    let r = run("samehost", "prof", 4, 1, &env("2.30", "rec6"), false);
    for q in 0..4 {
        let recs = r.rec(q);
        assert_eq!(
            recs.iter()
                .find(|e| e.what == "init")
                .unwrap()
                .get("nnodes"),
            "1"
        );
        assert!(!recs
            .iter()
            .any(|e| e.what == "start" && [8, 16, 128].contains(&e.ty())));
        check_v5_hierarchy(&recs, q, &|_| 0);
    }
}

#[test]
fn release_2_28_probes_v5_first() {
    let r = run("v5", "prof", 2, 1, &env("2.28", "rec6"), false);
    for q in 0..2 {
        assert_eq!(r.abi(q), 5);
        let recs = r.rec(q);
        assert_eq!(
            recs.iter().find(|e| e.what == "init").unwrap().get("v"),
            "5"
        );
        assert!(recs
            .iter()
            .filter(|e| e.what == "start")
            .all(|e| e.get("v") == "5"));
    }
}

fn check_v4(r: &Run, n: usize) {
    for q in 0..n {
        assert_eq!(r.abi(q), 4);
        let recs = r.rec(q);
        let init = recs.iter().find(|e| e.what == "init").unwrap();
        assert_eq!((init.get("v"), init.get("name")), ("4", "tp0"));
        assert!(
            !recs.iter().any(|e| e.what == "start" && e.ty() >= 256),
            "v4 has no API events"
        );
        assert!(!recs
            .iter()
            .any(|e| e.what == "state" && e.get("s").parse::<i32>().unwrap() >= 23));
        let groups = handles(&recs, 1);
        for e in recs
            .iter()
            .filter(|e| e.what == "start" && (e.ty() == 2 || e.ty() == 4))
        {
            assert!(
                groups.contains_key(e.get("parent")),
                "v4 Coll/P2p parent = Group: {e:?}"
            );
        }
        let colls = handles(&recs, 2);
        let p2ps = handles(&recs, 4);
        for k in handles(&recs, 64).values() {
            assert!(colls.contains_key(k.get("parent")) || p2ps.contains_key(k.get("parent")));
        }
    }
}

#[test]
fn release_2_27_loads_by_name_and_drives_v4() {
    let r = run("v4-227", "prof", 2, 1, &env("2.27", "rec6"), true);
    check_v4(&r, 2);
}

#[test]
fn v4_only_plugin_on_2_30_is_driven_through_v4() {
    let r = run("v4-230", "prof", 2, 1, &env("2.30", "rec4"), false);
    check_v4(&r, 2);
}

#[test]
fn loading_rules_per_release() {
    let abs5 = format!("{PLUGDIR}/libnccl-profiler-rec5.so");
    let rec6 = format!("{PLUGDIR}/libnccl-profiler-rec6.so");
    let cases: Vec<(&str, Env, u32)> = vec![
        ("abs-230", env("2.30", &abs5), 5),
        ("abs-227", env("2.27", &abs5), 0),
        ("none-230", env("2.30", "none"), 0),
        ("v3only", env("2.30", "rec3"), 0),
        ("missing", env("2.30", "nosuchplugin"), 0),
        (
            "static-230",
            [
                env("2.30", "STATIC_PLUGIN"),
                vec![("LD_PRELOAD", rec6.clone())],
            ]
            .concat(),
            6,
        ),
        (
            "static-227",
            [
                env("2.27", "STATIC_PLUGIN"),
                vec![("LD_PRELOAD", rec6.clone())],
            ]
            .concat(),
            0,
        ),
    ];
    for (name, e, want) in cases {
        let r = run(name, "prof", 2, 1, &e, false);
        for q in 0..2 {
            assert_eq!(r.abi(q), want, "{name} rank {q}: {}", r.ranks.err(q));
        }
        if name == "v3only" {
            assert!(
                r.ranks.err(0).contains("v3"),
                "logs that v3 is not driven: {}",
                r.ranks.err(0)
            );
        }
    }
}

#[test]
fn init_error_semantics_follow_each_release() {
    let fail = ("NCCL_STANDIN_REC_INIT_FAIL", "1".to_string());
    // 2.27: ncclProfiler = NULL for the whole process.
    let r = run(
        "fail-227",
        "prof",
        2,
        1,
        &[env("2.27", "rec6"), vec![fail.clone()]].concat(),
        false,
    );
    assert_eq!(r.abi(0), 0);
    assert_eq!(r.val(0, "OPS"), "0");
    // 2.28: logs, keeps delivering with the NULL context.
    let r = run(
        "fail-228",
        "prof",
        2,
        1,
        &[env("2.28", "rec6"), vec![fail.clone()]].concat(),
        false,
    );
    assert_eq!(r.abi(0), 5);
    assert_ne!(r.val(0, "OPS"), "0");
    // 2.30: unloads at once (dlclose).
    let r = run(
        "fail-230",
        "prof",
        2,
        1,
        &[env("2.30", "rec6"), vec![fail]].concat(),
        false,
    );
    assert_eq!(r.abi(0), 0);
    let recs = r.rec(0);
    let init = recs.iter().position(|e| e.what == "init").unwrap();
    let unl = recs
        .iter()
        .position(|e| e.what == "unload")
        .expect("unloaded after failed init");
    assert!(init < unl);
    assert!(!recs.iter().any(|e| e.what == "start"));
}

#[test]
fn last_comm_freed_dlcloses_and_a_later_comm_reloads() {
    let r = run("reload", "reload", 2, 2, &env("2.30", "rec6"), false);
    let seq: Vec<String> = r
        .rec(0)
        .iter()
        .filter(|e| ["load", "init", "finalize", "unload"].contains(&e.what.as_str()))
        .map(|e| e.what.clone())
        .collect();
    assert_eq!(
        seq,
        ["load", "init", "finalize", "unload", "load", "init", "finalize", "unload"]
    );
}

#[test]
fn kernel_ch_bit_alone_implies_its_ancestors_only() {
    let e = [
        env("2.30", "rec6"),
        vec![("NCCL_STANDIN_REC_MASK", "0x40".to_string())],
    ]
    .concat();
    let r = run("mask", "prof", 4, 1, &e, true);
    for q in 0..4 {
        let tys: std::collections::HashSet<u32> = r
            .rec(q)
            .iter()
            .filter(|e| e.what == "start")
            .map(Rec::ty)
            .collect();
        let want: std::collections::HashSet<u32> =
            [256, 512, 1024, 1, 2, 4, 64].into_iter().collect();
        assert_eq!(tys, want);
    }
}

#[test]
fn loss_injection_drops_whole_ops_and_the_counter_matches() {
    let e = [
        env("2.30", "rec6"),
        vec![
            ("COMMINSIGHT_TESTBED_LOSS_PCT", "50".to_string()),
            ("COMMINSIGHT_TESTBED_SEED", "7".to_string()),
        ],
    ]
    .concat();
    let r = run("loss", "loss", 2, 1, &e, false);
    for q in 0..2 {
        let recs = r.rec(q);
        let colls = handles(&recs, 2);
        let ops: usize = r.val(q, "OPS").parse().unwrap();
        assert_eq!(ops, colls.len());
        assert!(ops > 5 && ops < 35, "about half of 40 delivered: {ops}");
        let capi = handles(&recs, 512);
        assert_eq!(capi.len(), ops, "a lost op has no CollApi either");
        for k in handles(&recs, 64).values() {
            assert!(
                colls.contains_key(k.get("parent")),
                "no KernelCh of a lost op"
            );
        }
    }
}

fn colls_by_func(recs: &[Rec]) -> HashMap<String, Rec> {
    handles(recs, 2)
        .into_values()
        .map(|e| (e.get("func").to_string(), e))
        .collect()
}

#[test]
fn broadcast_on_2_30_shows_only_api_events_unless_allgatherv_is_disabled() {
    let r = run("bcast-230", "funcs", 2, 1, &env("2.30", "rec6"), false);
    let recs = r.rec(0);
    let colls = colls_by_func(&recs);
    assert!(
        !colls.contains_key("Broadcast"),
        "NCCL 2.29+ AllGatherV path: no Coll for Broadcast"
    );
    assert!(
        handles(&recs, 512)
            .values()
            .any(|e| e.get("func") == "Broadcast"),
        "CollApi still delivered"
    );
    let ag = &colls["AllGather"];
    assert_eq!(
        (ag.get("count"), ag.get("dt")),
        ("400", "ncclInt8"),
        "AllGather as bytes of int8"
    );
    assert_eq!(colls["AlltoAll"].get("seq"), "0");
    let e = [
        env("2.30", "rec6"),
        vec![("NCCL_ALLGATHERV_ENABLE", "0".to_string())],
    ]
    .concat();
    let r = run("bcast-230-off", "funcs", 2, 1, &e, false);
    let colls = colls_by_func(&r.rec(0));
    let b = &colls["Broadcast"];
    assert_eq!(
        (b.get("count"), b.get("dt"), b.get("seq")),
        ("4000", "ncclInt8", "0")
    );
}

#[test]
fn alltoall_on_2_27_is_grouped_send_recv() {
    let r = run("a2a-227", "funcs", 2, 1, &env("2.27", "rec6"), false);
    let recs = r.rec(0);
    assert!(!colls_by_func(&recs).contains_key("AlltoAll"));
    let p2p = handles(&recs, 4);
    assert_eq!(p2p.values().filter(|e| e.get("func") == "Send").count(), 2);
    assert_eq!(p2p.values().filter(|e| e.get("func") == "Recv").count(), 2);
    assert!(
        colls_by_func(&recs).contains_key("Broadcast"),
        "2.27 has no AllGatherV path"
    );
}

#[test]
fn v5_plugin_through_the_2_30_adapter_gets_non_null_group_api_args() {
    let abs5 = format!("{PLUGDIR}/libnccl-profiler-rec5.so");
    for (ver, null) in [("2.30", "0"), ("2.28", "1")] {
        let r = run("v5args", "prof", 2, 1, &env(ver, &abs5), false);
        let recs = r.rec(0);
        let g: Vec<&Rec> = recs
            .iter()
            .filter(|e| e.what == "state" && ["23", "24"].contains(&e.get("s")))
            .collect();
        assert!(!g.is_empty());
        assert!(g.iter().all(|e| e.get("null") == null), "{ver}: {g:?}");
    }
}

#[test]
fn split_children_get_their_own_init_with_name_hash_and_geometry() {
    let r = run("splitprof", "splitprof", 4, 1, &env("2.30", "rec6"), false);
    for q in 0..4 {
        let recs = r.rec(q);
        let inits: Vec<&Rec> = recs.iter().filter(|e| e.what == "init").collect();
        assert_eq!(inits.len(), 2);
        assert_eq!(
            (inits[0].get("name"), inits[0].get("nranks")),
            ("(null)", "4")
        );
        assert_eq!(
            (inits[1].get("name"), inits[1].get("nranks")),
            ("half", "2")
        );
        assert_eq!(inits[1].get("rank"), (q / 2).to_string());
        assert_eq!(inits[1].get("hash"), r.val(q, "CHILD"));
        assert_eq!(inits[0].get("hash"), r.val(q, "HASH"));
        let seq: Vec<&str> = recs
            .iter()
            .filter(|e| ["load", "init", "finalize", "unload"].contains(&e.what.as_str()))
            .map(|e| e.what.as_str())
            .collect();
        assert_eq!(
            seq,
            ["load", "init", "init", "finalize", "finalize", "unload"],
            "one load per process"
        );
    }
}

#[test]
fn ce_bits_imply_api_events_on_v6_and_are_cleared_for_v5_on_2_30() {
    let ce = ("NCCL_STANDIN_REC_MASK", "0x1000".to_string());
    let r = run(
        "ce6",
        "prof",
        2,
        1,
        &[env("2.30", "rec6"), vec![ce.clone()]].concat(),
        false,
    );
    let tys: std::collections::HashSet<u32> = r
        .rec(0)
        .iter()
        .filter(|e| e.what == "start")
        .map(Rec::ty)
        .collect();
    assert_eq!(
        tys,
        [256, 512].into_iter().collect(),
        "CeColl implies GroupApi and CollApi only"
    );
    let abs5 = format!("{PLUGDIR}/libnccl-profiler-rec5.so");
    let r = run(
        "ce5",
        "prof",
        2,
        1,
        &[env("2.30", &abs5), vec![ce]].concat(),
        false,
    );
    assert!(
        !r.rec(0).iter().any(|e| e.what == "start"),
        "the v5 adapter cleared the CE bits"
    );
}

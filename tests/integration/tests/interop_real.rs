//! Issue 22 acceptance on public real data (`../shared/data/real-traces/`, read each folder's
//! SOURCE.md): Flight Recorder dumps of a 16-rank Megatron MoE job with injected faults, and
//! Kineto traces of five jobs, imported with `comminsight-agent import` and diagnosed with the
//! same commands as the plugin's records.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use comminsight_tests::*;
use comminsight_wire::record::Body;

/// The real-trace folder: `COMMINSIGHT_REAL_TRACES`, else `../shared/data/real-traces` beside the
/// checkout. Missing data fails the test (it is part of the project's shared folder).
fn real_traces() -> PathBuf {
    let p = std::env::var_os("COMMINSIGHT_REAL_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/real-traces")
        });
    assert!(
        p.join("nvrx-fr-hang-16rank").is_dir(),
        "{}: the real traces are missing (set COMMINSIGHT_REAL_TRACES)",
        p.display()
    );
    p
}

fn run_json(args: &[&str]) -> (i32, serde_json::Value) {
    let o = agent(args);
    let code = o.status.code().unwrap_or(-1);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: exit {code}, not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (code, v)
}

/// The faulted ranks `fault_injection.log` names.
fn injected(scenario: &Path) -> Vec<i64> {
    let log = std::fs::read_to_string(scenario.join("fault_injection.log")).unwrap();
    let line = log.lines().find(|l| l.starts_with("Fault ranks:")).unwrap();
    let list = line.split_once('[').unwrap().1.trim_end_matches(']');
    list.split(',').map(|r| r.trim().parse().unwrap()).collect()
}

/// Both Flight Recorder scenarios, from the pickles and from their JSON form: `hang` names the
/// injected ranks as the sources, calls it Flight Recorder's `missing`, and the EP group's
/// all-to-all (the upstream analyser's answer) is where the other EP ranks wait for exactly them.
#[test]
fn flight_recorder_hangs_name_the_injected_ranks() {
    let root = real_traces().join("nvrx-fr-hang-16rank/fr_traces");
    for scenario in ["gpu_error_2nd", "lock_gil_1st"] {
        let dir = root.join(scenario);
        let faulty = injected(&dir);
        assert_eq!(faulty, vec![9, 14]);
        for form in ["pickle", "json"] {
            let out = OutDir::new(&format!("fr-{scenario}-{form}"));
            let input = out.path().join("in");
            std::fs::create_dir_all(&input).unwrap();
            for r in 0..16 {
                let name = format!("_dump_{r}");
                let (from, to) = if form == "pickle" {
                    (dir.join(&name), input.join(&name))
                } else {
                    (
                        dir.join(format!("{name}.json")),
                        input.join(format!("{name}.json")),
                    )
                };
                std::fs::copy(from, to).unwrap();
            }
            let imported = out.path().join("imported");
            // No format given: detected from the content.
            let (code, m) = run_json(&[
                "import",
                input.to_str().unwrap(),
                "-o",
                imported.to_str().unwrap(),
                "--job",
                scenario,
                "--json",
            ]);
            assert_eq!(code, 0, "{m}");
            assert_eq!(m["format"], "flight-recorder");
            assert_eq!(m["summary"]["files"], 16);
            assert_eq!(m["summary"]["streams"], 16);
            assert_eq!(m["summary"]["skipped"], serde_json::json!({}));
            let (code, h) = run_json(&["hang", imported.to_str().unwrap(), "--json"]);
            assert_eq!(code, 1, "a hang is a finding: {h}");
            let v = &h["verdicts"][0];
            assert_eq!(v["kind"], "hang", "{scenario} {form}: {v}");
            assert_eq!(
                v["source_ranks"],
                serde_json::json!(faulty),
                "{scenario} {form}"
            );
            assert_eq!(v["category"], "missing");
            let ep_waits: Vec<&serde_json::Value> = v["chain"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l["func"] == "AlltoAll")
                .collect();
            let waiters: BTreeSet<i64> = ep_waits
                .iter()
                .map(|l| l["rank"].as_i64().unwrap())
                .collect();
            assert_eq!(
                waiters,
                BTreeSet::from([8, 10, 11, 12, 13, 15]),
                "{scenario} {form}: the other EP ranks wait in the all-to-all"
            );
            assert!(ep_waits
                .iter()
                .all(|l| l["waits_for"] == serde_json::json!(faulty)));
            let membership = &v["evidence"]["sources"];
            assert_eq!(membership.as_array().unwrap().len(), 2);
            // The records carry the source too.
            let recs = records(&imported);
            let sources: BTreeSet<u8> = recs
                .iter()
                .filter_map(|r| match &r.body {
                    Body::Segment(s) => Some(s.source),
                    _ => None,
                })
                .collect();
            assert_eq!(
                sources,
                BTreeSet::from([comminsight_wire::segment::SOURCE_FLIGHT_RECORDER])
            );
        }
    }
}

/// The kernels of each `ProfilerStep#N` (by `coll_local_sn`), from the imported records and the
/// ground truth in `import.json`.
fn truth_steps(imported: &Path, manifest: &serde_json::Value) -> BTreeMap<u64, BTreeSet<u64>> {
    let ranges: Vec<(u64, u64, u64)> = manifest["ground_truth"]["profiler_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["step"].as_u64().unwrap(),
                t["start_ns"].as_u64().unwrap(),
                t["end_ns"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut out: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for r in records(imported) {
        let (Body::Coll(o) | Body::P2p(o)) = &r.body else {
            continue;
        };
        if let Some((step, _, _)) = ranges
            .iter()
            .find(|(_, s, e)| (*s..=*e).contains(&o.start_ns))
        {
            out.entry(*step).or_default().insert(o.coll_local_sn);
        }
    }
    out
}

/// Each real Kineto trace: imported (`ProfilerStep` ranges only as ground truth), its steps
/// rebuilt with the shipped templates, and every step compared with the profiler's: the
/// accuracy (ProfilerSteps whose NCCL kernels are exactly one rebuilt step) per file.
#[test]
fn kineto_steps_match_the_profiler_steps() {
    let dir = real_traces().join("hta-kineto-nccl");
    // (file, template, steps found of those with kernels, ProfilerSteps with kernels).
    let expect = [
        (
            "nccl_parser_config__rank0of2__nccl_data",
            Some("ddp-world"),
            2,
            3,
        ),
        ("trace_diff_control__rank3of8", Some("p2p-world"), 5, 6),
        ("negative_queue_check__rank0of16", None, 0, 5),
        ("trace_filter_sampled__rank0of128", None, 0, 2),
        ("trace_filter_sampled__rank1of128", None, 0, 2),
    ];
    let mut table = Vec::new();
    for (name, template, found, total) in expect {
        let out = OutDir::new(&format!("kineto-{name}"));
        let imported = out.path().join("imported");
        let file = dir.join(format!("{name}.json.gz"));
        let (code, m) = run_json(&[
            "import",
            "kineto",
            file.to_str().unwrap(),
            "-o",
            imported.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(code, 0, "{m}");
        assert_eq!(m["summary"]["skipped"], serde_json::json!({}), "{name}");
        let truth = truth_steps(&imported, &m);
        let (_, s) = run_json(&["steps", imported.to_str().unwrap(), "--json"]);
        assert_eq!(
            s["template"]["name"].as_str(),
            template,
            "{name}: template selected from the features {}",
            s["features"]
        );
        let rebuilt: Vec<BTreeSet<u64>> = s["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|st| {
                let a = st["first"]["coll_local_sn"].as_u64().unwrap();
                let b = st["last"]["coll_local_sn"].as_u64().unwrap();
                (a..=b).collect()
            })
            .collect();
        // Every rebuilt step is one profiler step, exactly.
        for st in &rebuilt {
            assert!(
                truth.values().any(|t| t == st),
                "{name}: rebuilt step {st:?} is no ProfilerStep's kernels ({truth:?})"
            );
        }
        if template.is_some() {
            // The other offline commands read the same import.
            let dir = imported.to_str().unwrap();
            let (code, st) = run_json(&["straggler", dir, "--json"]);
            assert!(code == 0 || code == 1, "{name}: straggler {st}");
            let pf = out.path().join("t.pftrace");
            let o = agent(&["trace", dir, "--steps", "0..1", "-o", pf.to_str().unwrap()]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(std::fs::metadata(&pf).unwrap().len() > 0);
            let html = out.path().join("r.html");
            let o = agent(&["report", dir, "-o", html.to_str().unwrap()]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(std::fs::read_to_string(&html).unwrap().contains(name));
        }
        let matched = truth.values().filter(|t| rebuilt.contains(t)).count();
        table.push(format!("{name}: {matched}/{} ProfilerSteps", truth.len()));
        assert_eq!((matched, truth.len()), (found, total), "{name}");
    }
    println!("step accuracy per file:\n  {}", table.join("\n  "));
}

/// Bad input: one line naming the file and what is wrong, exit 2, nothing written as records.
#[test]
fn bad_input_is_refused_with_one_line() {
    let out = OutDir::new("import-bad");
    std::fs::create_dir_all(out.path()).unwrap();
    let evil = out.path().join("_dump_0");
    // A pickle that would run `os.system` when unpickled by Python.
    std::fs::write(&evil, b"cos\nsystem\n(S'echo owned'\ntR.").unwrap();
    let o = agent(&[
        "import",
        "flight-recorder",
        evil.to_str().unwrap(),
        "-o",
        out.path().join("o1").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("_dump_0") && err.contains("GLOBAL"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let junk = out.path().join("notes.txt");
    std::fs::write(&junk, "hello\n").unwrap();
    let o = agent(&[
        "import",
        junk.to_str().unwrap(),
        "-o",
        out.path().join("o2").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("notes.txt") && err.contains("name the format"),
        "{err}"
    );

    // An output directory that already holds something is never mixed into.
    let used = out.path().join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("x"), "x").unwrap();
    let good = real_traces().join("nvrx-fr-hang-16rank/fr_traces/lock_gil_1st/_dump_0");
    let o = agent(&[
        "import",
        good.to_str().unwrap(),
        "-o",
        used.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not empty"));
}

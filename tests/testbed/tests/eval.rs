//! `comminsight-testbed eval hang --synthetic` end to end, with a stand-in for the analysis (a
//! Python script this test writes: it answers from `truth.json`, right or wrong on purpose), so
//! the harness is checked apart from the analysis it scores: exit codes, the tables,
//! `eval-hang.json`, kept and deleted run directories, `--only`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_comminsight-testbed");

/// `STANDIN_MODE`: `right` names the truth's culprit; `wrong-pyhang` names the next rank for
/// `pyhang` faults; `alarm` also raises a verdict for every stall.
const STANDIN: &str = r#"#!/usr/bin/env python3
import json, os, sys
if sys.argv[1:2] != ["hang"] or "--json" not in sys.argv:
    sys.exit(2)
d = sys.argv[2]
t = json.load(open(os.path.join(d, "truth.json")))
mode = os.environ.get("STANDIN_MODE", "right")
kinds = {"hang": "hang", "pyhang": "hang", "kill": "hang", "mismatch": "mismatch"}
v, res = [], []
for f in t["faults"]:
    if f["kind"] in kinds:
        r = f["rank"]
        if mode == "wrong-pyhang" and f["kind"] == "pyhang":
            r = (r + 1) % t["ranks"]
        v.append({"kind": kinds[f["kind"]], "source_ranks": [r], "evidence": {"x": 1}})
    elif f["kind"] == "stall":
        e = {"kind": "hang", "source_ranks": [f["rank"]]}
        (v if mode == "alarm" else res).append(e)
print(json.dumps({"verdicts": v, "resolved": res}))
sys.exit(1 if v else 0)
"#;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("cit-eval-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn standin(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("standin-agent");
    std::fs::write(&p, STANDIN).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn eval(dir: &Path, out: &str, mode: &str, extra: &[&str]) -> (Output, serde_json::Value) {
    let o = Command::new(BIN)
        .args([
            "eval",
            "hang",
            "--synthetic",
            "--max-ranks",
            "64",
            "--seed",
            "11",
        ])
        .args(["--scenarios", "5", "--healthy", "2", "--jobs", "2", "--out"])
        .arg(dir.join(out))
        .arg("--agent")
        .arg(standin(dir))
        .args(extra)
        .env("STANDIN_MODE", mode)
        .output()
        .unwrap();
    let json = std::fs::read_to_string(dir.join(out).join("eval-hang.json"))
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(serde_json::Value::Null);
    (o, json)
}

fn runs(dir: &Path, out: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join(out).join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn right_answers_meet_the_targets_and_leave_no_run_behind() {
    let s = Scratch::new("right");
    let (o, json) = eval(&s.0, "out", "right", &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("top-1 accuracy (target >= 99.5 %): PASS"),
        "{stdout}"
    );
    assert!(
        stdout.contains("false alarms: 0 (target 0): PASS"),
        "{stdout}"
    );
    for kind in ["hang", "pyhang", "kill", "mismatch", "pp-chain"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(kind) && l.contains(" 1 ")),
            "{kind}: {stdout}"
        );
    }
    let cases = json["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    assert_eq!(json["top1_accuracy"], 1.0);
    assert_eq!(
        json["transient_alarms"],
        cases[5]["faults"]
            .as_array()
            .unwrap()
            .iter()
            .chain(cases[6]["faults"].as_array().unwrap())
            .filter(|f| f.as_str().unwrap().starts_with("stall"))
            .count()
    );
    for c in cases {
        assert!(c["replay"].as_str().unwrap().contains("--synthetic"), "{c}");
        assert!(c["dir"].is_null());
        assert!(c["got"]["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v.get("evidence").is_none()));
    }
    assert!(runs(&s.0, "out").is_empty(), "passed runs are deleted");
}

#[test]
fn misses_and_false_alarms_fail_and_keep_their_runs_for_replay() {
    let s = Scratch::new("wrong");
    let (o, json) = eval(&s.0, "miss", "wrong-pyhang", &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("TARGET MISSED") && stdout.contains("#1 pyhang"),
        "{stdout}"
    );
    assert_eq!(json["by_kind"]["pyhang"]["top1_hits"], 0);
    let kept = runs(&s.0, "miss");
    assert!(
        kept.iter()
            .any(|r| r.starts_with("0001-pyhang-") && !r.contains('.')),
        "{kept:?}"
    );
    assert!(
        kept.iter().all(|r| r.starts_with("0001-")),
        "only the miss is kept: {kept:?}"
    );
    let dir = json["cases"][1]["dir"].as_str().unwrap();
    assert!(Path::new(dir).join("truth.json").is_file());

    // Replay the miss alone.
    let (o, json) = eval(&s.0, "only", "wrong-pyhang", &["--only", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(json["cases"].as_array().unwrap().len(), 1);
    assert_eq!(
        json["cases"][0]["faults"],
        serde_json::json!(json_case(&s.0, "miss", 1)["faults"])
    );

    // A verdict on a healthy run is a false alarm.
    let (o, json) = eval(&s.0, "alarm", "alarm", &[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert_eq!(json["false_alarms"], 2);
    assert_eq!(json["top1_accuracy"], 1.0);
    assert!(
        stdout.contains("false alarms: 2 (target 0): MISSED"),
        "{stdout}"
    );
}

fn json_case(dir: &Path, out: &str, i: usize) -> serde_json::Value {
    let t = std::fs::read_to_string(dir.join(out).join("eval-hang.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    v["cases"][i].clone()
}

#[test]
fn a_missing_analysis_binary_is_a_usage_error() {
    let s = Scratch::new("noagent");
    let o = Command::new(BIN)
        .args([
            "eval",
            "hang",
            "--synthetic",
            "--scenarios",
            "1",
            "--healthy",
            "0",
            "--out",
        ])
        .arg(s.0.join("o"))
        .args(["--agent", "/nonexistent/comminsight-agent"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/nonexistent/comminsight-agent not found") && err.contains("--agent"),
        "{err}"
    );
}

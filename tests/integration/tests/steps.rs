//! Issue 5: steps rebuilt from the communication records match the test bed's truth.

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_tests::*;

fn scenario(name: &str) -> String {
    format!(
        "{}/../../tests/scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `comminsight-agent steps OUT --json` scored against truth.json's `steps`: (matching (rank,
/// step) boundaries, truth pairs, template name).
fn score(out: &Path) -> (usize, usize, String) {
    let o = agent(&["steps", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("steps --json");
    let template = v["template"]["name"].as_str().unwrap_or("none").to_string();
    let mut got: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for s in v["steps"].as_array().expect("steps") {
        got.insert(
            (s["rank"].as_u64().unwrap(), s["step"].as_u64().unwrap()),
            (
                s["first"]["coll_local_sn"].as_u64().unwrap(),
                s["last"]["coll_local_sn"].as_u64().unwrap(),
            ),
        );
    }
    let t = truth(out);
    let (mut ok, mut total) = (0, 0);
    for (rank, steps) in t["steps"].as_object().unwrap() {
        let rank: u64 = rank.parse().unwrap();
        for (i, s) in steps.as_array().unwrap().iter().enumerate() {
            let Some(pair) = s.as_array() else { continue };
            total += 1;
            let want = (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap());
            if got.get(&(rank, i as u64)) == Some(&want) {
                ok += 1;
            }
        }
    }
    (ok, total, template)
}

#[test]
fn steps_match_the_truth_on_megatron_and_moe_jobs() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("steps-truth");
    let mut report = String::new();
    for (sc, args) in [
        ("megatron.toml", vec!["--ranks", "16", "--steps", "20"]),
        ("moe.toml", vec!["--ranks", "16", "--steps", "20"]),
        (
            "megatron.toml",
            vec!["--ranks", "16", "--steps", "200", "--synthetic"],
        ),
        (
            "moe.toml",
            vec!["--ranks", "16", "--steps", "200", "--synthetic"],
        ),
    ] {
        let out = dir.path().join(format!("{sc}-{}", args.len()));
        let mut a = vec!["--scenario".to_string(), scenario(sc)];
        a.extend(args.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        testbed(&out, &a, &[]).assert_ok();
        let (ok, total, template) = score(&out);
        report.push_str(&format!(
            "{sc} {}: {ok}/{total} (rank, step) boundaries, template {template}\n",
            args.join(" ")
        ));
        assert!(total > 0);
        assert!(
            ok as f64 >= 0.999 * total as f64,
            "{sc}: {ok}/{total}\n{report}"
        );
    }
    eprintln!("{report}");
}
